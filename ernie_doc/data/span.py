"""Span extraction across segments (TriviaQA, CMRC2018, DRCD, DuReader; HotpotQA's answer
stage): sub-tokens that remember their characters, windows with the question in every segment,
gold spans per window, and n-best decoding back to the original text. Details:
docs/design-notes.md, "Span data: tokens and text"."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ernie_doc.data.segment import Segment, windows
from ernie_doc.errors import ConfigError, SegmenterError
from ernie_doc.tokenization.wordpiece import is_cjk_char, is_punctuation


def context_words(text: str) -> List[Tuple[int, int]]:
    """[(start, end)] character spans of the words of `text`."""
    spans, start = [], None
    for i, ch in enumerate(text):
        if ch.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif is_cjk_char(ch) or is_punctuation(ch):
            if start is not None:
                spans.append((start, i))
                start = None
            spans.append((i, i + 1))
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    return spans


UNITS = ("token", "word")
POOLS = ("all", "context")


@dataclass
class TokenizedText:
    """ids [N] of a text with each token's character span: starts [N], ends [N] of its word,
    piece_starts [N], piece_ends [N] of its own characters (= the word's where unknown)."""
    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    piece_starts: Optional[np.ndarray] = None
    piece_ends: Optional[np.ndarray] = None

    def __post_init__(self):
        if self.piece_starts is None:
            self.piece_starts, self.piece_ends = self.starts, self.ends

    def __len__(self):
        return len(self.ids)

    def spans(self, unit: str = "word") -> Tuple[np.ndarray, np.ndarray]:
        """(starts [N], ends [N]) of each token's word ("word") or own characters ("token")."""
        if unit not in UNITS:
            raise ConfigError(f"unit {unit!r} is not one of {list(UNITS)}")
        return (self.piece_starts, self.piece_ends) if unit == "token" else (self.starts,
                                                                             self.ends)

    def token_span(self, char_start: int, char_end: int,
                   unit: str = "word") -> Optional[Tuple[int, int]]:
        """The tokens covering characters [char_start, char_end) → (first, last) inclusive, or
        None; unit: overlap with the token's word or its own characters."""
        starts, ends = self.spans(unit)
        inside = np.nonzero((ends > char_start) & (starts < char_end))[0]
        if len(inside) == 0:
            return None
        return int(inside[0]), int(inside[-1])


def _piece_offsets(tokenizer, word: str, pieces: List[int]) -> List[Tuple[int, int]]:
    """[(start, end)] of each piece's characters inside `word`: the tokenizer's own offsets when
    it gives the same non-empty pieces for the word alone, else the whole word."""
    whole = [(0, len(word))] * len(pieces)
    encode = getattr(tokenizer, "encode_with_offsets", None)
    if encode is None or len(pieces) < 2:
        return whole
    try:
        ids, offsets = encode(word)
    except Exception:   # a tokenizer that cannot offset a lone word keeps whole words
        return whole
    if list(ids) != list(pieces):
        return whole
    offsets = [(max(0, int(a)), min(len(word), int(b))) for a, b in offsets]
    if any(a >= b for a, b in offsets):
        return whole
    return offsets


def tokenize_with_offsets(text: str, tokenizer, cache: Optional[Dict] = None) -> TokenizedText:
    """Tokenize `text` word by word (see the module docstring). `cache`: a dict shared across
    calls (long corpora repeat words)."""
    cache = {} if cache is None else cache
    ids, starts, ends, piece_starts, piece_ends = [], [], [], [], []
    for start, end in context_words(text):
        key = (text[start:end], start > 0 and text[start - 1].isspace())
        found = cache.get(key)
        if found is None:
            pieces = list(tokenizer.encode_word(*key))
            found = cache[key] = (pieces, _piece_offsets(tokenizer, key[0], pieces))
        pieces, offsets = found
        ids.extend(pieces)
        starts.extend([start] * len(pieces))
        ends.extend([end] * len(pieces))
        piece_starts.extend(start + a for a, _ in offsets)
        piece_ends.extend(start + b for _, b in offsets)

    def array(values):
        return np.asarray(values, dtype=np.int64)

    return TokenizedText(array(ids), array(starts), array(ends), array(piece_starts),
                         array(piece_ends))


def max_context_flags(spans: Sequence[Tuple[int, int]]) -> List[np.ndarray]:
    """Per window [start, end): True per token where this window gives it its largest context
    (the BERT SQuAD rule; the first window wins ties)."""
    total = max((e for _, e in spans), default=0)
    best = np.full(total, -1.0)
    owner = np.full(total, -1)
    for w, (s, e) in enumerate(spans):
        pos = np.arange(s, e)
        score = np.minimum(pos - s, e - 1 - pos) + 0.01 * (e - s)
        better = score > best[s:e]
        best[s:e] = np.where(better, score, best[s:e])
        owner[s:e] = np.where(better, w, owner[s:e])
    return [owner[s:e] == w for w, (s, e) in enumerate(spans)]


class SpanSegmenter:
    """An example (context tokens, question ids, gold char spans) → segments `[CLS] window open
    question close PAD…` with [T] float32 targets `start_gold`, `end_gold`, `allowed`."""

    def __init__(self, seq_len, stride, cls_id, pad_id, open_id, close_id, max_query_len=64,
                 answer_unit="token"):
        if answer_unit not in UNITS:
            raise SegmenterError(f"answer_unit {answer_unit!r} is not one of {list(UNITS)}")
        self.seq_len, self.stride, self.max_query_len = seq_len, stride, max_query_len
        self.cls_id, self.pad_id, self.open_id, self.close_id = cls_id, pad_id, open_id, close_id
        self.answer_unit = answer_unit

    def __call__(self, context: TokenizedText, question_ids: Sequence[int],
                 gold_chars: Sequence[Tuple[int, int]], doc_index: int) -> List[Segment]:
        question = list(question_ids)[:self.max_query_len]
        window = self.seq_len - len(question) - 3
        if window < 1:
            raise ConfigError(f"max_seq_len {self.seq_len} leaves no room for the context next to "
                              f"a {len(question)}-token question (max_query_len)")
        gold = [context.token_span(s, e, self.answer_unit) for s, e in gold_chars]
        gold = sorted({g for g in gold if g is not None})
        spans = windows(len(context), window, self.stride)
        flags = max_context_flags(spans)
        T = self.seq_len
        segments = []
        for i, ((a, b), max_ctx) in enumerate(zip(spans, flags)):
            n = b - a
            ids = np.full(T, self.pad_id, dtype=np.int64)
            ids[0] = self.cls_id
            ids[1:n + 1] = context.ids[a:b]
            q0 = n + 1
            ids[q0] = self.open_id
            ids[q0 + 1:q0 + 1 + len(question)] = question
            ids[q0 + 1 + len(question)] = self.close_id
            mask = np.zeros(T, dtype=np.float32)
            mask[:q0 + 2 + len(question)] = 1.0
            allowed = np.zeros(T, dtype=np.float32)
            allowed[:n + 1] = 1.0
            start_gold = np.zeros(T, dtype=np.float32)
            end_gold = np.zeros(T, dtype=np.float32)
            for s, e in gold:
                if a <= s and e < b:
                    start_gold[s - a + 1] = end_gold[e - a + 1] = 1.0
            if not start_gold.any():
                start_gold[0] = end_gold[0] = 1.0
            segments.append(Segment(
                ids, mask, doc_index, i, len(spans),
                targets={"start_gold": start_gold, "end_gold": end_gold, "allowed": allowed},
                meta={"window": (a, b), "starts": context.starts[a:b],
                      "ends": context.ends[a:b], "piece_starts": context.piece_starts[a:b],
                      "piece_ends": context.piece_ends[a:b], "max_context": max_ctx},
                sources=(("context", a, b, 1),)))
        return segments


def _top_context(logits: np.ndarray, n: int, n_best: int, pool: str) -> np.ndarray:
    """Context indices (row − 1) of one segment's n-best logits: pool "context" ranks context
    rows only; "all" ranks all T rows (official), then keeps those in the context."""
    if pool == "context":
        return np.argsort(-logits[1:n + 1], kind="stable")[:n_best]
    top = np.argsort(-logits, kind="stable")[:n_best]   # stable: ties to the lower position
    return top[(top >= 1) & (top <= n)] - 1


def best_spans(segments, logits, n_best=20, max_answer_len=30, pool="context", unit="word"):
    """Candidate answers of one example, best first → [(score, char_start, char_end)]; logits:
    [T, 2] per final-pass segment `meta`; ranked by start + end logit (official)."""
    if pool not in POOLS:
        raise ConfigError(f"pool {pool!r} is not one of {list(POOLS)}")
    if unit not in UNITS:
        raise ConfigError(f"unit {unit!r} is not one of {list(UNITS)}")
    found = {}
    for meta, lg in zip(segments, logits):
        n = meta["window"][1] - meta["window"][0]
        if n == 0:
            continue
        lg = np.asarray(lg, dtype=np.float64)
        start, end = lg[1:n + 1, 0], lg[1:n + 1, 1]
        top_s = _top_context(lg[:, 0], n, n_best, pool)
        top_e = _top_context(lg[:, 1], n, n_best, pool)
        if unit == "token" and "piece_starts" in meta:
            char_starts, char_ends = meta["piece_starts"], meta["piece_ends"]
        else:
            char_starts, char_ends = meta["starts"], meta["ends"]
        for i in top_s:
            if not meta["max_context"][i]:
                continue
            for j in top_e:
                if j < i or j - i + 1 > max_answer_len:
                    continue
                key = (int(char_starts[i]), int(char_ends[j]))
                score = float(start[i] + end[j])
                if score > found.get(key, -np.inf):
                    found[key] = score
    return sorted(((s, a, b) for (a, b), s in found.items()), key=lambda x: (-x[0], x[1], x[2]))
