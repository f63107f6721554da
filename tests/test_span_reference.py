"""Span QA against the official ERNIE-Doc rules (PaddlePaddle/ERNIE, branch repro,
ernie-doc/utils/multi_process_eval.py and utils/metrics.py), each on a fixture small enough
to work out by hand, and each default's switch back to ours:

- the n-best pool: top n_best over all T positions, then the context ones (n_best_pool);
- the answer cut at sub-token characters, as get_final_text gives it (answer_unit);
- "empty" when no candidate survives (empty_answer), distinct texts in the n-best list;
- questions without a reference scored against "" and counted in the metric's mean, as the
  official metric scores a file's empty-string answer (it crashes on an empty list;
  unreferenced);
- the official loss' softmax over all T positions (loss_positions);
- the CMRC metric's word splitting by nltk 3.6.2's Treebank rules (the version ERNIE-Doc pins).
"""
import random

import numpy as np
import paddle
import pytest
from test_predict_kinds import _passes, _rows
from test_tasks import vocab_dir

from ernie_doc.data.document import Document
from ernie_doc.data.span import SpanSegmenter, best_spans, tokenize_with_offsets
from ernie_doc.kinds.span import SpanTask, span_nll
from ernie_doc.metrics import cmrc
from ernie_doc.run_config import load_config
from ernie_doc.tokenization.wordpiece import WordPieceTokenizer

HANZI = list("北京大学是中国的一所著名高校位于海淀区在哪里买")


def tokenizer(tmp_path):
    return WordPieceTokenizer(vocab_dir(tmp_path / "vocab", HANZI + ["iphone6", "##s"])
                              / "vocab.txt")


# -- n-best pool ------------------------------------------------------------------------------
# One window of 3 context tokens (rows 1..3 of T = 8; chars 0-2, 2-4, 4-6); rows 4..7 are the
# question and padding.
META = {"window": (0, 3), "starts": np.array([0, 2, 4]), "ends": np.array([2, 4, 6]),
        "max_context": np.array([True, True, True])}


def logits(start, end, T=8):
    lg = np.zeros((T, 2))
    for row, value in start.items():
        lg[row, 0] = value
    for row, value in end.items():
        lg[row, 1] = value
    return lg


def test_pool_all_ranks_every_position_then_keeps_the_context():
    lg = logits({0: 9, 5: 8, 1: 7, 2: 6, 3: 5}, {6: 9, 3: 8, 2: 7, 1: 1})
    # official: top-3 starts over all rows = 0 [CLS], 5 (question), 1 → only token 0 stays;
    # top-3 ends = rows 6, 3, 2 → tokens 2, 1. Spans 0..2 (7 + 8) and 0..1 (7 + 7).
    assert best_spans([META], [lg], n_best=3, pool="all") == [(15.0, 0, 6), (14.0, 0, 4)]
    # ours: the top 3 among the context rows: every start ≤ end pair of the 3 tokens
    assert best_spans([META], [lg], n_best=3, pool="context") == [
        (15.0, 0, 6), (14.0, 0, 4), (14.0, 2, 6), (13.0, 2, 4), (13.0, 4, 6), (8.0, 0, 2)]


def test_pool_all_can_leave_no_candidate():
    lg = logits({0: 9, 5: 8, 6: 7, 1: 1}, {1: 5})   # the 3 best starts are all outside
    assert best_spans([META], [lg], n_best=3, pool="all") == []
    assert best_spans([META], [lg], n_best=3, pool="context")[0] == (6.0, 0, 2)


# -- answer unit (get_final_text) -------------------------------------------------------------
def test_answer_cut_at_sub_token_characters(tmp_path):
    tok = tokenizer(tmp_path)
    text = "买iPhone6s在北京"
    ctx = tokenize_with_offsets(text, tok)
    assert tok.convert_ids_to_tokens(ctx.ids.tolist()) == ["买", "iphone6", "##s", "在", "北",
                                                            "京"]
    # the pieces' own characters vs their word's
    assert list(zip(ctx.piece_starts.tolist(), ctx.piece_ends.tolist()))[1:3] == [(1, 8),
                                                                                 (8, 9)]
    assert list(zip(ctx.starts.tolist(), ctx.ends.tolist()))[1:3] == [(1, 9), (1, 9)]
    # a gold answer "iPhone6" marks the piece iphone6 only (official _improve_answer_span),
    # or the whole word's pieces
    assert ctx.token_span(1, 8, "token") == (1, 1)
    assert ctx.token_span(1, 8, "word") == (1, 2)

    seg = SpanSegmenter(16, 8, tok.cls_token_id, tok.pad_token_id, tok.sep_token_id,
                        tok.sep_token_id, 4)
    (only,) = seg(ctx, tok.encode("在哪里"), [(1, 8)], doc_index=0)
    assert np.nonzero(only.targets["start_gold"])[0].tolist() == [2]
    assert np.nonzero(only.targets["end_gold"])[0].tolist() == [2]
    # start and end on the piece iphone6 (row 2). get_final_text by hand: the piece text
    # "iphone6" is found at 0 in the basic-tokenized original token "iphone6s", whose length
    # equals the original's, so the answer is the first 7 characters: "iPhone6".
    lg = logits({2: 5}, {2: 5}, T=16)
    (score, a, b), *_ = best_spans([only.meta], [lg], unit="token")
    assert text[a:b] == "iPhone6"
    (score, a, b), *_ = best_spans([only.meta], [lg], unit="word")
    assert text[a:b] == "iPhone6s"
    # the piece ##s alone: "s"
    (score, a, b), *_ = best_spans([only.meta], [logits({3: 5}, {3: 5}, T=16)], unit="token")
    assert text[a:b] == "s"


def test_unknown_word_keeps_its_whole_span(tmp_path):
    tok = tokenizer(tmp_path)
    ctx = tokenize_with_offsets("在x²", tok)            # "x²" is one [UNK]
    assert ctx.ids.tolist()[1] == tok.unk_token_id
    assert (int(ctx.piece_starts[1]), int(ctx.piece_ends[1])) == (1, 3)


# -- the task: n-best texts, "empty", unreferenced questions ----------------------------------
def span_task(options=""):
    cfg = load_config(None, ["task=cmrc2018", "kind=span", "max_seq_len=16",
                             "task_options={max_query_len: 4, max_answer_len: 8, n_best: 3"
                             + options + "}"])
    return SpanTask(cfg, None)


def setup(task, tok):
    task.setup({"cls": tok.cls_token_id, "sep": tok.sep_token_id, "pad": tok.pad_token_id},
               16, 8, tok)


def docs_and_rows(task, tok, make):
    """Two one-segment questions on "海淀是海淀": q0 with reference 海淀, q1 with none."""
    docs = [Document(f"q{i}", "海淀是海淀", fields={
        "context": "海淀是海淀", "question": "在哪里",
        "answers": [{"text": "海淀", "start": 0}] if i == 0 else [],
        "references": ["海淀"] if i == 0 else []}) for i in range(2)]
    passes = _passes(task, docs, tok)
    return docs, _rows(passes, make), passes


def two_hd(_):
    """Starts 海 (rows 1, 4) and ends 淀 (rows 2, 5); every other position −10."""
    lg = np.full((16, 2), -10.0)
    lg[1, 0], lg[4, 0], lg[2, 1], lg[5, 1] = 5.0, 4.0, 5.0, 4.0
    return lg


def test_n_best_keeps_each_text_once(tmp_path):
    tok = tokenizer(tmp_path)
    task = span_task(", n_best_pool: all")
    setup(task, tok)
    docs, rows, passes = docs_and_rows(task, tok, two_hd)
    record = task.predict(docs, rows, passes)[0]
    # candidates: 海淀@0 (5 + 5), 海淀是海淀 (5 + 4), 海淀@3 (4 + 4, the same text: dropped);
    # the third start in the pool is [CLS] (−10, ties go to the lower row): dropped
    assert record["n_best"] == [{"text": "海淀", "score": 10.0, "start": 0, "end": 2},
                                {"text": "海淀是海淀", "score": 9.0, "start": 0, "end": 5}]
    assert record["pred"] == "海淀"


def test_answer_unit_defaults_to_the_sub_token_cut(tmp_path):
    """The task's default answer_unit is the official one (token): a gold "iPhone6" in
    "买iPhone6s在北京" trains the piece iphone6 alone, and a span on that piece answers
    "iPhone6" (answer_unit: word: the pieces iphone6 ##s, "iPhone6s")."""
    tok = tokenizer(tmp_path)
    task = span_task()
    assert task.options["answer_unit"] == "token"
    setup(task, tok)
    text = "买iPhone6s在北京"
    doc = Document("q0", text, fields={"context": text, "question": "在哪里",
                                       "answers": [{"text": "iPhone6", "start": 1}],
                                       "references": ["iPhone6"]})
    (only,) = task.document_segments(doc, 0, tok)   # [CLS] 买 iphone6 ##s 在 北 京 [SEP] …
    assert np.nonzero(only.targets["start_gold"])[0].tolist() == [2]
    assert np.nonzero(only.targets["end_gold"])[0].tolist() == [2]
    passes = _passes(task, [doc], tok)
    rows = _rows(passes, lambda _: logits({2: 5}, {2: 5}, T=16))
    assert task.predict([doc], rows, passes)[0]["pred"] == "iPhone6"


def outside(_):
    """Every context position below the question and padding ones."""
    lg = np.zeros((16, 2))
    lg[1:6] = -5.0
    return lg


@pytest.mark.parametrize("options, expected", [
    (", n_best_pool: all", "empty"), (", n_best_pool: all, empty_answer: ''", ""),
    (", loss_positions: all", "empty"),   # auto follows the official loss: the official pool
    ("", "海"), (", n_best_pool: context", "海")])   # auto follows our loss: the context
def test_no_candidate_answers_empty(tmp_path, options, expected):
    tok = tokenizer(tmp_path)
    task = span_task(options)
    setup(task, tok)
    docs, rows, passes = docs_and_rows(task, tok, outside)
    # official: the top-3 starts are rows 0, 6, 7 (all 0, ties to the lower row): none in
    # the context, so no candidate; ours ranks the context rows only: 海 (0,0) first
    assert [r["pred"] for r in task.predict(docs, rows, passes)] == [expected] * 2


@pytest.mark.parametrize("options, expected", [
    ("", {"em": 50.0, "f1": 50.0, "avg": 50.0, "total": 2.0, "skipped": 0.0}),
    (", unreferenced: skip", {"em": 100.0, "f1": 100.0, "avg": 100.0, "total": 1.0,
                              "skipped": 0.0})])
def test_questions_without_reference_count_in_the_mean(tmp_path, options, expected):
    tok = tokenizer(tmp_path)
    task = span_task(options)
    setup(task, tok)
    docs, rows, passes = docs_and_rows(task, tok, two_hd)
    # q0 predicts 海淀 = its reference (EM 1, F1 1); q1 has none: scored against "" (0), as
    # the official metric scores a file's [""], and counted (it divides by every question)
    metrics, records = task.evaluate(docs, rows, passes)
    assert metrics == expected
    assert [r["references"] for r in records] == [["海淀"], []]


def test_cmrc_unreferenced_question_scores_against_empty_text():
    # the official metric with answers [""]: nothing is common (F1 0); EM 1 only for a
    # prediction that is empty once punctuation is removed. With answers [] it crashes
    # (max([])); ours scores [] as [""]
    want = {"em": 200 / 3, "f1": 100 / 3, "avg": 50.0, "total": 3, "skipped": 0}
    preds = {"a": "empty", "b": "：", "c": "x"}
    assert cmrc.evaluate(preds, {"a": [], "b": [], "c": ["x"]}) == pytest.approx(want)
    assert cmrc.evaluate(preds, {"a": [""], "b": [""], "c": ["x"]}) == pytest.approx(want)


def test_loss_over_all_positions():
    logits_ = np.array([[[0.0, 1.0], [1.0, 0.0], [2.0, 0.0], [5.0, 5.0]]], dtype=np.float32)
    batch = {"target_allowed": paddle.to_tensor([[1.0, 1.0, 1.0, 0.0]]),
             "target_start_gold": paddle.to_tensor([[0.0, 1.0, 0.0, 0.0]]),
             "target_end_gold": paddle.to_tensor([[1.0, 0.0, 0.0, 0.0]])}
    got = float(span_nll(paddle.to_tensor(logits_), batch, all_positions=True)[0])
    # cross-entropy over all 4 positions, position 3 (a question token) included
    s, e = logits_[0, :, 0], logits_[0, :, 1]
    want = -(np.log(np.exp(s[1]) / np.exp(s).sum()) + np.log(np.exp(e[0]) / np.exp(e).sum())) / 2
    assert got == pytest.approx(want, rel=1e-5)
    assert span_task(", loss_positions: all").options["loss_positions"] == "all"


# -- CMRC metric: nltk 3.6.2's word splitting ------------------------------------------------
def test_cmrc_word_splitting_is_nltk_3_6_2():
    tok = cmrc.treebank_tokenize
    # 3.6.2 splits '' off only after a non-space character; 3.7+ everywhere
    assert tok("''abc") == ["''abc"]
    assert tok("''abc", "3.7") == ["''", "abc"]
    assert tok("a''b") == tok("a''b", "3.7") == ["a", "''", "b"]
    assert tok("```") == ["``", "`"]                       # `` then `
    assert tok("b's'*") == ["b's", "'", "*"]   # * is padded after the ' rule: b's whole
    assert cmrc.mixed_segmentation("''hi''你好") == ["''hi", "''", "你", "好"]
    assert cmrc.mixed_segmentation("''hi''你好", nltk_rules="3.7") == ["''", "hi", "''", "你",
                                                                      "好"]
    # F1 vs "hi你好": 3.6.2 LCS 你好 = 2 of 4 / 3 segments → 4/7; 3.7: 2 of 5 / 3 → 1/2
    assert cmrc.f1_score("''hi''你好", ["hi你好"]) == pytest.approx(4 / 7)
    assert cmrc.evaluate({"q": "''hi''你好"}, {"q": ["hi你好"]})["f1"] == pytest.approx(400 / 7)
    assert cmrc.evaluate({"q": "''hi''你好"}, {"q": ["hi你好"]}, "3.7")["f1"] \
        == pytest.approx(50.0)
    with pytest.raises(ValueError):
        tok("x", "3.9")


def test_cmrc_word_splitting_agrees_with_installed_nltk():
    """Runs where nltk is installed (no data needed: word_tokenize's Treebank stage only);
    the rules compared are the installed version's."""
    nltk = pytest.importorskip("nltk")
    from nltk.tokenize.destructive import NLTKWordTokenizer
    version = tuple(int(x) for x in nltk.__version__.split(".")[:2])
    rules = "3.6" if version < (3, 7) else "3.7"
    rng = random.Random(0)
    alphabet = list("ab 1.,'\"`:;()?!$*[]<>&") + ["n't", "'s", "can", "not", "''", "”", "..."]
    reference = NLTKWordTokenizer().tokenize
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        assert cmrc.treebank_tokenize(text, rules) == reference(text), text
