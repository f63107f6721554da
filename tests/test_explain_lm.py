"""ernie_doc.explain.lm: `ernie-doc explain` for the language model. The models are tiny
Transformer-XLs with seeded weights (helpers.saved_lm: adaptive embedding and softmax of two
clusters, Segatron positions, the eval protocol tgt_len 8, memory 16, same_length, 2 rows):
the checks hold for any weights (exact zeros, completeness, agreement with LMPipeline)."""
import json

import numpy as np
import pytest
from helpers import in_process, saved_lm, write_wikitext

from ernie_doc.data.document import Document
from ernie_doc.errors import DataError
from ernie_doc.explain.lm import LMExplainer, parse_span, token_offsets
from ernie_doc.lm.data import Vocabulary
from ernie_doc.predict.lm import LMPipeline

TGT = 8


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    """{"text": a document of 5 lines, recurrence: its saved model}."""
    root = tmp_path_factory.mktemp("explain_lm")
    path = write_wikitext(root / "wiki.test.tokens", 5, 0, words=30)
    vocab = Vocabulary.build([path])
    assert len(vocab) > 20   # both softmax clusters are read
    found = {"text": path.read_text(encoding="utf-8")}
    for r in ("none", "enhanced"):
        found[r] = saved_lm(root, r, r, vocab, scale=0.2, cutoffs=[20], div_val=2,
                            segment_positions=True)
    return found


def lm_pipe(lms, recurrence, rows=None):
    return LMPipeline.from_pretrained(str(lms[recurrence]), batch_size=rows)


def short(lms, lines=3, first=0):
    """Lines first … first + lines − 1 of the document (a few segments)."""
    return "\n".join(lms["text"].split("\n")[first:first + lines]) + "\n"


@pytest.mark.parametrize("recurrence", ("none", "enhanced"))
def test_earlier_segments_reach_a_span_only_through_memory(lms, recurrence):
    """A span inside the last segment: without recurrence every earlier segment scores exactly
    0 by gradient and by occlusion; the enhanced recurrence carries every one of them."""
    pipe = lm_pipe(lms, recurrence)
    doc = short(lms)
    n = len(pipe.open_document(Document("d", doc))[0].ids)
    last = (n - 2) // TGT * TGT   # the last segment's first input token
    for method in ("gradient", "occlusion"):
        record = pipe.explain([doc], method=method, span=(last + 1, n))[0]
        scores = np.array([s["score"] for s in record["segments"]])
        assert len(scores) >= 4 and record["segments"][-1]["tokens"] == [last, n - 1]
        assert scores[-1] != 0
        if recurrence == "none":
            assert (scores[:-1] == 0).all(), (method, scores)
        else:
            assert (scores[-4:-1] != 0).all(), (method, scores)
            if method == "gradient":
                assert (scores != 0).all(), scores
    model = pipe.model
    assert model.memory_gradient is False
    assert all(not p.stop_gradient and p.grad is None for p in model.parameters())


def test_integrated_gradients_are_complete(lms):
    """Σ attributions = Σ log p(span) − the same with every input token <unk>, to the midpoint
    rule's error (1 % at 16 steps here); gradient × input is their one-step version, and
    tokens add up to their segments."""
    pipe = lm_pipe(lms, "enhanced")
    record = pipe.explain([lms["text"]], method="integrated_gradients", steps=16)[0]
    change = record["target"]["score"] - record["baseline"]
    total = sum(s["score"] for s in record["segments"])
    by_token = sum(v for _, _, v in record["token_scores"]["text"])
    assert abs(change) > 0.05 and record["steps"] == 16
    assert total == pytest.approx(change, rel=0.01)
    assert by_token == pytest.approx(total, rel=1e-4)
    assert [s["by_reading"] for s in record["segments"]] == [[s["score"]]
                                                            for s in record["segments"]]


def test_explain_agrees_with_the_pipeline(lms):
    """The prediction is LMPipeline's record of the document; the target is its summed
    log-probability over the span (default: the last tgt_len tokens); the segments are the
    tgt_len windows; offsets point at the words; segments after the span score 0 unread."""
    pipe = lm_pipe(lms, "enhanced")
    docs = [lms["text"], short(lms, 1, first=2)]
    # the prediction is the document read alone: predict's with one row, bit for bit (two
    # rows side by side differ in the last bits: the adaptive embedding gathers a batch)
    predicted = lm_pipe(lms, "enhanced", rows=1)(docs)
    for alone, beside in zip(predicted, pipe(docs)):
        assert alone["nll"] == pytest.approx(beside["nll"], rel=1e-6)
    for method in ("occlusion", "gradient"):
        for p, r in zip(predicted, pipe.explain(docs, method=method)):
            n = p["tokens"] + 1
            assert r["prediction"] == {k: v for k, v in p.items() if k != "index"}
            assert r["kind"] == "language_model" and r["readings"] == ["single"]
            assert r["span"] == [n - TGT, n] and r["target"]["label"] == f"{n - TGT}:{n}"
            assert r["target"]["name"] == f"log-probability of tokens [{n - TGT}, {n})"
            assert r["target"]["score"] == pytest.approx(
                sum(lp for _, lp in p["token_logprobs"][n - TGT - 1:]), abs=1e-4)
            assert [s["tokens"] for s in r["segments"]] == [
                [a, min(a + TGT, n - 1)] for a in range(0, n - 1, TGT)]
            text, tokens = r["texts"]["text"], r["token_scores"]["text"]
            words = [w for w, _ in p["token_logprobs"]]
            assert len(tokens) == n
            assert [text[a:b] if w != "<eos>" else "<eos>" for (a, b, _), w in
                    zip(tokens[1:], words)] == words
            for t in r["top_tokens"]:
                assert text[t["start"]:t["end"]] == t["text"]
    middle = pipe.explain(docs[:1], method="gradient", span=(20, 30))[0]
    assert middle["target"]["score"] == pytest.approx(
        sum(lp for _, lp in predicted[0]["token_logprobs"][19:29]), abs=1e-4)
    after = [s["score"] for s in middle["segments"] if s["tokens"][0] >= 29]
    assert after and all(v == 0 for v in after)


def test_variants_side_by_side_read_as_the_document_alone(lms):
    """Occlusion reads its variants as batch rows (2 here) or one at a time (1 row): the
    same scores; and a segment replaced by <unk> changes the span's log-probability."""
    doc = [short(lms)]
    two = lm_pipe(lms, "enhanced").explain(doc)[0]
    one = lm_pipe(lms, "enhanced", rows=1).explain(doc)[0]
    np.testing.assert_allclose([s["score"] for s in two["segments"]],
                               [s["score"] for s in one["segments"]], atol=2e-5)
    assert two["target"]["score"] == pytest.approx(one["target"]["score"], abs=1e-5)
    assert two["segments"][-1]["score"] != 0 and two["segments"][0]["by_reading"] is None


def test_documented_example(lms, tmp_path, monkeypatch, capsys):
    """docs/explain.md's block as written, on the saved enhanced model."""
    import readme_fixtures as rf
    block = rf.block_run_by("tests/test_explain_lm.py::test_documented_example")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "lm").symlink_to(lms["enhanced"])
    (tmp_path / "article.tokens").write_text(lms["text"], encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(block.code, "docs/explain.md", "exec"), scope)
    record = scope["record"]
    assert record["target"]["label"] == "40:48" and record["method"] == "gradient"
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("{'name': 'log-probability of tokens [40, 48)'")
    assert len(printed) == 1 + len(record["segments"])
    assert printed[-1] == "[104, 106] 0.0"   # after the span: not read, exactly 0


def test_token_offsets_follow_the_models_tokens():
    text = "\ufeffa bb\n\n  c\td \nlast"
    assert token_offsets(text, False).tolist() == [[1, 2], [3, 5], [5, 6], [6, 7], [9, 10],
                                                   [11, 12], [13, 14], [14, 18], [18, 18]]
    assert token_offsets("x\n", True).tolist() == [[0, 0], [0, 1], [1, 2]]


def test_a_bad_span_is_one_line(lms):
    pipe = lm_pipe(lms, "none")
    doc = short(lms, 2)
    n = len(pipe.open_document(Document("d", doc))[0].ids)
    for span, message in (((0, 5), f"span 0:5: this document's predicted tokens are 1 to "
                                    f"{n - 1} (t0 >= 1, t1 <= {n}; token 0 has no context)"),
                          ((3, n + 1), f"span 3:{n + 1}: this document's predicted tokens")):
        record = pipe.explain([{"id": "d", "text": doc}], span=span)[0]
        assert record["error"].startswith(message) and "\n" not in record["error"]
    for bad in ((5, 3), (-1, 2), (1.5, 3), "1:3", (1, 2, 3)):
        with pytest.raises(DataError, match=r"^span must be two token indices \(t0, t1\) with "
                                            r"0 <= t0 < t1, got"):
            LMExplainer(pipe, span=bad)
    assert parse_span("3:9") == (3, 9)
    with pytest.raises(DataError, match=r"^--target 'x:': a language model's target is a "
                                        r"token span T0:T1"):
        parse_span("x:")


def explain_cli(*args, expect=0):
    from tools.explain import command
    return in_process(command, [str(a) for a in args] + ["--no-progress"], expect)


def test_explain_command_reads_a_language_model(lms, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "a", "text": lms["text"]}) + "\n"
                    + json.dumps({"id": "b", "text": short(lms, 1, first=2)}) + "\n",
                    encoding="utf-8")
    out = tmp_path / "why"
    explain_cli(lms["enhanced"], "--input", docs, "--output", out, "--method", "gradient",
                "--target", "3:9")
    lines = [json.loads(x) for x in (out / "explanations.jsonl").read_text().splitlines()]
    assert [x["doc_id"] for x in lines] == ["a", "b"]
    for x in lines:
        assert x["kind"] == "language_model" and x["target"]["label"] == "3:9"
        assert "token_scores" not in x
        assert (out / x["files"]["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        page = (out / x["files"]["html"]).read_text(encoding="utf-8")
        assert "<html" in page and "http" not in page
    for extra, part in ((["--target", "9"], "--target '9': a language model's target is a "
                                           "token span T0:T1"),
                        (["--replace", "mask"], "--replace mask: a language model's segments "
                                                "become <unk>")):
        proc = explain_cli(lms["none"], "--input", docs, "--output", tmp_path / "no", *extra,
                           expect=2)
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and part in lines[0], \
            proc.stderr
