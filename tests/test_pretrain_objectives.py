"""Pretraining objectives: segment reordering (paper §3.4) and BERT / whole-word MLM masking."""
import itertools
import json
from collections import Counter

import numpy as np
import pytest
from helpers import tiny_config

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


# The pretraining loss against a cross-entropy worked out here from the model's full logits
# (MLM over the masked tokens of the rows that train, plus segment reordering on the rows at a
# document's last segment only, each weighted by `mlm_weight` / `reorder_weight`), and the
# held-out evaluation (`reader.eval_corpus`, `reader.eval_docs`) of a `format: file` corpus
# end to end against a segment-by-segment reading of the final model.


WORDS = [f"w{i}" for i in range(30)]
SPECIAL_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]   # ids 0..4


def write_vocab(root):
    vocab = root / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + WORDS) + "\n", encoding="utf-8")
    return vocab


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_mlm_plus_reorder_on_last_segments_with_their_weights(tmp_path):
    import paddle

    from ernie_doc.data.collate import collate
    from ernie_doc.data.segment import CLS_INDEX
    from ernie_doc.heads import ErnieDocForPretraining
    from ernie_doc.kinds import build_task
    from ernie_doc.pretraining.corpus import CorpusDocument
    from ernie_doc.run_config import load_config
    from ernie_doc.tokenization import load_tokenizer
    tokenizer = load_tokenizer(write_vocab(tmp_path))
    T = 16
    cfg = load_config(None, ["task=pretrain", "kind=pretraining", f"data_dir={tmp_path}",
                             "max_steps=1", f"max_seq_len={T}", "retro_feed=false",
                             "task_options.mask_prob=0.3"])
    task = build_task(cfg)
    task.setup({"cls": 1, "sep": 2, "pad": 0}, T, None, tokenizer)
    rng = np.random.default_rng(0)
    steps = [task.document_steps(CorpusDocument(f"d:{d}", " ".join(rng.choice(WORDS, n)),
                                                "d", d), 0, d)
             for d, n in enumerate((30, 20, 8))]   # windows of 14 tokens: 3, 2, 1 segments
    assert [len(s) for s in steps] == [3, 2, 1]
    # rows: a first and a last segment of d0, d1's last and d2's only segment, d1's first
    # segment (weight 0 below) and a padding row
    rows = [steps[0][0], steps[0][2], steps[1][1], steps[2][0], steps[1][0], None]
    batch = collate(rows, [True] * 6, T, 0)
    weight = task.train_weight(batch).astype("float32")
    weight[4] = 0.0
    assert weight.tolist() == [1, 1, 1, 1, 0, 0]
    assert batch["is_last"].tolist() == [False, True, True, True, False, False]
    tensors = {k: paddle.to_tensor(v) for k, v in batch.items()}

    model = ErnieDocForPretraining(tiny_config(
        vocab_size=len(tokenizer), max_position_embeddings=T, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, relu_dropout=0.0,
        cls_token_idx=CLS_INDEX[cfg.segment_layout]))
    model.eval()
    out, _ = task.forward(model, tensors, task.init_carry(model, 6))
    # the logits of every position (no masked_positions), read by hand
    full = model(tensors["input_ids"], model.ernie_doc.init_memories(6),
                 tensors["token_type_ids"], tensors["attention_mask"],
                 tensors["reset_memory"])
    mlm_lp = log_softmax(full.mlm_logits.numpy())          # [B, T, V]
    reorder_lp = log_softmax(full.reorder_logits.numpy())  # [B, 33]
    labels = batch["target_mlm_labels"]
    r, t = np.nonzero((labels >= 0) & (weight[:, None] > 0))
    assert len(r) >= 8 and set(r) == {0, 1, 2, 3}
    mlm = -mlm_lp[r, t, labels[r, t]].mean()
    last = np.nonzero((weight > 0) & batch["is_last"])[0]
    reorder_labels = batch["target_reorder_label"].reshape(-1)
    reorder = -reorder_lp[last, reorder_labels[last]].mean()
    # every weighted row instead of the last segments only would be another number
    every = np.nonzero(weight > 0)[0]
    assert abs(-reorder_lp[every, reorder_labels[every]].mean() - reorder) > 1e-3

    for mlm_weight, reorder_weight in ((1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (2.0, 1.0),
                                       (1.0, 2.0)):
        task.options.update(mlm_weight=mlm_weight, reorder_weight=reorder_weight)
        expected = mlm_weight * mlm + reorder_weight * reorder
        w = paddle.to_tensor(weight)
        assert float(task.loss(out, tensors, w)) == pytest.approx(expected, rel=1e-5)
        loss, scalars = task.train_loss(out, tensors, w)
        assert float(loss) == pytest.approx(expected, rel=1e-5)
        assert scalars["mlm_loss"] == pytest.approx((mlm * len(r), len(r)), rel=1e-5)
        assert scalars["reorder_loss"] == pytest.approx((reorder * len(last), len(last)),
                                                        rel=1e-5)
        means = task.combine_metrics({"mlm_loss": mlm, "reorder_loss": reorder})
        assert means["loss"] == pytest.approx(expected, rel=1e-9)


def write_file_corpus(root, name, files, seed):
    """`files` documents, one per file, each two paragraphs apart by a blank line (a
    blank_lines reader would see two documents in each) → (directory, word counts)."""
    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir()
    counts = []
    for i in range(files):
        a, b = (list(rng.choice(WORDS, int(rng.integers(10, 25)))) for _ in range(2))
        (folder / f"doc{i}.txt").write_text(" ".join(a) + "\n\n" + " ".join(b) + "\n",
                                            encoding="utf-8")
        counts.append(len(a) + len(b))
    return folder, counts


def test_held_out_evaluation_of_a_file_corpus_end_to_end(tmp_path):
    import paddle

    from ernie_doc.heads import ErnieDocForPretraining
    from ernie_doc.pretraining.corpus import iter_documents
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    from ernie_doc.training.trainer import Trainer
    vocab = write_vocab(tmp_path)
    corpus, _ = write_file_corpus(tmp_path, "corpus", 6, seed=1)
    held_out, counts = write_file_corpus(tmp_path, "eval", 3, seed=2)
    out = tmp_path / "run"
    cfg = load_config(None, [
        "task=pretrain", "kind=pretraining", f"data_dir={corpus}", f"tokenizer={vocab}",
        "model=ernie-doc-small",
        "model_overrides={num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 2, "
        "memory_len: 8, max_position_embeddings: 16, hidden_dropout_prob: 0.0, "
        "attention_probs_dropout_prob: 0.0, relu_dropout: 0.0}",
        "max_seq_len=16", "batch_size=2", "max_steps=3", "learning_rate=0.01",
        "warmup_steps=1", "logging_steps=0", "progress=false", "reader.format=file",
        f"reader.eval_corpus={held_out}", "reader.eval_docs=2", f"output_dir={out}"])
    run = prepare(cfg)
    Trainer(run).train()

    results = json.loads((out / "eval_results.json").read_text())
    assert results["split"] == "dev" and results["step"] == 3
    # format file: a file is one document (doc id "folder/name:1"); eval_docs: the first 2
    predictions = [json.loads(line) for line in open(out / "predictions_dev.jsonl")]
    assert [p["doc_id"] for p in predictions] == ["eval/doc0.txt:1", "eval/doc1.txt:1"]
    assert results["documents"] == 2
    # 15 % of each document's tokens (one per word here), rounded half up
    assert results["masked_tokens"] == sum(int(np.floor(0.15 * n + 0.5)) for n in counts[:2])

    # the final model (the one evaluated at the last step) read document by document: the
    # skim pass feeds its memory to the retrospective pass, which alone is scored
    model = ErnieDocForPretraining.from_pretrained(str(out / "final"))
    model.eval()
    nll = correct = count = reorder_right = 0.0
    docs = list(iter_documents(held_out, split="file"))[:2]
    for d, doc in enumerate(docs):
        segments = run.task.document_segments(doc, d, run.tokenizer)
        assert all(s.token_type_ids is None for s in segments)   # collated as type 0
        memories, memory_mask = model.ernie_doc.init_memories(1), None
        for reading in ("skim", "retro"):
            for i, s in enumerate(segments):
                with paddle.no_grad():
                    o = model(paddle.to_tensor(s.input_ids[None]), memories,
                              paddle.zeros([1, len(s.input_ids)], dtype="int64"),
                              paddle.to_tensor(s.attention_mask[None]),
                              paddle.to_tensor([reading == "skim" and i == 0]), memory_mask)
                memories, memory_mask = o.memories, o.memory_mask
                if reading == "skim":
                    continue
                labels = s.targets["mlm_labels"]
                at = np.nonzero(labels >= 0)[0]
                lp = log_softmax(o.mlm_logits.numpy()[0])
                nll -= lp[at, labels[at]].sum()
                correct += (lp[at].argmax(-1) == labels[at]).sum()
                count += len(at)
                if s.is_last:
                    reorder_right += int(o.reorder_logits.numpy()[0].argmax()
                                         == s.targets["reorder_label"])
    assert count == results["masked_tokens"]
    assert results["mlm_loss"] == pytest.approx(nll / count, rel=1e-4)
    assert results["mlm_accuracy"] == pytest.approx(correct / count, abs=1e-9)
    assert results["mlm_perplexity"] == pytest.approx(np.exp(nll / count), rel=1e-4)
    assert results["reorder_accuracy"] == pytest.approx(reorder_right / len(docs), abs=1e-9)
