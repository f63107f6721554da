"""Cut a tokenized document into fixed-length segments, and expand them into reading passes.

The official classification layout (`ClassifyReader` of the official `ernie-doc/` code):
windows of T−2 tokens that advance by min(window, stride) (stride = memory_len = 128 by
default, so windows overlap), each laid out `[t1 … tn, SEP, PAD …, CLS]` with [CLS] last.
`cls_first` gives `[CLS, t1 … tn, SEP, PAD …]`."""
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

LAYOUTS = ("cls_last", "cls_first")
CLS_INDEX = {"cls_last": -1, "cls_first": 0}   # where [CLS] sits: the model's cls_token_idx


@dataclass
class Segment:
    """One model input row: input_ids / attention_mask / token_type_ids [T]; `final` (predicted
    pass), `has_loss`, `targets` (collated arrays), `meta` (for evaluation, never collated)."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    doc_index: int
    seg_index: int = 0
    num_segments: int = 1
    token_type_ids: np.ndarray = None
    final: bool = True
    has_loss: bool = True
    targets: Dict[str, object] = field(default_factory=dict)
    meta: Optional[Dict[str, object]] = None

    @property
    def is_last(self):
        return self.seg_index == self.num_segments - 1


def windows(num_tokens: int, window: int, stride: int) -> List[Tuple[int, int]]:
    """[(start, end)] token windows of at most `window`, min(length, stride) apart, ending with
    the one that reaches the end (official); an empty document gives one empty window."""
    if window < 1 or stride < 1:
        raise ValueError(f"window ({window}) and stride ({stride}) must be positive")
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, window)
        spans.append((start, start + length))
        if start + length >= num_tokens:
            return spans
        start += min(length, stride)


class ClassificationSegmenter:
    """ids → [Segment]: windows of seq_len−2 tokens, laid out with [SEP] and [CLS]."""

    def __init__(self, seq_len, stride, cls_id, sep_id, pad_id, layout="cls_last"):
        if layout not in LAYOUTS:
            raise ValueError(f"segment layout {layout!r}: expected one of {LAYOUTS}")
        if seq_len < 3:
            raise ValueError(f"seq_len {seq_len} leaves no room for tokens besides [CLS]/[SEP]")
        self.seq_len, self.stride, self.layout = seq_len, stride, layout
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id

    @property
    def cls_position(self):
        return CLS_INDEX[self.layout] % self.seq_len

    def __call__(self, ids: Sequence[int], doc_index: int, targets=None,
                 aligned=None) -> List[Segment]:
        """targets: the same for every segment; aligned: {name: [n] int array} per token of
        `ids`, laid out like the tokens (−1 at [CLS]/[SEP]/padding) into target `name` [T]."""
        ids = np.asarray(ids, dtype=np.int64)
        spans = windows(len(ids), self.seq_len - 2, self.stride)
        offset = 0 if self.layout == "cls_last" else 1   # where the first token sits
        segments = []
        for i, (start, end) in enumerate(spans):
            n = end - start
            row = np.full(self.seq_len, self.pad_id, dtype=np.int64)
            mask = np.zeros(self.seq_len, dtype=np.float32)
            row[offset:offset + n], row[offset + n] = ids[start:end], self.sep_id
            mask[:offset + n + 1] = 1.0
            row[CLS_INDEX[self.layout]], mask[CLS_INDEX[self.layout]] = self.cls_id, 1.0
            seg_targets = dict(targets or {})
            for name, values in (aligned or {}).items():
                laid = np.full(self.seq_len, -1, dtype=np.int64)
                laid[offset:offset + n] = values[start:end]
                seg_targets[name] = laid
            segments.append(Segment(row, mask, doc_index, i, len(spans), targets=seg_targets))
        return segments


Step = Union[Segment, Tuple[Segment, ...]]


def step_members(step: Step) -> Tuple[Segment, ...]:
    """The rows of one step: a Segment, or a tuple of g Segments for tasks whose example
    occupies g adjacent rows read in lockstep (one per choice, one per pair ...)."""
    return step if isinstance(step, tuple) else (step,)


def reading_passes(segments: List[Step], retro_feed=True, train_skim=False) -> List[Step]:
    """The steps a document's row(s) read; with the retrospective feed, a skim pass
    (final=False) then the predicted retrospective pass (final=True)."""
    if not retro_feed:
        return list(segments)

    def skim(s):
        return replace(s, final=False, has_loss=s.has_loss and train_skim)

    return [tuple(skim(m) for m in step) if isinstance(step, tuple) else skim(step)
            for step in segments] + list(segments)


def pack_row(parts: Sequence[Sequence[int]], seq_len: int, cls_id: int, sep_id: int,
             pad_id: int) -> Tuple[np.ndarray, np.ndarray]:
    """`[CLS] part1 [SEP] part2 [SEP] …` padded to seq_len → (ids [T] int64, mask [T] float32)."""
    row = [cls_id]
    for part in parts:
        row.extend(part)
        row.append(sep_id)
    if len(row) > seq_len:
        raise ValueError(f"a row of {len(row)} tokens does not fit max_seq_len {seq_len}")
    ids = np.full(seq_len, pad_id, dtype=np.int64)
    ids[:len(row)] = row
    mask = np.zeros(seq_len, dtype=np.float32)
    mask[:len(row)] = 1.0
    return ids, mask
