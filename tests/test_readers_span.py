"""Span-extraction QA readers (ernie_doc/data/squad.py; tasks cmrc2018, drcd, dureader,
triviaqa): fixtures in the official formats, every bad-input case (a one-line DataError naming
the file and the question, or a counted skip), exact answer offsets, and the real ../shared
data when present."""
import io
import json
import logging
import re
import tarfile

import pytest
from helpers import error, shared_path, write

from ernie_doc.data.squad import align_answer, find_all, read_squad
from tasks.cmrc2018 import reader as cmrc2018
from tasks.drcd import reader as drcd
from tasks.dureader import reader as dureader
from tasks.triviaqa import reader as triviaqa

SKIP_LINE = re.compile(r"^(.*): skipped (\d+)(?: of (\d+))? (\w+): (.*) \(first at (.*)\)$")
# an item corrected and kept (Skips.fixed): "<file>: realigned the answer_start of 7 of 9657
# answers (answers kept; first at ...)", parsed to the key (what, "realigned the answer_start of")
KEPT_LINE = re.compile(r"^(.*): (\D+) (\d+)(?: of (\d+))? (\w+) \(\5 kept; first at (.*)\)$")
REALIGNED = ("answers", "realigned the answer_start of")


@pytest.fixture
def skips(caplog):
    """Call it to get {(what, reason): (count, total, first location)} of the Skips reports
    logged so far (ernie_doc.train may not propagate once a test set up logging, so caplog's
    handler is attached to it directly)."""
    logger = logging.getLogger("ernie_doc.train")
    direct = not logger.propagate
    if direct:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING)

    def parse():
        found = {}
        for record in caplog.records:
            match = SKIP_LINE.match(record.getMessage())
            if match:
                _, n, total, what, reason, first = match.groups()
                found[(what, reason)] = (int(n), total and int(total), first)
            kept = KEPT_LINE.match(record.getMessage())
            if kept:   # never said skipped
                assert "skipped" not in record.getMessage()
                _, action, n, total, what, first = kept.groups()
                found[(what, action)] = (int(n), total and int(total), first)
        return found

    yield parse
    if direct:
        logger.removeHandler(caplog.handler)


def check_answers(docs):
    """Every answer is verified against its context and the schema holds."""
    for doc in docs:
        assert doc.label is None and doc.text == doc.fields["context"]
        assert isinstance(doc.fields["question"], str) and doc.fields["question"].strip()
        assert isinstance(doc.fields["references"], list)
        for a in doc.fields["answers"]:
            assert set(a) == {"text", "start"}
            assert doc.text[a["start"]:a["start"] + len(a["text"])] == a["text"]


# -------------------------------------------------------------------------- squad helpers

def test_find_all_exact_overlapping_case_and_whole_words():
    assert find_all("aaaa", "aa") == [0, 1, 2]
    assert find_all("abc", "") == [] and find_all("abc", "x") == []
    text = "The theme: there is the THE. other the"
    assert find_all(text, "the") == [4, 11, 20, 30, 35]
    assert find_all(text, "the", ignore_case=True, whole_word=True) == [0, 20, 24, 35]
    # Offsets stay those of the original string even where lower() would change lengths.
    assert find_all("İİ Abc", "aBC", ignore_case=True) == [3]  # "İİ".lower() has 4 chars
    assert find_all("a+b (a+b) xa+b", "a+b", whole_word=True) == [0, 5]


def test_align_answer():
    context = "北京 上海 北京 广州 北京"
    assert align_answer(context, "北京", 6) == 6            # right as given
    assert align_answer(context, "北京", 5) == 6            # nearest occurrence
    assert align_answer(context, "北京", 3) == 0            # tie (0 and 6): the earlier
    assert align_answer(context, "北京", 100) == 12
    assert align_answer(context, "北京", -1) == 0
    assert align_answer(context, "北京", None) == 0
    assert align_answer(context, "深圳", 0) is None


# ------------------------------------------------------------------ SQuAD-style (CMRC, DRCD)

CONTEXT = "《战国无双3》是由光荣和ω-force开发的。光荣是日本公司。"


def squad(*qas, context=CONTEXT, title="战国无双3"):
    return {"version": "v1.0", "data": [{"id": "DEV_0", "title": title, "paragraphs": [
        {"id": "DEV_0", "context": context, "qas": list(qas)}]}]}


def qa(qid, answers, question="谁开发的？"):
    return {"question": question, "id": qid,
            "answers": [{"text": t, "answer_start": s} for t, s in answers]}


def test_squad_fields_alignment_and_counted_skips(tmp_path, skips):
    data = squad(qa("Q0", [("光荣和ω-force", 9), ("光荣和ω-force", 9), ("光荣", 9)]),
                 qa("Q1", [("光荣", 20)]),         # wrong start: realigned to 23, not 9
                 qa("Q2", [("任天堂", 9), ("光荣", -1)]),  # not in context; -1 start
                 qa("Q3", [("索尼", 3)]),          # no position at all
                 qa("Q4", []))                     # unanswered (dev/test keep it)
    path = write(tmp_path, {"dev.json": data}) / "dev.json"
    docs = read_squad(path, "dev")
    check_answers(docs)
    assert [d.doc_id for d in docs] == ["Q0", "Q1", "Q2", "Q3", "Q4"]
    q0 = docs[0]
    assert q0.text == CONTEXT and q0.fields["title"] == "战国无双3"
    assert q0.fields == {"question": "谁开发的？", "context": CONTEXT, "title": "战国无双3",
                         "answers": [{"text": "光荣和ω-force", "start": 9},
                                     {"text": "光荣", "start": 9}],  # the repeat merged
                         "references": ["光荣和ω-force", "光荣和ω-force", "光荣"]}
    assert docs[1].fields["answers"] == [{"text": "光荣", "start": 23}]
    assert CONTEXT[23:25] == "光荣"
    assert docs[2].fields["answers"] == [{"text": "光荣", "start": 9}]
    assert docs[2].fields["references"] == ["任天堂", "光荣"]
    assert docs[3].fields["answers"] == [] and docs[3].fields["references"] == ["索尼"]
    assert docs[4].fields["answers"] == docs[4].fields["references"] == []
    found = skips()
    assert found[REALIGNED][:2] == (2, 7)
    assert found[("answers", "answer text not found in context")] == (
        2, 7, "data[0].paragraphs[0].qas[2].answers[0] (id 'Q2')")
    assert not any(what == "questions" for what, _ in found)

    # Train drops the questions left without a position, counted.
    train = read_squad(path, "train")
    assert [d.doc_id for d in train] == ["Q0", "Q1", "Q2"]
    assert skips()[("questions", "no answer found in context")] == (
        2, 5, "data[0].paragraphs[0].qas[3] (id 'Q3')")


def test_squad_bad_input(tmp_path):
    def read(data, split="dev", **kw):
        path = write(tmp_path, {"f.json": data}) / "f.json"
        return lambda: read_squad(path, split, **kw)

    good = qa("Q0", [("光荣", 9)])
    at = "data[0].paragraphs[0].qas[1] (id 'Q1')"
    error(read(squad(good, qa("Q1", [("光荣", 9)], question=" "))),
          "f.json: " + at + ": empty question", "skip_empty_questions")
    error(read(squad(good, {"id": "Q1", "answers": []})), at, "empty question")
    error(read(squad(good, qa("Q1", [("光荣", 9)], question=3))), at, "not a string")
    error(read(squad(good, context=" ")), "qas[0] (id 'Q0'): empty context")
    no_context = squad(good)
    del no_context["data"][0]["paragraphs"][0]["context"]
    error(read(no_context), "f.json: data[0].paragraphs[0].qas[0] (id 'Q0'): empty context")
    error(read(squad(good, qa("Q0", []))), "f.json: data[0].paragraphs[0].qas[1] (id 'Q0'): "
          "duplicate question id")
    error(read(squad(good, {"question": "x", "answers": []})), "qas[1]: question without an 'id'")
    error(read(squad(good, dict(good, id="Q1", answers={}))), at, "'answers' is not a list")
    error(read(squad(dict(good, answers=[{"text": "光荣", "answer_start": "9"}]))),
          "qas[0].answers[0] (id 'Q0'): answer_start '9' is not an integer")
    error(read(squad(dict(good, answers=[{"answer_start": 9}]))), "answers[0]", "'text'")
    error(read({"version": "1"}), "f.json: expected {\"data\"")
    error(read({"data": [{"title": "x"}]}), "f.json: data[0]: article without a 'paragraphs'")
    error(read({"data": [{"paragraphs": [{"context": "x"}]}]}),
          "f.json: data[0].paragraphs[0]: paragraph without a 'qas' list")
    error(read(squad(qa("Q0", [("索尼", 0)])), split="train"), "no questions for split 'train'")
    error(read('{"data": [\n  {"title": "x",}\n]}'), "f.json:2: invalid JSON")


def test_squad_empty_question_skip_option(tmp_path, skips):
    data = squad(qa("Q0", [("光荣", 9)]), qa("Q1", [("光荣", 9)], question=""))
    path = write(tmp_path, {"f.json": data}) / "f.json"
    docs = read_squad(path, "train", skip_empty_questions=True)
    assert [d.doc_id for d in docs] == ["Q0"]
    assert skips()[("questions", "empty question")] == (
        1, 2, "data[0].paragraphs[0].qas[1] (id 'Q1')")


def test_cmrc2018_files_and_options(tmp_path):
    root = write(tmp_path, {"cmrc2018_train.json": squad(qa("T0", [("光荣", 9)])),
                            "dev.json": squad(qa("D0", [("光荣", 9)])),
                            "cmrc2018_trial.json": squad(qa("R0", [("光荣", 9)]))})
    assert [d.doc_id for d in cmrc2018.read(root, "train", {})] == ["T0"]
    assert [d.doc_id for d in cmrc2018.read(root, "dev", None)] == ["D0"]
    assert [d.doc_id for d in cmrc2018.read(root, "test", {})] == ["R0"]
    trial = {"files": {"train": "cmrc2018_trial.json"}}
    assert [d.doc_id for d in cmrc2018.read(root, "train", trial)] == ["R0"]
    error(lambda: cmrc2018.read(root, "train", {"file": "x"}), "unknown key 'file'")
    error(lambda: cmrc2018.read(root, "train", {"files": {"train": "no.json"}}), "no.json",
          "does not exist")
    (root / "dev.json").unlink()
    error(lambda: cmrc2018.read(root, "dev", {}), "no cmrc2018_dev.json or dev.json")


def test_drcd_traditional_chinese(tmp_path):
    context = "鴻海科技集團是由臺灣企業家郭台銘創辦的跨國企業，總部位於臺灣新北市土城區。"
    data = {"version": "1.3", "data": [{"id": "1001", "title": "鴻海科技集團", "paragraphs": [
        {"id": "1001-1", "context": context, "qas": [
            {"id": "1001-1-1", "question": "鴻海的創辦人是誰？",
             "answers": [{"id": "1", "text": "郭台銘", "answer_start": 13}]},
            {"id": "1001-1-2", "question": "鴻海總部在哪裡？",
             "answers": [{"id": "1", "text": "臺灣新北市土城區", "answer_start": 28}]}]}]}]}
    root = write(tmp_path, {"DRCD_training.json": data, "DRCD_dev.json": data,
                            "DRCD_test.json": data})
    for split in ("train", "dev", "test"):
        docs = drcd.read(root, split, {})
        check_answers(docs)
        assert [a["start"] for d in docs for a in d.fields["answers"]] == [13, 28]
        assert docs[0].fields["title"] == "鴻海科技集團"
    error(lambda: drcd.read(tmp_path / "missing", "dev", {}), "does not exist")


# ------------------------------------------------------------------------------- DuReader

def duread_doc(paragraphs, selected=None, related=None, title="标题"):
    """A DuReader document; paragraphs are word lists, the raw text keeps spaces between
    latin words as the real data does."""
    doc = {"title": title, "segmented_title": [title], "bs_rank_pos": 0,
           "paragraphs": [" ".join(words) for words in paragraphs],
           "segmented_paragraphs": paragraphs}
    if selected is not None:
        doc["is_selected"] = selected
    if related is not None:
        doc["most_related_para"] = related
    return doc


def duread(qid, documents, spans=None, answer_doc=None, fake=None, score=1.0,
           question="怎么 设置 微信", answers=("人工答案",)):
    record = {"question_id": qid, "question": question.replace(" ", ""),
              "segmented_question": question.split(), "question_type": "DESCRIPTION",
              "fact_or_opinion": "FACT", "documents": documents}
    if spans is not None:
        record.update(answers=list(answers), segmented_answers=[list(a) for a in answers],
                      answer_spans=spans, answer_docs=[] if answer_doc is None else [answer_doc],
                      fake_answers=[] if fake is None else [fake],
                      match_scores=[score] if spans else [])
    return record


def lines(*records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


P0 = ["打开", "微信", "。"]                                    # "打开微信。"
P1 = ["无关", "段落"]
P2A = ["点击", "设置", "，", "再", "点击", "设置", "即可"]      # "点击设置，再点击设置即可"
P2B = ["其他"]


def test_dureader_train_conversion_and_span(tmp_path, skips):
    docs_q = [duread_doc([P0], True, 0), duread_doc([P1], False, 0),
              duread_doc([P2B, P2A], True, 1)]
    # answer_spans: words 4..5 of P2A = the second "点击设置" (chars 6..9), not the first.
    good = duread(1, docs_q, spans=[[4, 5]], answer_doc=2, fake="点击设置")
    root = write(tmp_path, {"search.train.json": lines(
        good,
        duread(2, docs_q, spans=[]),                                     # no answer_spans
        duread(3, docs_q, spans=[[0, 1]], answer_doc=1, fake="无关段落"),  # doc not selected
        duread(4, docs_q, spans=[[0, 0]], answer_doc=0, fake="关闭"),     # fake not in para
        duread(5, docs_q, spans=[[0, 1]], answer_doc=0, fake="打开微信", score=0.5))})
    docs = dureader.read(root, "train", {})
    check_answers(docs)
    assert [d.doc_id for d in docs] == ["1", "5"]
    doc = docs[0]
    # Selected documents 0 and 2 only; paragraph 1 of document 2 (most_related_para).
    assert doc.text == "打开微信。\n点击设置，再点击设置即可"
    assert doc.fields["answers"] == [{"text": "点击设置", "start": 12}]  # 5 + 1 + 6
    assert doc.text.index("点击设置") == 6  # the first occurrence is not the annotated one
    assert doc.fields["references"] == ["人工答案"]
    assert doc.fields["question"] == "怎么设置微信"
    assert doc.fields["question_type"] == "DESCRIPTION"
    assert set(doc.fields) == {"question", "context", "answers", "references",
                               "question_type"}
    found = skips()
    assert found[("questions", "no answer_spans")] == (1, 5, "line 2 (question_id 2)")
    assert found[("questions", "answer document not among the selected documents")][0] == 1
    assert found[("questions", "no answer found in context")] == (
        1, 5, "line 4 (question_id 4)")
    assert found[("answers", "answer text not found in context")][0] == 1

    strict = dureader.read(root, "train", {"min_match_score": 0.7})
    assert [d.doc_id for d in strict] == ["1"]
    assert skips()[("questions", "match score below min_match_score")] == (
        1, 5, "line 5 (question_id 5)")
    # One document per question: question 1's answer document (the second selected) is gone.
    assert [(d.doc_id, d.text) for d in dureader.read(root, "train", {"max_docs": 1})] == [
        ("5", "打开微信。")]
    assert skips()[("questions", "answer document not among the selected documents")][0] == 2


def test_dureader_span_word_offset_wins_and_falls_back(tmp_path, skips):
    docs_q = [duread_doc([P2A], True, 0)]
    root = write(tmp_path, {"search.train.json": lines(
        duread(1, docs_q, spans=[[4, 5]], answer_doc=0, fake="点击设置"),
        # A span past the paragraph leaves the first occurrence, counted as realigned.
        duread(2, docs_q, spans=[[40, 41]], answer_doc=0, fake="点击设置"))})
    docs = dureader.read(root, "train", {})
    assert [d.fields["answers"][0]["start"] for d in docs] == [6, 0]
    assert skips()[REALIGNED] == (
        1, 2, "line 2 (question_id 2)")


def test_dureader_dev_test_and_question_match(tmp_path):
    docs_dev = [duread_doc([P0, P1], True, 1), duread_doc([P2A], False, 0)]
    root = write(tmp_path, {
        "search.dev.json": lines(
            duread(10, docs_dev, spans=[[0, 1]], answer_doc=1, fake="点击设置"),
            # A question without answers: most_related_para -1 → matched to the question.
            duread(11, [duread_doc([P1, P0], False, -1)], spans=[], answers=())),
        "zhidao.dev.json": lines(duread(12, docs_dev, spans=[])),
        "search.test.json": lines(duread(20, [
            # Recall of the question words 怎么/设置/微信: P1 0, P0 1/3, P2A 1/3 → the
            # shorter of the two best (P0).
            duread_doc([P1, P2A, P0]), duread_doc([["怎么", "设置", "微信", "呢"], P0])]))})
    dev = dureader.read(root, "dev", {})
    check_answers(dev)
    assert [d.doc_id for d in dev] == ["10", "11", "12"]  # search then zhidao
    assert dev[0].text == "无关段落\n点击设置，再点击设置即可"  # all documents in dev
    assert dev[0].fields["answers"] == [{"text": "点击设置", "start": 5}]
    assert dev[1].text == "打开微信。" and dev[1].fields["answers"] == []
    assert dev[1].fields["references"] == []
    assert dev[2].fields["answers"] == [] and dev[2].fields["references"] == ["人工答案"]
    assert [d.doc_id for d in dureader.read(root, "dev", {"sources": ["zhidao"]})] == ["12"]
    assert [d.doc_id for d in dureader.read(root, "dev", {"sources": "search"})] == [
        "10", "11"]
    assert [d.doc_id for d in dureader.read(
        root, "dev", {"files": {"dev": ["zhidao.dev.json", "search.dev.json"]}})] == [
        "12", "10", "11"]
    test = dureader.read(root, "test", {})
    assert test[0].text == "打开微信。\n怎么设置微信呢"
    assert test[0].fields["answers"] == [] and test[0].fields["references"] == []
    assert dureader.best_question_match([P1, P2A, P0], ["怎么", "设置", "微信"]) == 2
    assert dureader.best_question_match([P1], []) == 0

    error(lambda: dureader.read(root, "test", {"sources": ["zhidao"]}), "zhidao.test.json",
          "does not exist")
    error(lambda: dureader.read(root, "test", {"sources": ["baike"]}), "'baike'")
    error(lambda: dureader.read(root, "train", {}), "no search.train.json or zhidao.train.json")
    error(lambda: dureader.read(root, "dev", {"max_docs": 0}), "'max_docs'")
    error(lambda: dureader.read(root, "dev", {"min_match_score": "x"}), "'min_match_score'")


def test_dureader_bad_input(tmp_path):
    def read(*records, split="dev", text=None):
        path = write(tmp_path, {f"search.{split}.json": text or lines(*records)})
        return lambda: dureader.read(path, split, {})

    doc = duread_doc([P0], True, 0)
    error(read(text=lines(duread(1, [doc])) + "{bad json\n"), "search.dev.json:2: invalid JSON")
    error(read(duread(1, [doc]), duread(2, [doc], question=" ")),
          "search.dev.json:2 (question_id 2): empty question")
    error(read(duread(1, [duread_doc([[]], True, 0), duread_doc([], True)])),
          "search.dev.json:1 (question_id 1): empty context")
    error(read(duread(1, [duread_doc([P0], True, 3)])),
          "search.dev.json:1 (question_id 1): documents[0]: most_related_para 3")
    error(read(duread(1, [{"title": "x", "paragraphs": ["p"]}])),
          ":1 (question_id 1): documents[0]", "segmented_paragraphs")
    error(read({"question": "q", "documents": []}), "search.dev.json:1: record without a "
          "'question_id'")
    error(read(dict(duread(1, []), documents=None)), ":1 (question_id 1)", "'documents'")
    # One id in two files of a split.
    write(tmp_path, {"zhidao.dev.json": lines(duread(1, [doc]))})
    error(read(duread(1, [doc])), "zhidao.dev.json:1", "duplicate question_id '1'")


# ------------------------------------------------------------------------------- TriviaQA

BEARS = ("The Bears won the game. Bearsden is a town; the bears lost later.\n\n"
         "BEARS! Forebears and bear-like fans cheered the Bears' win.")
ANSWER = {"Aliases": ["The Bears", "Bears"], "NormalizedAliases": ["bears", "the bears"],
          "Value": "The Bears", "NormalizedValue": "the bears", "Type": "WikipediaEntity",
          "MatchedWikiEntityName": "Chicago Bears"}


def trivia_q(qid, pages, answer=ANSWER, question="Who won?"):
    item = {"QuestionId": qid, "Question": question, "QuestionSource": "http://example.com",
            "EntityPages": [{"DocSource": "TagMe", "Filename": p, "Title": p[:-4]}
                            for p in pages]}
    if answer is not None:
        item["Answer"] = answer
    return item


def trivia_qa(split, *items):
    return {"Data": list(items), "Domain": "Wikipedia", "Split": split,
            "VerifiedEval": False, "Version": 1.0}


TRIVIA = {
    "qa/wikipedia-train.json": trivia_qa(
        "train", trivia_q("tc_1", ["Bears.txt"]),
        trivia_q("tc_2", ["Other.txt"])),                       # alias absent: skipped
    "qa/wikipedia-dev.json": trivia_qa(
        "dev", trivia_q("tc_3", ["Other.txt", "Bears.txt"]), trivia_q("tc_4", ["Other.txt"])),
    "qa/wikipedia-test-without-answers.json": trivia_qa(
        "test", trivia_q("tc_5", ["Other.txt"], answer=None)),
    "evidence/wikipedia/Bears.txt": BEARS,
    "evidence/wikipedia/Other.txt": "Nothing about them here; bearskin rugs only.\n",
    "evidence/web/1/1_1.txt": "web evidence is not read",
    "qa/web-dev.json": trivia_qa("dev"),
}


def tgz(tmp_path, files, top="triviaqa-rc/"):
    """A .tgz of `files` under the directory `top`, written with tarfile."""
    path = tmp_path / "triviaqa-rc.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            data = content if isinstance(content, bytes) else (
                content if isinstance(content, str) else json.dumps(content)).encode("utf-8")
            info = tarfile.TarInfo(top + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_triviaqa_whole_word_alias_spans(tmp_path, skips):
    root = write(tmp_path / "dir", TRIVIA)
    train = triviaqa.read(root, "train", {})
    check_answers(train)
    assert [d.doc_id for d in train] == ["tc_1"]
    doc = train[0]
    assert doc.text == BEARS and doc.fields["question"] == "Who won?"
    # "the bears"/"bears" case-insensitive, whole words: not Bearsden, Forebears, bear-like.
    assert [(a["start"], a["text"]) for a in doc.fields["answers"]] == [
        (0, "The Bears"), (4, "Bears"), (44, "the bears"), (48, "bears"), (67, "BEARS"),
        (111, "the Bears"), (115, "Bears")]
    assert doc.fields["references"] == ["The Bears", "Bears", "bears", "the bears"]
    assert doc.fields["answer"] == ANSWER
    assert set(doc.fields) == {"question", "context", "answers", "references", "answer"}
    assert skips()[("questions", "no answer found in context")] == (
        1, 2, "Data[1] (QuestionId 'tc_2')")

    capped = triviaqa.read(root, "train", {"max_answer_spans": 2})[0]
    assert [a["start"] for a in capped.fields["answers"]] == [0, 4]
    assert len(triviaqa.read(root, "train", {"max_answer_spans": 0})[0].fields["answers"]) == 7

    dev = triviaqa.read(root, "dev", {})
    check_answers(dev)
    other = TRIVIA["evidence/wikipedia/Other.txt"]
    assert dev[0].text == other + "\n\n" + BEARS  # pages in EntityPages order
    assert dev[0].fields["answers"][0] == {"text": "The Bears", "start": len(other) + 2}
    assert dev[1].fields["answers"] == []  # dev keeps it: the metric needs only references
    assert dev[1].fields["references"] == ["The Bears", "Bears", "bears", "the bears"]
    cut = triviaqa.read(root, "dev", {"max_evidence_chars": 12})
    assert cut[0].text == other[:12] + "\n\n" + BEARS[:12]
    assert [a["start"] for a in cut[0].fields["answers"]] == [14, 18]

    test = triviaqa.read(root, "test", {})
    assert test[0].fields["answer"] is None
    assert test[0].fields["answers"] == test[0].fields["references"] == []

    verified = dict(TRIVIA, **{"qa/verified-wikipedia-dev.json": trivia_qa(
        "dev", trivia_q("tc_3", ["Bears.txt"]))})
    root2 = write(tmp_path / "dir2", verified)
    assert [d.doc_id for d in triviaqa.read(
        root2, "dev", {"files": {"dev": "qa/verified-wikipedia-dev.json"}})] == ["tc_3"]


def test_triviaqa_archive_equals_directory(tmp_path):
    root = write(tmp_path / "dir", TRIVIA)
    for top in ("triviaqa-rc/", ""):
        archive = tgz(tmp_path, TRIVIA, top)
        for split in ("train", "dev", "test"):
            assert triviaqa.read(archive, split, {}) == triviaqa.read(root, split, {})
    error(lambda: triviaqa.read(tmp_path / "nothing.tgz", "dev", {}), "does not exist")
    (tmp_path / "plain.tgz").write_bytes(b"not an archive")
    error(lambda: triviaqa.read(tmp_path / "plain.tgz", "dev", {}), "plain.tgz",
          "not a readable tar archive")


def test_triviaqa_bad_input(tmp_path):
    def read(files, split="dev", archive=False):
        root = write(tmp_path / "d", dict(TRIVIA, **files))
        source = tgz(tmp_path, dict(TRIVIA, **files)) if archive else root
        return lambda: triviaqa.read(source, split, {})

    dev = "qa/wikipedia-dev.json"
    error(read({dev: trivia_qa("dev", trivia_q("tc_9", ["Missing.txt"]))}),
          "wikipedia-dev.json: Data[0] (QuestionId 'tc_9'): evidence file "
          "evidence/wikipedia/Missing.txt not found")
    error(read({dev: trivia_qa("dev", trivia_q("tc_9", ["Missing.txt"]))}, archive=True),
          "triviaqa-rc.tgz:triviaqa-rc/qa/wikipedia-dev.json: Data[0] (QuestionId 'tc_9')",
          "Missing.txt")
    error(read({dev: '{"Data": [\n  {"QuestionId": "x",}\n]}'}), "wikipedia-dev.json:2: "
          "invalid JSON")
    error(read({dev: '{"Data": [\n  {"QuestionId": "x",}\n]}'}, archive=True),
          "triviaqa-rc.tgz:triviaqa-rc/qa/wikipedia-dev.json:2: invalid JSON")
    error(read({dev: trivia_qa("dev", trivia_q("tc_9", ["Bears.txt"], answer=None))}),
          "Data[0] (QuestionId 'tc_9'): question without an 'Answer' in split 'dev'")
    error(read({dev: trivia_qa("dev", trivia_q("tc_9", ["Bears.txt"], question=""))}),
          "wikipedia-dev.json: Data[0] (QuestionId 'tc_9'): empty question")
    error(read({dev: trivia_qa("dev", trivia_q("tc_9", []))}),
          "Data[0] (QuestionId 'tc_9'): empty context")
    error(read({dev: trivia_qa("dev", trivia_q("tc_9", ["Bears.txt"]),
                               trivia_q("tc_9", ["Bears.txt"]))}),
          "Data[1] (QuestionId 'tc_9'): duplicate QuestionId")
    error(read({dev: trivia_qa("dev", {"Question": "q"})}), "Data[0]: question without a "
          "'QuestionId'")
    error(read({dev: {"data": []}}), "wikipedia-dev.json: expected {\"Data\"")
    error(read({"evidence/wikipedia/Bears.txt": b"ok\n\xff"}), "Bears.txt:2: invalid UTF-8")
    error(read({dev: trivia_qa("dev")}), "no questions for split 'dev'")
    error(lambda: triviaqa.read(tmp_path / "d", "dev", {"max_answer_spans": -1}),
          "'max_answer_spans'")
    error(lambda: triviaqa.read(tmp_path / "d", "dev", {"files": {"dev": "qa/none.json"}}),
          "qa/none.json: file not found")


# ------------------------------------------------------------------------------ real data

def test_real_cmrc2018(skips):
    root = shared_path("data", "cmrc2018")
    # dev: 3,219 questions, 3 answers each (9,657); 193 answers have answer_start -1 and a
    # text that is not in the context (dropped from answers, kept in references), 7 have a
    # wrong answer_start (realigned). Every question keeps at least one position.
    dev = cmrc2018.read(root, "dev", {})
    check_answers(dev)
    assert len(dev) == 3219 and all(d.fields["answers"] for d in dev)
    assert sum(len(d.fields["references"]) for d in dev) == 9657
    found = skips()
    assert found[("answers", "answer text not found in context")][:2] == (193, 9657)
    assert found[REALIGNED][:2] == (7, 9657)
    assert not any(what == "questions" for what, _ in found)

    # trial: 1,002 questions, two with an empty question (TRIAL_776_QUERY_4, TRIAL_20_QUERY_0)
    # → DataError unless skip_empty_questions; then 1,000 questions, 5 answers realigned.
    trial = {"files": {"train": "cmrc2018_trial.json"}}
    error(lambda: cmrc2018.read(root, "train", trial), "cmrc2018_trial.json: "
          "data[188].paragraphs[0].qas[4] (id 'TRIAL_776_QUERY_4'): empty question")
    train = cmrc2018.read(root, "train", dict(trial, skip_empty_questions=True))
    check_answers(train)
    assert len(train) == 1000
    found = skips()
    assert found[("questions", "empty question")][:2] == (2, 1002)
    assert found[REALIGNED][:2] == (5, 1000)
    # No cmrc2018_test.json here: test falls back to the trial set.
    assert len(cmrc2018.read(root, "test", {"skip_empty_questions": True})) == 1000


def test_real_dureader_demo(skips):
    root = shared_path("data", "dureader")
    # search.train.json: 100 questions, 5 without answer_spans (skipped); the 95 others keep
    # their fake answer at the word offset of answer_spans (no realignment, none missing) in
    # a context of their is_selected documents (159 paragraphs).
    train = dureader.read(root, "train", {})
    check_answers(train)
    assert len(train) == 95 and all(len(d.fields["answers"]) == 1 for d in train)
    assert sum(d.text.count("\n") + 1 for d in train) == 159
    assert skips() == {("questions", "no answer_spans"): (5, 100, "line 6 (question_id 91164)")}
    # DuReader's preprocessed data kept match score >= 0.7: 16 more are skipped.
    assert len(dureader.read(root, "train", {"min_match_score": 0.7})) == 79
    assert skips()[("questions", "match score below min_match_score")][:2] == (16, 100)
    # dev: all 100 kept (99 with a position; 181585 has no answer), all 453 documents.
    dev = dureader.read(root, "dev", {})
    check_answers(dev)
    assert len(dev) == 100 and sum(bool(d.fields["answers"]) for d in dev) == 99
    assert sum(d.text.count("\n") + 1 for d in dev) == 453
    # test: no answers; 477 documents, paragraphs chosen by question match.
    test = dureader.read(root, "test", {})
    assert len(test) == 100 and not any(d.fields["answers"] or d.fields["references"]
                                        for d in test)
    assert sum(d.text.count("\n") + 1 for d in test) == 477


def test_real_triviaqa_sample(skips):
    archive = shared_path("data", "triviaqa", "triviaqa-sample.tgz")
    # Wikipedia setting: 4 train and 2 dev questions, every one with alias spans, no skips
    # (the 5 web questions are not read); there is no test file in the sample.
    train, dev = triviaqa.read(archive, "train", {}), triviaqa.read(archive, "dev", {})
    check_answers(train + dev)
    assert [d.doc_id for d in train] == ["tc_3", "tc_8", "tc_9", "tc_10"]
    assert [d.doc_id for d in dev] == ["tc_33", "tc_40"]
    assert [len(d.fields["answers"]) for d in train + dev] == [13, 36, 3, 2, 6, 6]
    assert dev[0].fields["answer"]["Value"] == "Sunset Boulevard"
    assert skips() == {}
    error(lambda: triviaqa.read(archive, "test", {}), "wikipedia-test-without-answers.json",
          "file not found")
