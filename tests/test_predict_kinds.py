"""Every document kind's `predict` (one record per document, no gold read), `evaluate` =
`predict` + gold, per-document independence (what `ernie-doc predict` relies on: it predicts
each document as its rows finish), segmenting documents that carry only their input fields,
and `check_input`. Row outputs are random but seeded: only the kinds' arithmetic is tested."""
import copy
import json

import numpy as np
import pytest
from helpers import ROOT  # noqa: F401  (repo on sys.path)
from test_tasks import vocab_dir

from ernie_doc.data.document import Document
from ernie_doc.data.segment import reading_passes, step_members
from ernie_doc.run_config import load_config

KINDS = ("classification", "span", "multiple_choice", "pair_matching", "hotpot_evidence",
         "hotpot_answer", "openkp")
HANZI = list("北京大学是中国的一所著名高校位于海淀区清华在旁边谁哪里什么")
# what each kind's records hold besides its predict keys (evaluate adds them)
GOLD_KEYS = {"classification": {"label"}, "span": {"references"},
             "multiple_choice": {"label"}, "pair_matching": {"label"},
             "hotpot_evidence": {"gold_supporting_facts"},
             "hotpot_answer": {"gold_answer", "gold_supporting_facts"},
             "openkp": {"references"}}


class CharTokenizer:
    """One id per character (10 + code point mod 50): enough for the kinds that only encode."""

    def encode(self, text):
        return [10 + ord(ch) % 50 for ch in text]


def _reader(labels):
    class Reader:
        @staticmethod
        def labels(data_dir, options):
            return list(labels)
    return Reader


def _passes(task, docs, tok, retro=True):
    return [reading_passes(task.document_segments(d, i, tok), retro) for i, d in enumerate(docs)]


def _rows(passes, make):
    """{doc: [(seg index, output)]} for each final step (a group's first row stands for it),
    delivered in reverse segment order (as ranks may merge them: kinds must sort)."""
    rows = {}
    for i, steps in enumerate(passes):
        finals = [step_members(s)[0] for s in steps if step_members(s)[0].final]
        rows[i] = [(m.seg_index, make(m)) for m in reversed(finals)]
    return rows


# -- tiny cases, one per kind: (task, documents, rows, passes, tokenizer) -----------------
def case_classification(tmp_path, rng):
    from ernie_doc.kinds.classification import ClassificationTask
    cfg = load_config(None, ["task=imdb", "kind=classification", "max_seq_len=8",
                             "metrics=[accuracy, f1, macro_f1]"])
    task = ClassificationTask(cfg, _reader(["neg", "pos", "mid"]))
    task.setup({"cls": 1, "sep": 2, "pad": 0}, 8, 3)
    docs = [Document(f"c{i}", "abcdefghij"[: 3 + 2 * i], ["neg", "pos", "mid"][i % 3])
            for i in range(5)]
    tok = CharTokenizer()
    passes = _passes(task, docs, tok)

    def out(_):
        x = rng.normal(size=3)
        return np.exp(x) / np.exp(x).sum()
    return task, docs, _rows(passes, out), passes, tok


def case_span(tmp_path, rng):
    from ernie_doc.kinds.span import SpanTask
    from ernie_doc.tokenization.wordpiece import WordPieceTokenizer
    tok = WordPieceTokenizer(vocab_dir(tmp_path / "zh", HANZI) / "vocab.txt")
    cfg = load_config(None, ["task=cmrc2018", "kind=span", "max_seq_len=16",
                             "task_options={max_query_len: 4, max_answer_len: 4, n_best: 3}"])
    task = SpanTask(cfg, None)
    task.setup({"cls": tok.cls_token_id, "sep": tok.sep_token_id, "pad": tok.pad_token_id},
               16, 3, tok)
    context = "北京大学是中国的一所著名高校位于海淀区"
    docs = []
    for i in range(4):
        ctx = context[i:]
        start = ctx.index("海淀")
        docs.append(Document(f"s{i}", ctx, fields={
            "context": ctx, "question": "北京大学在哪里"[: 3 + i],
            "answers": [{"text": "海淀", "start": start}] if i != 3 else [],
            "references": ["海淀", "海淀区"] if i != 3 else []}))
    passes = _passes(task, docs, tok)
    return task, docs, _rows(passes, lambda m: rng.normal(size=(16, 2)) * 3), passes, tok


def case_multiple_choice(tmp_path, rng):
    from ernie_doc.kinds.choice import MultipleChoiceTask
    cfg = load_config(None, ["task=c3", "kind=multiple_choice", "max_seq_len=16"])
    task = MultipleChoiceTask(cfg, _reader(["0", "1", "2", "3"]))
    task.setup({"cls": 1, "sep": 2, "pad": 0}, 16, 4)
    docs = [Document(f"m{i}", fields={"context": "x" * (5 + 9 * i), "question": "q",
                                      "choices": ["a", "bb", "c", "dd"][: 2 + i % 3]},
                     label=str(i % 2)) for i in range(4)]
    tok = CharTokenizer()
    passes = _passes(task, docs, tok)
    return task, docs, _rows(passes, lambda m: rng.normal(size=4)), passes, tok


def case_pair_matching(tmp_path, rng):
    from ernie_doc.kinds.choice import PairMatchingTask
    cfg = load_config(None, ["task=cail2019_scm", "kind=pair_matching", "max_seq_len=11"])
    task = PairMatchingTask(cfg, _reader(["B", "C"]))
    task.setup({"cls": 1, "sep": 2, "pad": 0}, 11, 2)
    docs = [Document(f"p{i}", "a" * (3 + i), "BC"[i % 2],
                     fields={"A": "a" * (3 + i), "B": "b" * (2 + 2 * i), "C": "c" * 5})
            for i in range(4)]
    tok = CharTokenizer()
    passes = _passes(task, docs, tok)
    return task, docs, _rows(passes, lambda m: np.float32(rng.uniform())), passes, tok


def _hotpot(tmp_path, rng, stage):
    from test_hotpotqa import SMALL, YES, make_task, write_dev
    other = json.loads(json.dumps(SMALL))
    other["_id"], other["supporting_facts"] = "q3", [["beta", 0]]
    data = write_dev(tmp_path, [SMALL, YES, other])
    extra = {"evidence": "gold"} if stage == "answer" else {}
    task, tok = make_task(tmp_path, data, stage=stage, seq_len=16, stride=4, **extra)
    docs = task.read("dev")
    if stage == "answer":
        docs[0].fields["evidence"] = [0, 1]

    def out(m):
        o = {"para": rng.uniform(size=16), "sent": rng.uniform(size=16)}
        if stage == "answer":
            o["type"] = rng.dirichlet(np.ones(3))
            o["span"] = rng.normal(size=(16, 2)) * 3
        return o
    passes = _passes(task, docs, tok)
    return task, docs, _rows(passes, out), passes, tok


def case_hotpot_evidence(tmp_path, rng):
    return _hotpot(tmp_path, rng, "evidence")


def case_hotpot_answer(tmp_path, rng):
    return _hotpot(tmp_path, rng, "answer")


def case_openkp(tmp_path, rng):
    from test_openkp import PieceTokenizer, build_openkp_task, openkp_file
    docs = []
    for i in range(4):
        words = [f"w{int(k)}" for k in rng.integers(0, 9, size=12 + 5 * i)]
        docs.append((f"http://d{i}.org", words, [words[2:4]] if i != 3 else [["w50"]]))
    openkp_file(tmp_path / "OpenKPDev.jsonl", docs)
    tok = PieceTokenizer(split={"w3"})
    task = build_openkp_task(tmp_path, tok)
    docs = task.read("dev")
    passes = _passes(task, docs, tok)
    return task, docs, _rows(passes, lambda m: rng.normal(size=(12, 5))), passes, tok


def build(kind, tmp_path, seed=0):
    return globals()["case_" + kind](tmp_path, np.random.default_rng(seed))


GOLD_FIELDS = ("answers", "references", "supporting_facts", "answer", "answer_type",
               "answer_spans", "type", "keyphrases", "keyphrase_positions")


def without_gold(doc):
    """A copy of `doc` with only its input fields: what `ernie-doc predict` reads."""
    doc = copy.deepcopy(doc)
    doc.label = None
    for key in GOLD_FIELDS:
        doc.fields.pop(key, None)
    return doc


def members(steps):
    return [m for step in steps for m in step_members(step)]


# -- predict ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_each_document_predicts_alone_and_without_gold(kind, tmp_path):
    """The pipeline predicts a document as soon as its rows are in: predict([doc], {0: its
    rows}, [its passes]) is the record predict gives it among all documents, and no gold
    field is read (the record is the same from a copy without them)."""
    task, docs, rows, passes, tok = build(kind, tmp_path)
    records = task.predict(docs, rows, passes)
    assert [r["doc_id"] for r in records] == [d.doc_id for d in docs]
    for i, doc in enumerate(docs):
        assert task.predict([doc], {0: rows[i]}, [passes[i]]) == [records[i]]
        assert task.predict([without_gold(doc)], {0: rows[i]}, [passes[i]]) == [records[i]]
        assert json.loads(json.dumps(records[i])) == records[i]   # JSON as it is
        assert records[i]["segments"] == len(rows[i])
        assert not set(records[i]) & GOLD_KEYS[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_records_are_the_predictions_with_gold_added(kind, tmp_path):
    task, docs, rows, passes, tok = build(kind, tmp_path, seed=1)
    metrics, records = task.evaluate(docs, rows, passes)
    predicted = task.predict(docs, rows, passes)
    assert set(metrics) >= set(task.metric_names) - {"total", "skipped", "missing"}
    for record, prediction in zip(records, predicted):
        assert set(record) - set(prediction) == GOLD_KEYS[kind]
        assert {k: v for k, v in record.items() if k not in GOLD_KEYS[kind]} == prediction
        assert list(record)[-1] == "segments"


@pytest.mark.parametrize("kind", KINDS)
def test_documents_without_gold_read_alike_and_do_not_train(kind, tmp_path):
    task, docs, rows, passes, tok = build(kind, tmp_path)
    for i, doc in enumerate(docs):
        assert task.check_input(doc) is None and task.check_input(without_gold(doc)) is None
        gold = members(task.document_segments(doc, i, tok))
        bare = members(task.document_segments(without_gold(doc), i, tok))
        assert len(bare) == len(gold)
        for g, b in zip(gold, bare):
            np.testing.assert_array_equal(g.input_ids, b.input_ids)
            np.testing.assert_array_equal(g.attention_mask, b.attention_mask)
            assert sorted(g.targets) == sorted(b.targets)   # collated alike
            for key, value in b.targets.items():
                assert np.shape(value) == np.shape(g.targets[key]), key
            assert g.has_loss and not b.has_loss


def test_span_record_offsets_point_into_the_context(tmp_path):
    task, docs, rows, passes, tok = build("span", tmp_path)
    spans = 0
    for doc, record in zip(docs, task.predict(docs, rows, passes)):
        context = doc.fields["context"]
        if record["start"] is None:
            # the official pool (top n_best over all positions, then the context ones) can
            # leave no candidate: the official "empty" answer
            assert (record["pred"], record["score"], record["n_best"]) == ("empty", None, [])
            continue
        spans += 1
        assert record["pred"] == context[record["start"]:record["end"]]
        assert record["n_best"][0] == {"text": record["pred"], "score": record["score"],
                                       "start": record["start"], "end": record["end"]}
        assert 1 <= len(record["n_best"]) <= task.options["n_best"]
        scores = [c["score"] for c in record["n_best"]]
        assert scores == sorted(scores, reverse=True)
        for c in record["n_best"]:
            assert c["text"] == context[c["start"]:c["end"]]
        assert len({c["text"] for c in record["n_best"]}) == len(record["n_best"])
    assert spans >= 2
    # a question whose rows were all lost predicts the official "empty", with None offsets
    [empty] = task.predict(docs[:1], {}, passes[:1])
    assert (empty["pred"], empty["score"], empty["start"], empty["n_best"]) == ("empty", None,
                                                                                None, [])


def test_multiple_choice_record_names_the_chosen_text(tmp_path):
    task, docs, rows, passes, tok = build("multiple_choice", tmp_path)
    for doc, record in zip(docs, task.predict(docs, rows, passes)):
        assert record["choice"] == doc.fields["choices"][int(record["pred"])]
        assert len(record["probs"]) == len(doc.fields["choices"])
        assert sum(record["probs"]) == pytest.approx(1.0, abs=1e-5)


def test_pretraining_has_no_document_prediction():
    from ernie_doc.kinds.pretraining import PretrainingTask
    with pytest.raises(NotImplementedError, match="pretraining has no per-document"):
        PretrainingTask.predict(None, [], {}, [])


# -- check_input ------------------------------------------------------------------------------
def _doc(text=None, **fields):
    return Document("x", text, fields=fields)


CHECKS = [
    ("classification", _doc("a text"), None),
    ("classification", Document("x", ids=[5, 6, 7]), None),
    ("classification", _doc(), "missing field 'text'"),
    ("classification", _doc("  \n"), "empty text"),
    ("classification", _doc(3), "text must be a string"),
    ("classification", Document("x", ids=[]), "empty text"),
    ("span", _doc(context="北京", question="哪里"), None),
    ("span", _doc(context="北京"), "missing field 'question'"),
    ("span", _doc(context=" ", question="哪里"), "empty context"),
    ("span", _doc(context="北京", question=["哪里"]), "question must be a string, got list"),
    ("multiple_choice", _doc(context="c", question="q", choices=["a", "b"]), None),
    ("multiple_choice", _doc(context="c", question="q"), "missing field 'choices'"),
    ("multiple_choice", _doc(context="c", question="q", choices=[]),
     "choices must be a non-empty list of strings"),
    ("multiple_choice", _doc(context="c", question="q", choices=["a", 1]),
     "choices must be a non-empty list of strings"),
    ("multiple_choice", _doc(context="c", question="q", choices=list("abcde")),
     "5 choices, at most 4"),
    ("pair_matching", _doc(A="a", B="b", C="c"), None),
    ("pair_matching", _doc(A="a", B="b"), "missing field 'C'"),
    ("pair_matching", _doc(A="a", B="", C="c"), "empty B"),
    ("hotpot_evidence", _doc(question="q", paragraphs=[["t", ["s ."]]]), None),
    ("hotpot_evidence", _doc(paragraphs=[["t", ["s ."]]]), "missing field 'question'"),
    ("hotpot_evidence", _doc(question="q", paragraphs=[]), "paragraphs must be a non-empty"),
    ("hotpot_evidence", _doc(question="q", paragraphs=[["t", "s ."]]),
     "paragraph 0 is not [title, [sentence, ...]]"),
    ("openkp", _doc("cheap flights"), None),
    ("openkp", _doc(words=["cheap", "flights"]), None),
    ("openkp", _doc(), "missing field 'text'"),
    ("openkp", Document("x", ids=[5, 6]), "text must be a string, got list"),
    ("openkp", _doc("http://a.org www.b.com"), "no words left once URLs are removed"),
    ("openkp", _doc(words=["cheap", ""]), "words must be a non-empty list of non-empty strings"),
]


@pytest.mark.parametrize("kind, doc, problem", CHECKS)
def test_check_input_names_the_problem_in_one_line(kind, doc, problem, tmp_path):
    task = build(kind, tmp_path)[0]
    got = task.check_input(doc)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got and "\n" not in got, got


INPUT_FIELDS = {"classification": ("text",), "span": ("context", "question"),
                "multiple_choice": ("context", "question", "choices"),
                "pair_matching": ("A", "B", "C"), "hotpot_evidence": ("question", "paragraphs"),
                "hotpot_answer": ("question", "paragraphs"), "openkp": ("text",)}


@pytest.mark.parametrize("kind", KINDS)
def test_input_fields_are_what_check_input_requires(kind, tmp_path):
    task, docs, *_ = build(kind, tmp_path)
    assert type(task).input_fields == INPUT_FIELDS[kind]
    for name in task.input_fields:
        doc = without_gold(docs[0])
        doc.fields.pop("words", None)   # OpenKP reads the reader's words before the text
        if name == "text":
            doc.text = None
        else:
            del doc.fields[name]
        assert task.check_input(doc) == f"missing field {name!r}"


def test_hotpot_answer_stage_reads_stage_one_evidence_for_a_new_question(tmp_path):
    """A question to predict has no `evidence` field: stage 2 reads its doc_id's stage-1
    selection (check_input says when the file has none), or every paragraph with evidence:
    gold (a new question has no supporting facts)."""
    from test_hotpotqa import SMALL, make_task, write_dev
    data = write_dev(tmp_path, [SMALL])
    stage1 = tmp_path / "predictions_test.jsonl"
    stage1.write_text(json.dumps({"doc_id": "q1", "paragraphs": [
        {"index": 1, "title": "beta", "prob": 0.9}]}) + "\n")
    task, tok = make_task(tmp_path, data, stage="answer", evidence_file=str(stage1))
    doc = without_gold(task.read("dev")[0])
    doc.fields.pop("evidence")
    assert task.check_input(doc) is None
    segments = task.document_segments(doc, 0, tok)
    assert {int(p) for s in segments for p in s.meta["layout"].para} == {1}
    assert not any(s.has_loss for s in segments)
    rows = {0: [(s.seg_index, {"para": np.zeros(32), "sent": np.zeros(32),
                               "type": np.array([1.0, 0.0, 0.0]), "span": np.zeros((32, 2))})
                for s in segments]}
    [record] = task.predict([doc], rows, [reading_passes(segments, False)])
    assert record["evidence"] == ["beta"] and record["answer"] == "yes"
    doc.doc_id = "elsewhere"
    problem = task.check_input(doc)
    assert "no stage-1 evidence for question 'elsewhere'" in problem and "split" not in problem

    task, tok = make_task(tmp_path, data, stage="answer", evidence="gold")
    assert task.check_input(doc) is None
    segments = task.document_segments(doc, 0, tok)
    assert {int(p) for s in segments for p in s.meta["layout"].para} == {0, 1}


def test_openkp_document_given_as_text_reads_as_the_reader_read_it(tmp_path):
    """A web page to predict is its text: its words are cleaned as the reader cleans them
    (URL words dropped), so the segments and the record are those of the reader's document."""
    task, docs, rows, passes, tok = build("openkp", tmp_path)
    for i, doc in enumerate(docs):
        words = doc.fields["words"]
        text = " ".join(words[:3] + ["(http://x.org/a", "www.y.com"] + words[3:])
        bare = Document(doc.doc_id, text)
        assert task.check_input(bare) is None
        got = members(task.document_segments(bare, i, tok))
        want = members(passes[i])[len(got):]    # the retrospective pass
        assert [g.input_ids.tolist() for g in got] == [w.input_ids.tolist() for w in want]
        assert task.predict([bare], {0: rows[i]}, [passes[i]]) == \
            task.predict([doc], {0: rows[i]}, [passes[i]])
