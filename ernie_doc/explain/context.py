"""How far back a document model looks: the influence of the segment d segments back on the
last segment's prediction, by occlusion |Δ| and by gradient norm, averaged over documents; the
*reach* is the distance from which the occlusion curve stays under THRESHOLD of its value at
d = 0. Details: docs/explain.md, "How far back a model looks"."""
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from ernie_doc.data.document import Document
from ernie_doc.errors import DataError
from ernie_doc.explain.attribution import EmbeddingProbe, deep, gradient_norms, gradient_pass
from ernie_doc.explain.explainer import Explainer

THRESHOLD = 0.01   # the reach: influence under 1 % of the last segment's own


def last_segment_influence(explainer: Explainer, doc: Document) -> Optional[Dict[str, list]]:
    """One document → {"occlusion": |Δ| by distance [S], "gradient": norm by distance [S]}
    (index d: d segments back from the last), or None for a one-segment document."""
    task = explainer.task
    layout = explainer.layout_of(doc)
    S = layout.segments
    if S < 2:
        return None
    found: list = []

    def scorer(rows):   # the last segment's own prediction, from the document's rows
        last = [max(rows, key=lambda r: r[0])]
        plain = [(s, r.numpy()) for s, r in last]
        record = task.predict_document(doc, plain, layout.passes)
        found.append(task.explain_target(doc, layout.passes, plain, record, None))
        return lambda got: float(found[0].score([max(got, key=lambda r: r[0])]))
    deltas = np.abs(explainer.occlusion_deltas(layout, f"context {doc.doc_id}", scorer))
    target = found[0]
    norms = deep(last_segment_gradients, explainer, layout, target)
    return {"occlusion": deltas[::-1].tolist(), "gradient": norms[::-1].tolist()}


def last_segment_gradients(explainer: Explainer, layout: Any, target: Any) -> np.ndarray:
    """‖∂target/∂x‖ per segment [S] (the target's margin where the kind has one), from one
    gradient pass through the memories (run it with attribution.deep)."""
    probe = EmbeddingProbe(explainer.model.ernie_doc.embeddings.word_emb,
                           explainer.replacement, [1.0], layout.group)
    _, recompute = explainer._plan(layout)
    with gradient_pass(explainer.model, recompute), probe.attached():
        got = explainer._read(layout, [None], probe)[0]
        (target.margin or target.score)([max(got, key=lambda r: r[0])]).backward()
    return gradient_norms(probe, layout.segments)


def mean_curve(curves: List[List[float]]) -> Dict[str, list]:
    """Per distance d: the mean over the curves that reach d, and how many do."""
    longest = max((len(c) for c in curves), default=0)
    means, counts = [], []
    for d in range(longest):
        values = [c[d] for c in curves if len(c) > d]
        means.append(float(np.mean(values)))
        counts.append(len(values))
    return {"mean": means, "documents": counts}


def reach(curve: List[float], threshold: float = THRESHOLD) -> Dict[str, Any]:
    """The distance from which `curve` (by distance, d = 0 first) stays under threshold ×
    curve[0] → {"distance": d, "beyond": True when it never falls under within the curve}."""
    if not curve or curve[0] <= 0:
        return {"distance": 0, "beyond": False}
    above = [d for d, v in enumerate(curve) if v >= threshold * curve[0]]
    d = max(above) + 1
    return {"distance": d, "beyond": d >= len(curve)}


def measure_documents(explainer: Explainer, documents: Iterable[Any], limit: int,
                      bar: Any = None) -> Dict[str, Any]:
    """The model's curves over the first `limit` documents of two segments or more (the
    others, and those it cannot read, are counted) → {"occlusion": mean_curve + reach,
    "gradient": mean_curve + reach, "documents", "skipped"}."""
    occlusion, gradient, skipped = [], [], 0
    for index, item in enumerate(explainer.pipe.items(documents)):
        if len(occlusion) >= limit:
            break
        doc = explainer.pipe.admit(index, item, set(), {})
        try:
            found = last_segment_influence(explainer, doc) \
                if isinstance(doc, Document) else None
        except DataError:
            found = None
        if found is None:
            skipped += 1
            continue
        occlusion.append(found["occlusion"])
        gradient.append(found["gradient"])
        if bar is not None:
            bar.update(1)
    result: Dict[str, Any] = {"documents": len(occlusion), "skipped": skipped}
    for name, curves in (("occlusion", occlusion), ("gradient", gradient)):
        curve = mean_curve(curves)
        result[name] = dict(curve, reach=reach(curve["mean"]))
    return result
