"""`compile: true`: the training forward as a captured program (ernie_doc.training.compiled).

Every head's compiled forward and its gradients equal dygraph's on two segments with memory
carried and a row reset; a trainer run with compile equals the dygraph run to float rounding
(dropout off); with dropout on, a resumed compiled run equals an uninterrupted one; a step that
cannot be captured falls back to dygraph with one log line."""
import json
import logging

import numpy as np
import paddle
import pytest
from helpers import tiny_config, tiny_longdep

from ernie_doc import auto
from ernie_doc.errors import Bf16ProgramError, ConfigError
from ernie_doc.precision import AmpSettings
from ernie_doc.training.compiled import CompiledForward, compiled_or_none, try_compiled

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, relu_dropout=0.0,
                  classifier_dropout=0.0)
HEAD_ARGS = {"sequence_classification": {"num_labels": 3}, "token_classification":
             {"num_labels": 3}, "multiple_choice": {"num_choices": 2}}


def two_segments(model, call, rows=4, seg=16, extra=None):
    """Segments 1 and 2 through `call` (the model or its compiled forward), the memory of the
    first carried into the second, whose row 1 starts a new document → (the outputs' tensors,
    flattened, and every parameter's gradient of a loss on each segment's head outputs, summed
    over the segments). Each segment's backward runs before the next forward, as in the
    trainer: paddle 2.6.2's captured program keeps one call's activations, so two calls before
    one backward would give the first call the second's."""
    rng = np.random.default_rng(0)
    memories = model.ernie_doc.init_memories(rows)
    outputs = []
    for step in range(2):
        ids = paddle.to_tensor(rng.integers(4, 60, (rows, seg)))
        types = paddle.to_tensor(rng.integers(0, 2, (rows, seg)))   # mixed task types
        mask = paddle.to_tensor((np.arange(seg) < seg - step * 3).astype("float32")
                                [None].repeat(rows, 0))
        reset = paddle.to_tensor(np.array([False, step == 1, False, False]))
        out = call(ids, memories, types, mask, reset, None, **(extra or {}))
        memories = out.memories
        leaves = [t for t in paddle.utils.flatten(out) if isinstance(t, paddle.Tensor)]
        outputs += [t.numpy() for t in leaves]
        # The loss is on the head's outputs, as every task's, not on the encoder's: on paddle
        # 2.6.2 a gradient sent into an output the program also uses inside (pooled_output,
        # under the logits) is dropped.
        heads = paddle.utils.flatten([v for k, v in out._asdict().items() if k != "encoder"])
        sum((t.astype("float32") ** 2).mean() for t in heads
            if isinstance(t, paddle.Tensor) and not t.stop_gradient).backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    return outputs, grads


HEADS = ["sequence_classification", "question_answering", "token_classification",
         "multiple_choice", "pair_matching", "pretraining", "keyphrase", "hotpotqa"]


def head_in_training(name):
    """A tiny head model `name` without dropout (seed 3, train mode) → (model, the extra
    inputs two_segments passes it: None, or the keyphrase head's word positions)."""
    paddle.seed(3)
    model = auto.head_class(name)(tiny_config(**NO_DROPOUT), **HEAD_ARGS.get(name, {}))
    model.train()
    extra = None
    if name == "keyphrase":   # word positions: word w of row b starts at token 2w
        extra = {"word_index": paddle.to_tensor(np.tile(np.arange(16) // 2, (4, 1)))}
    return model, extra


@pytest.mark.parametrize("name", HEADS)
def test_every_head_compiled_equals_dygraph(name):
    model, extra = head_in_training(name)
    eager, eager_grads = two_segments(model, model, extra=extra)
    compiled, compiled_grads = two_segments(model, CompiledForward(model), extra=extra)
    assert len(eager) == len(compiled) >= 3
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert sorted(eager_grads) == sorted(compiled_grads) and len(eager_grads) > 10
    for n in eager_grads:
        np.testing.assert_allclose(compiled_grads[n], eager_grads[n], rtol=1e-4, atol=1e-6,
                                   err_msg=n)


def test_compiled_output_keeps_its_type():
    model = auto.head_class("question_answering")(tiny_config(**NO_DROPOUT))
    model.train()
    out = CompiledForward(model)(paddle.randint(4, 60, [2, 16]),
                                 model.ernie_doc.init_memories(2))
    assert type(out).__name__ == "HeadOutput" and out.memory_mask is None
    assert list(out.start_logits.shape) == [2, 16]
    assert list(out.encoder.sequence_output.shape) == [2, 16, 32]


def test_later_calls_replay_the_program_without_the_python_forward():
    """The first call traces the training forward into a program with operators; the calls
    after it replay that program: the model's Python forward (counted by a pre-hook, which
    every dygraph call runs) is not called again."""
    model = auto.head_class("sequence_classification")(tiny_config(**NO_DROPOUT), num_labels=2)
    model.train()
    calls = []
    model.register_forward_pre_hook(lambda layer, inputs: calls.append(1))
    compiled = CompiledForward(model)
    ids, memories = paddle.randint(4, 60, [2, 16]), model.ernie_doc.init_memories(2)
    compiled(ids, memories)
    traced = len(calls)
    assert traced <= 1
    concrete, _ = compiled._program.get_concrete_program([ids, memories], {}, True)
    assert len(concrete.main_program.global_block().ops) > 100
    for _ in range(2):
        out = compiled(ids, memories)
    assert len(calls) == traced
    np.testing.assert_allclose(out.logits.numpy(), model(ids, memories).logits.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert len(calls) == traced + 1   # the hook does count a dygraph call


def test_compiled_forward_refuses_eval_mode():
    model = auto.head_class("sequence_classification")(tiny_config(), num_labels=2)
    compiled = CompiledForward(model)
    model.eval()
    with pytest.raises(RuntimeError, match="runs training steps; call the model itself in "
                                           "eval mode"):
        compiled(paddle.randint(4, 60, [2, 16]))


def train_log(out):
    with open(out / "train_log.jsonl") as f:
        return [json.loads(line) for line in f]


def run(tmp_path, name, *extra):
    from helpers import train_and_dump
    out = tmp_path / name
    trainer = train_and_dump(out, tiny_longdep(*extra, train_docs=24))
    return out, trainer


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """(output folder, Trainer) of the compiled run without dropout: compared with dygraph
    below, and with the run with dropout (which must differ from it)."""
    return run(tmp_path_factory.mktemp("compiled"), "compiled", "compile=true")


def test_trainer_compiled_run_equals_dygraph(tmp_path, compiled_run):
    eager, _ = run(tmp_path, "eager")
    compiled, trainer = compiled_run
    assert trainer.compiled is not None and trainer.compiled.proven
    a, b = train_log(eager), train_log(compiled)
    assert len(a) == len(b) == 24
    assert sum("loss" in x for x in a) == 12   # the skim steps of the retro feed have none
    for x, y in zip(a, b):
        assert ("loss" in x) == ("loss" in y)
        assert abs(x.get("loss", 0) - y.get("loss", 0)) < 1e-5, (x, y)
    pa, pb = np.load(eager / "params-rank0.npz"), np.load(compiled / "params-rank0.npz")
    for k in pa.files:   # (r_proj.bias has a zero gradient: Adam moves it by rounding noise)
        np.testing.assert_allclose(pb[k], pa[k], rtol=1e-4, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(np.load(compiled / "memories-rank0.npy"),
                               np.load(eager / "memories-rank0.npy"), rtol=1e-4, atol=1e-5)


def test_compiled_run_with_dropout_resumes_exactly(tmp_path, compiled_run):
    dropout = ("model_overrides.hidden_dropout_prob=0.1",
               "model_overrides.attention_probs_dropout_prob=0.1", "compile=true")
    whole, _ = run(tmp_path, "whole", *dropout)
    cut, _ = run(tmp_path, "cut", *dropout, "stop_at_step=5")
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    from ernie_doc.training.trainer import Trainer
    config = load_config(str(cut / "run_config.yaml"), ["stop_at_step=0", f"output_dir={cut}"])
    Trainer(prepare(config, resume=True)).train()
    a, b = train_log(whole), train_log(cut)
    assert [r["step"] for r in b] == list(range(1, 25))
    assert [r.get("loss") for r in a] == pytest.approx([r.get("loss") for r in b], abs=1e-6)
    # the masks are dygraph's (the executor runs in program order), and dropout does act
    eager = train_log(run(tmp_path, "eager", *dropout[:2])[0])
    assert [r.get("loss") for r in eager] == pytest.approx([r.get("loss") for r in a],
                                                            abs=1e-4)
    plain = train_log(compiled_run[0])   # the same run without dropout
    assert abs(plain[-1]["loss"] - a[-1]["loss"]) > 1e-3


def test_a_step_that_cannot_be_captured_falls_back_to_dygraph(caplog):
    calls = []

    class Broken:
        proven = False
        amp = AmpSettings()

        def __call__(self):
            raise ValueError("In user code:\n\n    cannot capture this op\n  more")

    def step(model):
        calls.append(model)
        return "dygraph" if model == "eager" else model()

    undone = []
    with caplog.at_level(logging.WARNING, logger="ernie_doc.train"):
        result, used = try_compiled(step, Broken(), "eager", lambda: undone.append(1))
    assert (result, used, undone) == ("dygraph", "eager", [1])
    assert "falling back to dygraph" in caplog.text
    assert "ValueError: cannot capture this op" in caplog.text
    # once a compiled step has run, a later failure is the run's error, not a fallback
    proven = Broken()
    proven.proven = True
    with pytest.raises(ValueError):
        try_compiled(step, proven, "eager", lambda: None)
    # a CPU bf16 step has no dygraph equivalent: its failure is the run's error
    bf16 = Broken()
    bf16.amp = AmpSettings(True, "bfloat16", in_program=True)
    undone.clear()
    with pytest.raises(Bf16ProgramError, match=r"amp: bf16 on CPU: the compiled step failed "
                                               r"on paddle .*cannot capture this op"):
        try_compiled(step, bf16, "eager", lambda: undone.append(1))
    assert not undone


def test_compile_settings(caplog):
    model = auto.head_class("sequence_classification")(tiny_config(), num_labels=2)
    assert compiled_or_none(model, False) is None
    with caplog.at_level(logging.WARNING, logger="ernie_doc.train"):
        assert compiled_or_none(model, True, world=2) is None
    assert "not supported with 2 data-parallel ranks" in caplog.text
    assert isinstance(compiled_or_none(model, True), CompiledForward)
    from ernie_doc.run_config import load_config
    with pytest.raises(ConfigError, match="compile: cannot be combined with recompute"):
        load_config(None, tiny_longdep("compile=true", "recompute=true"))


def test_first_line_finds_the_error_paddle_wrapped():
    from ernie_doc.training.compiled import first_line
    wrapped = TypeError("In transformed code:\n\n    File \"lm/model.py\", line 3, in forward\n"
                        "\tout = paddle.take_along_axis(x, i, 1)\n\n"
                        "    TypeError: (InvalidType) Check data type error for op: "
                        "take_along_axis, input: arr, arr.dtype: bfloat16\n")
    assert first_line(wrapped) == ("TypeError: (InvalidType) Check data type error for op: "
                                   "take_along_axis, input: arr, arr.dtype: bfloat16")
    assert first_line(ValueError("In user code:\n\n    cannot capture this op\n")) == \
        "ValueError: cannot capture this op"


def test_compile_is_the_default_nowhere():
    """On CPU the compiled step measured slower than dygraph at every shape (the demo's and
    base-en; docs/benchmarks.md), so no default turns it on: not the run keys, not a task's or
    a pretraining config, not a launcher script."""
    import yaml
    from helpers import ROOT

    from ernie_doc.run_keys import DEFAULTS
    assert DEFAULTS["compile"] is False
    files = [p for folder in ("tasks", "configs") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".yaml", ".yml", ".sh")]
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        if path.suffix == ".sh":
            assert "compile=true" not in text, path
            continue
        values = yaml.safe_load(text) or {}
        assert not values.get("compile"), path
        assert "compile" not in str(values.get("variants", "")), path
