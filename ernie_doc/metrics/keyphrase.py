"""OpenKP keyphrase metrics P/R/F1 @1, @3, @5, reproducing the official MS MARCO OpenKP
evaluate.py (microsoft/OpenKP, also bertkpe/evaluator/openkp_evaluator.py of thunlp/BERT-KPE).

A phrase is normalised by lower-casing its words and joining them with one space (the
official script gets phrases as word lists; a string here is split on whitespace first),
without removing punctuation or articles; empty phrases are dropped. Predictions are
de-duplicated keeping rank order, gold phrases counted once. P@k = hits in the top k / k
(k even when fewer were predicted), R@k = hits / distinct gold phrases, F1@k per document;
all three averaged over documents, as fractions in 0..1.

Deviations: averages run over all reference documents, a document without predictions
scoring 0 (the official script refuses to score unless both files list the same URLs); a
document with no gold phrase scores recall 0 (the official script divides by zero).
"""

DEPTHS = (1, 3, 5)


def normalize_phrase(phrase):
    """Lower-cased words joined by single spaces; phrase is a string or a list of words."""
    words = phrase.split() if isinstance(phrase, str) else [str(w) for w in phrase]
    return " ".join(w.lower() for w in words).rstrip()


def _clean(phrases):
    """Normalised, non-empty, first occurrence kept, order kept."""
    kept = []
    for phrase in phrases:
        # official remove_empty: a word list whose first word is empty is dropped whole
        if not isinstance(phrase, str) and (len(phrase) == 0 or len(phrase[0]) == 0):
            continue
        norm = normalize_phrase(phrase)
        if norm:
            kept.append(norm)
    return list(dict.fromkeys(kept))


def precision_recall_at(predicted, gold, depths=DEPTHS):
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


def evaluate(predictions, references, depths=DEPTHS):
    """predictions: url -> ranked phrases; references: url -> gold phrases.
    → {"f1@k", "p@k", "r@k"} for each k, "total" (documents), "missing" (without prediction)."""
    sums = {f"{m}@{k}": 0.0 for k in depths for m in ("f1", "p", "r")}
    missing = 0
    for url, gold in references.items():
        if url not in predictions:
            missing += 1
        for k, (p, r) in precision_recall_at(predictions.get(url, []), gold, depths).items():
            sums[f"f1@{k}"] += f1(p, r)
            sums[f"p@{k}"] += p
            sums[f"r@{k}"] += r
    total = len(references)
    result = {key: value / total if total else 0.0 for key, value in sums.items()}
    result.update(total=total, missing=missing)
    return result
