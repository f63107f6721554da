"""Document-QA / keyphrase metrics (CMRC2018, TriviaQA, HotpotQA, OpenKP) against
hand-computed cases; each expected number's derivation is in the comment beside it."""
import pytest

from ernie_doc.metrics import cmrc, hotpot, keyphrase, squad, triviaqa

approx = pytest.approx


# ---------------------------------------------------------------- shared SQuAD helpers
def test_squad_normalize_removes_punctuation_articles_whitespace():
    # lower → "the  cat's, a pet!"; drop punctuation → "the  cats a pet";
    # articles → spaces; collapse → "cats pet"
    assert squad.normalize_answer("The  Cat's, a pet!") == "cats pet"
    # "another"/"theory" keep their a/the: articles are whole words only
    assert squad.normalize_answer("another theory") == "another theory"


def test_squad_token_f1_and_exact_match():
    # pred tokens {big, red, apple} vs gold {red, apple} ("an" dropped): 2 shared,
    # precision 2/3, recall 2/2, F1 = 2·(2/3)·1 / (2/3 + 1) = 0.8
    assert squad.token_f1("big red apple", "an apple, red") == approx((0.8, 2 / 3, 1.0))
    assert squad.token_f1("pear", "apple") == (0.0, 0.0, 0.0)
    assert squad.exact_match("The Apple.", "apple") == 1.0
    assert squad.exact_match("apples", "apple") == 0.0
    assert squad.max_over_ground_truths(squad.exact_match, "x", []) == 0.0


# ---------------------------------------------------------------- CMRC2018
def test_cmrc_mixed_segmentation_chinese_english():
    # lower + strip; each CJK char alone; "peking university 2019" is a run → 3 words
    assert cmrc.mixed_segmentation(" 北京大学Peking University 2019年 ") == [
        "北", "京", "大", "学", "peking", "university", "2019", "年"]
    # official punctuation chars are segments; rm_punc drops them
    assert cmrc.mixed_segmentation("《三体》：刘慈欣") == ["《", "三", "体", "》", "：", "刘", "慈", "欣"]
    assert cmrc.mixed_segmentation("《三体》：刘慈欣", rm_punc=True) == ["三", "体", "刘", "慈", "欣"]
    # "-" is official punctuation: a segment of its own, removed with rm_punc (→ "covid19")
    assert cmrc.mixed_segmentation("COVID-19疫苗") == ["covid", "-", "19", "疫", "苗"]
    assert cmrc.mixed_segmentation("COVID-19疫苗", rm_punc=True) == ["covid19", "疫", "苗"]


def test_cmrc_treebank_tokenizer_rules():
    # what nltk.word_tokenize gives for these (one sentence each)
    tok = cmrc.treebank_tokenize
    assert tok("he said, hello.") == ["he", "said", ",", "hello", "."]
    assert tok("3.5 and 3,000 at 10:30") == ["3.5", "and", "3,000", "at", "10:30"]
    assert tok("(abc) don't cannot") == ["(", "abc", ")", "do", "n't", "can", "not"]
    assert tok('"hi" there') == ["``", "hi", "''", "there"]
    # only a run-final period is split off; an inner "u.s." stays whole
    assert tok("u.s. a...b it's $5!") == ["u.s.", "a", "...", "b", "it", "'s", "$", "5", "!"]
    assert tok("the u.s.") == ["the", "u.s", "."]
    assert tok("   ") == []


def test_cmrc_remove_punctuation_and_ellipsis_quirk():
    assert cmrc.remove_punctuation(" 《三体》， Two ") == "三体 two"   # space inside is kept
    # the official "……" entry is two characters long and never matches: "…" stays
    assert cmrc.remove_punctuation("三体…") == "三体…"


def test_cmrc_find_lcs_is_contiguous():
    # common runs of "abxcd" / "abcd": "ab" (2) and "cd" (2); the first in s1 wins.
    # A subsequence LCS would be 4 ("abcd").
    assert cmrc.find_lcs(list("abxcd"), list("abcd")) == (["a", "b"], 2)
    assert cmrc.find_lcs([], list("ab")) == ([], 0)


def test_cmrc_f1_known_values():
    # pred 北京大学 (4 segs) vs gold 北京 (2): LCS 2 → P = 2/4, R = 2/2,
    # F1 = 2·0.5·1 / 1.5 = 0.6667
    assert cmrc.f1_score("北京大学", ["北京"]) == approx(2 / 3)
    # pred 北大京 vs gold 北京: longest contiguous common run is one char → P = 1/3, R = 1/2,
    # F1 = 2·(1/6) / (5/6) = 0.4
    assert cmrc.f1_score("北大京", ["北京"]) == approx(0.4)
    # mixed: pred [iphone, 11, 手, 机] vs gold [iphone, 11]: LCS 2 → P 1/2, R 1 → 2/3
    assert cmrc.f1_score("iPhone 11手机", ["iphone 11"]) == approx(2 / 3)
    # max over golds: vs 上海 → 0, vs 北京大学 → 1
    assert cmrc.f1_score("北京大学", ["上海", "北京大学"]) == 1.0
    assert cmrc.f1_score("", ["北京"]) == 0.0


def test_cmrc_exact_match_ignores_punctuation_only():
    assert cmrc.exact_match("《三体》。", ["三体"]) == 1.0
    # "-" is deleted, not replaced by a space
    assert cmrc.exact_match("Peking-University", ["peking university"]) == 0.0
    assert cmrc.exact_match("pekinguniversity", ["Peking-University"]) == 1.0
    # a space survives remove_punctuation, so EM 0, but segment F1 is 1 (spaces vanish)
    assert cmrc.exact_match("三 体", ["三体"]) == 0.0
    assert cmrc.f1_score("三 体", ["三体"]) == 1.0


def test_cmrc_evaluate():
    references = {"q1": ["北京"], "q2": ["三体", "《三体》"], "q3": ["上海"]}
    predictions = {"q1": "北京大学", "q2": "《三体》", "extra": "x"}   # q3 unanswered
    out = cmrc.evaluate(predictions, references)
    # EM: q1 0, q2 1, q3 0 → 100·1/3;  F1: 2/3 + 1 + 0 → 100·(5/3)/3 = 55.556
    # avg = (33.333 + 55.556) / 2 = 44.444
    assert out["em"] == approx(100 / 3)
    assert out["f1"] == approx(500 / 9)
    assert out["avg"] == approx(400 / 9)
    assert (out["total"], out["skipped"]) == (3, 1)


def test_cmrc_empty_answer_list_is_unanswerable():
    # scored against [""]: an empty prediction matches exactly (EM 1, F1 0 as official)
    assert cmrc.evaluate({"q": ""}, {"q": []}) == approx(
        {"em": 100.0, "f1": 0.0, "avg": 50.0, "total": 1, "skipped": 0})


# ---------------------------------------------------------------- TriviaQA
def test_triviaqa_normalize_underscore_punctuation_articles():
    # "_" → " "; lower; "!" → " "; "the" removed → "beatles"
    assert triviaqa.normalize_answer("The_Beatles!") == "beatles"
    # punctuation becomes a space in TriviaQA, is deleted in SQuAD
    assert triviaqa.normalize_answer("Rock-n-Roll") == "rock n roll"
    assert squad.normalize_answer("Rock-n-Roll") == "rocknroll"
    # the unicode quotes/accent the official script adds: ’ ‘ ´
    assert triviaqa.normalize_answer("Don’t ‘Stop´") == "don t stop"
    assert squad.normalize_answer("Don’t") == "don’t"          # not ASCII punctuation


def test_triviaqa_scores():
    # pred [rolling, stones, band] vs gold "Rolling_Stones" → [rolling, stones]:
    # P = 2/3, R = 1, F1 = 0.8
    assert triviaqa.f1_score("The Rolling Stones band", "Rolling_Stones") == approx(0.8)
    assert triviaqa.exact_match("the rolling-stones", "Rolling Stones") == 1.0


def test_triviaqa_ground_truths():
    answer = {"NormalizedAliases": ["fab four", "beatles"], "NormalizedValue": "beatles",
              "HumanAnswers": ["The_Beatles.", "Lennon & co"]}
    # aliases, value (already there), then the normalised human answers, duplicates once
    assert triviaqa.ground_truths(answer) == ["fab four", "beatles", "lennon co"]
    hf_style = {"normalized_aliases": ["x"], "normalized_value": "y"}
    assert triviaqa.ground_truths(hf_style) == ["x", "y"]


def test_triviaqa_evaluate():
    references = {
        "q1": {"NormalizedAliases": ["beatles", "fab four"], "NormalizedValue": "beatles"},
        "q2": ["Paul McCartney"],
        "q3": {"NormalizedAliases": ["london"]},
    }
    predictions = {"q1": "The Beatles", "q2": "Sir Paul McCartney"}   # q3 missing
    out = triviaqa.evaluate(predictions, references)
    # q1: EM 1, F1 1.  q2: [sir, paul, mccartney] vs [paul, mccartney] → P 2/3, R 1,
    # F1 0.8, EM 0.  q3: 0.  EM = 100·1/3, F1 = 100·1.8/3 = 60
    assert out == approx({"em": 100 / 3, "f1": 60.0, "total": 3, "missing": 1})


# ---------------------------------------------------------------- HotpotQA
def test_hotpot_answer_yes_no_rule():
    # plain token F1 of "yes" vs "yes it is": P 1, R 1/3, F1 0.5 ...
    assert squad.token_f1("yes", "yes it is") == approx((0.5, 1.0, 1 / 3))
    # ... but a yes/no prediction that differs from the gold scores 0 in HotpotQA
    assert hotpot.answer_scores("yes", "yes it is") == (0.0, 0.0, 0.0, 0.0)
    assert hotpot.answer_scores("it is no", "no") == (0.0, 0.0, 0.0, 0.0)   # gold side
    assert hotpot.answer_scores("Yes.", "yes") == (1.0, 1.0, 1.0, 1.0)
    # not special: "Barack Obama" vs "Obama" → P 1/2, R 1, F1 2/3, EM 0
    assert hotpot.answer_scores("Barack Obama", "the Obama") == approx((0.0, 2 / 3, 0.5, 1.0))


def test_hotpot_supporting_facts():
    # pred {(A,0),(A,1),(B,2)} (duplicate dropped) vs gold {(A,0),(B,0)}: tp 1, fp 2, fn 1
    # → P 1/3, R 1/2, F1 = 2·(1/6)/(5/6) = 0.4, EM 0
    pred = [["A", 0], ["A", 1], ["B", 2], ["A", 0]]
    assert hotpot.sp_scores(pred, [["A", 0], ["B", 0]]) == approx((0.0, 0.4, 1 / 3, 0.5))
    assert hotpot.sp_scores([["B", 1], ["A", 0]], [["A", 0], ["B", 1]]) == (1.0, 1.0, 1.0, 1.0)
    assert hotpot.sp_scores([], []) == (1.0, 0.0, 0.0, 0.0)   # official: fp + fn = 0 → EM 1


def test_hotpot_evaluate_joint():
    gold = [
        {"_id": "a", "answer": "Obama", "supporting_facts": [["A", 0], ["B", 1], ["C", 2]]},
        {"_id": "b", "answer": "yes", "supporting_facts": [["D", 0]]},
        {"_id": "c", "answer": "Paris", "supporting_facts": [["E", 3]]},
    ]
    pred_answers = {"a": "Barack Obama", "b": "Yes"}                   # "c" missing
    pred_sp = {"a": [["A", 0], ["B", 1]], "b": [["D", 0]], "c": [["E", 3]]}
    out = hotpot.evaluate(pred_answers, pred_sp, gold)
    # a: answer EM 0, F1 2/3, P 1/2, R 1;  sp tp 2 fp 0 fn 1 → EM 0, P 1, R 2/3, F1 0.8
    #    joint P = 1/2·1 = 1/2, R = 1·2/3, F1 = 2·(1/2)(2/3)/(7/6) = 4/7, EM 0
    # b: everything 1.   c: answer 0 (missing), sp all 1, joint 0
    expected = {
        "em": 1 / 3, "f1": (2 / 3 + 1) / 3, "prec": 1.5 / 3, "recall": 2 / 3,
        "sp_em": 2 / 3, "sp_f1": 2.8 / 3, "sp_prec": 1.0, "sp_recall": (2 / 3 + 2) / 3,
        "joint_em": 1 / 3, "joint_f1": (4 / 7 + 1) / 3, "joint_prec": 1.5 / 3,
        "joint_recall": (2 / 3 + 1) / 3,
    }
    assert out == approx(expected)
    assert set(out) == set(hotpot.KEYS)


# ---------------------------------------------------------------- OpenKP
def test_keyphrase_normalize():
    assert keyphrase.normalize_phrase("  Machine \t Learning ") == "machine learning"
    assert keyphrase.normalize_phrase(["Machine", "Learning"]) == "machine learning"
    # no punctuation / article removal in OpenKP
    assert keyphrase.normalize_phrase("The C++ Book") == "the c++ book"


def test_keyphrase_duplicates_and_k_beyond_predictions():
    # preds de-duplicated → [deep learning, neural nets, gpu]; 3 distinct gold.
    # @1: 1 hit → P 1, R 1/3, F1 = 2·(1/3)/(4/3) = 0.5
    # @3: 2 hits → P 2/3, R 2/3, F1 2/3 (without de-dup the top 3 would hold 1 hit)
    # @5: still 2 hits, P = 2/5 (divided by k), R 2/3, F1 = (8/15)/(16/15) = 0.5
    pr = keyphrase.precision_recall_at(
        ["Deep Learning", "deep  learning", "neural nets", "GPU", ""],
        ["deep learning", "GPU", "transformers", "Transformers"])
    assert sorted(pr) == [1, 3, 5]
    assert pr[1] == approx((1.0, 1 / 3))
    assert pr[3] == approx((2 / 3, 2 / 3))
    assert pr[5] == approx((0.4, 2 / 3))


def test_keyphrase_evaluate():
    predictions = {
        "u1": ["Deep Learning", "deep learning", "neural nets", "GPU"],
        "u2": ["x"],
        "u4": ["a"],
    }
    references = {
        "u1": ["deep learning", "GPU", "transformers"],
        "u2": ["Y", "y"],
        "u3": ["z"],                       # no prediction → 0
        "u4": [["A"]],                     # one gold (a word list), predicted first
    }
    out = keyphrase.evaluate(predictions, references)
    # u1 as above: @1 (P 1, R 1/3, F1 1/2), @3 (2/3, 2/3, 2/3), @5 (2/5, 2/3, 1/2)
    # u2, u3: all 0
    # u4: 1 hit of 1 gold: @1 P 1 R 1 F1 1; @3 P 1/3 R 1 F1 = (2/3)/(4/3) = 1/2;
    #     @5 P 1/5 R 1 F1 = (2/5)/(6/5) = 1/3
    # averages over 4 documents:
    expected = {
        "p@1": 2 / 4, "r@1": (1 / 3 + 1) / 4, "f1@1": 1.5 / 4,
        "p@3": (2 / 3 + 1 / 3) / 4, "r@3": (2 / 3 + 1) / 4, "f1@3": (2 / 3 + 1 / 2) / 4,
        "p@5": (2 / 5 + 1 / 5) / 4, "r@5": (2 / 3 + 1) / 4, "f1@5": (1 / 2 + 1 / 3) / 4,
        "total": 4, "missing": 1,
    }
    assert out == approx(expected)
