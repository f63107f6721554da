"""Cut documents into the batches of segments the model reads, for your own loop
(`segment_batches`; the loop: docs/model.md).

The pieces are the trainer's (data.segment, data.schedule, data.collate), and documents are
read as a stream: only those in the batch rows are held. With a fine-tuned run's tokenizer,
`stride` the run's and `retro_feed=model.config.retro_feed`, the segments are those its
evaluation and `pipeline` read."""
from collections import namedtuple
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from ernie_doc.data.collate import TensorStage, collate
from ernie_doc.data.schedule import RowScheduler
from ernie_doc.data.segment import (ClassificationSegmenter, LazySteps, Segment, reading_passes,
                                    window_count, window_span)
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.utils import clip

# The largest segment and batch segment_batches cuts: a segment's [batch_size, seq_len] arrays
# are allocated per step (the tokenizers' MAX_MODEL_MAX_LENGTH bounds seq_len likewise).
MAX_SEQ_LEN = 1 << 20
MAX_BATCH_SIZE = 1 << 16


class SegmentBatch(namedtuple("SegmentBatch", ["input_ids", "attention_mask", "new_doc"])):
    """One step: input_ids [B, T] int64, attention_mask [B, T] float32, new_doc [B] bool (unpacks
    as those three); doc_index [B] int64 (−1: padding), final [B] bool (the reading whose
    outputs count: the second under retro_feed, else every segment) and is_last [B] bool (the
    document's last segment of that reading)."""
    doc_index: np.ndarray
    final: np.ndarray
    is_last: np.ndarray


def raw_segments(ids: Sequence[int], doc_index: int, seq_len: int, pad_id: int,
                 stride: Optional[int] = None) -> LazySteps:
    """ids → consecutive windows of `seq_len` tokens (`stride` apart, default seq_len), padded
    with pad_id, no special tokens (run-document's cut), each Segment built when read."""
    ids = np.array(ids, dtype=np.int64)   # our own copy: segments are cut from it later
    stride = stride or seq_len
    count = window_count(len(ids), seq_len, stride)

    def build(i):
        start, end = window_span(i, len(ids), seq_len, stride)
        row = np.full(seq_len, pad_id, dtype=np.int64)
        mask = np.zeros(seq_len, dtype=np.float32)
        row[:end - start], mask[:end - start] = ids[start:end], 1.0
        return Segment(row, mask, doc_index, i, count)
    return LazySteps(count, build)


def segment_batches(documents: Iterable[Any], seq_len: int, batch_size: int = 1,
                    tokenizer: Any = None, *, stride: Optional[int] = None,
                    pad_id: Optional[int] = None, special_tokens: bool = True,
                    retro_feed: bool = False,
                    return_tensors: Optional[str] = None) -> Iterator[SegmentBatch]:
    """Yield the SegmentBatch of each step reading `documents` (ids, or str with a tokenizer)
    lazily in `batch_size` rows of `seq_len`; with special_tokens the official layout (T−2
    tokens, [SEP], padding, [CLS]), or the layout a fine-tuned run's tokenizer records
    (`segment_layout`; its `max_doc_tokens` cuts each document, and `stride` defaults to its
    `segment_stride`, else T−2; seq_len must be its model_max_length). retro_feed (a bool;
    None, as a model config that records nothing, is False): each row reads its document
    twice, memory carried into the second reading (paper §3.1). return_tensors: None or "pd".
    ValueError naming the bad argument or document (one without tokens included: the
    pipeline gives it an error record)."""
    _check_size("seq_len", seq_len, MAX_SEQ_LEN)
    _check_reading(seq_len, tokenizer if special_tokens else None, retro_feed)
    _check_size("batch_size", batch_size, MAX_BATCH_SIZE)
    if stride is not None:
        _check_size("stride", stride, MAX_SEQ_LEN)
    if tokenizer is not None and special_tokens and seq_len < 3:
        raise ConfigError(f"seq_len must be at least 3 with special tokens ([SEP], [CLS] and a "
                          f"token), got {seq_len}")
    if return_tensors not in (None, "np", "pd"):
        raise ConfigError(f"return_tensors must be None, 'np' or 'pd', got {return_tensors!r}")
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
        if pad_id is None:
            raise ConfigError("pad_id: give it, or a tokenizer that has one")
    cut = _document_cutter(seq_len, tokenizer if special_tokens else None, stride, pad_id,
                           bool(retro_feed))
    vocab = getattr(tokenizer, "vocab_size", None)
    source = ((index, _document_ids(doc, index, tokenizer, vocab))
              for index, doc in enumerate(documents))
    held = {}   # doc index → its segments, while a row reads it

    def next_doc():
        item = next(source, None)
        if item is None:
            return None
        index, ids = item
        held[index] = cut(ids, index)
        return index, len(held[index])

    scheduler = RowScheduler(batch_size)
    stage = TensorStage() if return_tensors == "pd" else None
    while True:
        step = scheduler.step(next_doc)
        if all(key is None for key, _, _ in step):
            return
        rows = [None if key is None else held[key][seg] for key, seg, _ in step]
        arrays = collate(rows, [reset for _, _, reset in step], seq_len, pad_id)
        for key, seg, _ in step:
            if key is not None and seg == len(held[key]) - 1:
                del held[key]
        yield _batch(arrays, stage)


def _document_cutter(seq_len: int, tokenizer: Any, stride: Optional[int], pad_id: int,
                     retro_feed: bool) -> Callable[[Any, int], Sequence[Segment]]:
    """How one document's ids become the segments its row reads: the tokenizer's segment
    layout (the official one, [CLS] last, unless a run's tokenizer records another) with its
    [CLS] / [SEP], its document cut (max_doc_tokens) and its stride (segment_stride, else
    T−2) when a tokenizer is given, else raw windows of seq_len (`raw_segments`); twice under
    retro_feed."""
    if tokenizer is not None:   # what a fine-tuned run's tokenizer records is how it read
        layout = getattr(tokenizer, "segment_layout", None) or "cls_last"
        keep = getattr(tokenizer, "max_doc_tokens", 0) or None
        stride = stride or getattr(tokenizer, "segment_stride", 0) or seq_len - 2
        segmenter = ClassificationSegmenter(seq_len, stride,
                                            tokenizer.cls_token_id, tokenizer.sep_token_id,
                                            pad_id, layout)

        def segments(ids, index):
            return segmenter(ids[:keep], index)
    else:
        def segments(ids, index):
            return raw_segments(ids, index, seq_len, pad_id, stride)

    def cut(ids, index):
        return reading_passes(segments(ids, index), retro_feed)
    return cut


def _check_reading(seq_len: int, tokenizer: Any, retro_feed: Any) -> None:
    """ValueError for a retro_feed that is no bool (None: False), or a seq_len other than the
    segments a fine-tuned run's tokenizer lays out (its model_max_length)."""
    if not isinstance(retro_feed, (bool, type(None))):
        raise ConfigError(f"retro_feed must be True or False, got {clip(repr(retro_feed), 80)}")
    run_length = getattr(tokenizer, "model_max_length", None)
    if getattr(tokenizer, "segment_layout", None) and seq_len != run_length:
        raise ConfigError(f"seq_len {seq_len}: this tokenizer lays out its run's segments of "
                          f"{run_length} tokens (its model_max_length); the model was "
                          f"fine-tuned on those")


def _check_size(name: str, value: Any, high: int) -> None:
    """ValueError naming `name` unless value is an int from 1 to `high` (checked before a
    [batch_size, seq_len] array is allocated)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigError(f"{name} must be an integer from 1 to {high}, got "
                          f"{clip(repr(value), 80)}")


def _document_ids(doc: Any, index: int, tokenizer: Any, vocab: Optional[int]) -> np.ndarray:
    """Document `index` as int64 ids [n] (a str through tokenizer.encode); ValueError naming
    the document for a str without a tokenizer or ids outside [0, vocab)."""
    if isinstance(doc, str):
        if tokenizer is None:
            raise DataError(f"document {index}: documents are token ids: pass a tokenizer or "
                            f"tok.encode(text)")
        doc = tokenizer.encode(doc)
    elif isinstance(doc, (bytes, bytearray)):
        raise DataError(f"document {index}: documents are token ids (or str with a "
                        f"tokenizer), got {type(doc).__name__}")
    if hasattr(doc, "numpy"):
        doc = doc.numpy()
    ids = np.asarray(doc)
    if ids.size == 0:
        raise DataError(f"document {index}: no tokens (an empty or blank text): nothing to "
                        f"read (the pipeline gives it an error record)")
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise DataError(f"document {index}: expected a sequence of integer token ids, got "
                        f"{'shape ' + str(list(ids.shape)) if ids.ndim != 1 else ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        raise DataError(f"document {index}: token id {bad} is outside the vocabulary "
                        f"[0, {vocab if vocab is not None else 'inf'})")
    return ids.astype(np.int64, copy=False)


def _batch(arrays, stage: Optional[TensorStage]) -> SegmentBatch:
    """One step's SegmentBatch: numpy arrays, or tensors through `stage`."""
    names = ("input_ids", "attention_mask", "reset_memory")
    fields = {k: arrays[k] for k in names}
    if stage is not None:
        fields = stage(fields)
    batch = SegmentBatch(*(fields[k] for k in names))
    batch.doc_index, batch.final = arrays["doc_index"], arrays["final"]
    batch.is_last = arrays["is_last"] & arrays["final"]   # a skim's last segment is not
    return batch
