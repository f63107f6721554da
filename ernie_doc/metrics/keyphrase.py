"""OpenKP keyphrase metrics P/R/F1 @1, @3, @5, reproducing the official MS MARCO OpenKP
evaluate.py (microsoft/OpenKP, also bertkpe/evaluator/openkp_evaluator.py of thunlp/BERT-KPE).

Phrases are lower-cased and whitespace-normalised (no punctuation or article removal);
predictions are de-duplicated keeping rank order. P@k = hits in the top k / k, R@k = hits /
distinct gold phrases, F1@k per document, all averaged over documents as fractions in 0..1.
Empty phrases and deviations: docs/design-notes.md, "Metrics: OpenKP"."""

from typing import Dict, Iterable, List, Sequence, Tuple, Union

DEPTHS = (1, 3, 5)
Phrase = Union[str, Sequence[str]]   # a string (split on whitespace) or a list of words


def normalize_phrase(phrase):
    """Lower-cased words joined by single spaces; phrase is a string or a list of words."""
    words = phrase.split() if isinstance(phrase, str) else [str(w) for w in phrase]
    return " ".join(w.lower() for w in words).rstrip()


def _clean(phrases: Iterable[Phrase]) -> List[str]:
    """Normalised phrases, first occurrence kept, order kept; the official remove_empty
    rule (see the module docstring)."""
    kept = []
    for phrase in phrases:
        words = phrase.split() if isinstance(phrase, str) else list(phrase)
        # official remove_empty: a word list without words, or whose first word is empty, is
        # dropped whole; a list such as [" "] passes and normalises to ""
        if len(words) == 0 or len(str(words[0])) == 0:
            continue
        kept.append(normalize_phrase(words))
    return list(dict.fromkeys(kept))


def precision_recall_at(predicted: Iterable[Phrase], gold: Iterable[Phrase],
                        depths: Sequence[int] = DEPTHS) -> Dict[int, Tuple[float, float]]:
    """{k: (precision@k, recall@k)} of one document's ranked predictions."""
    predicted, gold = _clean(predicted), set(_clean(gold))
    out = {}
    for k in depths:
        hits = sum(p in gold for p in predicted[:k])
        out[k] = (hits / k, hits / len(gold) if gold else 0.0)
    return out


def f1(precision, recall):
    """Harmonic mean, 0 when both are 0."""
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def evaluate(predictions: Dict[str, List[Phrase]], references: Dict[str, List[Phrase]],
             depths: Sequence[int] = DEPTHS) -> Dict[str, float]:
    """predictions: url -> ranked phrases; references: url -> gold phrases → {"f1@k", "p@k",
    "r@k"} per k, "total", "missing". A phrase normalised to "" keeps its rank (official)."""
    sums = {f"{m}@{k}": 0.0 for k in depths for m in ("f1", "p", "r")}
    missing = 0
    for url, gold in references.items():
        if url not in predictions:
            missing += 1
        for k, (p, r) in precision_recall_at(predictions.get(url, []), gold,
                                             depths).items():
            sums[f"f1@{k}"] += f1(p, r)
            sums[f"p@{k}"] += p
            sums[f"r@{k}"] += r
    total = len(references)
    result = {key: value / total if total else 0.0 for key, value in sums.items()}
    result.update(total=total, missing=missing)
    return result
