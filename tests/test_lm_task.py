"""The language-model task (kind language_model) through the shared trainer: logs, results and
a reloadable model; the reported ppl equals a hand-rolled pass over the test stream under the
eval protocol; exact resume; two fleetrun ranks equal one process; bad input; run.sh."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import (ROOT, assert_two_ranks_equal_one_process, in_process, launch_two_ranks,
                     train_and_dump, write_wikitext)
from safetensors.numpy import load_file

from ernie_doc.errors import ConfigError, DataError
from ernie_doc.kinds.lm import LMTrainStream, load_vocabulary
from ernie_doc.lm.data import LMStreams, Vocabulary
from ernie_doc.lm.model import TransformerXLLM
from ernie_doc.run_config import load_config
from ernie_doc.training.trainer import run

PY = sys.executable


write_tokens = write_wikitext   # 40 words, no extra periods


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("wt")
    write_tokens(root / "wiki.train.tokens", 300, 0)
    write_tokens(root / "wiki.valid.tokens", 60, 1)
    write_tokens(root / "wiki.test.tokens", 60, 2, unseen=5)
    return root


def tiny(data, out, *extra):
    return ["task=wikitext103", "kind=language_model", f"data_dir={data}",
            f"reader.cache_dir={out}-cache", "model=wt103-base",
            "model_overrides={n_layer: 2, d_model: 32, n_head: 2, d_head: 16, d_inner: 64, "
            "cutoffs: [20], div_val: 2, dropout: 0.1, tgt_len: 12, mem_len: 12, "
            "segment_positions: true}",
            "task_options={eval_tgt_len: 6, eval_mem_len: 30, eval_clamp_len: 20, "
            "eval_same_length: true}",
            "batch_size=4", "eval_batch_size=3", "max_steps=30", "learning_rate=0.005",
            "lr_schedule=cosine", "warmup_steps=3", "weight_decay=0.0", "max_grad_norm=0.25",
            "eval_splits=[valid]", "test_splits=[test]", "eval_steps=10",
            "eval_every_epoch=false", "logging_steps=0", "progress=false",
            f"output_dir={out}", *extra]


def train(args):
    return run(load_config(None, args))


def train_cli(args, resume=None):
    """In a fresh process, as users resume (optimizer state is keyed by parameter names that
    a second model in the same process would not share)."""
    cmd = [PY, os.path.join(ROOT, "tools", "finetune.py")]
    cmd += ["--resume", str(resume)] if resume else []
    proc = subprocess.run(cmd + ["--set", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "out"
    results = train(tiny(data, out, "save_steps=10"))
    return out, results


def stream_ppl(model, data, rows, tgt, mem, clamp, same, positions=None):
    """The eval protocol written out: lengths switched by hand, memories carried along."""
    import dataclasses
    model.config = dataclasses.replace(model.config, mem_len=mem, clamp_len=clamp,
                                       same_length=same)
    model.eval()
    nll, count, mems, mpos = 0.0, 0, None, None
    with paddle.no_grad():
        for b in LMStreams(data, rows, tgt, 0, positions):
            pos = None if b.positions is None else paddle.to_tensor(b.positions)
            out = model(paddle.to_tensor(b.input), paddle.to_tensor(b.target), mems, None,
                        pos, mpos)
            mems, mpos = out.memories, out.memory_positions
            nll += float(out.nll.astype("float64").sum())
            count += out.nll.size
    return math.exp(nll / count), count


def test_run_writes_ppl_logs_and_a_reloadable_model(finished, data):
    out, results = finished
    from ernie_doc.training.outdir import foreign_entries
    assert foreign_entries(out) == []   # a re-run may remove every name this run wrote
    log = read_jsonl(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 31))
    assert all(r["ppl"] == pytest.approx(math.exp(r["loss"]), rel=1e-5) for r in log)
    first, last = np.mean([r["loss"] for r in log[:5]]), np.mean([r["loss"] for r in log[-5:]])
    assert last < first - 0.5, (first, last)
    evals = read_jsonl(out / "eval_history.jsonl")
    assert [(e["split"], e["step"]) for e in evals] == [("valid", 10), ("valid", 20),
                                                        ("valid", 30), ("test", results["step"])]
    best = min(evals[:3], key=lambda e: e["ppl"])
    assert results["split"] == "valid" and results["step"] == best["step"]
    assert results["ppl"] == pytest.approx(best["ppl"])
    test = json.loads((out / "test_results.json").read_text())
    assert test["unk_in_split"] > 0 and test["ppl"] > 1
    assert os.path.isdir(out / "vdl") and (out / "curves.png").is_file()
    assert (out / "results.json").is_file() and (out / "final" / "lm_config.json").is_file()
    # the best model reloads with its vocabulary; the reported test ppl is the stream's
    model = TransformerXLLM.from_pretrained(str(out / "best"))
    vocab = load_vocabulary(str(out / "best"))
    assert vocab == Vocabulary.build([data / "wiki.train.tokens"])
    from ernie_doc.lm.data import load_corpus
    corpus = load_corpus({"test": data / "wiki.test.tokens"}, out / "best" / "vocab.txt",
                         positions="global")
    ppl, count = stream_ppl(model, corpus.data["test"], 3, 6, 30, 20, True,
                            corpus.positions["test"])
    assert test["tokens"] == count
    assert test["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert corpus.oov["test"] == test["unk_in_split"]


def test_the_encoder_doors_name_a_saved_language_model(finished):
    """AutoModel / AutoTokenizer on a language model's folder: one line naming what it is and
    how to read it (they said "pass config=" and "vocab.txt has no [UNK]")."""
    from ernie_doc import AutoModel, AutoTokenizer
    from ernie_doc.errors import CheckpointError, TokenizerError
    best = finished[0] / "best"
    line = (f"{best}: a language model (lm_config.json: a Transformer-XL with a word vocabulary, "
            f"no tokenizer), not an ERNIE-Doc model; read text with pipeline({str(best)!r}), "
            "load it with ernie_doc.lm.model.TransformerXLLM")
    for load, error in ((AutoModel.from_pretrained, CheckpointError),
                        (AutoTokenizer.from_pretrained, TokenizerError)):
        with pytest.raises(error) as e:
            load(str(best))
        assert str(e.value) == line


def test_warm_start_from_a_trained_model(finished, data, tmp_path):
    best = finished[0] / "best"
    out = tmp_path / "warm"
    results = train(tiny(data, out, f"init_checkpoint={best}", "max_steps=2", "eval_steps=2",
                         "test_splits=[]", "learning_rate=0.0", "model_overrides={}"))
    # no update (lr 0): the warm-started model is the best model, re-evaluated
    before = json.loads((best / "eval.json").read_text())
    assert results["ppl"] == pytest.approx(before["ppl"], rel=1e-6)
    assert (out / "best" / "vocab.txt").read_text() == (best / "vocab.txt").read_text()
    other = tmp_path / "other.vocab"
    other.write_text("<eos>\n<unk>\nw1\n", encoding="utf-8")
    with pytest.raises(DataError, match="3 tokens, the checkpoint's model has vocab_size"):
        train(tiny(data, tmp_path / "bad", f"init_checkpoint={best}", f"reader.vocab={other}",
                   "model_overrides={}"))


def test_eval_only_reads_the_test_stream_under_any_protocol(finished, data, tmp_path):
    best = finished[0] / "best"
    test = json.loads((finished[0] / "test_results.json").read_text())
    out = tmp_path / "eval"
    # no train file needed: the vocabulary and the model come from the checkpoint
    results = train(tiny(data, out, "eval_only=true", f"init_checkpoint={best}",
                         "model_overrides={}", "reader.files.train=absent.tokens",
                         "eval_splits=[]", "max_steps=0"))
    assert results["split"] == "test" and results["ppl"] == pytest.approx(test["ppl"], rel=1e-6)
    assert not (out / "checkpoints").exists() and (out / "test_results.json").is_file()
    # another protocol (no same_length, a longer memory) = the hand-rolled pass under it
    results = train(tiny(data, tmp_path / "eval2", "eval_only=true", f"init_checkpoint={best}",
                         "model_overrides={}", "eval_splits=[]",
                         "task_options={eval_tgt_len: 8, eval_mem_len: 40, eval_clamp_len: -1,"
                         " eval_same_length: false}"))
    from ernie_doc.lm.data import load_corpus
    corpus = load_corpus({"test": data / "wiki.test.tokens"}, best / "vocab.txt",
                         positions="global")
    ppl, _ = stream_ppl(TransformerXLLM.from_pretrained(str(best)), corpus.data["test"], 3, 8,
                        40, -1, False, corpus.positions["test"])
    assert results["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert abs(results["ppl"] - test["ppl"]) > 1e-3 * test["ppl"]
    # a config without the run's eval_batch_size (3 rows; the default is batch_size, 4)
    # evaluates in the run's rows, and so gives the run's own test perplexity
    args = [a for a in tiny(data, tmp_path / "eval3", "eval_only=true", f"init_checkpoint={best}",
                            "model_overrides={}", "eval_splits=[]")
            if not a.startswith("eval_batch_size=")]
    assert train(args)["ppl"] == pytest.approx(test["ppl"], rel=1e-6)


def test_resume_reproduces_the_uninterrupted_run(data, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    common = ("max_steps=16", "save_steps=0", "eval_steps=8", "test_splits=[]")
    train(tiny(data, full, *common))
    train(tiny(data, part, *common, "stop_at_step=5"))
    assert len(read_jsonl(part / "train_log.jsonl")) == 5
    assert "memory_positions" in np.load(part / "checkpoints" / "latest" / "rank-0.npz").files
    train_cli(["stop_at_step=0"], resume=part)
    a, b = read_jsonl(full / "train_log.jsonl"), read_jsonl(part / "train_log.jsonl")
    strip = [{k: v for k, v in r.items() if not k.startswith("tokens_per_sec")} for r in a]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("tokens_per_sec")}
                     for r in b]
    pa = load_file(str(full / "final" / "model.safetensors"))
    pb = load_file(str(part / "final" / "model.safetensors"))
    assert sorted(pa) == sorted(pb) and pa
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    assert read_jsonl(full / "eval_history.jsonl") == read_jsonl(part / "eval_history.jsonl")


def test_train_stream_rows_and_passes():
    data = np.arange(1000)
    one = LMTrainStream(data, None, 4, 0, 1, 10, 0)
    r0, r1 = LMTrainStream(data, None, 2, 0, 2, 10, 0), LMTrainStream(data, None, 2, 1, 2, 10, 0)
    n = len(one)
    assert n == math.ceil((1000 // 4 - 1) / 10)
    for micro in (0, 1, n - 1, n, n + 3):
        epoch, b = one.batch(micro)
        _, b0 = r0.batch(micro)
        _, b1 = r1.batch(micro)
        assert epoch == micro // n
        np.testing.assert_array_equal(np.concatenate([b0["input_ids"], b1["input_ids"]]),
                                      b["input_ids"])
        assert b["reset_memory"].all() == (micro % n == 0)
        np.testing.assert_array_equal(b["target"][:, :-1], b["input_ids"][:, 1:])
    with pytest.raises(DataError, match="resume with the same"):
        LMTrainStream(data, None, 4, 0, 1, 12, 0).load_state_array(one.state_array())


@pytest.mark.two_ranks
def test_two_ranks_equal_one_process_on_the_union_of_their_rows(data, tmp_path):
    common = ("max_steps=6", "save_steps=0", "eval_steps=0", "test_splits=[]",
              "eval_splits=[]", "adam_epsilon=0.01", "model_overrides.dropout=0.0")
    dp, single = tmp_path / "dp", tmp_path / "single"
    proc, logs = launch_two_ranks(tmp_path, [os.path.join("tests", "dp_worker.py"), str(dp),
                                             *tiny(data, dp, *common, "batch_size=2")])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    single.mkdir()
    train_and_dump(single, tiny(data, single, *common, "batch_size=4"))
    a, b = assert_two_ranks_equal_one_process(dp, single)
    assert len(a) == len(b) == 6
    for ra, rb in zip(a, b):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)


@pytest.mark.parametrize("extra, error, message", [
    (("reader.files.test=missing.tokens",), DataError,
     "missing.tokens: the test split's token file does not exist"),
    (("test_splits=[dev]",), DataError, "split 'dev': no file for it in reader.files"),
    (("reader.files.valid=empty.tokens",), DataError, "empty.tokens: empty file"),
    (("reader.files.valid=short.tokens",), DataError,
     "short.tokens: 4 tokens, too few for 3 rows of the valid stream"),
    (("model_overrides.cutoffs=[5000]",), ConfigError, "cutoffs"),
    (("layer_decay=0.8",), ConfigError, "layer_decay: not supported"),
    (("task_options.eval_tgt_len=0",), ConfigError, "task_options.eval_tgt_len: must be"),
    (("task_options.eval_ext_len=6",), ConfigError,
     "task_options.eval_ext_len: 6 must be below eval_tgt_len 6"),
    (("model=wt103-huge",), ConfigError, "not a language-model preset"),
    (("reader.tokens=1",), DataError, "reader: unknown option 'tokens'"),
    (("eval_only=true",), ConfigError, "init_checkpoint is not set: eval_only evaluates it"),
])
def test_bad_input_is_one_clear_error_and_writes_nothing(data, tmp_path, extra, error,
                                                         message):
    (data / "empty.tokens").write_text("", encoding="utf-8")
    (data / "short.tokens").write_text(" w1 w2 \n\n", encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(error, match=None) as e:
        train(tiny(data, out, *extra))
    assert message in str(e.value), str(e.value)
    assert not out.exists()


def test_error_line_from_the_command_line(data, tmp_path):
    from tools.finetune import command
    proc = in_process(command, ["--set", *tiny(data, tmp_path / "o",
                                               "reader.files.train=nope.tokens")], expect=2)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {data / 'nope.tokens'}: the train split's token file does not exist "
        f"(reader.files.train under data_dir {str(data)!r})")


def test_no_cache_keeps_the_vocabulary_in_the_run(data, tmp_path):
    out = tmp_path / "out"
    results = train(tiny(data, out, "reader.cache_dir=false", "max_steps=4", "eval_steps=2",
                         "test_splits=[]"))
    assert results["split"] == "valid" and math.isfinite(results["ppl"])
    assert load_vocabulary(str(out / "best")) == Vocabulary.load(out / "vocab.txt")
    assert not os.path.exists(f"{out}-cache")


@pytest.mark.slow
def test_run_sh_tiny_config_runs_offline(tmp_path):
    env = dict(os.environ, OUTPUT_DIR=str(tmp_path / "out"), PYTHON=PY,
               ERNIE_DOC_CACHE=str(tmp_path / "cache"))
    env.pop("DATA_DIR", None)
    proc = subprocess.run(["bash", "tasks/wikitext103/run.sh", "max_steps=6", "eval_steps=3",
                           "progress=false"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["split"] == "valid" and 1 < results["ppl"] < 1e6
    test = json.loads((tmp_path / "out" / "test_results.json").read_text())
    assert test["unk_in_split"] > 0
