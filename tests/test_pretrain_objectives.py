"""Pretraining objectives: segment reordering (paper §3.4) and BERT / whole-word MLM masking."""
import itertools
from collections import Counter

import numpy as np
import pytest

from ernie_doc.heads import NUM_REORDER_CLASSES
from ernie_doc.pretraining.objectives import (chunk_bounds, mask_tokens, num_reorder_classes,
                                              permutation_of, permutations_table, reorder_document,
                                              reorder_label, restore_document,
                                              tokenizer_special_ids, wordpiece_word_starts)

CLS, SEP, PAD, MASK = 0, 1, 2, 3
SPECIALS = (CLS, SEP, PAD, MASK)
VOCAB = 50


# --------------------------------------------------------------------------- reordering

def test_num_classes_per_m():
    assert [num_reorder_classes(m) for m in range(1, 6)] == [1, 3, 9, 33, 153]
    assert num_reorder_classes(4) == NUM_REORDER_CLASSES == len(permutations_table(4))
    with pytest.raises(ValueError):
        num_reorder_classes(0)


def test_table_canonical_order_and_bijection():
    table = permutations_table(4)
    assert table[:4] == ((0,), (0, 1), (1, 0), (0, 1, 2))
    assert table[-1] == (3, 2, 1, 0)
    # k ascending, then lexicographic within k; the table for m is a prefix of m + 1's.
    assert list(table) == sorted(table, key=lambda p: (len(p), p))
    assert permutations_table(5)[:33] == table
    for label, perm in enumerate(table):
        assert reorder_label(perm) == label
        assert permutation_of(label) == perm
    assert {reorder_label(p) for p in itertools.permutations(range(4))} == set(range(9, 33))
    for bad in [(), (0, 0), (1, 2)]:
        with pytest.raises(ValueError):
            reorder_label(bad)
    with pytest.raises(ValueError):
        permutation_of(-1)


def test_chunking_rule_is_array_split():
    for n in range(1, 12):
        for k in range(1, min(n, 4) + 1):
            b = chunk_bounds(n, k)
            expected = [len(c) for c in np.array_split(np.arange(n), k)]
            assert np.diff(b).tolist() == expected and b[0] == 0 and b[-1] == n


def test_reorder_applies_label_and_inverse_restores():
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 4, 5, 7, 10, 101]:
        doc = np.arange(100, 100 + n)
        before = doc.copy()
        for _ in range(30):
            permuted, label, k = reorder_document(doc, rng)
            perm = permutation_of(label)
            assert len(perm) == k and 1 <= k <= min(4, n) and 0 <= label < 33
            assert sorted(permuted.tolist()) == doc.tolist()  # a permutation of the tokens
            # Label = original chunk indices in the order they appear in the permuted text.
            chunks = np.array_split(doc, k)
            assert permuted.tolist() == np.concatenate([chunks[p] for p in perm]).tolist()
            assert restore_document(permuted, label).tolist() == doc.tolist()
        assert np.array_equal(doc, before)
    permuted, _, _ = reorder_document([5, 6, 7], rng)  # lists work too
    assert sorted(permuted.tolist()) == [5, 6, 7]


def test_k_and_permutations_are_uniform():
    rng = np.random.default_rng(123)
    draws = 8000
    ks, labels = Counter(), Counter()
    for _ in range(draws):
        _, label, k = reorder_document(np.arange(40), rng)
        ks[k] += 1
        labels[label] += 1
    for k in range(1, 5):
        assert abs(ks[k] - draws / 4) < 0.1 * draws / 4, ks
    # Within k = 3 every one of the 3! orders (identity included) appears about equally.
    k3 = [labels[reorder_label(p)] for p in itertools.permutations(range(3))]
    assert min(k3) > 0.75 * ks[3] / 6 and max(k3) < 1.25 * ks[3] / 6, k3


def test_reorder_deterministic_for_a_seed():
    doc = np.arange(37)
    a = [reorder_document(doc, np.random.default_rng(7)) for _ in range(2)]
    assert np.array_equal(a[0][0], a[1][0]) and a[0][1:] == a[1][1:]


def test_short_and_empty_documents():
    rng = np.random.default_rng(1)
    ks = Counter(reorder_document([9, 8], rng)[2] for _ in range(400))
    assert set(ks) == {1, 2}  # k clamped to the length: never an empty chunk
    assert ks[2] > ks[1]  # the mass of k = 3, 4 went to k = 2
    for _ in range(20):
        permuted, label, k = reorder_document([42], rng)
        assert permuted.tolist() == [42] and label == 0 and k == 1
    with pytest.raises(ValueError, match="empty"):
        reorder_document([], rng)


def test_too_many_chunks_for_the_head():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="max_chunks=5 needs 153 classes but the head has 33"):
        reorder_document(np.arange(20), rng, max_chunks=5)
    permuted, label, k = reorder_document(np.arange(20), rng, max_chunks=5, num_classes=153)
    assert label < 153 and k <= 5
    _, label, k = reorder_document(np.arange(20), rng, max_chunks=2)  # fewer: fine
    assert label < 3 and k <= 2


# --------------------------------------------------------------------------- masking

def _batch(rng, rows=400, width=128):
    """[rows, width] ids: CLS text SEP then PAD tails of random length."""
    ids = rng.integers(4, VOCAB, size=(rows, width))
    ids[:, 0] = CLS
    lengths = rng.integers(width // 2, width + 1, size=rows)
    for r, n in enumerate(lengths):
        ids[r, n - 1] = SEP
        ids[r, n:] = PAD
    return ids


def test_mask_statistics():
    data = np.random.default_rng(0)
    ids = _batch(data)
    before = ids.copy()
    masked, pos, labels = mask_tokens(ids, np.random.default_rng(1), VOCAB, MASK, SPECIALS)
    assert np.array_equal(ids, before)  # input untouched
    assert masked.shape == ids.shape and pos.dtype == np.int64 and labels.dtype == np.int64
    flat_in, flat_out = ids.reshape(-1), masked.reshape(-1)
    maskable = ~np.isin(flat_in, SPECIALS)
    # Exactly round-half-up(15%) per row, so the total is ~15% of maskable tokens.
    per_row = np.bincount(pos // ids.shape[1], minlength=ids.shape[0])
    expected = np.floor(0.15 * (~np.isin(ids, SPECIALS)).sum(1) + 0.5).astype(int)
    assert np.array_equal(per_row, np.maximum(expected, 1))
    assert abs(pos.size / maskable.sum() - 0.15) < 0.005
    assert np.all(np.diff(pos) > 0) and np.all(maskable[pos])  # sorted, never special
    assert np.array_equal(labels, flat_in[pos])
    # Outside the selection nothing changed.
    untouched = np.ones(flat_in.size, bool)
    untouched[pos] = False
    assert np.array_equal(flat_out[untouched], flat_in[untouched])
    # 80 / 10 / 10 (a random id equal to the original counts as "kept": ~1/46 of 10%).
    is_mask = flat_out[pos] == MASK
    same = flat_out[pos] == flat_in[pos]
    changed = ~is_mask & ~same
    assert abs(is_mask.mean() - 0.8) < 0.02
    assert abs(changed.mean() - 0.1 * (1 - 1 / 46)) < 0.015
    assert abs(same.mean() - 0.1 * (1 + 1 / 46)) < 0.015
    # Random replacements are never special ids and stay in the vocabulary.
    assert not np.isin(flat_out[pos][~is_mask], SPECIALS).any()
    assert flat_out.min() >= 0 and flat_out.max() < VOCAB
    # The only specials in the output are the original ones plus [MASK] at selected positions.
    assert np.array_equal(np.isin(flat_out, (CLS, SEP, PAD)), np.isin(flat_in, (CLS, SEP, PAD)))


def test_mask_deterministic_and_1d():
    ids = _batch(np.random.default_rng(3), rows=4)
    a = mask_tokens(ids, np.random.default_rng(5), VOCAB, MASK, SPECIALS)
    b = mask_tokens(ids, np.random.default_rng(5), VOCAB, MASK, SPECIALS)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = mask_tokens(ids, np.random.default_rng(6), VOCAB, MASK, SPECIALS)
    assert not np.array_equal(a[1], c[1])
    row = list(ids[0])
    masked, pos, labels = mask_tokens(row, np.random.default_rng(5), VOCAB, MASK, SPECIALS)
    assert masked.shape == (len(row),) and np.array_equal(labels, np.asarray(row)[pos])


def test_mask_small_and_degenerate_rows():
    rng = np.random.default_rng(0)
    # One maskable token: always selected (at least one).
    for _ in range(10):
        _, pos, labels = mask_tokens([CLS, 17, SEP, PAD], rng, VOCAB, MASK, SPECIALS)
        assert pos.tolist() == [1] and labels.tolist() == [17]
    # Only specials: nothing selected.
    masked, pos, labels = mask_tokens([CLS, SEP, PAD, PAD], rng, VOCAB, MASK, SPECIALS)
    assert pos.size == 0 and labels.size == 0 and masked.tolist() == [CLS, SEP, PAD, PAD]
    # Rounding: 10 maskable → round(1.5) = 2 (half up), 3 → round(0.45) → at least 1.
    _, pos, _ = mask_tokens(np.arange(4, 14), rng, VOCAB, MASK, SPECIALS)
    assert pos.size == 2
    _, pos, _ = mask_tokens(np.arange(4, 7), rng, VOCAB, MASK, SPECIALS)
    assert pos.size == 1
    # mask_id is never drawn as a replacement even when not listed among the specials.
    masked, pos, _ = mask_tokens(np.full((200, 40), 9), rng, 8 + 4, MASK, (CLS, SEP, PAD),
                                 mask_prob=1.0)
    assert pos.size == 8000 and set(np.unique(masked)) <= {MASK, 4, 5, 6, 7, 8, 9, 10, 11}
    for bad in [0.0, 1.5]:
        with pytest.raises(ValueError):
            mask_tokens([5, 6], rng, VOCAB, MASK, SPECIALS, mask_prob=bad)


def test_wordpiece_word_starts():
    tokens = ["[CLS]", "un", "##aff", "##able", "is", "##", "我", "##们", "爱", "##s", "[SEP]"]
    starts = wordpiece_word_starts(tokens)
    assert starts.dtype == bool
    # "##" alone is a token, not a prefix; "##们" is a CJK character → its own word.
    assert starts.tolist() == [True, True, False, False, True, True, True, True, True, False,
                               True]


def test_whole_word_masking():
    data = np.random.default_rng(0)
    rows, width = 300, 96
    ids = _batch(data, rows, width)
    starts = data.random((rows, width)) < 0.5  # words of ~2 pieces on average
    starts[:, 1] = True
    before = (ids.copy(), starts.copy())
    masked, pos, labels = mask_tokens(ids, np.random.default_rng(2), VOCAB, MASK, SPECIALS,
                                      word_starts=starts)
    assert np.array_equal(ids, before[0]) and np.array_equal(starts, before[1])
    assert np.array_equal(labels, ids.reshape(-1)[pos])
    selected = np.zeros(ids.shape, bool).reshape(-1)
    selected[pos] = True
    selected = selected.reshape(ids.shape)
    maskable = ~np.isin(ids, SPECIALS)
    assert not (selected & ~maskable).any()
    n_mask_words = n_words = 0
    for r in range(rows):
        # Words: maximal runs of maskable tokens, each started by a word start.
        word_start = maskable[r] & (starts[r] | ~np.r_[False, maskable[r][:-1]])
        row_words = 0
        for s in np.flatnonzero(word_start):
            e = s + 1
            while e < width and maskable[r, e] and not word_start[e]:
                e += 1
            sel = selected[r, s:e]
            assert sel.all() or not sel.any(), (r, s, e)  # whole word or nothing
            if sel.all():
                row_words += 1
                out = masked[r, s:e]
                # One 80/10/10 decision per word: all [MASK] or none of them.
                assert (out == MASK).all() or not (out == MASK).any()
                n_mask_words += int((out == MASK).all())
        n_words += row_words
        # Budget: never above it, except a single first word longer than the budget.
        target = max(1, int(np.floor(0.15 * maskable[r].sum() + 0.5)))
        assert row_words >= 1
        assert selected[r].sum() <= target or row_words == 1
    assert abs(selected.sum() / maskable.sum() - 0.15) < 0.01
    assert abs(n_mask_words / n_words - 0.8) < 0.04


def test_whole_word_unit_never_crosses_a_special_or_a_row():
    # A stray continuation after [SEP] / at a row start still starts a new unit.
    ids = np.array([[10, 11, SEP, 12, 13], [14, 15, 16, 17, 18]])
    starts = np.array([[True, False, True, False, False], [False, False, False, False, False]])
    for seed in range(20):
        _, pos, _ = mask_tokens(ids, np.random.default_rng(seed), VOCAB, MASK, SPECIALS,
                                mask_prob=0.2, word_starts=starts)
        sel = set(pos.tolist())
        for word in ({0, 1}, {3, 4}, {5, 6, 7, 8, 9}):
            assert word <= sel or not (word & sel)
        assert 2 not in sel and len(sel & {5, 6, 7, 8, 9}) in (0, 5)
    with pytest.raises(ValueError):
        mask_tokens(ids, np.random.default_rng(0), VOCAB, MASK, SPECIALS, word_starts=starts[0])


def test_tokenizer_special_ids():
    class Tok:
        cls_token_id, sep_token_id, pad_token_id, mask_token_id, unk_token_id = 5, 6, 0, 7, 1
    assert tokenizer_special_ids(Tok()) == (0, 5, 6, 7)
