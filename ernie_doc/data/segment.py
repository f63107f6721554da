"""Cut a tokenized document into fixed-length segments, and expand them into reading passes.

The official classification layout (`ClassifyReader` of the official `ernie-doc/` code):
windows of T−2 tokens that advance by min(window, stride) (stride = memory_len = 128 by
default, so windows overlap), each laid out `[t1 … tn, SEP, PAD …, CLS]` with [CLS] last.
`cls_first` gives `[CLS, t1 … tn, SEP, PAD …]`.

A document's segments are built when read (`LazySteps`): a document of any length holds its
token ids and nothing per segment, in training, evaluation and prediction alike."""
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ernie_doc.errors import ConfigError, SegmenterError

LAYOUTS = ("cls_last", "cls_first")
CLS_INDEX = {"cls_last": -1, "cls_first": 0}   # where [CLS] sits: the model's cls_token_idx


@dataclass
class Segment:
    """One model input row: input_ids / attention_mask / token_type_ids [T]; `final` (predicted
    pass), `has_loss`, `targets` (collated arrays), `meta` (for evaluation, never collated),
    `sources`: where the document's tokens sit in the row, [(field, first token, end token,
    first position)] (an explanation maps positions back to the text; never collated)."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    doc_index: int
    seg_index: int = 0
    num_segments: int = 1
    token_type_ids: np.ndarray = None
    final: bool = True
    has_loss: bool = True
    targets: Dict[str, object] = field(default_factory=dict)
    meta: Optional[Dict[str, Any]] = None
    sources: Tuple[Tuple[str, int, int, int], ...] = ()

    @property
    def is_last(self):
        return self.seg_index == self.num_segments - 1


def window_count(num_tokens: int, window: int, stride: int) -> int:
    """How many windows `windows` cuts: 1 up to `window` tokens, else
    ceil((num_tokens − window) / min(window, stride)) + 1."""
    if window < 1 or stride < 1:
        raise ConfigError(f"window ({window}) and stride ({stride}) must be positive")
    return 1 + max(0, -(-(num_tokens - window) // min(window, stride)))


def window_span(i: int, num_tokens: int, window: int, stride: int) -> Tuple[int, int]:
    """(start, end) of window i of `windows`: every window but the last is full, so they
    start min(window, stride) apart."""
    start = i * min(window, stride)
    return start, min(start + window, num_tokens)


def windows(num_tokens: int, window: int, stride: int) -> List[Tuple[int, int]]:
    """[(start, end)] token windows of at most `window`, min(length, stride) apart, ending with
    the one that reaches the end (official); an empty document gives one empty window."""
    return [window_span(i, num_tokens, window, stride)
            for i in range(window_count(num_tokens, window, stride))]


class LazySteps(SequenceABC):
    """`count` steps, step i built by `build(i)` each time it is read: a sequence (len,
    indexing, slices, iteration) that holds nothing per step."""

    def __init__(self, count: int, build: Callable[[int], Any]):
        self.count, self.build = count, build

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.build(k) for k in range(*i.indices(self.count))]
        if not -self.count <= i < self.count:
            raise IndexError(f"step {i} of {self.count}")
        return self.build(i % self.count)


class ClassificationSegmenter:
    """ids → [Segment]: windows of seq_len−2 tokens, laid out with [SEP] and [CLS]."""

    def __init__(self, seq_len, stride, cls_id, sep_id, pad_id, layout="cls_last"):
        if layout not in LAYOUTS:
            raise SegmenterError(f"segment layout {layout!r}: expected one of {LAYOUTS}")
        if seq_len < 3:
            raise SegmenterError(f"seq_len {seq_len} leaves no room for tokens besides "
                                 f"[CLS]/[SEP]")
        self.seq_len, self.stride, self.layout = seq_len, stride, layout
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id

    @property
    def cls_position(self):
        return CLS_INDEX[self.layout] % self.seq_len

    def __call__(self, ids: Sequence[int], doc_index: int, targets=None, aligned=None,
                 has_loss: bool = True) -> LazySteps:
        """→ the document's segments, each built when read (LazySteps of Segment). targets:
        the same for every segment; aligned: {name: [n] int array} per token of `ids`, laid
        out like the tokens (−1 at [CLS]/[SEP]/padding) into target `name` [T]; has_loss:
        False for a document without gold (its rows never train)."""
        ids = np.array(ids, dtype=np.int64)   # our own copy: segments are cut from it later
        count = window_count(len(ids), self.seq_len - 2, self.stride)
        targets, aligned = dict(targets or {}), dict(aligned or {})

        def build(i):
            return self.segment(ids, i, count, doc_index, targets, aligned, has_loss)
        return LazySteps(count, build)

    def segment(self, ids: np.ndarray, i: int, count: int, doc_index: int,
                targets: Dict[str, Any], aligned: Dict[str, np.ndarray],
                has_loss: bool) -> Segment:
        """Segment i of `count` cut from the document's int64 `ids` [n] (see __call__)."""
        start, end = window_span(i, len(ids), self.seq_len - 2, self.stride)
        offset = 0 if self.layout == "cls_last" else 1   # where the first token sits
        n = end - start
        row = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        mask = np.zeros(self.seq_len, dtype=np.float32)
        row[offset:offset + n], row[offset + n] = ids[start:end], self.sep_id
        mask[:offset + n + 1] = 1.0
        row[CLS_INDEX[self.layout]], mask[CLS_INDEX[self.layout]] = self.cls_id, 1.0
        seg_targets = dict(targets)
        for name, values in aligned.items():
            laid = np.full(self.seq_len, -1, dtype=np.int64)
            laid[offset:offset + n] = values[start:end]
            seg_targets[name] = laid
        return Segment(row, mask, doc_index, i, count, targets=seg_targets, has_loss=has_loss,
                       sources=(("text", start, end, offset),))


Step = Union[Segment, Tuple[Segment, ...]]


def step_members(step: Step) -> Tuple[Segment, ...]:
    """The rows of one step: a Segment, or a tuple of g Segments for tasks whose example
    occupies g adjacent rows read in lockstep (one per choice, one per pair ...)."""
    return step if isinstance(step, tuple) else (step,)


def reading_passes(segments: Sequence[Step], retro_feed=True,
                   train_skim=False) -> Sequence[Step]:
    """The steps a document's row(s) read, built when read; with the retrospective feed, a
    skim pass (final=False) then the predicted retrospective pass (final=True)."""
    if not retro_feed:
        return segments
    n = len(segments)

    def skim(s):
        return replace(s, final=False, has_loss=s.has_loss and train_skim)

    def build(i):
        if i >= n:
            return segments[i - n]
        step = segments[i]
        return tuple(skim(m) for m in step) if isinstance(step, tuple) else skim(step)
    return LazySteps(2 * n, build)


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
