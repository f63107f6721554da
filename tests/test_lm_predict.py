"""LMPipeline (ernie_doc.predict.lm): a trained language model scores documents. One document
that is a whole split file gets exactly the run's evaluation of that split (eval_batch_size 1);
prepend_eos equals evaluating the file with a blank line before it, under another protocol
(ext_len, no same_length); rows do not interact; token log-probabilities add up; bad documents
follow on_error; __call__ keeps input order."""
import json
import math
import shutil

import numpy as np
import pytest
from helpers import ROOT, write_wikitext

from ernie_doc.errors import PipelineError
from ernie_doc.lm.data import Vocabulary
from ernie_doc.lm.model import TransformerXLLM
from ernie_doc.predict.lm import LMPipeline, document_lines, encode_document
from ernie_doc.predict.pipeline import model_directory
from ernie_doc.run_config import load_config
from ernie_doc.training.trainer import run
from ernie_doc.utils import denormals_flushed, flush_denormals

TINY = str(ROOT / "tasks" / "wikitext103" / "config_tiny.yaml")


def write_tokens(path, lines, seed, unseen=0):
    """WikiText-like lines (helpers.write_wikitext) over 700 words: a vocabulary beyond
    config_tiny's adaptive-softmax cutoff 500, so both clusters are read."""
    return write_wikitext(path, lines, seed, words=700, unseen=unseen, periods=0.1)


def tiny(data, out, *extra):
    """config_tiny.yaml (2 layers, enhanced recurrence, Segatron positions, its eval protocol)
    on the files in `data`, briefly trained; eval_batch_size 1: the test stream is one row."""
    return load_config(TINY, [
        f"data_dir={data}", "reader.files={train: wiki.train.tokens, valid: wiki.valid.tokens,"
        " test: wiki.test.tokens}", f"reader.cache_dir={out}-cache", "max_steps=12",
        "eval_steps=12", "warmup_steps=2", "eval_batch_size=1", "logging_steps=0",
        "progress=false", f"output_dir={out}", *extra])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("wt")
    write_tokens(root / "wiki.train.tokens", 400, 0)
    write_tokens(root / "wiki.valid.tokens", 20, 1)
    write_tokens(root / "wiki.test.tokens", 40, 2, unseen=5)
    return root


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "out"
    run(tiny(data, out))
    return out


@pytest.fixture(scope="module")
def pipe(trained):
    return LMPipeline.from_pretrained(model_directory(str(trained)), batch_size=1)


@pytest.mark.skipif(denormals_flushed() is None,
                    reason="reads the x86-64 MXCSR through glibc's fenv")
def test_prediction_flushes_denormals_as_the_run_did(trained):
    """A saved language model predicts with denormal floats flushed, as its run trained
    (flush_denormals defaults to true), like every other kind (tests/test_predict.py)."""
    before = denormals_flushed()
    flush_denormals(False)
    try:
        LMPipeline.from_pretrained(model_directory(str(trained)), batch_size=1)
        assert denormals_flushed() is True
    finally:
        flush_denormals(before)


def test_a_split_file_as_one_document_equals_its_evaluation(trained, data, pipe):
    test = json.loads((trained / "test_results.json").read_text())
    assert pipe.lengths == {"tgt_len": 16, "mem_len": 64, "clamp_len": 48,
                            "same_length": True, "ext_len": 0}
    text = (data / "wiki.test.tokens").read_text(encoding="utf-8")
    record = pipe([{"id": "test", "text": text}])[0]
    assert record["tokens"] == test["tokens"]
    assert record["nll"] == pytest.approx(test["loss"], rel=1e-5)
    assert record["ppl"] == pytest.approx(test["ppl"], rel=1e-5)
    assert record["oov"] == test["unk_in_split"] > 0
    assert record["unk"] == record["oov"]   # this text has no literal <unk>
    logprobs = record["token_logprobs"]
    assert len(logprobs) == record["tokens"]
    assert sum(lp for _, lp in logprobs) == pytest.approx(-record["nll"] * record["tokens"],
                                                          rel=1e-9)
    words = [w for line in text.split("\n")[:-1] for w in line.split() + ["<eos>"]]
    assert [w for w, _ in logprobs] == words[1:]   # every token but the first is predicted


def test_prepend_eos_equals_evaluating_the_file_after_a_blank_line(trained, data, tmp_path):
    """Another protocol (shorter segments, ext_len context, no same_length, no clamp) in an
    eval_only run over the test file with a blank line first = prepend_eos on the text."""
    text = (data / "wiki.test.tokens").read_text(encoding="utf-8")
    (tmp_path / "blank_first.tokens").write_text("\n" + text, encoding="utf-8")
    best = model_directory(str(trained))
    options = {"eval_tgt_len": 8, "eval_mem_len": 20, "eval_clamp_len": -1,
               "eval_same_length": False, "eval_ext_len": 3}
    results = run(tiny(data, tmp_path / "eval", "eval_only=true", f"init_checkpoint={best}",
                       "model_overrides={}", "eval_splits=[]", "max_steps=0",
                       f"reader.files.test={tmp_path / 'blank_first.tokens'}",
                       "task_options=" + json.dumps(options)))
    lengths = {"tgt_len": 8, "mem_len": 20, "clamp_len": -1, "same_length": False,
               "ext_len": 3}
    pipe = LMPipeline(TransformerXLLM.from_pretrained(best),
                      Vocabulary.load(f"{best}/vocab.txt"), lengths, prepend_eos=True)
    record = pipe([text])[0]
    assert record["tokens"] == results["tokens"] == len(encode_document(
        text, pipe.vocab, False).ids)   # all N tokens, the first word included
    assert record["ppl"] == pytest.approx(results["ppl"], rel=1e-5)
    assert record["token_logprobs"][0][0] == text.split()[0]


def test_rows_do_not_interact_and_call_keeps_input_order(trained, data, pipe):
    lines = (data / "wiki.train.tokens").read_text(encoding="utf-8").split("\n")
    documents = ["\n".join(lines[:40]), " w1 w2 w3 . ", {"doc_id": "c", "text": "\n".join(
        lines[40:50])}, {"id": "d", "text": "\n".join(lines[50:120]) + "\n"}, " w5 new1 w6 "]
    alone = [pipe([doc])[0] for doc in documents]
    wide = LMPipeline.from_pretrained(model_directory(str(trained)), batch_size=3)
    finished = list(wide.stream(documents))
    assert [r["index"] for r in finished] != list(range(5))   # short documents finish first
    records = wide(documents)
    assert [r["index"] for r in records] == list(range(5))
    assert [r["doc_id"] for r in records] == ["0", "1", "c", "d", "4"]
    for a, b in zip(alone, records):
        assert a["tokens"] == b["tokens"] and a["unk"] == b["unk"]
        assert a["nll"] == pytest.approx(b["nll"], rel=1e-5)
        np.testing.assert_allclose([lp for _, lp in a["token_logprobs"]],
                                   [lp for _, lp in b["token_logprobs"]], rtol=1e-4, atol=1e-5)
    assert records[4]["unk"] == records[4]["oov"] == 1
    assert records[4]["ppl"] == pytest.approx(math.exp(records[4]["nll"]))
    assert [r["doc_id"] for r in wide(documents[:2]) if "error" not in r] == ["0", "1"]
    assert sorted(r["doc_id"] for r in wide.stream(documents, skip={"c", "0"})) == ["1", "4", "d"]


def test_bad_documents_follow_on_error(trained, pipe):
    documents = ["w1 w2 .", "", {"id": "x", "text": "w3 w4"}, {"id": "x", "text": "w5"},
                 {"id": "y"}, " \n  \n", 42, {"id": "z", "text": 7}, "w7 w8"]
    records = pipe(documents)
    assert [(r["doc_id"], r.get("error")) for r in records] == [
        ("0", None), ("1", "no tokens (empty or only blank lines)"), ("x", None),
        ("x#3", "duplicate document id (first given by input item 3)"),
        ("y", "no 'text' (a language model scores text)"),
        ("5", "no tokens (empty or only blank lines)"),
        ("#6", "expected text, a Document or a dict, got int"), ("z", "'text' must be a string"),
        ("8", None)]
    assert [r["index"] for r in records] == list(range(9))
    assert set(records[1]) == {"doc_id", "index", "error"}
    fail = LMPipeline.from_pretrained(model_directory(str(trained)), on_error="fail")
    assert fail(documents[:1])[0]["tokens"] == 3   # w2 . <eos>
    with pytest.raises(PipelineError, match=r"^document '1' \(input item 2\): no tokens"):
        fail(documents[:2])
    with pytest.raises(PipelineError, match="on_error must be one of"):
        LMPipeline.from_pretrained(model_directory(str(trained)), on_error="skip")


def test_bad_model_directories_are_one_line(trained, tmp_path):
    best = model_directory(str(trained))
    copy = tmp_path / "copy"
    shutil.copytree(best, copy)
    (copy / "vocab.txt").unlink()
    with pytest.raises(PipelineError, match="vocab.txt"):
        LMPipeline.from_pretrained(str(copy))
    (copy / "vocab.txt").write_text("<eos>\n<unk>\nw1\n", encoding="utf-8")
    with pytest.raises(PipelineError, match="3 tokens, the model's vocab_size is"):
        LMPipeline.from_pretrained(str(copy))
    record = json.loads((copy / "task.json").read_text())
    (copy / "task.json").write_text(json.dumps(dict(record, kind="classification")))
    with pytest.raises(PipelineError, match="'kind' 'classification' disagrees with "
                                            "config.kind 'language_model'"):
        LMPipeline.from_pretrained(str(copy))
    (copy / "task.json").write_text(json.dumps(dict(
        record, kind="classification", config=dict(record["config"], kind="classification"))))
    with pytest.raises(PipelineError, match="not a language model"):
        LMPipeline.from_pretrained(str(copy))


def test_document_lines_read_text_as_a_file_is_read():
    assert document_lines("a b\n\n c \n") == ["a b", "", " c "]
    assert document_lines("\ufeffa\r\nb") == ["a\r", "b"]
    assert document_lines("a\x0bb\u2028c") == ["a\x0bb\u2028c"]   # "\n" only ends a line
