"""Pretraining objectives on token ids: segment reordering (paper §3.4) and MLM masking.

Pure numpy; every draw comes from a ``numpy.random.Generator`` passed in, so a resume is exact.
Reordering labels a shuffle of k chunks with one of ``K = sum_{i=1..m} i!`` classes (33 for
m = 4); masking is BERT's 80/10/10, optionally by whole words. Details: docs/design-notes.md,
"Pretraining: objectives"."""
from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np

from ernie_doc.errors import ConfigError
from ernie_doc.tokenization.wordpiece import is_cjk_char

__all__ = [
    "DEFAULT_MAX_CHUNKS",
    "permutations_table",
    "num_reorder_classes",
    "reorder_label",
    "permutation_of",
    "chunk_bounds",
    "reorder_document",
    "restore_document",
    "mask_tokens",
    "wordpiece_word_starts",
    "tokenizer_special_ids",
]

DEFAULT_MAX_CHUNKS = 4
_DEFAULT_NUM_CLASSES = 33  # == heads.NUM_REORDER_CLASSES (not imported: keeps this paddle-free)


# --------------------------------------------------------------------------- reordering

def num_reorder_classes(max_chunks: int = DEFAULT_MAX_CHUNKS) -> int:
    """K = sum_{k=1..m} k!  (m=1..5 → 1, 3, 9, 33, 153)."""
    if max_chunks < 1:
        raise ConfigError(f"max_chunks must be >= 1, got {max_chunks}")
    return sum(math.factorial(k) for k in range(1, max_chunks + 1))


@lru_cache(maxsize=None)
def permutations_table(max_chunks: int = DEFAULT_MAX_CHUNKS) -> Tuple[Tuple[int, ...], ...]:
    """All permutations of range(k), k = 1..max_chunks (k ascending, then lexicographic): a
    tuple of K tuples, entry ``label`` being ``permutation_of(label)``."""
    if max_chunks < 1:
        raise ConfigError(f"max_chunks must be >= 1, got {max_chunks}")
    # itertools.permutations of a sorted input yields lexicographic order.
    return tuple(p for k in range(1, max_chunks + 1) for p in itertools.permutations(range(k)))


def _check_perm(perm: Sequence[int]) -> Tuple[int, ...]:
    perm = tuple(int(p) for p in perm)
    if not perm or sorted(perm) != list(range(len(perm))):
        raise ConfigError(f"not a permutation of range(k), k >= 1: {perm}")
    return perm


def reorder_label(perm: Sequence[int]) -> int:
    """Index of ``perm`` in the canonical table: sum_{j<k} j! + lexicographic rank of perm."""
    perm = _check_perm(perm)
    k = len(perm)
    offset = num_reorder_classes(k - 1) if k > 1 else 0
    # Lexicographic rank via the Lehmer code: count smaller elements still unused.
    rank, rest = 0, list(range(k))
    for i, p in enumerate(perm):
        j = rest.index(p)
        rank += j * math.factorial(k - 1 - i)
        rest.pop(j)
    return offset + rank


def permutation_of(label: int) -> Tuple[int, ...]:
    """Inverse of ``reorder_label``: the permutation (tuple of length k) for a label >= 0."""
    label = int(label)
    if label < 0:
        raise ConfigError(f"reorder label must be >= 0, got {label}")
    k, rank = 1, label
    while rank >= math.factorial(k):  # skip the blocks of shorter permutations
        rank -= math.factorial(k)
        k += 1
    rest, perm = list(range(k)), []
    for i in range(k):
        f = math.factorial(k - 1 - i)
        perm.append(rest.pop(rank // f))
        rank %= f
    return tuple(perm)


def chunk_bounds(n: int, k: int) -> np.ndarray:
    """[k + 1] int64 boundaries of the ``numpy.array_split`` chunks of n tokens into k."""
    if not 1 <= k <= n:
        raise ConfigError(f"cannot cut {n} tokens into {k} non-empty chunks")
    q, r = divmod(n, k)
    sizes = np.full(k, q, dtype=np.int64)
    sizes[:r] += 1  # the first n % k chunks take one extra token (array_split convention)
    return np.concatenate([[0], np.cumsum(sizes)])


def _check_classes(max_chunks: int, num_classes: int) -> None:
    if num_reorder_classes(max_chunks) > num_classes:
        raise ConfigError(
            f"segment reordering with max_chunks={max_chunks} needs "
            f"{num_reorder_classes(max_chunks)} classes but the head has {num_classes}")


def reorder_document(ids, rng: np.random.Generator, max_chunks: int = DEFAULT_MAX_CHUNKS,
                     num_classes: int = _DEFAULT_NUM_CLASSES) -> Tuple[np.ndarray, int, int]:
    """Cut a document ids [n] into k chunks and shuffle them (paper §3.4) → (permuted [n],
    label, k); k ~ uniform{1..max_chunks} clamped to n. Draws one ``integers``, one
    ``permutation``. ValueError: an empty document or too few head classes."""
    _check_classes(max_chunks, num_classes)
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ConfigError(f"reorder_document expects a 1-D token sequence, got shape {ids.shape}")
    n = ids.shape[0]
    if n == 0:
        raise ConfigError("cannot reorder an empty document")
    # Draw k before clamping so the number of draws does not depend on the length.
    k = min(int(rng.integers(1, max_chunks + 1)), n)
    perm = tuple(int(p) for p in rng.permutation(k))
    bounds = chunk_bounds(n, k)
    permuted = np.concatenate([ids[bounds[p]:bounds[p + 1]] for p in perm])
    return permuted, reorder_label(perm), k


def restore_document(permuted, label: int) -> np.ndarray:
    """Undo ``reorder_document``: [n] permuted ids + label → [n] original order."""
    permuted = np.asarray(permuted)
    perm = permutation_of(label)
    bounds = chunk_bounds(permuted.shape[0], len(perm))
    sizes = np.diff(bounds)
    out = np.empty_like(permuted)
    start = 0
    for p in perm:  # the i-th piece of the permuted text is original chunk perm[i]
        out[bounds[p]:bounds[p + 1]] = permuted[start:start + sizes[p]]
        start += sizes[p]
    return out


# --------------------------------------------------------------------------- MLM masking

def tokenizer_special_ids(tokenizer) -> Tuple[int, ...]:
    """Sorted ids of cls/sep/pad/mask tokens a tokenizer defines ([UNK] stays maskable, as BERT)."""
    names = ("cls_token_id", "sep_token_id", "pad_token_id", "mask_token_id")
    ids = {getattr(tokenizer, name, None) for name in names}
    return tuple(sorted(int(i) for i in ids if i is not None))


def wordpiece_word_starts(tokens: Sequence[str]) -> np.ndarray:
    """[T] bool, True at a word's first piece; a CJK "##" piece is a word of its own."""
    out = np.ones(len(tokens), dtype=bool)
    for i, tok in enumerate(tokens):
        if tok.startswith("##") and len(tok) > 2:
            body = tok[2:]
            out[i] = len(body) == 1 and is_cjk_char(body)
    return out


def _num_to_mask(n: int, mask_prob: float) -> int:
    if n == 0:
        return 0
    # Round half up (not Python's banker's rounding), then at least one, at most n.
    return min(n, max(1, int(math.floor(mask_prob * n + 0.5))))


def _mask_row(ids, rng, maskable, word_starts, mask_prob):
    """Select units for one row. Returns (sorted positions, unit id per position)."""
    pos = np.flatnonzero(maskable)
    target = _num_to_mask(pos.size, mask_prob)
    if target == 0:
        return pos[:0], pos[:0]
    prev_maskable = np.concatenate([[False], maskable[:-1]])
    # A word starts at a declared start or after a non-maskable token (a special token
    # always ends a word, even before a stray continuation piece).
    starts = (word_starts | ~prev_maskable)[pos]
    word_of = np.cumsum(starts) - 1  # word index of each maskable position
    first = np.flatnonzero(starts)
    sizes = np.diff(np.append(first, pos.size))
    chosen, covered = [], 0
    for w in rng.permutation(first.size):
        if covered >= target:
            break
        # BERT-wwm: skip words that would overshoot the budget, but always take the first
        # one so that a row whose words are all long still gets one masked word.
        if chosen and covered + sizes[w] > target:
            continue
        chosen.append(w)
        covered += sizes[w]
    sel = np.isin(word_of, np.asarray(chosen, dtype=np.int64))
    return pos[sel], word_of[sel]


def mask_tokens(ids, rng: np.random.Generator, vocab_size: int, mask_id: int,
                special_ids: Iterable[int], mask_prob: float = 0.15,
                word_starts: Optional[np.ndarray] = None
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERT 80/10/10 masking of [T] or [B, T] ids → (masked copy int64, positions [N] int64,
    labels [N] int64); positions are ascending flat indices into ids.reshape(-1).
    special_ids are never masked nor drawn; word_starts: whole-word masking."""
    if not 0.0 < mask_prob <= 1.0:
        raise ConfigError(f"mask_prob must be in (0, 1], got {mask_prob}")
    src = np.asarray(ids)
    if src.ndim not in (1, 2):
        raise ConfigError(f"mask_tokens expects [T] or [B, T] ids, got shape {src.shape}")
    rows = src.astype(np.int64).reshape(-1, src.shape[-1])  # a copy: the input stays untouched
    specials = np.union1d(np.asarray(sorted(set(int(s) for s in special_ids)), dtype=np.int64),
                          [int(mask_id)])
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), specials)
    if allowed.size == 0:
        raise ConfigError("no non-special id to draw random replacements from")
    if word_starts is None:
        starts = np.ones(rows.shape, dtype=bool)
    else:
        starts = np.asarray(word_starts, dtype=bool)
        if starts.shape != src.shape:
            raise ConfigError(f"word_starts shape {starts.shape} != ids shape {src.shape}")
        starts = starts.reshape(rows.shape)
    maskable = ~np.isin(rows, specials)

    out, all_pos, all_lab = rows.copy(), [], []
    width = rows.shape[1]
    for r in range(rows.shape[0]):
        pos, unit = _mask_row(rows[r], rng, maskable[r], starts[r], mask_prob)
        if pos.size == 0:
            continue
        # One 80/10/10 draw per unit (word), shared by all of its pieces.
        _, inv = np.unique(unit, return_inverse=True)
        u = rng.random(inv.max() + 1)[inv]
        to_mask, to_rand = pos[u < 0.8], pos[(u >= 0.8) & (u < 0.9)]
        all_pos.append(pos + r * width)
        all_lab.append(rows[r, pos])
        out[r, to_mask] = mask_id
        out[r, to_rand] = rng.choice(allowed, size=to_rand.size)
    positions = np.concatenate(all_pos) if all_pos else np.zeros(0, dtype=np.int64)
    labels = np.concatenate(all_lab) if all_lab else np.zeros(0, dtype=np.int64)
    return out.reshape(src.shape), positions.astype(np.int64), labels.astype(np.int64)
