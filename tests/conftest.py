"""pytest's fixtures for every test: seeded paddle and numpy. Shared helpers are imported from
tests/helpers.py (which also puts the repository on sys.path)."""
import helpers  # noqa: F401  the repository on sys.path before any test module imports
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed():
    import paddle
    paddle.seed(1234)
    np.random.seed(1234)
    yield
