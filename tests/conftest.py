"""pytest's fixtures for every test: seeded paddle and numpy. Shared helpers are imported from
tests/helpers.py (which also puts the repository on sys.path).

Under pytest-xdist (`-n 3` on two cores: a share of the tests waits on subprocesses and
timeouts, and a third worker uses that time) pytest.ini sets `--dist loadscope`: a module's
tests run on one worker, so a module-scoped fixture (a tiny training run, an export) is built
once, not once per worker. The modules with a multi-minute or two-process test (marked slow or
two_ranks) start first, so that none of them starts last while the other workers idle.

Each xdist worker (and every process it starts) gets one thread for the OpenMP and BLAS pools:
workers with a pool of one thread per core each oversubscribe the cores, and the spinning
threads cost time. Set before numpy is imported."""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
import helpers  # noqa: F401  the repository on sys.path before any test module imports
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed():
    import paddle
    paddle.seed(1234)
    np.random.seed(1234)
    yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first = {item.nodeid.split("::")[0] for item in items
             if item.get_closest_marker("slow") or item.get_closest_marker("two_ranks")}
    # xdist hands modules out in the order of their first test (--no-loadscope-reorder)
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in first)
