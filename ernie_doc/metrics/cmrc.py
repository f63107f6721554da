"""CMRC2018 span-extraction metrics (also used for DRCD and DuReader), reproducing the
official cmrc2018_evaluate.py (ymcui/cmrc2018, v5).

F1 over the longest common run of segments (CJK characters, punctuation, Treebank words), EM
without punctuation, max over gold answers. `treebank_tokenize` reimplements nltk 3.6.2's word
tokenizer. Deviations: docs/design-notes.md, "Metrics: CMRC2018"."""
import re
from typing import Dict, List, Mapping, Sequence

from ernie_doc.errors import ConfigError
from ernie_doc.metrics.squad import average_scores

# The official list, in its order. Only one-character entries can ever match.
_OFFICIAL_PUNCTUATION = (
    "-", ":", "_", "*", "^", "/", "\\", "~", "`", "+", "=",
    "，", "。", "：", "？", "！", "“", "”", "；", "’", "《", "》", "……", "·", "、",
    "「", "」", "（", "）", "－", "～", "『", "』")
PUNCTUATION = frozenset(p for p in _OFFICIAL_PUNCTUATION if len(p) == 1)


def _is_cjk(ch):
    return "\u4e00" <= ch <= "\u9fa5"


# --- Treebank word tokenizer (what nltk.word_tokenize applies within a sentence) -------
def _rules(*pairs):
    return [(re.compile(pattern), repl) for pattern, repl in pairs]


_OPENING = _rules(
    (r"([«“‘„]|`+)", r" \1 "),                   # opening quotes are tokens
    (r'^"', "``"),                                # a leading " opens a quote
    (r"(``)", r" \1 "),                          # `` is a token even inside ```
    (r"([ (\[{<])(\"|'')", r"\1 `` "),            # so does one after a space / bracket
    (r"(?i)(')(?!re|ve|ll|m|t|s|d|n)(\w)\b", r"\1 \2"),  # 'x (one letter), not a clitic
)
_PUNCT = _rules(
    (r"([^.])(\.)([\]\)}>\"'»”’ ]*)\s*$", r"\1 \2 \3 "),  # only the final period
    (r"([:,])([^\d])", r" \1 \2"),                # not inside numbers: 3,000 10:30
    (r"([:,])$", r" \1 "),
    (r"\.{2,}", r" \g<0> "),                      # ellipsis
    (r"[;@#$%&]", r" \g<0> "),
    (r"([^.])(\.)([\]\)}>\"']*)\s*$", r"\1 \2\3 "),  # nltk's second final-period rule
    (r"[?!]", r" \g<0> "),
    (r"([^'])' ", r"\1 ' "),                      # closing single quote
    (r"[*]", r" \g<0> "),                        # after it: "b's'*" keeps "b's" whole
    (r"[\]\[(){}<>]", r" \g<0> "),                # brackets
    (r"--", r" -- "),
)
_CLOSING_COMMON = _rules((r"([»”’])", r" \1 "),)
# nltk 3.6.2 (the version ERNIE-Doc pins): a remaining " closes a quote, and '' is split off
# only after a non-space character, so a run-initial '' stays glued to its word ("''abc").
_CLOSING_36 = _rules(
    (r'"', " '' "),
    (r"(\S)('')", r"\1 \2 "),
)
# nltk >= 3.7: every '' is a token of its own ("''abc" → '' abc).
_CLOSING_37 = _rules(
    (r"''", " '' "),
    (r'"', " '' "),
)
_CLITICS = _rules(
    (r"([^' ])('[sS]|'[mM]|'[dD]|') ", r"\1 \2 "),  # clitics: he 's, do n't
    (r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", r"\1 \2 "),
)
# Robert MacIntyre's contractions, split in two as the Treebank does.
_CONTRACTIONS = [re.compile(p) for p in (
    r"(?i)\b(can)(not)\b", r"(?i)\b(d)('ye)\b", r"(?i)\b(gim)(me)\b", r"(?i)\b(gon)(na)\b",
    r"(?i)\b(got)(ta)\b", r"(?i)\b(lem)(me)\b", r"(?i)\b(more)('n)\b", r"(?i)\b(wan)(na)(?=\s)",
    r"(?i) ('t)(is)\b", r"(?i) ('t)(was)\b")]


NLTK_RULES = ("3.6", "3.7")
_CLOSING = {"3.6": _CLOSING_COMMON + _CLOSING_36 + _CLITICS,
            "3.7": _CLOSING_COMMON + _CLOSING_37 + _CLITICS}


def treebank_tokenize(text: str, nltk_rules: str = "3.6") -> List[str]:
    """Word tokens of `text` by nltk.word_tokenize's Treebank rules. nltk_rules: "3.6" (nltk
    3.6.2, ERNIE-Doc's pin; default) or "3.7" (later nltk: splits a run-initial '')."""
    if nltk_rules not in _CLOSING:
        raise ConfigError(f"nltk_rules {nltk_rules!r} is not one of {list(NLTK_RULES)}")
    for pattern, repl in _OPENING + _PUNCT:
        text = pattern.sub(repl, text)
    # The closing-quote rules look for a following space: pad both ends.
    text = f" {text} "
    for pattern, repl in _CLOSING[nltk_rules]:
        text = pattern.sub(repl, text)
    for pattern in _CONTRACTIONS:
        text = pattern.sub(r" \1 \2 ", text)
    return text.split()


# --- official metric -----------------------------------------------------------------
def mixed_segmentation(text: str, rm_punc: bool = False, nltk_rules: str = "3.6") -> List[str]:
    """Segments of a Chinese/English string: one per CJK or punctuation character, Treebank
    words between; rm_punc drops punctuation."""
    segments, run = [], []
    for ch in str(text).lower().strip():
        if rm_punc and ch in PUNCTUATION:
            continue
        if _is_cjk(ch) or ch in PUNCTUATION:
            segments += treebank_tokenize("".join(run), nltk_rules)
            run = []
            segments.append(ch)
        else:
            run.append(ch)
    segments += treebank_tokenize("".join(run), nltk_rules)
    return segments


def remove_punctuation(text):
    """Lower-cased, stripped, official punctuation characters deleted (spaces kept)."""
    return "".join(ch for ch in str(text).lower().strip() if ch not in PUNCTUATION)


def find_lcs(s1, s2):
    """(longest common contiguous sub-list of s1 and s2, its length); the first one in s1
    on ties."""
    best, end = 0, 0
    prev = [0] * (len(s2) + 1)
    for i, a in enumerate(s1):
        cur = [0] * (len(s2) + 1)
        for j, b in enumerate(s2):
            if a == b:
                cur[j + 1] = prev[j] + 1
                if cur[j + 1] > best:
                    best, end = cur[j + 1], i + 1
        prev = cur
    return s1[end - best:end], best


def _as_list(answers):
    answers = [answers] if isinstance(answers, str) else list(answers)
    return answers or [""]


def f1_score(prediction: str, answers, nltk_rules: str = "3.6") -> float:
    """Max over the gold answers (a string or a list; none = [""]) of the segment-LCS F1 (0..1)."""
    pred_segs = mixed_segmentation(prediction, True, nltk_rules)
    best = 0.0
    for answer in _as_list(answers):
        gold_segs = mixed_segmentation(answer, True, nltk_rules)
        _, lcs = find_lcs(gold_segs, pred_segs)
        if lcs:
            precision, recall = lcs / len(pred_segs), lcs / len(gold_segs)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def exact_match(prediction: str, answers) -> float:
    """1.0 when the prediction equals a gold answer once punctuation is removed."""
    pred = remove_punctuation(prediction)
    return float(any(remove_punctuation(a) == pred for a in _as_list(answers)))


def evaluate(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]],
             nltk_rules: str = "3.6") -> Dict[str, float]:
    """predictions: qid -> answer; references: qid -> gold answers ([] scores against [""]) →
    {"em", "f1", "avg"} ×100, "total", "skipped". nltk_rules: see treebank_tokenize."""
    em, f1, total, skipped = average_scores(
        predictions, references, exact_match,
        lambda p, ref: f1_score(p, ref, nltk_rules))
    return {"em": em, "f1": f1, "avg": (em + f1) / 2, "total": total, "skipped": skipped}
