"""`amp: bf16` on CPU (compile: true): bfloat16 matmuls inside the compiled training step.

Every head's bf16 compiled forward and gradients stay within bf16 rounding of dygraph fp32 and
differ from it (so bf16 really ran); a trainer run's loss curve stays within a stated distance
of the fp32 run's; a program paddle's oneDNN bf16 matmul gradient would crash on is refused
before it runs. Where this paddle or processor cannot train bf16 on CPU, the tests check the
refusal instead."""
import contextlib
import json
import re

import numpy as np
import paddle
import pytest
from helpers import tiny_longdep
from test_compiled import HEADS, head_in_training, two_segments

from ernie_doc.errors import Bf16ProgramError, ConfigError
from ernie_doc.precision import amp_settings, cpu_bf16_problem
from ernie_doc.training.compiled import CompiledForward

PROBLEM = cpu_bf16_problem()
needs_cpu_bf16 = pytest.mark.skipif(PROBLEM is not None, reason=f"no CPU bf16: {PROBLEM}")
# The stated tolerance: bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ≈ 0.002 per
# product input); through a 2-layer model the outputs stay within this of fp32's.
OUTPUT_ATOL, OUTPUT_RTOL = 0.05, 0.05
# ‖bf16 gradient − fp32 gradient‖ / ‖fp32 gradient‖ of each parameter
GRAD_RTOL = 0.2   # the largest seen: 0.12, a bias next to the head
# a tiny run's per-step losses (cross-entropy near ln 2) move less than this
LOSS_ATOL = 3e-3


def bf16():
    return amp_settings("bf16", "cpu", compiled=True)


@needs_cpu_bf16
@pytest.mark.parametrize("name", HEADS)
def test_every_head_bf16_compiled_is_close_to_fp32(name):
    model, extra = head_in_training(name)
    fp32, fp32_grads = two_segments(model, model, extra=extra)
    low, low_grads = two_segments(model, CompiledForward(model, bf16()), extra=extra)
    assert len(fp32) == len(low) >= 3
    largest = 0.0
    for a, b in zip(fp32, low):
        assert b.dtype == a.dtype   # the outputs come back in the model's dtypes
        np.testing.assert_allclose(b, a, rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL)
        if a.dtype.kind == "f":
            largest = max(largest, float(np.abs(b - a).max()))
    assert largest > 1e-4   # bf16 ran: fp32 would agree to about 1e-6
    assert sorted(fp32_grads) == sorted(low_grads)
    for n in fp32_grads:   # each gradient points the same way, with about the same length
        a, b = fp32_grads[n].ravel(), low_grads[n].ravel()
        norm = float(np.linalg.norm(a))
        if norm < 1e-6:
            continue
        assert float(np.linalg.norm(b - a)) / norm < GRAD_RTOL, n


def losses(out):
    with open(out / "train_log.jsonl") as f:
        return [json.loads(line).get("loss") for line in f]


@needs_cpu_bf16
def test_trainer_bf16_run_stays_near_the_fp32_run(tmp_path):
    from helpers import train_and_dump
    fp32 = train_and_dump(tmp_path / "fp32", tiny_longdep(train_docs=24))
    low = train_and_dump(tmp_path / "bf16", tiny_longdep("compile=true", "amp=bf16",
                                                         train_docs=24))
    assert low.run.amp.in_program and low.compiled is not None and low.compiled.proven
    assert fp32.compiled is None
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    assert len(a) == len(b) == 24 and sum(x is not None for x in a) == 12
    gaps = [abs(x - y) for x, y in zip(a, b) if x is not None]
    assert max(gaps) < LOSS_ATOL, gaps
    assert max(gaps) > 1e-6, gaps   # not an fp32 run under a bf16 name
    pa = np.load(tmp_path / "fp32" / "params-rank0.npz")
    pb = np.load(tmp_path / "bf16" / "params-rank0.npz")
    for k in pa.files:   # within 10 Adam steps (lr 0.01) of the fp32 run's
        np.testing.assert_allclose(pb[k], pa[k], atol=0.1, err_msg=k)


class FrozenProjection(paddle.nn.Layer):
    """A head-like layer whose projection weight takes no gradient: its bf16 matmul has one
    input with a gradient and one without."""

    def __init__(self):
        super().__init__()
        self.inner = paddle.nn.Linear(8, 8)
        self.frozen = paddle.nn.Linear(8, 4)
        self.frozen.weight.stop_gradient = True

    def forward(self, x):
        return self.frozen(self.inner(x))


@needs_cpu_bf16
def test_a_program_the_bf16_gradient_would_crash_on_is_refused():
    model = FrozenProjection()
    model.train()
    x = paddle.ones([2, 8])
    x.stop_gradient = False   # else the inner matmul is one-sided too
    # without the check this call's backward ends the process (segmentation fault)
    with pytest.raises(Bf16ProgramError, match=r"1 of the 2 bfloat16 matmuls of the compiled "
                                               r"step multiply a tensor that takes a gradient"):
        CompiledForward(model, bf16())(x)
    model.frozen.weight.stop_gradient = False
    out = CompiledForward(model, bf16())(x)   # every matmul takes gradients on both sides
    assert out.dtype == paddle.float32
    out.sum().backward()
    assert model.frozen.weight.grad is not None


def no_autocast(self):
    return contextlib.nullcontext()


@needs_cpu_bf16
def test_a_program_left_in_fp32_is_refused(monkeypatch):
    """If autocast did not reach the program, the run would be fp32 under a bf16 name."""
    model = FrozenProjection()
    model.frozen.weight.stop_gradient = False
    model.train()
    settings = bf16()
    monkeypatch.setattr(type(settings), "program_autocast", no_autocast)
    with pytest.raises(Bf16ProgramError, match=r"left every matmul of the compiled step in "
                                               r"float32"):
        CompiledForward(model, settings)(paddle.ones([2, 8]))


@pytest.mark.skipif(PROBLEM is None, reason="this paddle and CPU train bf16 (tested above)")
def test_where_cpu_bf16_cannot_train_the_run_is_refused(tmp_path):
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    cfg = load_config(None, tiny_longdep("compile=true", "amp=bf16",
                                         f"output_dir={tmp_path / 'run'}"))
    with pytest.raises(ConfigError, match=re.escape(f"amp: {PROBLEM}")):
        prepare(cfg)
    assert not (tmp_path / "run").exists()
