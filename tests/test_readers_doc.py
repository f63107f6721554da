"""Readers of HotpotQA, C3, CAIL2019-SCM and OpenKP: fixtures in the official formats, the exact
Document fields, every bad-input case (a one-line DataError naming file and line / id, or a
counted skip), and the real ../shared data when present."""
import json
import logging

import pytest
from helpers import error, shared_path, write

from ernie_doc.data.document import Document
from tasks.c3 import reader as c3
from tasks.cail2019_scm import reader as scm
from tasks.hotpotqa import reader as hotpot
from tasks.openkp import reader as openkp


def jsonl(*records):
    return "".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) + "\n"
                   for r in records)



@pytest.fixture
def warnings(caplog):
    """The warning lines of the readers' logger (its propagation may be off after a run set
    up logging, so caplog's handler is attached to it directly)."""
    logger = logging.getLogger("ernie_doc.train")
    direct = not logger.propagate  # else caplog's root handler sees the records already
    if direct:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING)
    yield lambda: [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if direct:
        logger.removeHandler(caplog.handler)


# ------------------------------------------------------------------------------- hotpotqa

def hotpot_record(qid, question="Which city is the capital of France?", answer="Paris",
                  facts=(("France", 0),), context=None, **extra):
    context = context if context is not None else [
        ["France", ["France is a country.", " Its capital is Paris, and paris is big."]],
        ["Paris", ["Paris is a city.", " Paris hosts the Louvre."]],
    ]
    record = {"_id": qid, "question": question, "answer": answer,
              "supporting_facts": [list(f) for f in facts], "context": context,
              "type": "bridge", "level": "easy"}
    record.update(extra)
    return record


def test_hotpotqa_fields(tmp_path):
    records = [
        hotpot_record("q1", facts=[("France", 1), ("Paris", 0)]),
        hotpot_record("q2", question="Is Paris in France?", answer="yes", type="comparison"),
        hotpot_record("q3", answer="the louvre"),  # only a case-insensitive occurrence
        hotpot_record("q4", answer="aa", context=[["T", ["aaa", "b"]]], facts=[("T", 0)]),
    ]
    root = write(tmp_path, {"hotpot_dev_distractor_v1.json": records})
    docs = hotpot.read(root, "dev", {})
    assert [d.doc_id for d in docs] == ["q1", "q2", "q3", "q4"]
    q1 = docs[0]
    assert q1 == Document("q1", "Which city is the capital of France?\n"
                                "France is a country. Its capital is Paris, and paris is big.\n"
                                "Paris is a city. Paris hosts the Louvre.", None, fields={
        "question": "Which city is the capital of France?", "answer": "Paris", "type": "bridge",
        "paragraphs": records[0]["context"], "supporting_facts": [["France", 1], ["Paris", 0]],
        "answer_type": "span",
        # case-sensitive matches only: "paris" at [0, 1, 31] is not one
        "answer_spans": [[0, 1, 16], [1, 0, 0], [1, 1, 1]]})
    assert docs[1].fields["answer_type"] == "yes" and docs[1].fields["answer_spans"] == []
    assert docs[1].fields["type"] == "comparison"
    assert docs[2].fields["answer_type"] == "span"
    assert docs[2].fields["answer_spans"] == [[1, 1, 13]]
    assert docs[3].fields["answer_spans"] == [[0, 0, 0], [0, 0, 1]]  # overlapping ones too
    para, sent, start = q1.fields["answer_spans"][0]
    assert q1.fields["paragraphs"][para][1][sent][start:start + 5] == "Paris"
    assert hotpot.find_answer("no", [["T", ["No, no."]]]) == [[0, 0, 4]]


def test_hotpotqa_missing_supporting_facts_are_counted_skips(tmp_path, warnings):
    records = [hotpot_record("q1", facts=[("France", 0), ("Nowhere", 0), ("Paris", 2)]),
               hotpot_record("q2", facts=[("Paris", 1), ("France", -1)])]
    root = write(tmp_path, {"hotpot_dev_distractor_v1.json": records})
    docs = hotpot.read(root, "dev", {})
    assert [d.fields["supporting_facts"] for d in docs] == [[["France", 0]], [["Paris", 1]]]
    [line] = warnings()
    assert "skipped 3 of 5 supporting facts: supporting fact points at a missing sentence" in line
    assert "hotpot_dev_distractor_v1.json _id q1" in line


def test_hotpotqa_unfound_train_answer_skips_the_question(tmp_path, warnings):
    records = [hotpot_record("q1"), hotpot_record("q2", answer="Berlin"),
               hotpot_record("q3", answer="no")]
    root = write(tmp_path, {"hotpot_train_v1.1.json": records,
                            "hotpot_dev_distractor_v1.json": records})
    assert [d.doc_id for d in hotpot.read(root, "train", {})] == ["q1", "q3"]
    [line] = warnings()
    assert "skipped 1 of 3 questions: span answer occurs in no sentence" in line
    assert "_id q2" in line
    dev = hotpot.read(root, "dev", {})  # dev keeps it: the answer string is still scored
    assert [d.doc_id for d in dev] == ["q1", "q2", "q3"]
    assert dev[1].fields["answer_spans"] == []


def test_hotpotqa_test_file_without_answers(tmp_path):
    record = {"_id": "t1", "question": "Who?", "context": [["A", ["Alice met Bob."]]]}
    root = write(tmp_path, {"hotpot_test_fullwiki_v1.json": [record]})
    [doc] = hotpot.read(root, "test", {})
    assert doc.fields == {"question": "Who?", "answer": None, "type": None,
                          "paragraphs": [["A", ["Alice met Bob."]]], "supporting_facts": [],
                          "answer_type": None, "answer_spans": []}
    root = write(tmp_path, {"hotpot_dev_distractor_v1.json": [record]})
    error(lambda: hotpot.read(root, "dev", {}), "hotpot_dev_distractor_v1.json", "_id t1",
          "no 'answer'")


def test_hotpotqa_ratio_split_of_one_file(tmp_path):
    records = [hotpot_record(f"q{i}") for i in range(40)]
    root = write(tmp_path, {"first.json": records})
    options = {"file": "first.json", "dev_ratio": 0.25}
    train, dev = hotpot.read(root, "train", options), hotpot.read(root, "dev", options)
    assert len(train) + len(dev) == 40 and not {d.doc_id for d in train} & {d.doc_id for d in dev}
    assert 0 < len(dev) < 20
    assert hotpot.read(root, "dev", options) == dev
    error(lambda: hotpot.read(root, "test", options), "split 'test'")
    error(lambda: hotpot.read(root, "train", {"file": "first.json"}), "'file' needs 'dev_ratio'")
    assert len(hotpot.read(root, "dev", {"files": {"dev": "first.json"}})) == 40


@pytest.mark.parametrize("records, parts", [
    ([hotpot_record("q1", question="  ")], ["_id q1", "empty or missing question"]),
    ([hotpot_record("q1", context=[])], ["_id q1", "empty context"]),
    ([hotpot_record("q1", context=[["T", ["", " "]]])], ["_id q1", "empty context"]),
    ([hotpot_record("q1", context=[["T", "not a list"]])], ["_id q1", "paragraph 0"]),
    ([hotpot_record("q1", facts=[("France",)])], ["_id q1", "supporting fact"]),
    ([hotpot_record("q1", answer="")], ["_id q1", "answer is empty"]),
    ([hotpot_record("q1"), hotpot_record("q1")], ["duplicate _id 'q1'"]),
    ([{"question": "x"}], ["question 0", "'_id'"]),
    ({"_id": "q1"}, ["expected a JSON list"]),
])
def test_hotpotqa_bad_input(tmp_path, records, parts):
    root = write(tmp_path, {"hotpot_dev_distractor_v1.json": records})
    error(lambda: hotpot.read(root, "dev", {}), "hotpot_dev_distractor_v1.json", *parts)


def test_hotpotqa_malformed_json_and_missing_file(tmp_path):
    root = write(tmp_path, {"hotpot_dev_distractor_v1.json": '[\n{"_id": "q1",\n'})
    error(lambda: hotpot.read(root, "dev", {}), "hotpot_dev_distractor_v1.json:3:",
          "invalid JSON")
    error(lambda: hotpot.read(root, "train", {}), "hotpot_train_v1.1.json")
    error(lambda: hotpot.read(root, "dev", {"dev_ration": 0.1}), "unknown key 'dev_ration'")


def test_hotpotqa_real_dev_first100(warnings):
    path = shared_path("data", "hotpotqa", "hotpot_dev_distractor_first100.json")
    docs = hotpot.read(path.parent, "dev", {"files": {"dev": path.name}})
    assert len(docs) == 100 and len({d.doc_id for d in docs}) == 100
    assert warnings() == []  # no supporting fact points at a missing sentence
    assert sum(len(d.fields["supporting_facts"]) for d in docs) == 243
    kinds = [d.fields["answer_type"] for d in docs]
    assert (kinds.count("span"), kinds.count("yes"), kinds.count("no")) == (88, 5, 7)
    for doc in docs:
        assert len(doc.fields["paragraphs"]) in (2, 10)
        answer = doc.fields["answer"]
        if doc.fields["answer_type"] == "span":
            assert doc.fields["answer_spans"]  # every span answer is found, case-sensitively
            for para, sent, start in doc.fields["answer_spans"]:
                sentence = doc.fields["paragraphs"][para][1][sent]
                assert sentence[start:start + len(answer)] == answer
    options = {"file": path.name, "dev_ratio": 0.2}
    train = hotpot.read(path.parent, "train", options)
    dev = hotpot.read(path.parent, "dev", options)
    assert (len(train), len(dev)) == (74, 26)


# ------------------------------------------------------------------------------------ c3

C3_D = [[["男：你好。", "女：你好，请坐。"],
         [{"question": "他们在哪儿?", "choice": ["家", "学校", "医院"], "answer": "学校"},
          {"question": "女的说什么?", "choice": ["你好", "再见"], "answer": "你好"}], "1-1"]]
C3_M = [[["第一段。", "第二段。"],
         [{"question": "文章讲了什么?", "choice": ["甲", "乙", "丙", "丁"], "answer": "丁"}],
         "1-1"]]


def test_c3_reads_d_and_m(tmp_path):
    root = write(tmp_path, {"c3-d-dev.json": C3_D, "c3-m-dev.json": C3_M, "c3-m-test.json": C3_M})
    assert c3.labels(root, {}) == ["0", "1", "2", "3"]
    context = "男：你好。\n女：你好，请坐。"
    assert c3.read(root, "dev", {}) == [
        Document("d-1-1-0", context, "1", fields={
            "question": "他们在哪儿?", "choices": ["家", "学校", "医院"], "context": context}),
        Document("d-1-1-1", context, "0", fields={
            "question": "女的说什么?", "choices": ["你好", "再见"], "context": context}),
        # the same id in the m file is another text: the subset keeps doc_ids unique
        Document("m-1-1-0", "第一段。\n第二段。", "3", fields={
            "question": "文章讲了什么?", "choices": ["甲", "乙", "丙", "丁"],
            "context": "第一段。\n第二段。"}),
    ]
    assert [d.doc_id for d in c3.read(root, "test", {})] == ["m-1-1-0"]  # only m present
    assert [d.doc_id for d in c3.read(root, "dev", {"subsets": ["m"]})] == ["m-1-1-0"]
    error(lambda: c3.read(root, "test", {"subsets": ["d"]}), "c3-d-test.json", "does not exist")
    error(lambda: c3.read(root, "train", {}), "no c3-d-train.json or c3-m-train.json")
    error(lambda: c3.read(root, "dev", {"subsets": ["x"]}), "'subsets'")
    mine = c3.read(root, "train", {"files": {"train": ["c3-m-dev.json", "c3-d-dev.json"]}})
    assert [d.doc_id for d in mine] == ["m-1-1-0", "d-1-1-0", "d-1-1-1"]
    error(lambda: c3.read(root, "dev", {"files": {}, "subsets": ["d"]}), "set one")


def c3_question(**item):
    base = {"question": "问题?", "choice": ["甲", "乙"], "answer": "甲"}
    base.update(item)
    return [[["上下文。"], [{"question": "好?", "choice": ["是", "否"], "answer": "是"}, base],
             "7-9"]]


@pytest.mark.parametrize("entries, parts", [
    (c3_question(choice=[]), ["entry 0 (id 7-9) question 1", "empty choice list"]),
    (c3_question(choice=["a", "b", "c", "d", "e"], answer="a"),
     ["question 1", "5 choices, C3 has at most 4"]),
    (c3_question(answer="丙"), ["question 1", "answer '丙' is not among the choices"]),
    (c3_question(answer=None), ["question 1", "answer None"]),
    (c3_question(question=""), ["question 1", "empty or missing question"]),
    ([[["", " "], [{"question": "q", "choice": ["a"], "answer": "a"}], "5"]],
     ["entry 0 (id 5)", "empty context"]),
    ([[["x"], [], "5"]], ["entry 0 (id 5)", "no questions"]),
    ([[["x"], [{"question": "q", "choice": ["a"], "answer": "a"}]]], ["entry 0", "expected"]),
    (C3_D + C3_D, ["entry 1 (id 1-1)", "duplicate id"]),
    ({"a": 1}, ["expected a JSON list"]),
])
def test_c3_bad_input(tmp_path, entries, parts):
    root = write(tmp_path, {"c3-d-train.json": entries})
    error(lambda: c3.read(root, "train", {}), "c3-d-train.json", *parts)


def test_c3_real_files():
    root = shared_path("data", "c3")
    counts = {}
    for split in ("train", "dev", "test"):
        docs = c3.read(root, split, {})
        assert len({d.doc_id for d in docs}) == len(docs)
        assert {d.label for d in docs} == {"0", "1", "2", "3"}  # test has answers too
        assert all(2 <= len(d.fields["choices"]) <= 4 for d in docs)
        assert all(d.fields["choices"][int(d.label)] for d in docs)
        counts[split] = (len(c3.read(root, split, {"subsets": ["d"]})),
                         len(c3.read(root, split, {"subsets": ["m"]})), len(docs))
    assert counts == {"train": (5856, 6013, 11869), "dev": (1825, 1991, 3816),
                      "test": (1890, 2002, 3892)}


# -------------------------------------------------------------------------- cail2019_scm

def scm_record(label="B", **extra):
    record = {"A": "甲借款一万元。", "B": "乙借款两万元。", "C": "丙欠货款。"}
    if label is not None:
        record["label"] = label
    record.update(extra)
    return record


def test_cail2019_scm_fields(tmp_path):
    root = write(tmp_path, {
        "train.json": jsonl(scm_record("B"), "\n", scm_record("C")),
        "valid.json": jsonl(scm_record("C", id=17)),
        "dev.json": jsonl(scm_record("B")),
        "cail2019_scm_test.json": jsonl(scm_record("B")),
    })
    assert scm.labels(root, {}) == ["B", "C"]
    fields = {"A": "甲借款一万元。", "B": "乙借款两万元。", "C": "丙欠货款。"}
    assert scm.read(root, "train", {}) == [Document("1", "甲借款一万元。", "B", fields=fields),
                                           Document("3", "甲借款一万元。", "C", fields=fields)]
    assert scm.read(root, "dev", {}) == [Document("17", "甲借款一万元。", "C", fields=fields)]
    assert scm.read(root, "dev", {"files": {"dev": "dev.json"}})[0].label == "B"
    assert len(scm.read(root, "test", {})) == 1


def test_cail2019_scm_unlabeled(tmp_path):
    root = write(tmp_path, {"test.json": jsonl(scm_record(None), scm_record("C")),
                            "input.txt": jsonl(scm_record(None))})
    error(lambda: scm.read(root, "test", {}), "test.json:1:", "no 'label'", "unlabeled")
    docs = scm.read(root, "test", {"unlabeled": True})
    assert [d.label for d in docs] == [None, "C"]
    # the competition's stage input is read as unlabeled without the option
    assert scm.read(root, "test", {"files": {"test": "input.txt"}})[0].label is None
    error(lambda: scm.read(root, "test", {"files": {"test": "input.txt"}, "unlabeled": False}),
          "input.txt:1:", "no 'label'")
    error(lambda: scm.read(root, "test", {"unlabeled": "yes"}), "'unlabeled'")


@pytest.mark.parametrize("content, parts", [
    (jsonl(scm_record(), '{"A": "x", \n'), ["train.json:2:", "invalid JSON"]),
    (jsonl(scm_record(), scm_record(B="  ")), ["train.json:2:", "empty case B"]),
    (jsonl(scm_record(A="")), ["train.json:1:", "empty case A"]),
    (jsonl(scm_record(C=None)), ["train.json:1:", "'C' is missing"]),
    (jsonl(scm_record(None)), ["train.json:1:", "no 'label'"]),
    (jsonl(scm_record("A")), ["train.json:1:", "label 'A' is not in the label set"]),
    (jsonl(scm_record(id=1), scm_record(id=1)), ["train.json:2:", "duplicate id '1'"]),
    (jsonl("[1, 2]\n"), ["train.json:1:", "expected a JSON object"]),
    ("\n", ["train.json", "no examples for split 'train'"]),
])
def test_cail2019_scm_bad_input(tmp_path, content, parts):
    root = write(tmp_path, {"train.json": content})
    error(lambda: scm.read(root, "train", {}), *parts)


def test_cail2019_scm_real_stage_input():
    root = shared_path("data", "cail2019_scm")
    options = {"files": {"test": "input.jsonl"}, "unlabeled": True}
    docs = scm.read(root, "test", options)
    assert len(docs) == 500 and {d.label for d in docs} == {None}
    assert [d.doc_id for d in docs[:2]] == ["1", "2"]
    assert all(d.text == d.fields["A"] and d.fields["B"] and d.fields["C"] for d in docs)
    assert scm.read(root, "test", {}) == docs  # input.jsonl is the test fallback
    error(lambda: scm.read(root, "test", dict(options, unlabeled=False)), "input.jsonl:1:",
          "no 'label'")


# -------------------------------------------------------------------------------- openkp

def kp_record(url, text, phrases=None, vdom="[]"):
    record = {"url": url, "text": text, "VDOM": vdom}
    if phrases is not None:
        record["KeyPhrases"] = phrases
    return record


def test_openkp_fields(tmp_path):
    text = ("Deep Learning http://x.org/a is fun . see www.example.com (https://t.co/z) "
            "deep learning and Machine learning")
    root = write(tmp_path, {
        "OpenKPDev.jsonl": jsonl(kp_record("http://a.com", text,
                                           [["deep", "learning"], ["machine learning"],
                                            ["Deep", "Learning"], ["absent"]])),
        "OpenKPEvalPublic.jsonl": jsonl(kp_record("http://b.com", "Only  words\there")),
    })
    words = ["Deep", "Learning", "is", "fun", ".", "see", "deep", "learning", "and", "Machine",
             "learning"]
    [doc] = openkp.read(root, "dev", {})
    assert doc == Document("http://a.com", " ".join(words), None, fields={
        "words": words,
        "keyphrases": [["deep", "learning"], ["machine learning"], ["Deep", "Learning"],
                       ["absent"]],
        "keyphrase_positions": [[0, 1], [6, 7], [9, 10]]})
    [kept] = openkp.read(root, "dev", {"remove_urls": False})
    assert kept.fields["words"][2] == "http://x.org/a"
    assert kept.fields["keyphrase_positions"] == [[0, 1], [9, 10], [12, 13]]
    [test] = openkp.read(root, "test", {})
    assert test == Document("http://b.com", "Only words here", None, fields={
        "words": ["Only", "words", "here"], "keyphrases": [], "keyphrase_positions": []})
    assert openkp.find_phrases(["a", "A", "a"], [["a", "a"]]) == [[0, 1], [1, 2]]


def test_openkp_counted_skips(tmp_path, warnings):
    root = write(tmp_path, {"OpenKPTrain.jsonl": jsonl(
        kp_record("u1", "red apple pie", [["apple"]]),
        kp_record("u2", "green pear", [["banana"]]),
        kp_record("u1", "red apple pie again", [["pie"]]),
        kp_record("u3", "http://only.url www.x.y", [["x"]]),
        kp_record("u4", "blue sky", [["sky"], ["sea"]]),
    )})
    docs = openkp.read(root, "train", {})
    # the repeated u1 keeps its last record ("pie" at word 2), at the url's first place
    assert [(d.doc_id, d.fields["keyphrase_positions"]) for d in docs] == [
        ("u1", [[2, 2]]), ("u4", [[1, 1]])]
    lines = warnings()
    assert len(lines) == 3
    assert any("skipped 1 of 5 documents: none of its keyphrases occurs in the text "
               "(first at " in line and "OpenKPTrain.jsonl:2)" in line for line in lines)
    assert any("repeated url (the last record is kept)" in line
               and "OpenKPTrain.jsonl:1)" in line for line in lines)
    assert any("no words left once URLs are removed" in line for line in lines)
    # dev keeps a document whose keyphrases do not occur: it is still scored
    root = write(tmp_path, {"OpenKPDev.jsonl": jsonl(kp_record("u2", "green pear", [["x"]]))})
    assert openkp.read(root, "dev", {})[0].fields["keyphrase_positions"] == []


@pytest.mark.parametrize("content, parts", [
    (jsonl(kp_record("u1", "a b", [["a"]]), '{"url": \n'), ["OpenKPDev.jsonl:2:", "invalid JSON"]),
    (jsonl(kp_record("u1", "  ", [["a"]])), ["OpenKPDev.jsonl:1:", "empty text"]),
    (jsonl({"text": "a b", "KeyPhrases": [["a"]]}), ["OpenKPDev.jsonl:1:", "'url' is missing"]),
    (jsonl(kp_record("", "a b", [["a"]])), ["OpenKPDev.jsonl:1:", "'url'"]),
    (jsonl({"url": "u1", "KeyPhrases": [["a"]]}), ["OpenKPDev.jsonl:1:", "'text' is missing"]),
    (jsonl(kp_record("u1", "a b")), ["OpenKPDev.jsonl:1:", "no 'KeyPhrases'"]),
    (jsonl(kp_record("u1", "a b", ["a"])), ["OpenKPDev.jsonl:1:", "not a list of lists"]),
    ("\n", ["OpenKPDev.jsonl", "no examples for split 'dev'"]),
])
def test_openkp_bad_input(tmp_path, content, parts):
    root = write(tmp_path, {"OpenKPDev.jsonl": content})
    error(lambda: openkp.read(root, "dev", {}), *parts)


def test_openkp_options(tmp_path):
    root = write(tmp_path, {"kp.jsonl": jsonl(kp_record("u1", "a b", [["b"]]))})
    assert openkp.read(root, "train", {"files": {"train": "kp.jsonl"}})[0].doc_id == "u1"
    error(lambda: openkp.read(root, "train", {}), "OpenKPTrain.jsonl")
    error(lambda: openkp.read(root, "train", {"files": {"train": "kp.jsonl"},
                                              "remove_urls": "no"}), "'remove_urls'")
    error(lambda: openkp.read(root, "train", {"vdom": True}), "unknown key 'vdom'")
