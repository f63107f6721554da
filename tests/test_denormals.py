"""Denormal floats (utils.flush_denormals, config key flush_denormals): flushed to zero by a
run's preparation unless switched off, restored when off, and followed by paddle's kernels.
Why: a backward over denormal gradients is many times slower on an x86 CPU (README,
Benchmark)."""
import numpy as np
import pytest
from helpers import tiny_longdep

from ernie_doc.utils import denormals_flushed, flush_denormals

pytestmark = pytest.mark.skipif(denormals_flushed() is None,
                                reason="reads the x86-64 MXCSR through glibc's fenv")
DENORMAL = np.float32(1e-39)


@pytest.fixture(autouse=True)
def restore():
    before = denormals_flushed()
    yield
    flush_denormals(before)


def test_flushing_leaves_numpy_quiet():
    """numpy's finfo warns when float32's smallest subnormal reads as 0: the run's stderr
    must stay one error line (tests/test_cli.py), so the setting silences it."""
    import subprocess
    import sys
    code = ("import numpy as np; from ernie_doc.utils import flush_denormals; "
            "flush_denormals(); np.finfo(np.float32); np.finfo(np.float64)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_flush_and_restore():
    assert flush_denormals(False) and not denormals_flushed()
    assert DENORMAL * np.float32(1) == DENORMAL                       # IEEE: kept
    assert np.float32(1e-30) * np.float32(1e-9) > 0
    assert flush_denormals(True) and denormals_flushed()
    assert DENORMAL * np.float32(1) == 0                              # read as zero (DAZ)
    assert np.float32(1e-30) * np.float32(1e-9) == 0                  # written as zero (FTZ)
    assert np.float32(1e-30) * np.float32(1e-7) == np.float32(1e-37)  # normal: unchanged


@pytest.mark.parametrize("setting, flushed", [("true", True), ("false", False),
                                              (None, True)])   # the key left out: flushed
def test_prepare_applies_the_config_key(tmp_path, setting, flushed):
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    flush_denormals(not flushed)
    given = [] if setting is None else [f"flush_denormals={setting}"]
    cfg = load_config(None, tiny_longdep(*given, f"output_dir={tmp_path / 'run'}"))
    assert cfg.flush_denormals is flushed
    prepare(cfg)
    assert denormals_flushed() is flushed


def test_paddle_kernels_follow_the_setting():
    """paddle's matmul and backward (its math threads included) see the setting: gradients
    scaled into the denormal range stay denormal under IEEE and are zero when flushed (the
    speed-up this buys is measured in the README, not timed here)."""
    import paddle

    from ernie_doc.utils import set_paddle_threads
    set_paddle_threads(2)
    paddle.seed(0)
    layer = paddle.nn.Linear(64, 64)
    x = paddle.to_tensor(np.random.RandomState(0).rand(128, 64).astype("float32"))

    def weight_grad():
        (layer(x).mean() * 1e-36).backward()
        grad = layer.weight.grad.numpy().copy()
        layer.clear_gradients()
        return grad

    flush_denormals(False)
    ieee = weight_grad()
    assert (ieee != 0).all() and (np.abs(ieee) < np.finfo(np.float32).tiny).all()
    flush_denormals(True)
    assert (weight_grad() == 0).all()
