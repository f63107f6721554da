"""The document readers and the keyphrase metric follow the public references. Each expected
value is worked out by hand from the reference's rule, on a small fixture; the real data, where
it is here, pins what the rule does to it."""
import json

import numpy as np
import pytest
from helpers import error, shared_path, write

from ernie_doc.metrics import keyphrase
from tasks.hyp import reader as hyp
from tasks.imdb import reader as imdb
from tasks.openkp import reader as openkp
from tasks.triviaqa import reader as triviaqa

# -- IMDB: only <br /><br /> becomes a space (ERNIE-Doc multi_files_to_one.py, PaddleNLP) ---

REVIEW = "A<br /><br />B<br />C<br /><br /><br />D\tE\n"


def test_imdb_replaces_only_br_pairs_by_default(tmp_path):
    tsv_text = REVIEW.strip().replace("\t", "")    # a TSV field holds no tab
    root = write(tmp_path, {"test/pos/1_9.txt": REVIEW, "test/neg/2_1.txt": "x",
                            "train.txt": f"qid\tlabel\ttext_a\n7\t1\t{tsv_text}\n"})
    # by hand, pairs replaced left to right: "A" " " "B<br />C" " " "<br />D" + tab dropped
    assert imdb.read(root, "test", {})[1].text == "A B<br />C <br />DE"
    assert imdb.read(root, "train", {})[0].text == "A B<br />C <br />DE"   # the TSV alike
    assert imdb.clean("<br /><br /><br /><br />x") == "x"    # two pairs, nothing lone
    error(lambda: imdb.read(root, "test", {"br_tags": "all"}), "unknown key 'br_tags'")


def test_real_imdb_sample_has_no_lone_br():
    # The sample's text_a already went through the official pair replacement; not one of its
    # 5,000 reviews has a lone <br /> left.
    path = shared_path("data", "imdb", "imdb_test_sample5k.tsv")
    options = {"file": path.name, "dev_ratio": 0.2}
    pairs = imdb.read(path.parent, "train", options) + imdb.read(path.parent, "dev", options)
    assert len(pairs) == 5000
    assert sum("<br" in d.text for d in pairs) == 0


# -- Hyperpartisan: strip, then delete "\n" and "\t" (PaddleNLP HYPTextPreprocessor) --------

def hyp_files(articles):
    body = "".join(f'<article id="{i}" title="T">{text}</article>\n' for i, text in articles)
    truth = "".join(f'<article id="{i}" hyperpartisan="true"/>\n' for i, _ in articles)
    ids = [int(i) for i, _ in articles]
    return {"articles-x.xml": f"<articles>\n{body}</articles>\n",
            "ground-truth-x.xml": f"<articles>\n{truth}</articles>\n",
            "hp-splits.json": json.dumps({"train": ids, "dev": [], "test": []})}


def test_hyp_deletes_newlines_and_tabs_by_default(tmp_path):
    root = write(tmp_path, hyp_files([
        ("0000001", "\n<p>One\ntwo</p>\n<p>Three\tfour &amp; five</p>\n"),
        ("0000002", "  <p>Six  \n seven\u00a0eight</p>  "),
    ]))
    # by hand: character data "\nOne\ntwo\nThree\tfour & five\n", stripped, then every "\n"
    # and "\t" deleted: the words they alone separated run together
    assert [d.text for d in hyp.read(root, "train", {})] == [
        "OnetwoThreefour & five", "Six   seven\u00a0eight"]
    error(lambda: hyp.read(root, "train", {"whitespace": "collapse"}),
          "unknown key 'whitespace'")


def test_real_hyperpartisan_rules_give_the_same_tokens():
    # The tokenizer collapses whitespace runs before anything else (BPETokenizer.tokenize), so
    # two texts equal up to whitespace runs give the same tokens. On the 645 articles
    # PaddleNLP's rule differs byte-wise from collapsing every run in 209 texts (runs of
    # spaces, no-break spaces), never beyond: every line break inside an article sits next to
    # a space, so nothing runs together.
    root = shared_path("data", "hyperpartisan")
    articles = hyp.parse_articles(root / "articles-training-byarticle-20181122.xml")
    raw = [text for _, _, text in articles.values()]
    assert len(raw) == 645
    reference = [hyp.clean(t) for t in raw]
    collapsed = [" ".join(t.split()) for t in raw]
    assert sum(a != b for a, b in zip(reference, collapsed)) == 209
    assert [" ".join(a.split()) for a in reference] == collapsed
    assert sum("\n" in t.strip() for t in raw) == 16


# -- OpenKP: a repeated url keeps its last record (official evaluate.py loads a dict) -------

def kp_line(url, text, phrases):
    return json.dumps({"url": url, "text": text, "VDOM": "[]", "KeyPhrases": phrases}) + "\n"


def test_openkp_repeated_url_keeps_the_last_record(tmp_path):
    root = write(tmp_path, {"OpenKPDev.jsonl": (
        kp_line("u1", "red apple", [["red"]]) + kp_line("u2", "blue sea sky", [["sky"], ["sea"]])
        + kp_line("u1", "blue apple", [["blue"]]))})
    last = openkp.read(root, "dev", {})
    # the url keeps the place of its first record, the content of its last
    assert [(d.doc_id, d.text) for d in last] == [("u1", "blue apple"), ("u2", "blue sea sky")]
    predictions = {"u1": ["blue"], "u2": ["sea", "land"]}
    # by hand, F1@1: u1 scores 1 against its last record; u2 has P@1 = 1, R@1 = 1/2,
    # F1@1 = 2/3; two documents, not three
    result = keyphrase.evaluate(predictions, {d.doc_id: d.fields["keyphrases"] for d in last})
    assert result["total"] == 2
    assert result["f1@1"] == pytest.approx((1.0 + 2 / 3) / 2)
    error(lambda: openkp.read(root, "dev", {"repeated_url": "first"}),
          "unknown key 'repeated_url'")


# -- OpenKP metric: a phrase that normalises to "" keeps its rank (official remove_empty) ---

def test_keyphrase_metric_keeps_a_phrase_that_normalises_to_empty():
    gold = [["A"], ["b"]]
    # [" "] passes remove_empty (its first word is not "") and normalises to "": it takes
    # rank 1. ["", "a"] (first word empty) and [] are dropped, as officially.
    predicted = [[" "], [], ["", "a"], ["a"]]
    by_k = keyphrase.precision_recall_at(predicted, gold)
    # by hand: ranked ["", "a"]; @1 no hit; @3 and @5 one hit of 2 gold
    assert by_k == {1: (0.0, 0.0), 3: (1 / 3, 0.5), 5: (1 / 5, 0.5)}
    # a gold "" counts among the distinct gold phrases (and only a predicted "" hits it)
    assert keyphrase.precision_recall_at(["a"], [["a"], ["\t"]]) == {
        1: (1.0, 0.5), 3: (1 / 3, 0.5), 5: (1 / 5, 0.5)}
    assert keyphrase.precision_recall_at([[" "]], [[" "]])[1] == (1.0, 1.0)
    result = keyphrase.evaluate({"u": [[" "], ["a"]]}, {"u": gold})
    assert result["f1@3"] == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))   # = 0.4
    assert result["f1@1"] == 0.0


def test_openkp_task_keeps_a_phrase_that_normalises_to_empty(tmp_path):
    from test_openkp import PieceTokenizer, build_openkp_task, openkp_file

    from ernie_doc.data.segment import reading_passes
    openkp_file(tmp_path / "OpenKPDev.jsonl",
                [("http://d.org", ["w1", "w2", "w3"], [["w1"], [" "]])])
    tokenizer = PieceTokenizer()
    task = build_openkp_task(tmp_path, tokenizer)
    assert task.options["empty_phrases"] == "keep"
    docs = task.read("dev")
    passes = [reading_passes(task.document_segments(docs[0], 0, tokenizer),
                             retro_feed=False)]
    rows = {0: [(s.seg_index, np.where(s.targets["gold"], 10.0, -10.0))
                for s in passes[0] if s.final]}
    metrics = task.evaluate(docs, rows, passes)[0]
    # "w1" is predicted first; the gold [" "] is the phrase "": R@1 = 1/2
    assert metrics["f1@1"] == pytest.approx(2 / 3)


# -- TriviaQA: a verified file is read as its verified part (official read_triviaqa_data) --

def trivia_item(qid, pages, verified):
    return {"QuestionId": qid, "Question": f"Question {qid}?", "QuestionPartOfVerifiedEval":
            verified, "Answer": {"Aliases": ["Bears"], "NormalizedAliases": ["bears"],
                                 "Value": "Bears", "NormalizedValue": "bears"},
            "EntityPages": [{"Filename": f, "Title": f[:-4], "DocPartOfVerifiedEval": ok}
                            for f, ok in pages], "SearchResults": []}


def trivia_files(items, verified_file=True):
    return {"qa/verified-wikipedia-dev.json": {"Data": items, "Domain": "Wikipedia",
                                               "Split": "dev", "VerifiedEval": verified_file,
                                               "Version": 1.0},
            "evidence/wikipedia/A.txt": "The Bears won.", "evidence/wikipedia/B.txt": "Bees."}


FILES = {"files": {"dev": "qa/verified-wikipedia-dev.json"}}


def test_triviaqa_verified_file_keeps_its_verified_part(tmp_path):
    items = [trivia_item("q1", [("A.txt", True), ("B.txt", False)], True),
             trivia_item("q2", [("A.txt", True)], False),        # not a verified question
             trivia_item("q3", [("B.txt", False)], True),        # no verified page left
             trivia_item("q4", [("B.txt", True), ("A.txt", True)], True)]
    root = write(tmp_path / "v", trivia_files(items))
    docs = triviaqa.read(root, "dev", FILES)
    assert [(d.doc_id, d.text) for d in docs] == [("q1", "The Bears won."),
                                                  ("q4", "Bees.\n\nThe Bears won.")]
    # a file that is not verified is read whole, flags or not
    plain = write(tmp_path / "p", trivia_files(items, verified_file=False))
    assert [d.doc_id for d in triviaqa.read(plain, "dev", FILES)] == ["q1", "q2", "q3", "q4"]
    bad = dict(items[0])
    del bad["QuestionPartOfVerifiedEval"]
    root = write(tmp_path / "b", trivia_files([bad]))
    error(lambda: triviaqa.read(root, "dev", FILES), "QuestionId 'q1'",
          "QuestionPartOfVerifiedEval is missing")
    error(lambda: triviaqa.read(root, "dev", dict(FILES, verified_eval=False)),
          "unknown key 'verified_eval'")


def test_real_triviaqa_sample_has_no_verified_file():
    # The sample's qa files all have VerifiedEval false: they are read whole.
    archive = shared_path("data", "triviaqa", "triviaqa-sample.tgz")
    for split in ("train", "dev"):
        docs = triviaqa.read(archive, split, {})
        assert len(docs) == {"train": 4, "dev": 2}[split]
