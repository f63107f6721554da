"""Predictor engines: the device / precision decision (every combination, refusals included),
how a decision configures paddle.inference (GPU included, without a GPU), and bf16 on a CPU
that has it against fp32 on the same export.

The GPU path is never run by these tests (no CUDA build here): _configure is checked against a
recording Config, and the enable_use_gpu spelling against the real Config of this paddle.
"""
import itertools

import numpy as np
import paddle
import pytest
from helpers import tiny_config

from ernie_doc.errors import EngineError
from ernie_doc.heads import ErnieDocForTokenClassification
from ernie_doc.predict import engine as inference
from ernie_doc.predict.engine import (BF16_CPU_FLAGS, GPU_MEMORY_POOL_MB, InferenceSettings,
                                      Predictor, inference_settings)
from ernie_doc.predict.export import export

SEQ_LEN = 16
BATCH = 4

HAS_BF16_CPU = bool(set(BF16_CPU_FLAGS) & inference.cpu_flags())
CUDA = paddle.is_compiled_with_cuda()


# -- the decision -----------------------------------------------------------------------------
def _expected(device, precision, onednn, cuda, gpus, flags, capability):
    """The rule, written out independently of inference_settings: (device, precision, onednn,
    gpu_precision, onednn_bf16) or the text the EngineError must contain."""
    if device == "auto":
        device = "gpu" if cuda and gpus else "cpu"
    if device == "gpu":
        if not cuda:
            return "not compiled with CUDA"
        if not gpus:
            return "sees no GPU"
        if precision == "bf16" and capability is not None and capability < (8, 0):
            return "compute capability 8.0"
        return ("gpu", precision, False,
                {"fp32": "Float32", "fp16": "Half", "bf16": "Bfloat16"}[precision], False)
    if precision == "fp16":
        return "runs on GPU only"
    if precision == "bf16":
        if not onednn:
            return "enable_onednn must be True"
        if not ({"avx512_bf16", "amx_bf16"} & flags):
            return "avx512_bf16 or amx_bf16"
        return ("cpu", "bf16", True, None, True)
    return ("cpu", "fp32", onednn, None, False)


FLAG_SETS = [frozenset(), frozenset({"avx512f", "avx512_core"}), frozenset({"avx512_bf16"}),
             frozenset({"amx_bf16", "amx_tile"})]
COMBINATIONS = list(itertools.product(("cpu", "gpu", "auto"), ("fp32", "bf16", "fp16"),
                                      (True, False), (False, True), (0, 1), FLAG_SETS,
                                      (None, (7, 5), (8, 0), (9, 0))))


def test_every_combination_is_decided_as_the_rule_says():
    refused = 0
    for combo in COMBINATIONS:
        want = _expected(*combo)
        if isinstance(want, str):
            refused += 1
            with pytest.raises(EngineError, match=want) as err:
                inference_settings(*combo)
            assert "\n" not in str(err.value), combo   # one line
        else:
            got = inference_settings(*combo)
            assert isinstance(got, InferenceSettings)
            assert (got.device, got.precision, got.onednn, got.gpu_precision,
                    got.onednn_bf16) == want, combo
    assert 0 < refused < len(COMBINATIONS)


def test_defaults_are_cpu_fp32_onednn():
    assert inference_settings() == InferenceSettings("cpu", "fp32", onednn=True)
    assert inference_settings().describe() == "cpu fp32 (oneDNN)"


@pytest.mark.parametrize("device,precision,message", [
    ("tpu", "fp32", "device must be one of cpu, gpu, auto, got 'tpu'"),
    ("cpu", "int8", "precision must be one of fp32, bf16, fp16, got 'int8'"),
    ("cpu", "FP32", "precision must be one of"),
])
def test_unknown_names_are_refused(device, precision, message):
    with pytest.raises(EngineError, match=message):
        inference_settings(device, precision)


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert inference.cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}


# -- applying a decision to paddle.inference.Config -------------------------------------------
class _RecordingConfig:
    """Stands in for paddle.inference.Config: records the calls _configure makes."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name,) + args)


def test_gpu_settings_configure_enable_use_gpu_with_the_precision():
    from paddle.inference import PrecisionType
    for precision, member in (("fp32", PrecisionType.Float32), ("fp16", PrecisionType.Half),
                              ("bf16", PrecisionType.Bfloat16)):
        cfg = _RecordingConfig()
        settings = inference_settings("gpu", precision, cuda_compiled=True, gpu_count=1,
                                      gpu_capability=(8, 0))
        inference._configure(cfg, settings, "pir", threads=2)
        # no oneDNN, no CPU-only switches, no pass deletions (those are oneDNN's problems)
        assert cfg.calls == [("enable_use_gpu", GPU_MEMORY_POOL_MB, 0, member),
                             ("disable_glog_info",)], precision


def test_cpu_settings_configure_onednn_and_bf16():
    cfg = _RecordingConfig()
    inference._configure(cfg, inference_settings("cpu", "bf16", flags={"amx_bf16"}), "pir", 3)
    names = [c[0] for c in cfg.calls]
    assert names[:3] == ["disable_gpu", "set_cpu_math_library_num_threads", "enable_mkldnn"]
    assert ("set_cpu_math_library_num_threads", 3) in cfg.calls
    assert names.count("delete_pass") == len(inference._BROKEN_ONEDNN_PIR_PASSES)
    assert names[-2:] == ["enable_mkldnn_bfloat16", "disable_glog_info"]
    cfg = _RecordingConfig()
    inference._configure(cfg, inference_settings("cpu", "fp32", enable_onednn=False),
                         "program", 1)
    assert [c[0] for c in cfg.calls] == ["disable_gpu", "set_cpu_math_library_num_threads",
                                         "disable_mkldnn", "disable_glog_info"]


@pytest.mark.parametrize("member", ["Float32", "Half", "Bfloat16"])
def test_real_config_takes_the_gpu_call(member):
    """The enable_use_gpu spelling _configure uses is this paddle's (2.6 and 3.x alike). A CPU
    build accepts the call and stays on CPU (paddle logs that it lacks CUDA)."""
    from paddle.inference import Config, PrecisionType
    cfg = Config()
    cfg.enable_use_gpu(GPU_MEMORY_POOL_MB, 0, getattr(PrecisionType, member))
    assert cfg.use_gpu() == CUDA


def test_low_precision_outputs_come_back_as_float32():
    want = np.array([1.0, -2.5, 0.15625], "float32")
    bf16_bits = (want.view(np.uint32) >> 16).astype(np.uint16)   # exact in bfloat16
    assert np.array_equal(inference._float32(bf16_bits, "float32"), want)
    assert inference._float32(want.astype(np.float16), "float32").dtype == np.float32
    ids = np.array([1, 2], "int64")
    assert inference._float32(ids, "int64") is ids


# -- Predictor ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, export prefix): token classification (logits [B,T,5]), fixed seq_len 16."""
    paddle.seed(41)
    model = ErnieDocForTokenClassification(tiny_config(), num_labels=5)
    model.eval()
    prefix = str(tmp_path_factory.mktemp("engines") / "tok")
    export(model, prefix, seq_len=SEQ_LEN)
    return model, prefix


def _inputs(config, seed=0):
    rng = np.random.RandomState(seed)
    return [rng.randint(4, config.vocab_size, (BATCH, SEQ_LEN)).astype("int64")
            for _ in range(3)]


@pytest.mark.skipif(CUDA, reason="checks the refusal on a paddle without CUDA")
def test_gpu_is_refused_without_cuda(exported):
    _, prefix = exported
    with pytest.raises(EngineError, match=r"device 'gpu': this paddle is not compiled with "
                                          r"CUDA"):
        Predictor(prefix, device="gpu")


def test_auto_without_a_gpu_is_the_default_engine(exported):
    model, prefix = exported
    if CUDA and paddle.device.cuda.device_count():
        pytest.skip("a GPU is visible: auto picks it")
    auto, default = Predictor(prefix, device="auto"), Predictor(prefix)
    assert auto.settings == default.settings == InferenceSettings("cpu", "fp32", True)
    segs = _inputs(model.config)
    for a, b in zip(auto.stream(segs), default.stream(segs)):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_cpu_fp16_is_refused(exported):
    with pytest.raises(EngineError, match="precision 'fp16' runs on GPU only"):
        Predictor(exported[1], precision="fp16")


def test_bf16_is_refused_on_a_cpu_without_it(exported, monkeypatch):
    """Whatever this machine has: a CPU without the flags is refused, in one line naming
    them, before paddle.inference is asked (which would quietly run fp32)."""
    monkeypatch.setattr(inference, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    with pytest.raises(EngineError, match=r"precision 'bf16' on CPU needs a processor with "
                                          r"avx512_bf16 or amx_bf16"):
        Predictor(exported[1], precision="bf16")
    with pytest.raises(EngineError, match="enable_onednn must be True"):
        Predictor(exported[1], precision="bf16", enable_onednn=False)


def _paddle_emulates_bf16() -> bool:
    from paddle.base import core
    check = getattr(core, "supports_bfloat16", None)
    return bool(check and check())


@pytest.mark.skipif(HAS_BF16_CPU, reason="this CPU has bf16: see test_bf16_matches_fp32")
@pytest.mark.skipif(_paddle_emulates_bf16(), reason="paddle's oneDNN emulates bf16 on this "
                    "AVX-512 CPU (slower than fp32, not a silent fp32)")
def test_paddle_alone_would_fall_back_to_fp32_silently(exported):
    """Why the refusal: on a CPU without bf16 or AVX-512, enable_mkldnn_bfloat16 is accepted and
    the predictor runs fp32 (bit for bit), saying so only in a log line."""
    model, prefix = exported
    from paddle import inference as pi
    fp32 = Predictor(prefix)
    cfg = pi.Config(fp32.model_path, fp32.params_path)
    inference._configure(cfg, InferenceSettings("cpu", "bf16", True, onednn_bf16=True),
                         fp32.meta["ir"], 1)
    forced = pi.create_predictor(cfg)
    fp32._predictor = forced   # reuse run()'s feeding with the forced predictor's handles
    fp32._input_handles = {n: forced.get_input_handle(n) for n in forced.get_input_names()}
    fp32._output_handles = [forced.get_output_handle(n) for n in forced.get_output_names()]
    ids = _inputs(model.config)[0]
    assert np.array_equal(fp32.run(ids)["logits"], Predictor(prefix).run(ids)["logits"])


# Tolerances for bf16 (8-bit mantissa, ~3 significant digits) against fp32 through this tiny
# model's 2 layers: |bf16 − fp32| ≤ BF16_ATOL + BF16_RTOL·|fp32|; the label must agree
# wherever fp32's top-two margin exceeds twice that bound.
BF16_ATOL, BF16_RTOL = 2e-2, 2e-2


@pytest.mark.skipif(not HAS_BF16_CPU, reason="the CPU has neither avx512_bf16 nor amx_bf16")
def test_bf16_matches_fp32(exported):
    model, prefix = exported
    fp32, bf16 = Predictor(prefix), Predictor(prefix, precision="bf16")
    assert bf16.settings == InferenceSettings("cpu", "bf16", True, onednn_bf16=True)
    segs = _inputs(model.config, seed=3)
    for i, (a, b) in enumerate(zip(fp32.stream(segs), bf16.stream(segs))):
        want, got = a["logits"], b["logits"]
        assert got.dtype == np.float32 and got.shape == want.shape
        bound = BF16_ATOL + BF16_RTOL * np.abs(want)
        assert (np.abs(got - want) <= bound).all(), \
            f"segment {i}: max abs diff {np.abs(got - want).max()}"
        top2 = np.sort(want, axis=-1)[..., -2:]
        clear = (top2[..., 1] - top2[..., 0]) > 2 * bound.max(axis=-1)
        assert (got.argmax(-1) == want.argmax(-1))[clear].all(), f"segment {i}"
        # bf16 really ran: a silent fp32 fallback would be bit for bit equal
        assert not np.array_equal(got, want), f"segment {i}: bf16 output equals fp32's"
