"""Optimizer rules, metrics, and the trainer end to end (tools/finetune.py) on the synthetic
longdep task: results, resume, atomic checkpoints, data parallel, errors."""
import json
import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, in_process, launch_two_ranks, tiny_config

from ernie_doc.data.document import Document
from ernie_doc.metrics.classification import aggregate_segments, classification_metrics, f1_score
from ernie_doc.run_keys import TrainConfig
from ernie_doc.training.optim import build_optimizer, lr_lambda, paddlenlp_ratio

PY = sys.executable
TINY = [
    "task=longdep", "model=ernie-doc-small",
    "model_overrides={num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 2, "
    "memory_len: 16, max_position_embeddings: 16, hidden_dropout_prob: 0.1}",
    "reader={num_docs: {train: 24, dev: 12, test: 12}, segment_tokens: 14, max_segments: 4}",
    "max_seq_len=16", "stride=14", "batch_size=4", "epochs=2", "learning_rate=0.001",
    "logging_steps=0", "progress=false", "eval_every_epoch=true",
]


def finetune(out, *overrides, resume=False, expect=0):
    argv = ["--resume", str(out)] if resume else ["--set", *TINY, f"output_dir={out}"]
    if overrides:
        argv += ["--set", *overrides]
    return finetune_main(argv, expect)


def finetune_main(argv, expect=0):
    """tools/finetune.py, in this process."""
    from tools.finetune import command
    return in_process(command, argv, expect)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# -- optimizer and metrics -------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["official", "paddlenlp"])
def test_layer_ratio_and_weight_decay_groups(rule):
    # PaddleNLP's ratios by our names (the official ones: tests/test_optim.py)
    assert paddlenlp_ratio("ernie_doc.encoder.layers.11.attn.q.weight", 12, 0.8) == \
        pytest.approx(0.8)
    assert paddlenlp_ratio("ernie_doc.encoder.layers.0.norm1.bias", 12, 0.8) == \
        pytest.approx(0.8 ** 12)
    assert paddlenlp_ratio("ernie_doc.embeddings.word_emb.weight", 12, 0.8) == \
        pytest.approx(0.8 ** 13)
    assert paddlenlp_ratio("ernie_doc.embeddings.norms.0.weight", 12, 0.8) == \
        pytest.approx(0.8 ** 13)
    assert paddlenlp_ratio("ernie_doc.pooler.dense.weight", 12, 0.8) == 1.0
    assert paddlenlp_ratio("linear.weight", 12, 0.8) == 1.0
    assert paddlenlp_ratio("ernie_doc.encoder.layers.3.ffn.linear1.weight", 12, 1.0) == 1.0

    from ernie_doc import ErnieDocForSequenceClassification
    from ernie_doc.training.optim import layer_ratios
    model = ErnieDocForSequenceClassification(tiny_config(), num_labels=3)
    cfg = TrainConfig(learning_rate=1e-3, warmup_proportion=0.1, lr_schedule="linear",
                      weight_decay=0.01, layer_decay=0.5, layer_decay_rule=rule,
                      max_grad_norm=0.0)
    opt, _ = build_optimizer(model, cfg, total_steps=10, num_layers=2)
    by_param = {}
    for group in opt._param_groups:
        for p in group["params"]:
            by_param[p.name] = (group["learning_rate"], group["weight_decay"])
    names = {p.name: n for n, p in model.named_parameters()}
    ratios = layer_ratios(model, 2, 0.5, rule)
    for pname, (ratio, wd) in by_param.items():
        name = names[pname]
        assert ratio == pytest.approx(ratios[name]), name
        one_d = name.endswith("bias") or "norm" in name or "_bias" in name
        # official: the group's decay coefficient undoes its ratio (decay at the global LR)
        decay = 0.01 / ratio if rule == "official" else 0.01
        assert wd == (0.0 if one_d else pytest.approx(decay)), name
    assert len(by_param) == len(names)


def test_lr_schedules():
    lin = lr_lambda("linear", warmup_steps=10, total_steps=100)
    assert [lin(g) for g in (0, 5, 10, 55, 100, 120)] == pytest.approx([0, 0.5, 1, 0.5, 0, 0])
    off = lr_lambda("official", warmup_steps=10, total_steps=100)
    # the official schedule jumps to 1 - warmup/total when warmup ends
    assert [off(g) for g in (0, 5, 9, 10, 50, 100)] == pytest.approx([0, .5, .9, .9, .5, 0])
    # Transformer-XL's cosine: over all steps (warmup included), to 0 at the end
    cos = lr_lambda("cosine", warmup_steps=10, total_steps=100)
    assert [cos(g) for g in (0, 5, 10, 50, 100, 120)] == pytest.approx(
        [0, .5, (1 + math.cos(math.pi * .1)) / 2, .5, 0, 0])
    assert lr_lambda("cosine", 0, 100)(0) == 1.0
    # model/optimization.py without warmup: a constant LR
    assert [lr_lambda("official", 0, 100)(g) for g in (0, 50, 100)] == [1.0, 1.0, 1.0]


def test_the_log_says_what_max_steps_leaves_of_the_epochs():
    """The trainer's `training:` line: epochs that max_steps cuts short are not announced as
    run (a run of 15 epochs of 4 steps each with max_steps=6 runs 2 of them)."""
    from types import SimpleNamespace

    from ernie_doc.training.prepare import count_steps, training_plan
    train = SimpleNamespace(endless=False, num_steps=lambda epoch: 7)   # micro-steps per epoch

    def plan(**cfg):
        cfg = SimpleNamespace(**dict(dict(epochs=15, max_steps=0, grad_accum_steps=2), **cfg))
        return training_plan(cfg, train, count_steps(cfg, train))
    assert plan() == "15 epochs, 60 optimizer steps"
    assert plan(max_steps=6) == "2 of 15 epochs (max_steps), 6 optimizer steps"
    assert plan(max_steps=3) == "1 of 15 epochs (max_steps), 3 optimizer steps"
    assert plan(max_steps=60) == plan(max_steps=99) == plan()
    assert plan(max_steps=57) == "15 epochs (max_steps), 57 optimizer steps"
    stream = SimpleNamespace(endless=True)
    assert training_plan(SimpleNamespace(max_steps=9), stream, 9) == "9 optimizer steps"


def test_metrics_and_aggregation():
    probs = [(1, np.array([0.2, 0.8])), (0, np.array([0.9, 0.1])), (2, np.array([0.4, 0.6]))]
    assert aggregate_segments(probs).tolist() == pytest.approx([0.5, 0.5])
    assert aggregate_segments(probs, "last").tolist() == [0.4, 0.6]
    pred, gold = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    # tp 2, fp 1, fn 1 → F1 = 4/6
    m = classification_metrics(pred, gold, 2)
    assert m == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})
    # macro over 3 classes: class 0 F1 1, class 1 F1 2/3, class 2 F1 0
    assert f1_score([0, 1, 1, 2], [0, 1, 2, 1], "macro") == pytest.approx((1 + 0.5 + 0) / 3)


def classification_task(*overrides):
    from ernie_doc.kinds import build_task
    from ernie_doc.run_config import load_config
    return build_task(load_config(None, [*TINY, *overrides]))


def test_classification_objective_is_official_and_the_papers_is_one_switch_away():
    """Default (the official classifier): every final-pass segment trains and the document is
    the mean of its segments' probabilities. `loss_segments: last` (the paper's appendix: the
    loss on the last segment's [CLS]) trains the last segment only, and doc_prediction, null,
    follows it: the document is its last segment's. A doc_prediction given is kept."""
    import paddle
    batch = {"has_loss": np.array([True, True, True, False]),
             "is_last": np.array([False, True, True, False]),
             "target_label": paddle.to_tensor([0, 1, 1, 0])}
    logits = paddle.to_tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 9.0]])
    ce = [math.log1p(math.exp(-2.0)), math.log1p(math.exp(-1.0)), math.log1p(math.exp(1.0))]
    rows = [(1, np.array([0.8, 0.2])), (0, np.array([0.9, 0.1])), (2, np.array([0.3, 0.7]))]
    doc = Document("d", text="x")
    from types import SimpleNamespace
    for given, weight, loss, probs in (
            ((), [1, 1, 1, 0], sum(ce) / 3, [2 / 3, 1 / 3]),
            (("loss_segments=last",), [0, 1, 1, 0], (ce[1] + ce[2]) / 2, [0.3, 0.7]),
            (("loss_segments=last", "doc_prediction=mean"), [0, 1, 1, 0], None, [2 / 3, 1 / 3])):
        task = classification_task(*given)
        assert task.train_weight(batch).astype(int).tolist() == weight, given
        got = task.loss(SimpleNamespace(logits=logits), batch,
                        paddle.to_tensor(np.array(weight, dtype="float32")))
        if loss is not None:
            assert float(got) == pytest.approx(loss, rel=1e-6), given
        record = task.predict_document(doc, rows)
        assert record["probs"] == pytest.approx(probs, abs=1e-6), given
        assert record["pred"] == task.labels[int(np.argmax(probs))]


def test_two_label_softmax_cross_entropy_is_binary_cross_entropy_of_the_logit_difference():
    """The paper's "binary cross entropy" with two labels: the classification loss, a softmax
    cross-entropy over the logits (a0, a1), is the binary cross-entropy of the one logit
    a1 − a0 (softmax(a)₁ = σ(a1 − a0)), row by row, and its gradient is that logit's, with
    opposite signs on a0 and a1: the paper's head is ours reparametrised, no second head."""
    import paddle
    import paddle.nn.functional as F
    rng = np.random.default_rng(0)
    values, labels = rng.normal(0, 3, (64, 2)), rng.integers(0, 2, 64)
    task = classification_task()
    logits = paddle.to_tensor(values, stop_gradient=False)
    from types import SimpleNamespace
    softmax_ce = task.loss(SimpleNamespace(logits=logits), {"target_label": paddle.to_tensor(
        labels)}, paddle.ones([64], dtype="float64"))
    diff = paddle.to_tensor(values[:, 1] - values[:, 0], stop_gradient=False)
    binary_ce = F.binary_cross_entropy_with_logits(diff, paddle.to_tensor(labels * 1.0))
    np.testing.assert_allclose(float(softmax_ce), float(binary_ce), rtol=1e-12)
    softmax_ce.backward()
    binary_ce.backward()
    np.testing.assert_allclose(logits.grad.numpy()[:, 1], diff.grad.numpy(), atol=1e-15)
    np.testing.assert_allclose(logits.grad.numpy()[:, 0], -diff.grad.numpy(), atol=1e-15)
    np.testing.assert_allclose(F.softmax(logits, axis=-1).numpy()[:, 1],
                               F.sigmoid(diff).numpy(), atol=1e-15)


# -- the trainer -----------------------------------------------------------------------------
def test_finetune_end_to_end_writes_results(tmp_path):
    out = tmp_path / "run"
    stdout = finetune(out, "test_splits=[test]", "eval_steps=5").stdout
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) >= {"accuracy", "f1", "loss", "step", "split", "main_metric"}
    # the optimiser as the official rule resolved the null clipping and epsilon; the run's
    # saved config keeps the nulls (a resume resolves them again for the same steps)
    line, = [x for x in stdout.splitlines() if "optimizer: AdamW" in x]
    assert re.search(r"warmup [1-9]\d* of \d+ steps, no gradient clipping, epsilon 1e-08 "
                     r"\(max_grad_norm and adam_epsilon null: the official code's values with "
                     r"warmup\)$", line), line
    saved = (out / "run_config.yaml").read_text()
    assert "max_grad_norm: null" in saved and "adam_epsilon: null" in saved
    assert results["main_metric"] == "accuracy"
    assert 0.0 <= results["accuracy"] <= 1.0 and results["split"] == "dev"
    test = json.loads((out / "test_results.json").read_text())
    assert test["step"] == results["step"] and test["split"] == "test"
    preds = read_jsonl(out / "predictions_dev.jsonl")
    assert len(preds) == 12 and {p["doc_id"] for p in preds} == {f"dev-{i}" for i in range(12)}
    for p in preds:
        assert sum(p["probs"]) == pytest.approx(1.0, abs=1e-5) and p["segments"] >= 1
    log = read_jsonl(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, len(log) + 1))
    assert log[0]["lr"] == 0.0 and all(np.isfinite(r["loss"]) for r in log if "loss" in r)
    # steps where every row only skims (the retrospective feed's first reading) train nothing
    # and log no loss; every other step does
    assert 0 < sum("loss" in r for r in log) < len(log)
    history = read_jsonl(out / "eval_history.jsonl")
    assert {h["step"] for h in history if h["split"] == "dev"} >= {5, 10, len(log)}
    for name in ("curves.png", "run_config.yaml", "train.log"):
        assert (out / name).is_file(), name
    from ernie_doc.training.outdir import foreign_entries
    assert foreign_entries(out) == []   # a re-run may remove every name this run wrote
    assert os.listdir(out / "vdl")
    # the best model loads through the one door and predicts
    from ernie_doc import ErnieDocForSequenceClassification
    best = ErnieDocForSequenceClassification.from_pretrained(str(out / "best"))
    assert best.config.num_labels == 2 and best.config.num_hidden_layers == 2
    assert not best.load_report.missing


def test_the_papers_objective_is_saved_and_predict_reads_as_the_run_evaluated(tmp_path):
    """A run with `loss_segments: last` and doc_prediction left null saves the resolved "last"
    in its task.json: predict reads the last segment as the run's evaluation did. (Large
    initial weights: the segments' probabilities differ by up to 0.7, so the mean would show.)"""
    from ernie_doc.kinds.base import load_reader
    from ernie_doc.predict.pipeline import Pipeline
    out = tmp_path / "run"
    finetune(out, "loss_segments=last", "epochs=1", "model_overrides.initializer_range=1.0")
    config = json.loads((out / "best" / "task.json").read_text())["config"]
    assert (config["loss_segments"], config["doc_prediction"]) == ("last", "last")
    pipeline = Pipeline.from_pretrained(str(out / "best"))
    assert pipeline.cfg.doc_prediction == "last"
    docs = load_reader("longdep").read("", "dev", config["reader"])
    evaluated = {r["doc_id"]: r for r in read_jsonl(out / "predictions_dev.jsonl")}
    for r in pipeline(docs):
        assert r["pred"] == evaluated[r["doc_id"]]["pred"]
        np.testing.assert_allclose(r["probs"], evaluated[r["doc_id"]]["probs"], atol=1e-5)


def test_eval_only_evaluates_a_trained_model(tmp_path):
    out = tmp_path / "run"
    finetune(out, "test_splits=[test]")
    best = json.loads((out / "eval_results.json").read_text())
    test = json.loads((out / "test_results.json").read_text())
    ev = tmp_path / "eval"
    finetune(ev, "eval_only=true", f"init_checkpoint={out / 'best'}", "eval_splits=[dev]",
             "test_splits=[test]", "reader.num_docs.train=1")
    again = json.loads((ev / "eval_results.json").read_text())
    assert again["split"] == "dev" and again["accuracy"] == pytest.approx(best["accuracy"])
    assert json.loads((ev / "test_results.json").read_text())["accuracy"] == \
        pytest.approx(test["accuracy"])
    assert (ev / "predictions_test.jsonl").is_file() and not (ev / "checkpoints").exists()


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    finetune(full, "grad_accum_steps=2")
    finetune(part, "grad_accum_steps=2", "stop_at_step=7")
    assert len(read_jsonl(part / "train_log.jsonl")) == 7
    finetune(part, resume=True)
    a, b = read_jsonl(full / "train_log.jsonl"), read_jsonl(part / "train_log.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert ra.get("loss") == rb.get("loss") and ra["lr"] == rb["lr"], (ra, rb)
    ea = json.loads((full / "eval_results.json").read_text())
    eb = json.loads((part / "eval_results.json").read_text())
    assert ea == eb


KILL_IN_SAVE = r"""
import os, signal, sys
sys.path.insert(0, {root!r})
import safetensors.numpy
real_save = safetensors.numpy.save_file
def dying_save(arrays, path, *a, **k):
    real_save(arrays, path, *a, **k)
    if path.endswith("optimizer.safetensors"):
        with open(path, "r+b") as f:   # half-written optimizer file, then the process dies
            f.truncate(os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
safetensors.numpy.save_file = dying_save
from tools.finetune import main
main(["--resume", {out!r}, "--set", "stop_at_step=0", "save_steps=1"])
"""


def test_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    out = tmp_path / "run"
    finetune(out, "stop_at_step=3")
    latest = os.path.realpath(out / "checkpoints" / "latest")
    assert latest.endswith("step-3")
    script = tmp_path / "kill.py"
    script.write_text(KILL_IN_SAVE.format(root=str(ROOT), out=str(out)))
    proc = subprocess.run([PY, str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert os.path.realpath(out / "checkpoints" / "latest") == latest
    torn = out / "checkpoints" / "step-4.tmp"                 # the torn write, never linked
    assert torn.is_dir() and (torn / "model.safetensors").is_file()
    assert not (torn / "trainer_state.json").exists()
    finetune(out, resume=True)                                 # resumes from step 3 and ends
    log = read_jsonl(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, len(log) + 1))
    assert (out / "eval_results.json").is_file()


def test_data_parallel_two_ranks_keep_identical_parameters(tmp_path):
    out = tmp_path / "dp"
    proc, logs = launch_two_ranks(tmp_path, [os.path.join("tests", "dp_worker.py"), str(out),
                                             *TINY, "grad_accum_steps=2"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    p0 = np.load(out / "params-rank0.npz")
    p1 = np.load(out / "params-rank1.npz")
    assert sorted(p0.files) == sorted(p1.files) and len(p0.files) > 10
    for k in p0.files:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
    log = read_jsonl(out / "train_log.jsonl")
    assert len(log) > 3 and (out / "eval_results.json").is_file()
    # the two ranks read different rows: their memories differ
    m0, m1 = np.load(out / "memories-rank0.npy"), np.load(out / "memories-rank1.npy")
    assert m0.shape == m1.shape and not np.allclose(m0, m1)


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("override, message", [
    ("no_such_key=1", "unknown key 'no_such_key'"),
    ("batch_size=0", "batch_size: must be a positive integer"),
    ("reader.bogus=1", "unknown option 'bogus'"),
    ("task=nope", "no tasks/nope/reader.py"),
    ("doc_prediction=median", "doc_prediction: 'median' is not one of"),
    ("max_seq_len=64", "exceeds the model's max_position_embeddings"),
    ("eval_splits=[]", "eval_splits: needs at least one split"),
    ("init_checkpoint=/nonexistent/ckpt", "/nonexistent/ckpt"),
    ("metrics=[bleu]", "metrics: unknown ['bleu']"),
    ("layer_decay_rule=oficial", "layer_decay_rule: 'oficial' is not one of "
                                 "['official', 'paddlenlp'] (did you mean 'official'?)"),
    ("layer_decay=0", "layer_decay: must be positive"),
])
def test_bad_config_is_one_error_line_and_writes_nothing(tmp_path, override, message):
    out = tmp_path / "run"
    proc = finetune(out, override, expect=2)
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert not out.exists()


def test_bad_yaml_names_file_and_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("task: longdep\nepochs: 1\nbatch_sise: 4\n")
    proc = finetune_main([str(cfg)], expect=2)
    assert f"{cfg}:3: unknown key 'batch_sise'" in proc.stderr
    cfg.write_text("task: longdep\nepochs: [1\n")
    proc = finetune_main([str(cfg)], expect=2)
    assert f"{cfg}:" in proc.stderr and "invalid YAML" in proc.stderr
    # the script itself: the traceback under --debug
    proc = subprocess.run([PY, "tools/finetune.py", str(cfg), "--debug"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_existing_run_is_not_overwritten_silently(tmp_path):
    out = tmp_path / "run"
    finetune(out, "epochs=1")
    proc = finetune(out, "epochs=1", expect=2)
    assert "already holds a run" in proc.stderr
    finetune(out, "epochs=1", "overwrite_output_dir=true")


def test_non_finite_loss_stops_the_run(tmp_path):
    proc = finetune(tmp_path / "run", "learning_rate=1e30", "warmup_proportion=0",
                    "model_overrides.hidden_dropout_prob=0.0", expect=1)
    assert "the loss is" in proc.stderr and ("nan" in proc.stderr or "inf" in proc.stderr)


def test_longdep_ids_can_follow_a_pretrained_tokenizer():
    from ernie_doc.errors import DataError
    from tasks.longdep import reader
    opts = {"num_docs": {"dev": 40}}
    special, vocab = reader.id_vocabulary(opts)
    assert special == {"pad": 0, "cls": 1, "sep": 2} and vocab == 32
    base = reader.read(None, "dev", opts)
    assert {i for d in base for i in d.ids} <= set(range(4, 32))
    moved_opts = dict(opts, special_ids={"pad": 0, "cls": 2, "sep": 3}, first_id=8)
    special, vocab = reader.id_vocabulary(moved_opts)
    assert special == {"pad": 0, "cls": 2, "sep": 3} and vocab == 36
    moved = reader.read(None, "dev", moved_opts)
    for a, b in zip(base, moved):   # the same documents, every id shifted by 4
        assert a.label == b.label and [i + 4 for i in a.ids] == b.ids
    with pytest.raises(DataError, match="outside the keys and filler"):
        reader.id_vocabulary(dict(opts, special_ids={"pad": 0, "cls": 5, "sep": 3}))
    with pytest.raises(DataError, match="special_ids"):
        reader.id_vocabulary(dict(opts, special_ids={"pad": 0, "cls": 1}))
