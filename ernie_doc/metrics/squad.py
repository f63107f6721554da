"""SQuAD-style answer normalisation and token-overlap scores, shared by the TriviaQA and
HotpotQA metrics.

Reproduces `normalize_answer`, `f1_score` and `exact_match_score` of the SQuAD v1.1
evaluation script (copied unchanged into HotpotQA's hotpot_evaluate_v1.py) and, with
``triviaqa=True``, the variant of TriviaQA's triviaqa_evaluation.py. No deviation, except
that `max_over_ground_truths` of an empty list is 0 where the scripts raise."""
import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
# TriviaQA also counts the curly single quotes and the acute accent as punctuation
# (its list adds "`" too, already in string.punctuation).
_TRIVIAQA_PUNCT = _ASCII_PUNCT | frozenset("\u2018\u2019\u00b4")


def normalize_answer(text, triviaqa=False):
    """Lower-case, drop punctuation, articles and extra whitespace. triviaqa=True: underscores
    and punctuation become spaces ("rock n roll", not SQuAD's "rocknroll")."""
    text = str(text).lower()
    if triviaqa:
        text = text.replace("_", " ")
        text = "".join(" " if ch in _TRIVIAQA_PUNCT else ch for ch in text)
    else:
        text = "".join(ch for ch in text if ch not in _ASCII_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction, ground_truth, triviaqa=False):
    """(f1, precision, recall) of the bag-of-tokens overlap of the normalised strings;
    all 0 when no token is shared (also when either side normalises to nothing)."""
    pred_tokens = normalize_answer(prediction, triviaqa).split()
    gold_tokens = normalize_answer(ground_truth, triviaqa).split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def exact_match(prediction, ground_truth, triviaqa=False):
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction, triviaqa) == normalize_answer(ground_truth, triviaqa))


def max_over_ground_truths(metric, prediction, ground_truths):
    """Best `metric(prediction, gt)` over the ground truths (0.0 for none)."""
    return max((metric(prediction, gt) for gt in ground_truths), default=0.0)


def average_scores(predictions, references, em_of, f1_of):
    """Mean EM and F1 ×100 over every reference question (em_of / f1_of → [0, 1]; no prediction
    scores 0) → (em, f1, total, missing)."""
    em = f1 = 0.0
    missing = 0
    for qid, ref in references.items():
        if qid not in predictions:
            missing += 1
            continue
        pred = str(predictions[qid])
        em += em_of(pred, ref)
        f1 += f1_of(pred, ref)
    total = len(references)
    scale = 100.0 / total if total else 0.0
    return em * scale, f1 * scale, total, missing
