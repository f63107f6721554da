"""ernie_doc.explain: occlusion and gradients through the memory (attribution, explainer,
the effective-context measurement) and `ernie-doc explain` / `ernie-doc context`.

The models are tiny IMDB classifiers trained for one step (helpers.tiny_classifier): the
checks here hold for any weights (exact zeros, completeness, agreement with predict). What a
trained model shows (the demo's keys) is checked after the demo's own run in
tests/test_tasks.py::test_main_command_shows_the_paper_ablation_order."""
import json

import numpy as np
import paddle
import pytest
from helpers import in_process, tiny_classifier
from test_tasks import WORDS

from ernie_doc.data.document import Document
from ernie_doc.explain.attribution import (ALL, EmbeddingProbe, content_mask, document_layout,
                                           gradient_norms, gradient_pass, occluded)
from ernie_doc.explain.context import last_segment_influence, reach
from ernie_doc.explain.explainer import Explainer
from ernie_doc.predict.pipeline import Pipeline

RECURRENCES = ("none", "xl", "enhanced")


def review(k: int, n: int = 60) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for i in range(n))


DOCS = [review(k, n) for k, n in ((0, 60), (3, 45), (5, 13), (8, 90))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{recurrence: the run's OUTPUT_DIR}, the retrospective feed on (the imdb default)."""
    root = tmp_path_factory.mktemp("explain")
    return {r: tiny_classifier(root / r, f"model_overrides.recurrence={r}")
            for r in RECURRENCES}


def loud(pipe, seed=0):
    """`pipe` with its model's weights redrawn wide (seeded): a one-step model is nearly
    constant, and these checks want outputs that move (nothing is written)."""
    rng = np.random.default_rng(seed)
    for p in pipe.model.parameters():
        if len(p.shape) == 2:
            p.set_value(rng.normal(0, 0.3, p.shape).astype("float32"))
    return pipe


def explainer(run, **options):
    return Explainer(loud(Pipeline.from_pretrained(str(run))), **options)


# -- the layout: what occlusion replaces -------------------------------------------------------
def test_occlusion_replaces_the_documents_tokens_only(runs):
    pipe = Pipeline.from_pretrained(str(runs["enhanced"]))
    doc = Document("d", DOCS[0])
    layout = document_layout(pipe.task, doc, pipe.tokenizer, True)
    assert layout.readings == 2 and len(layout.passes) == 2 * layout.segments
    specials = {pipe.run.special[k] for k in ("cls", "sep", "pad")}
    for i in range(len(layout.passes)):
        seg = layout.passes[i]
        mask = content_mask(seg, 16)
        # the document's tokens: real, never [CLS], [SEP] or padding
        assert mask.sum() > 0 and not (seg.attention_mask[mask] == 0).any()
        assert not set(seg.input_ids[mask].tolist()) & specials
        out = occluded(seg, pipe.pad_id)
        assert (out.input_ids[mask] == pipe.pad_id).all()
        assert (out.input_ids[~mask] == seg.input_ids[~mask]).all()
        assert (out.attention_mask == seg.attention_mask).all()
        assert out.input_ids is not seg.input_ids   # a copy: the segment is untouched


def test_occluding_only_padding_changes_nothing(runs):
    """A variant whose replaced positions are the rows' padding alone reads bit for bit as the
    document; occluding the document's own tokens does not."""
    from dataclasses import replace as copy_with

    from ernie_doc.data.segment import LazySteps
    ex = explainer(runs["enhanced"])
    layout = document_layout(ex.task, Document("d", DOCS[2] + " " + DOCS[1]),
                             ex.pipe.tokenizer, True)
    padded_rows = []

    def padding_only(i):
        seg = layout.passes[i]
        pads = np.flatnonzero(seg.attention_mask == 0)
        assert (seg.input_ids[pads] == ex.pipe.pad_id).all()
        padded_rows.append(len(pads))
        return copy_with(seg, sources=(("text", 0, len(pads), int(pads[0])),) if len(pads)
                         else ())
    padded = type(layout)(LazySteps(len(layout.passes), padding_only), layout.segments,
                          layout.readings, layout.group)
    with paddle.no_grad():
        plain, *same = ex._read(padded, [None, 0, ALL])   # one batch: the same kernels
        changed = ex._read(layout, [None, ALL])[1]
    assert max(padded_rows) > 0   # some rows have padding to replace
    for variant in same:
        assert all((a.numpy() == b.numpy()).all() for (_, a), (_, b) in zip(variant, plain))
    assert any(not np.allclose(a.numpy(), b.numpy()) for (_, a), (_, b) in zip(changed, plain))


def test_an_occlusion_read_keeps_one_tensor_a_step_and_builds_none_from_arrays(runs,
                                                                               monkeypatch):
    """Occlusion reads a document once per segment, many variants side by side: what a read
    keeps is one score tensor per predicted step (not one per step and variant: thousands of
    small tensors that outlived the read held on to the heap pages of every step, and the
    resident memory grew with segments x variants), and its step tensors come from the
    explainer's TensorStage, never paddle.to_tensor (paddle 3 keeps memory of each call)."""
    import gc

    ex = explainer(runs["enhanced"], method="occlusion")
    layout = document_layout(ex.task, Document("d", DOCS[3]), ex.pipe.tokenizer, True)
    variants = [None] + list(range(7))
    built = []
    real = paddle.to_tensor
    monkeypatch.setattr(paddle, "to_tensor", lambda *a, **k: built.append(1) or real(*a, **k))

    def held(obj):   # the tensors `obj` holds, through containers and ernie_doc objects
        seen, found, todo = set(), [], [obj]
        while todo:
            o = todo.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, paddle.Tensor):
                found.append(o)
            elif isinstance(o, (list, tuple, dict)) or (
                    not isinstance(o, type) and type(o).__module__.startswith("ernie_doc")):
                todo.extend(gc.get_referents(*(vars(o).values() if hasattr(o, "__dict__")
                                               else [o])))
        return found
    with paddle.no_grad():
        read = ex._read(layout, variants)
    assert built == []
    assert len(read) == len(variants) and layout.segments >= 5
    # the final reading's steps, one [variants, C] each
    assert [t.shape for t in held(read)] == [[len(variants), 2]] * layout.segments
    rows = read[3]
    assert [s for s, _ in rows] == list(range(layout.segments))
    assert all(r.shape == [2] for _, r in rows)


# -- gradients through the memory ----------------------------------------------------------------
@pytest.mark.parametrize("recurrence", RECURRENCES)
def test_the_last_segments_gradient_reaches_earlier_segments_only_through_memory(runs,
                                                                                 recurrence):
    """For recurrence none, the gradient of the last segment's prediction on every earlier
    segment's embeddings is exactly 0 (and so is occlusion's change); one layer of
    Transformer-XL's recurrence reaches exactly one segment back, the enhanced one every
    segment; and it is all 0 again when the memories stay detached (the pass lifts the
    stop-gradient for itself only)."""
    ex = explainer(runs[recurrence])
    found = last_segment_influence(ex, Document("d", DOCS[3]))
    grads, occl = np.array(found["gradient"]), np.array(found["occlusion"])
    assert grads[0] > 0 and occl[0] > 0 and len(grads) >= 4
    if recurrence == "none":
        assert (grads[1:] == 0).all() and (occl[1:] == 0).all()
    elif recurrence == "xl":   # one layer: Transformer-XL's memory reaches one segment back
        assert grads[1] > 0 and occl[1] > 0
        assert (grads[2:] == 0).all() and (occl[2:] == 0).all()
    else:                      # the enhanced recurrence: every earlier segment
        assert (grads > 0).all() and (occl > 0).all()
    encoder = ex.model.ernie_doc
    assert encoder.memory_gradient is False and encoder.recompute is False
    assert all(not p.stop_gradient for p in ex.model.parameters())   # restored
    # the same pass with the memories detached: nothing reaches the earlier segments
    layout = document_layout(ex.task, Document("d", DOCS[3]), ex.pipe.tokenizer, True)
    probe = EmbeddingProbe(encoder.embeddings.word_emb, ex.replacement, [1.0], 1)
    with gradient_pass(ex.model, False), probe.attached():
        encoder.memory_gradient = False
        got = ex._read(layout, [None], probe)[0]
        max(got, key=lambda r: r[0])[1][0].backward()
    norms = gradient_norms(probe, layout.segments)
    assert norms[-1] > 0 and (norms[:-1] == 0).all()


def test_the_gradient_pass_keeps_layer_norm_input_gradients():
    """Paddle gives LayerNorm's input the gradient of a unit scale when the scale is frozen:
    the pass keeps the scales' gradient on (and drops it after), so ∂/∂x is the true one."""
    rng = np.random.default_rng(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.LayerNorm(8))
    model.memory_gradient = False   # gradient_pass's switch (a model without .ernie_doc)
    for p in model.parameters():
        p.set_value(rng.normal(0, 1.0, p.shape).astype("float32"))
    x0, c = (rng.normal(0, 1, (3, 8)).astype("float32") for _ in range(2))

    def input_gradient():
        x = paddle.to_tensor(x0, stop_gradient=False)
        (model(x) * paddle.to_tensor(c)).sum().backward()
        return x.grad.numpy()
    plain = input_gradient()
    for p in model.parameters():   # no gradient at all (None), as a pipeline's model
        p.clear_gradient(False)
    with gradient_pass(model, False):
        assert model.memory_gradient is True
        inside = input_gradient()
    np.testing.assert_allclose(inside, plain, rtol=1e-5, atol=1e-6)
    assert model.memory_gradient is False
    assert all(p.grad is None and not p.stop_gradient for p in model.parameters())
    with pytest.raises(ValueError, match="Sequential cannot recompute its layers"):
        with gradient_pass(model, True):
            pass


def test_recomputed_gradients_equal_kept_ones(runs):
    ex = explainer(runs["enhanced"], method="gradient")
    doc = Document("d", DOCS[0])
    kept = ex.explain_document(doc)
    ex.max_memory = ex.graph_bytes(document_layout(ex.task, doc, ex.pipe.tokenizer, True),
                                   1, True)   # fits recomputed only
    again = ex.explain_document(doc)
    assert kept["recompute"] is False and again["recompute"] is True
    np.testing.assert_allclose([s["score"] for s in again["segments"]],
                               [s["score"] for s in kept["segments"]], rtol=1e-4, atol=1e-9)
    ex.max_memory = 1000
    with pytest.raises(Exception, match=r"a gradient pass over this document \(\d+ segment "
                                        r"reads\) keeps about .* more than the"):
        ex.explain_document(doc)


@pytest.mark.parametrize("recurrence", ("none", "enhanced"))
def test_integrated_gradients_are_complete(runs, recurrence):
    """Σ attributions = target(document) − target(baseline: every token replaced), to the
    midpoint rule's error; and gradient × input is their one-step version."""
    ex = explainer(runs[recurrence], method="integrated_gradients", steps=32)
    record = ex.explain_document(Document("d", DOCS[0]))
    change = record["target"]["score"] - record["baseline"]
    total = sum(s["score"] for s in record["segments"])
    by_token = sum(v for _, _, v in record["token_scores"]["text"])
    assert abs(change) > 1e-4
    assert total == pytest.approx(change, rel=0.02, abs=1e-6)
    assert by_token == pytest.approx(total, rel=1e-3, abs=1e-7)
    for s in record["segments"]:   # the readings add up to the segment
        assert sum(s["by_reading"]) == pytest.approx(s["score"], rel=1e-3, abs=1e-9)


# -- explain agrees with predict -----------------------------------------------------------------
def test_explain_agrees_with_predict_and_the_record_is_whole(runs):
    pipe = loud(Pipeline.from_pretrained(str(runs["xl"])))
    predicted = pipe(DOCS)
    for method in ("occlusion", "gradient"):
        records = pipe.explain(DOCS, method=method)
        for p, r in zip(predicted, records):
            assert r["prediction"] == {k: v for k, v in p.items() if k != "index"}
            assert r["index"] == p["index"] and r["doc_id"] == p["doc_id"]
            assert r["target"]["label"] == p["pred"]
            assert r["target"]["score"] == pytest.approx(p["probs"][int(p["pred"])], abs=2e-6)
            assert r["readings"] == ["skim", "retrospective"]
            assert len(r["segments"]) == p["segments"]
            text = r["texts"]["text"]
            for t in r["top_tokens"]:
                assert text[t["start"]:t["end"]] == t["text"] and t["text"] in WORDS
            assert [s["chars"][0] for s in r["segments"]][0] == 0
            assert r["segments"][-1]["chars"][1] == len(text)
    other = pipe.explain(DOCS[:1], target="0")[0]
    assert other["target"]["label"] == "0"
    assert other["target"]["score"] == pytest.approx(predicted[0]["probs"][0], abs=2e-6)
    bad = pipe.explain(DOCS[:1], target="nope")[0]
    assert bad["error"].startswith("--target 'nope' is not a label of this model")


def test_occlusion_is_the_change_of_reading_the_document_without_the_segment(runs):
    """Segment s's occlusion score = target(document) − target(segment s replaced in both
    readings), each variant read as the document alone would be."""
    ex = explainer(runs["enhanced"])
    doc = Document("d", DOCS[0])
    record = ex.explain_document(doc)
    layout = document_layout(ex.task, doc, ex.pipe.tokenizer, True)
    target = record["target"]["score"]
    for s in (0, 2):
        with paddle.no_grad():
            alone = ex._read(layout, [s])[0]
        probs = np.mean([r.numpy() for _, r in alone], axis=0)
        assert record["segments"][s]["score"] == pytest.approx(
            target - probs[int(record["target"]["label"])], abs=2e-6)
    assert record["segments"][0]["by_reading"] is None


def test_reach_is_where_influence_stays_under_one_percent():
    assert reach([1.0, 0.5, 0.02, 0.001, 0.0]) == {"distance": 3, "beyond": False}
    assert reach([1.0, 0.5, 0.001, 0.02]) == {"distance": 4, "beyond": True}
    assert reach([1.0, 0.0]) == {"distance": 1, "beyond": False}
    assert reach([0.0, 0.0]) == {"distance": 0, "beyond": False}


# -- the command line ----------------------------------------------------------------------------
def explain_cli(*args, expect=0):
    from tools.explain import command
    return in_process(command, [str(a) for a in args] + ["--no-progress"], expect)


def test_explain_command_writes_lines_pictures_and_pages(runs, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n"
                            for i, t in enumerate(DOCS)) + json.dumps({"id": "x", "text": ""})
                    + "\n", encoding="utf-8")
    out = tmp_path / "why"
    explain_cli(runs["enhanced"], "--input", docs, "--output", out, "--method", "gradient")
    lines = [json.loads(x) for x in (out / "explanations.jsonl").read_text().splitlines()]
    assert [x["doc_id"] for x in lines] == ["r0", "r1", "r2", "r3", "x"]
    assert lines[-1]["error"] == "empty text"
    for x in lines[:-1]:
        assert "token_scores" not in x and "texts" not in x
        assert (out / x["files"]["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        page = (out / x["files"]["html"]).read_text(encoding="utf-8")
        assert "<html" in page and "http" not in page
    # --resume: nothing new to explain; the same file, the same figures
    before = (out / "explanations.jsonl").read_bytes()
    explain_cli(runs["enhanced"], "--input", docs, "--output", out, "--method", "gradient",
                "--resume")
    assert (out / "explanations.jsonl").read_bytes() == before


def one_line(proc, *parts):
    """The command's stderr is one `error:` line holding every part → that line."""
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(p in lines[0] for p in parts), lines[0]
    return lines[0]


def test_explain_command_refuses_in_one_line(runs, tmp_path):
    docs = tmp_path / "d.txt"
    docs.write_text(DOCS[0], encoding="utf-8")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    one_line(explain_cli(runs["none"], "--input", docs, "--output", a_file, expect=2),
             "exists and is not a directory")
    missing = tmp_path / "no" / "where"
    one_line(explain_cli(runs["none"], "--input", docs, "--output", missing, expect=2),
             "does not exist")
    assert not missing.parent.exists()
    out = tmp_path / "new"
    one_line(explain_cli(runs["none"], "--input", tmp_path / "nothing.txt", "--output", out,
                         expect=2), "nothing.txt")
    assert not out.exists()   # made by this run, left empty: removed
    one_line(explain_cli(runs["none"], "--input", docs, "--output", out, "--target", "nope",
                         "--on-error", "fail", expect=2), "--target 'nope' is not a label")
    # as predict: the records written before the failure (none), complete, and no figure
    assert (out / "explanations.jsonl").read_bytes() == b""
    assert sorted(p.name for p in out.iterdir()) == ["explanations.jsonl",
                                                     "explanations.jsonl.meta.json"]


def context_cli(*args, expect=0):
    from tools.context import command
    return in_process(command, [str(a) for a in args] + ["--no-progress"], expect)


def test_context_command_measures_how_far_back_each_run_looks(runs, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS), encoding="utf-8")
    out = tmp_path / "ctx"
    named = []   # the runs under their recurrence's name (a run's name is its folder's)
    for r in ("none", "xl", "enhanced"):
        (tmp_path / r).symlink_to(runs[r], target_is_directory=True)
        named.append(tmp_path / r)
    context_cli(*named, "--input", docs, "--output", out, "--documents", "3")
    found = json.loads((out / "context.json").read_text())
    assert found["kind"] == "document" and list(found["runs"]) == ["none", "xl", "enhanced"]
    none, xl = found["runs"]["none"], found["runs"]["xl"]
    # DOCS[2] is one segment: skipped; the other three measured
    assert none["documents"] == 3 and none["skipped"] == 1
    assert none["occlusion"]["mean"][1:] == [0.0] * (len(none["occlusion"]["mean"]) - 1)
    assert none["occlusion"]["reach"]["distance"] == 1
    assert none["gradient"]["reach"] == {"distance": 1, "beyond": False}
    assert xl["gradient"]["mean"][2:] == [0.0] * (len(xl["gradient"]["mean"]) - 2)
    counts = none["occlusion"]["documents"]   # documents that have each distance
    assert counts[0] == 3 and counts[-1] >= 1 and counts == sorted(counts, reverse=True)
    assert "| none | none | yes | 3 | 1 | 1 |" in (out / "context.md").read_text()
    assert (out / "context.png").read_bytes()[:4] == b"\x89PNG"
    proc = context_cli(named[0], "--input", docs, "--output", out, expect=2)
    assert "holds context.json, context.md, context.png already (--overwrite replaces them)" \
        in proc.stderr and proc.stderr.count("\n") == 1


def test_a_long_documents_gradient_pass_does_not_overflow_the_stack(runs, tmp_path):
    """The graph through the memories is walked (and freed) recursively by paddle's autograd:
    on the main thread's stack a long document segfaults. Under a 1 MiB stack limit the
    gradient pass of a 400-segment document still explains (attribution.deep)."""
    import resource
    import subprocess
    import sys
    doc = tmp_path / "long.txt"
    doc.write_text(" ".join(["good movie the plot"] * 800), encoding="utf-8")

    def small_stack():
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, 1 << 20))
    proc = subprocess.run([sys.executable, "-m", "ernie_doc.cli", "explain",
                           str(runs["enhanced"]),   # a chain through every segment
                           "--input", str(doc), "--output", str(tmp_path / "why"),
                           "--method", "gradient", "--no-png", "--no-html", "--no-progress"],
                          preexec_fn=small_stack, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "why" / "explanations.jsonl").read_text())
    assert len(record["segments"]) >= 400 and record["segments"][-2]["score"] != 0


# -- what an attack found ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def span_run(tmp_path_factory):
    from test_span_tasks import cmrc_run
    return cmrc_run(tmp_path_factory.mktemp("span"))


def test_span_target_is_the_score_predict_decoded(span_run):
    """Overlapping windows hold an answer more than once: the explained logit is the one whose
    score predict's decoding reported (the window giving the answer its largest context)."""
    from ernie_doc.kinds.base import load_reader
    data, out = span_run
    docs = load_reader("cmrc2018").read(str(data), "dev", {})
    inputs = [{"id": d.doc_id, "question": d.fields["question"],
               "context": d.fields["context"]} for d in docs]
    records = loud(Pipeline.from_pretrained(str(out))).explain(inputs)
    explained = [r for r in records if "error" not in r]
    assert explained
    for r in explained:
        assert r["target"]["score"] == pytest.approx(r["prediction"]["score"], abs=1e-4)
        assert r["target"]["label"] == r["prediction"]["pred"]


def test_resume_refuses_another_method_or_another_commands_file(runs, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n"
                            for i, t in enumerate(DOCS[:2])), encoding="utf-8")
    out = tmp_path / "why"
    explain_cli(runs["none"], "--input", docs, "--output", out)
    before = (out / "explanations.jsonl").read_bytes()
    one_line(explain_cli(runs["none"], "--input", docs, "--output", out, "--resume",
                         "--method", "gradient", expect=2), "written with other settings")
    from tools.predict import command as predict
    preds = tmp_path / "p"
    preds.mkdir()
    in_process(predict, [str(runs["none"]), "--input", str(docs), "--output",
                         str(preds / "explanations.jsonl"), "--no-progress"])
    one_line(explain_cli(runs["none"], "--input", docs, "--output", preds, "--resume",
                         expect=2), "not a record of ernie-doc explain")
    assert (out / "explanations.jsonl").read_bytes() == before
    # a new run never replaces a file named like a figure (--overwrite may)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "00000-r0.png").write_bytes(b"mine")
    one_line(explain_cli(runs["none"], "--input", docs, "--output", other, expect=2),
             "holds 00000-r0.png named like this command's figures")
    assert (other / "00000-r0.png").read_bytes() == b"mine"


def test_context_never_writes_in_a_model_folder_and_leaves_nothing(runs, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": DOCS[0]}) + "\n", encoding="utf-8")
    best = runs["none"] / "best"
    before = sorted(p.name for p in best.iterdir())
    one_line(context_cli(runs["none"], "--input", docs, "--output", best, expect=2),
             "inside the input folder")
    one_line(context_cli(runs["none"], "--input", docs, "--output", best / "ctx", expect=2),
             "inside the input folder")
    assert sorted(p.name for p in best.iterdir()) == before
    out = tmp_path / "ctx"
    one_line(context_cli(runs["none"], "--input", tmp_path / "none.jsonl", "--output", out,
                         expect=2), "none.jsonl")
    assert not out.exists()


def test_choice_targets_read_text_first_then_an_index(tmp_path):
    from test_span_tasks import c3_data
    from test_tasks import HANZI, finetune_task, vocab_dir
    data = c3_data(tmp_path, (("train", 4), ("dev", 2), ("test", 2)))
    out = tmp_path / "out"
    finetune_task("c3", data, out, vocab_dir(tmp_path / "vocab", HANZI), "stride=4",
                  "batch_size=1", "grad_accum_steps=1", "max_seq_len=32", "max_steps=1",
                  "model_overrides.max_position_embeddings=32")
    pipe = Pipeline.from_pretrained(str(out))
    doc = {"id": "q", "context": "好坏新闻体育", "question": "新闻", "choices": ["1", "0", "坏"]}
    by_text = pipe.explain([doc], target="1")[0]
    assert by_text["target"]["label"] == "0"   # the choice whose text is "1"
    assert pipe.explain([doc], target="2")[0]["target"]["label"] == "2"
    for bad in ("²", "3", "-1", "01x"):
        assert pipe.explain([doc], target=bad)[0]["error"].startswith(f"--target {bad!r}")


def test_span_context_measures_only_the_last_segments_answer(span_run):
    """The last segment's own answer may sit in earlier overlapping windows too: only the
    scored rows are looked up (it raised KeyError)."""
    from ernie_doc.errors import DataError
    from ernie_doc.kinds.base import load_reader
    data, out = span_run
    ex = Explainer(loud(Pipeline.from_pretrained(str(out))))
    measured = 0
    for d in load_reader("cmrc2018").read(str(data), "dev", {}):
        doc = Document(d.doc_id, fields={"question": d.fields["question"],
                                         "context": d.fields["context"]})
        try:
            found = last_segment_influence(ex, doc)
        except DataError:   # the last segment holds no answer of its own
            continue
        measured += found is not None
    assert measured >= 1
