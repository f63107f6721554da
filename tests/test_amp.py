"""`amp:` (ernie_doc.training.amp): the decision over every value and device, its refusal on
CPU through a real run's preparation, and the paddle behaviour that refusal rests on."""
import warnings

import numpy as np
import paddle
import pytest
from helpers import tiny_longdep

from ernie_doc.config import ConfigError
from ernie_doc.training.amp import AmpSettings, amp_settings
from ernie_doc.training.prepare import prepare
from ernie_doc.training.run_config import load_config


@pytest.mark.parametrize("value, device, want", [
    (False, "cpu", AmpSettings(False)),
    (False, "gpu", AmpSettings(False)),
    (True, "gpu", AmpSettings(True, "float16", loss_scaling=True)),
    ("fp16", "gpu", AmpSettings(True, "float16", loss_scaling=True)),
    ("bf16", "gpu", AmpSettings(True, "bfloat16", loss_scaling=False)),
])
def test_amp_settings(value, device, want):
    got = amp_settings(value, device)
    assert got == want
    assert (got.scaler() is not None) == want.loss_scaling


@pytest.mark.parametrize("value, device, message", [
    (True, "cpu", "fp16 training needs a GPU (device is cpu)"),
    ("fp16", "cpu", "fp16 training needs a GPU (device is cpu)"),
    ("bf16", "cpu", "bf16 training needs a GPU (device is cpu)"),
    ("bf16", "xpu", "bf16 training needs a GPU (device is xpu)"),
    ("int8", "gpu", "must be false, true, fp16 or bf16, got 'int8'"),
    (1, "gpu", "must be false, true, fp16 or bf16, got 1"),
    ("FP16", "gpu", "got 'FP16'"),
])
def test_amp_settings_refuses(value, device, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        amp_settings(value, device)


@pytest.mark.parametrize("value, capability, refused", [
    ("bf16", (7, 5), "bf16 training needs a GPU of compute capability 8.0 or newer, this one "
                     "has 7.5"),
    ("bf16", (8, 0), None), ("bf16", (9, 0), None),
    (True, (6, 1), "fp16 training needs a GPU of compute capability 7.0 or newer"),
    ("fp16", (7, 0), None), ("bf16", None, None),   # None: capability unknown
])
def test_amp_settings_checks_the_gpu(value, capability, refused):
    if refused:
        with pytest.raises(ValueError, match=refused):
            amp_settings(value, "gpu", capability)
    else:
        assert amp_settings(value, "gpu", capability).enabled


def test_bf16_refusal_points_to_bf16_prediction():
    with pytest.raises(ValueError, match=r"ernie-doc predict --precision bf16"):
        amp_settings("bf16", "cpu")


def test_config_checks_the_value_and_prepare_the_device(tmp_path):
    with pytest.raises(ConfigError, match=r"amp: must be false, true, fp16 or bf16, got 'int8'"):
        load_config(None, tiny_longdep("amp=int8"))
    for value in ("false", "true", "fp16", "bf16"):   # each value passes the config check
        load_config(None, tiny_longdep(f"amp={value}", f"output_dir={tmp_path / value}"))
    cfg = load_config(None, tiny_longdep("amp=bf16", f"output_dir={tmp_path / 'run'}"))
    with pytest.raises(ConfigError, match=r"amp: bf16 training needs a GPU \(device is cpu\)"):
        prepare(cfg)
    assert not (tmp_path / "run").exists()   # refused before anything is written


def test_paddle_does_not_autocast_on_cpu():
    """Why amp is refused on CPU: paddle's autocast leaves a CPU matmul in fp32 (with a
    warning), and paddle has no CPU bfloat16 matmul kernel to call by hand. When a paddle
    release changes either, this test fails: then CPU bf16 training can be enabled."""
    paddle.set_device("cpu")
    layer = paddle.nn.Linear(8, 8)
    x = paddle.to_tensor(np.ones((2, 8), "float32"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with paddle.amp.auto_cast(enable=True, dtype="bfloat16"):
            y = layer(x)
    assert y.dtype == paddle.float32
    with pytest.raises(Exception, match="bfloat16"):   # not registered on CPU
        paddle.matmul(x.astype("bfloat16"), x.astype("bfloat16"), transpose_y=True)
