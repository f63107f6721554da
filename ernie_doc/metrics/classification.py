"""Document-level classification: aggregate segment probabilities, then accuracy / F1."""
import numpy as np

from ernie_doc.errors import ConfigError


def aggregate_segments(segment_probs, how="mean"):
    """segment_probs: [(seg_index, probs [C])] of one document's predicted (final-pass)
    segments, or an object whose `arrays()` gives them as (seg_index [n], probs [n, C])
    (data.splits.RowOutputs) → document probabilities [C]: their mean (official) or the last
    segment's. Either form gives the same bits: the same rows, in the same order."""
    if not len(segment_probs):
        raise ValueError("a document has no predicted segment")
    arrays = segment_probs.arrays() if hasattr(segment_probs, "arrays") else None
    if arrays is not None:
        segs, probs = arrays
        ordered = probs[np.argsort(segs, kind="stable")]
    else:
        ordered = [p for _, p in sorted(segment_probs, key=lambda x: x[0])]
    if how == "last":
        return np.asarray(ordered[-1], dtype=np.float64)
    if how != "mean":
        raise ConfigError(f"unknown aggregation {how!r}")
    return np.mean(ordered, axis=0)


def accuracy(pred, gold):
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float((pred == gold).mean()) if len(gold) else 0.0


def f1_score(pred, gold, average="binary", positive=1):
    """average="binary": F1 of the `positive` class; "macro": mean F1 over the classes
    present in gold or pred."""
    pred, gold = np.asarray(pred), np.asarray(gold)

    def f1_of(c):
        tp = float(((pred == c) & (gold == c)).sum())
        fp = float(((pred == c) & (gold != c)).sum())
        fn = float(((pred != c) & (gold == c)).sum())
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0

    if average == "binary":
        return f1_of(positive)
    classes = sorted(set(pred.tolist()) | set(gold.tolist()))
    return float(np.mean([f1_of(c) for c in classes])) if classes else 0.0


def classification_metrics(pred, gold, num_classes, names=("accuracy", "f1"), positive=1):
    out = {}
    for name in names:
        if name == "accuracy":
            out[name] = accuracy(pred, gold)
        elif name == "f1":
            # binary F1 of the positive class for two labels, macro F1 otherwise
            out[name] = f1_score(pred, gold, "binary" if num_classes == 2 else "macro",
                                 positive)
        elif name == "macro_f1":
            out[name] = f1_score(pred, gold, "macro")
        else:
            raise ConfigError(f"unknown classification metric {name!r}")
    return out
