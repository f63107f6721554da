"""`amp:` (ernie_doc.precision): the decision over every value, device and `compile`, its
refusals through a real run's preparation, and the paddle behaviour they rest on. CPU bf16
training itself is tested in test_bf16_training.py."""
import contextlib
import warnings

import numpy as np
import paddle
import pytest
from helpers import tiny_longdep

from ernie_doc.errors import ConfigError
from ernie_doc.precision import AmpSettings, amp_settings
from ernie_doc.run_config import load_config
from ernie_doc.training.prepare import prepare


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


@pytest.mark.parametrize("pir, fast, compiled, refused", [
    (True, True, True, None),
    (True, True, False, "bf16 training on CPU runs inside the compiled training step: set "
                        "compile: true"),
    (False, True, True, "captures legacy programs, where autocast leaves CPU matmuls in fp32"),
    (True, False, True, "this processor has no AVX512-BF16 instructions"),
])
def test_cpu_bf16_needs_compile_pir_and_the_instructions(monkeypatch, pir, fast, compiled,
                                                         refused):
    monkeypatch.setattr(paddle.framework, "use_pir_api", lambda: pir)
    monkeypatch.setattr(paddle.base.core, "supports_bfloat16_fast_performance", lambda: fast)
    if refused:
        with pytest.raises(ValueError, match=refused):
            amp_settings("bf16", "cpu", compiled=compiled)
        with pytest.raises(ValueError, match=r"bf16 prediction: ernie-doc predict --precision"):
            amp_settings("bf16", "cpu", compiled=compiled)
        return
    got = amp_settings("bf16", "cpu", compiled=compiled)
    assert got == AmpSettings(True, "bfloat16", loss_scaling=False, in_program=True)
    assert got.scaler() is None
    # dygraph calls get no autocast (it would warn and stay fp32); the compiled step's does
    assert isinstance(got.autocast(), contextlib.nullcontext)
    assert not isinstance(got.program_autocast(), contextlib.nullcontext)
    assert isinstance(AmpSettings(True, "bfloat16").program_autocast(), contextlib.nullcontext)


def test_config_checks_the_value_and_prepare_the_device(tmp_path):
    with pytest.raises(ConfigError, match=r"amp: must be false, true, fp16 or bf16, got 'int8'"):
        load_config(None, tiny_longdep("amp=int8"))
    for value in ("false", "true", "fp16", "bf16"):   # each value passes the config check
        load_config(None, tiny_longdep(f"amp={value}", f"output_dir={tmp_path / value}"))
    for value, refused in (("fp16", r"amp: fp16 training needs a GPU \(device is cpu\)"),
                           ("bf16", r"amp: (.*)bf16 training on CPU runs inside the compiled "
                                    r"training step|amp: paddle 2|amp: this processor has no "
                                    r"AVX512-BF16")):
        cfg = load_config(None, tiny_longdep(f"amp={value}", f"output_dir={tmp_path / 'run'}"))
        with pytest.raises(ConfigError, match=refused):
            prepare(cfg)
        assert not (tmp_path / "run").exists()   # refused before anything is written


def test_paddle_does_not_autocast_on_cpu():
    """Why CPU bf16 trains only in the compiled step: paddle's dygraph autocast leaves a CPU
    matmul in fp32 (with a warning), and paddle has no dygraph CPU bfloat16 matmul kernel to
    call by hand. When a paddle release changes either, this test fails: then dygraph CPU bf16
    training can be enabled."""
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
