"""An explanation as one JSON-able record (its schema: docs/explain.md, "The record"), built
from per-segment and per-token scores; every kind's explainer builds it here."""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

READINGS = {1: ["single"], 2: ["skim", "retrospective"]}
Fields = Dict[str, Tuple[str, np.ndarray]]   # field → (text, token offsets [n, 2])
Source = Tuple[str, int, int]                 # (field, first token, end token)
# a segment's source, or all of them (pair matching reads A beside B, and A beside C)
Sources = Union[Source, List[Source]]


def all_sources(source: Sources) -> List[Source]:
    return source if isinstance(source, list) else [source]


def spread(sources: Sequence[Sources], scores: np.ndarray, fields: Fields
           ) -> Dict[str, np.ndarray]:
    """Each token's score as the mean of the scores of the segments holding it (segments may
    overlap; a segment may hold tokens of several fields) → {field: [n]}; tokens no segment
    holds get 0."""
    found = {}
    pairs = [(src, score) for each, score in zip(sources, scores) for src in all_sources(each)]
    for field, (_, offsets) in fields.items():
        total, count = np.zeros(len(offsets) + 1), np.zeros(len(offsets) + 1)
        for (f, start, end), score in pairs:
            if f == field and end > start:
                total[start] += score
                total[end] -= score
                count[start] += 1
                count[end] -= 1
        total, count = np.cumsum(total)[:-1], np.cumsum(count)[:-1]
        found[field] = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    return found


def segment_entries(sources: Sequence[Sources], scores: np.ndarray,
                    by_reading: Optional[np.ndarray], fields: Fields) -> List[dict]:
    """The record's "segments": one entry per segment with its (first) field, token and
    character ranges, score, and per-reading scores (or None)."""
    entries = []
    for s, each in enumerate(sources):
        field, start, end = all_sources(each)[0]
        offsets = fields[field][1]
        chars = [int(offsets[start][0]), int(offsets[end - 1][1])] if end > start else [0, 0]
        entries.append({"segment": s, "field": field, "chars": chars,
                        "tokens": [int(start), int(end)], "score": _num(scores[s]),
                        "by_reading": None if by_reading is None else
                        [_num(x) for x in by_reading[s]]})
    return entries


def top_tokens(tokens: Dict[str, np.ndarray], fields: Fields, k: int) -> List[dict]:
    """The k tokens of largest |score| over every field, largest first, with their character
    offsets and text."""
    pool = [(abs(float(v)), field, t) for field, values in tokens.items()
            for t, v in enumerate(values) if v != 0]
    pool.sort(key=lambda x: (-x[0], x[1], x[2]))
    found = []
    for _, field, t in pool[:k]:
        text, offsets = fields[field]
        a, b = int(offsets[t][0]), int(offsets[t][1])
        found.append({"field": field, "start": a, "end": b, "text": text[a:b],
                      "score": _num(tokens[field][t])})
    return found


def explanation_record(doc_id: str, kind: str, method: str, target: Dict[str, Any],
                       prediction: Dict[str, Any], readings: int,
                       sources: Sequence[Source], scores: np.ndarray,
                       by_reading: Optional[np.ndarray], tokens: Optional[Dict[str, np.ndarray]],
                       fields: Fields, top: int = 20, extra: Optional[dict] = None) -> dict:
    """The record. `scores` [S]: each segment's; `by_reading` [S, readings] or None;
    `tokens` {field: [n]} per token, or None (occlusion: each segment's score spread over
    its tokens for the page; no top tokens)."""
    per_token = tokens is not None
    if tokens is None:
        tokens = spread(sources, scores, fields)
    record = {"doc_id": doc_id, "kind": kind, "method": method, "target": target,
              "prediction": prediction, "readings": READINGS[readings],
              "segments": segment_entries(sources, scores, by_reading, fields),
              # occlusion scores segments: its tokens would list the best segment's words
              "top_tokens": top_tokens(tokens, fields, top) if per_token else []}
    record.update(extra or {})
    record["token_scores"] = {
        field: [[int(a), int(b), _num(v)] for (a, b), v in zip(fields[field][1], values)]
        for field, values in tokens.items()}
    record["texts"] = {field: text for field, (text, _) in fields.items()}
    return record


def _num(x: Any) -> float:
    """A score as a JSON number: float, 6 significant digits."""
    return float(f"{float(x):.6g}")
