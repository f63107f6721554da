"""The streamed pretraining split: the online row scheduler, the stream shuffle, aligned MLM
labels under their tokens, PretrainingTask.document_steps, shard coverage, the
data-parallel row equality, exact resume, and the errors of bad corpora and configs."""
import json

import numpy as np
import pytest
from helpers import deadline, error, write

from ernie_doc.data.schedule import RowScheduler, schedule_rows
from ernie_doc.data.segment import CLS_INDEX, ClassificationSegmenter
from ernie_doc.errors import ConfigError
from ernie_doc.kinds import build_task
from ernie_doc.pretraining.corpus import CorpusDocument, iter_documents
from ernie_doc.pretraining.objectives import _num_to_mask, restore_document
from ernie_doc.pretraining.stream import StreamSplit, shuffled
from ernie_doc.run_config import load_config
from ernie_doc.tokenization import load_tokenizer

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega").split()
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
PAD, CLS, SEP, MASK = 0, 1, 2, 3
SEQ = 16                 # max_seq_len: windows of 14 tokens


# --------------------------------------------------------------------------- helpers

def vocab_dir(root):
    root.mkdir(parents=True, exist_ok=True)
    (root / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    return root


def words(n, seed):
    return " ".join(np.random.default_rng(seed).choice(WORDS, size=n))


def corpus_dir(root, files):
    """files: {name: [document lengths in words]} → blank-line separated plain text."""
    seed = 0
    contents = {}
    for name, lengths in files.items():
        docs = []
        for n in lengths:
            docs.append(words(n, seed))
            seed += 1
        contents[name] = "\n\n".join(docs) + "\n"
    return write(root, contents)


def make_task(tmp_path, data_dir, *overrides, batch_size=4):
    cfg = load_config(None, ["task=pretrain", "kind=pretraining", f"data_dir={data_dir}",
                             "max_steps=10", f"max_seq_len={SEQ}", f"batch_size={batch_size}",
                             *overrides])
    task = build_task(cfg)
    tokenizer = load_tokenizer(vocab_dir(tmp_path / "vocab"))
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
            tokenizer.mask_token_id) == (PAD, CLS, SEP, MASK)
    task.setup({"cls": CLS, "sep": SEP, "pad": PAD}, SEQ, None, tokenizer)
    return task, tokenizer


def take(split, n):
    gen = split.batches()
    return [next(gen)[1] for _ in range(n)]


def assert_batches_equal(a, b, where=""):
    assert sorted(a) == sorted(b), where
    for key in a:
        assert a[key].dtype == b[key].dtype, (where, key)
        assert np.array_equal(a[key], b[key]), (where, key)


# --------------------------------------------------------------------------- 1. RowScheduler

def drive(scheduler, lengths, order, start=0, steps=None):
    """Drive `scheduler` online from order[start:]; → (rows per step, next queue index)."""
    position = [start]

    def next_doc():
        if position[0] == len(order):
            return None
        d = order[position[0]]
        position[0] += 1
        return d, lengths[d]

    out = []
    while steps is None or len(out) < steps:
        step = scheduler.step(next_doc)
        if steps is None and all(key is None for key, _, _ in step):
            break
        out.append(step)
    return out, position[0]


def as_arrays(steps):
    doc = np.asarray([[-1 if k is None else k for k, _, _ in s] for s in steps], dtype=np.int64)
    seg = np.asarray([[g for _, g, _ in s] for s in steps], dtype=np.int64)
    reset = np.asarray([[r for _, _, r in s] for s in steps], dtype=bool)
    return doc, seg, reset


def test_schedule_rows_by_hand():
    s = schedule_rows([3, 1, 2, 1], 2)
    assert s.doc.tolist() == [[0, 1], [0, 2], [0, 2], [3, -1]]
    assert s.seg.tolist() == [[0, 0], [1, 0], [2, 1], [0, 0]]
    assert s.reset.tolist() == [[True, True], [False, True], [False, False], [True, True]]
    steps, _ = drive(RowScheduler(2), [3, 1, 2, 1], [0, 1, 2, 3])
    assert steps[3] == [(3, 0, True), (None, 0, True)]


@pytest.mark.parametrize("seed", range(8))
def test_row_scheduler_online_equals_schedule_rows(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    lengths = rng.integers(1, 8, size=n).tolist()
    rows = int(rng.integers(1, 6))
    order = rng.permutation(n).tolist()
    expected = schedule_rows(lengths, rows, order)
    steps, used = drive(RowScheduler(rows), lengths, order)
    assert used == n
    doc, seg, reset = as_arrays(steps)
    assert np.array_equal(doc, expected.doc)
    assert np.array_equal(seg, expected.seg)
    assert np.array_equal(reset, expected.reset)
    # every document once, in one row, its segments 0..L-1 on consecutive steps
    for d in range(n):
        where = np.argwhere(expected.doc == d)
        assert len(where) == lengths[d]
        assert len(set(where[:, 1])) == 1
        assert np.array_equal(where[:, 0], where[0, 0] + np.arange(lengths[d]))
        assert expected.seg[expected.doc == d].tolist() == list(range(lengths[d]))
        assert expected.reset[where[0, 0], where[0, 1]]
    # padding rows are (None, 0, True); non-padding resets exactly at segment 0
    for s in steps:
        for key, g, r in s:
            if key is None:
                assert (g, r) == (0, True)
    assert np.array_equal(expected.reset, (expected.doc == -1) | (expected.seg == 0))
    # documents enter in `order`: the first step of each document, row-major, is `order`
    firsts = [int(d) for d in expected.doc[expected.reset & (expected.doc >= 0)]]
    assert firsts == order
    assert len(expected) == len(steps) >= int(np.ceil(sum(lengths) / rows))


@pytest.mark.parametrize("seed", range(5))
def test_row_scheduler_state_round_trip(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 20))
    lengths = rng.integers(1, 6, size=n).tolist()
    rows = int(rng.integers(1, 5))
    order = rng.permutation(n).tolist()
    full = as_arrays(drive(RowScheduler(rows), lengths, order)[0])
    total = len(full[0])
    for k in range(total + 1):
        first = RowScheduler(rows)
        head, used = drive(first, lengths, order, steps=k)
        state = json.loads(json.dumps(first.state()))
        resumed = RowScheduler(rows)
        resumed.load_state(state)
        assert resumed.state() == first.state()
        tail, _ = drive(resumed, lengths, order, start=used)
        doc, seg, reset = as_arrays(head + tail)
        assert np.array_equal(doc, full[0]), k
        assert np.array_equal(seg, full[1]), k
        assert np.array_equal(reset, full[2]), k


def test_row_scheduler_drops_idle_rows():
    """drop_idle after a step keeps the rows that read something, each with its own document,
    position and remaining steps: predict's rows after the documents ran out."""
    scheduler = RowScheduler(4)
    steps, _ = drive(scheduler, [3, 1, 2], [0, 1, 2], steps=1)
    assert steps[0] == [(0, 0, True), (1, 0, True), (2, 0, True), (None, 0, True)]
    assert scheduler.drop_idle() == [0, 1, 2] and scheduler.rows == 3
    kept, sizes = [], []
    while True:
        step, _ = drive(scheduler, [3, 1, 2], [], steps=1)
        if all(key is None for key, _, _ in step[0]):
            break
        kept.append(scheduler.drop_idle())
        sizes.append(scheduler.rows)
    # step 1: doc 1 is done, its row dropped; step 2: doc 0 reads its last, doc 2 is done
    assert kept == [[0, 2], [0]] and sizes == [2, 1]
    assert scheduler.state() == [[None, 3, 0]]


def test_row_scheduler_errors():
    with pytest.raises(ValueError):
        RowScheduler(0)
    with pytest.raises(ValueError, match="no segment"):
        RowScheduler(1).step(lambda: ("d", 0))
    with pytest.raises(ValueError, match="3 rows"):
        RowScheduler(2).load_state([[None, 0, 0]] * 3)
    with pytest.raises(ValueError):
        schedule_rows([2, 0], 1)


# --------------------------------------------------------------------------- 2. shuffled

@pytest.mark.parametrize("buffer", [0, 1, 3, 50])
def test_shuffled_is_a_permutation(buffer):
    docs = list(range(20))

    def run(seed):
        return list(shuffled(iter(docs), buffer, np.random.default_rng(seed)))

    out = run(5)
    assert sorted(out) == docs                                  # every item once
    assert out == run(5)                                        # same seed, same order
    # nothing is emitted before it is read: out[j] is among the first buffer + j items
    assert all(x < max(buffer, 1) + j for j, x in enumerate(out))
    if buffer <= 1:
        assert out == docs
    else:
        assert any(run(s) != docs for s in range(3))
        assert len({tuple(run(s)) for s in range(5)}) > 1
    assert list(shuffled(iter([]), buffer, np.random.default_rng(0))) == []


# --------------------------------------------------------------------------- 3. aligned labels

@pytest.mark.parametrize("layout", ["cls_last", "cls_first"])
@pytest.mark.parametrize("n,stride", [(23, 6), (12, 6), (1, 6), (23, 4)])
def test_segmenter_aligned_values_sit_under_their_tokens(layout, n, stride):
    seq_len = 8
    ids = np.arange(100, 100 + n, dtype=np.int64)
    values = ids * 10
    seg = ClassificationSegmenter(seq_len, stride, CLS, SEP, PAD, layout)
    segments = seg(ids, 7, targets={"reorder_label": 5}, aligned={"mlm_labels": values})
    offset = 0 if layout == "cls_last" else 1
    seen = []
    for i, s in enumerate(segments):
        row, laid = s.input_ids, s.targets["mlm_labels"]
        assert laid.shape == (seq_len,) and laid.dtype == np.int64
        tokens = row >= 100
        k = int(tokens.sum())
        assert np.array_equal(np.flatnonzero(tokens), offset + np.arange(k))
        assert np.array_equal(laid[tokens], row[tokens] * 10)    # exactly under its token
        assert (laid[~tokens] == -1).all()                       # [CLS], [SEP], padding
        assert row[CLS_INDEX[layout]] == CLS and row[offset + k] == SEP
        assert (row[~tokens] < 100).all()
        assert s.targets["reorder_label"] == 5
        assert (s.doc_index, s.seg_index, s.num_segments) == (7, i, len(segments))
        seen.append(row[tokens])
    # the windows advance by `stride`: token i first appears in window i // stride
    if stride >= seq_len - 2:
        assert np.array_equal(np.concatenate(seen), ids)
    else:
        assert [w[0] for w in seen] == [100 + stride * i for i in range(len(seen))]
        assert seen[-1][-1] == ids[-1]


# --------------------------------------------------------------------------- 4. document_steps

@pytest.fixture
def doc_task(tmp_path):
    data = corpus_dir(tmp_path / "corpus", {"a.txt": [10]})

    def build(*overrides):
        return make_task(tmp_path, data, *overrides)
    return build


def doc(n, seed=3, doc_id="corpus/a.txt:1"):
    return CorpusDocument(doc_id, words(n, seed), "a.txt", 1)


def step_arrays(steps):
    return [(s.input_ids, s.attention_mask, s.targets["mlm_labels"], s.targets["reorder_label"],
             s.final, s.has_loss, s.seg_index) for s in steps]


def same_steps(a, b):
    return len(a) == len(b) and all(
        all(np.array_equal(x, y) for x, y in zip(sa, sb))
        for sa, sb in zip(step_arrays(a), step_arrays(b)))


def test_document_steps_deterministic(doc_task):
    task, _ = doc_task()
    d = doc(60)
    first = task.document_steps(d, 0, 7)
    assert same_steps(first, task.document_steps(d, 0, 7))
    # the draws come from (seed, epoch, document id), not from the row key
    again = task.document_steps(d, 0, 8)
    assert same_steps(first, again)
    assert [s.doc_index for s in first] == [7] * len(first)
    assert [s.doc_index for s in again] == [8] * len(again)
    # another epoch or another document id: other masks
    for other in (task.document_steps(d, 1, 7),
                  task.document_steps(doc(60, doc_id="corpus/a.txt:9"), 0, 7)):
        assert not all(np.array_equal(a.input_ids, b.input_ids) and
                       np.array_equal(a.targets["mlm_labels"], b.targets["mlm_labels"])
                       for a, b in zip(first, other))


@pytest.mark.parametrize("retro,skim", [(True, False), (True, True), (False, False)])
def test_document_steps_passes(doc_task, retro, skim):
    task, _ = doc_task(f"retro_feed={str(retro).lower()}", f"train_skim={str(skim).lower()}")
    steps = task.document_steps(doc(30), 0, 0)
    n = 3                                                # 30 tokens in windows of 14
    assert len(steps) == (2 * n if retro else n)
    if retro:
        assert [s.final for s in steps] == [False] * n + [True] * n
        assert [s.has_loss for s in steps] == [skim] * n + [True] * n
        assert [s.seg_index for s in steps] == list(range(n)) * 2
        for skimmed, final in zip(steps[:n], steps[n:]):   # the same rows, read twice
            assert np.array_equal(skimmed.input_ids, final.input_ids)
            assert np.array_equal(skimmed.targets["mlm_labels"], final.targets["mlm_labels"])
    else:
        assert all(s.final and s.has_loss for s in steps)
        assert [s.seg_index for s in steps] == list(range(n))
    assert [s.is_last for s in steps[-n:]] == [False] * (n - 1) + [True]


@pytest.mark.parametrize("layout", ["cls_last", "cls_first"])
@pytest.mark.parametrize("n,seed", [(4, 1), (14, 2), (29, 3), (60, 4), (101, 5)])
def test_document_steps_undo_gives_the_text(doc_task, layout, n, seed):
    task, tokenizer = doc_task(f"segment_layout={layout}")
    d = doc(n, seed)
    expected = np.asarray(tokenizer.encode(d.text), dtype=np.int64)
    assert len(expected) == n
    for epoch in range(3):
        steps = task.document_steps(d, epoch, 0)
        final = [s for s in steps if s.final]
        assert len(final) == len(steps) // 2 == -(-n // (SEQ - 2))
        labels = {s.targets["reorder_label"] for s in final}
        assert len(labels) == 1
        pieces = []
        for s in final:
            mlm = s.targets["mlm_labels"]
            restored = np.where(mlm >= 0, mlm, s.input_ids)
            assert s.input_ids[CLS_INDEX[layout]] == CLS
            pieces.append(restored[~np.isin(restored, [CLS, SEP, PAD])])
            # every [MASK] in the input is a prediction target
            assert (mlm[s.input_ids == MASK] >= 0).all()
        permuted = np.concatenate(pieces)
        assert np.array_equal(restore_document(permuted, labels.pop()), expected)


def restored_text(steps):
    """The document the final pass of `steps` reads, masks undone: ids [n]."""
    pieces = []
    for s in (s for s in steps if s.final):
        mlm = s.targets["mlm_labels"]
        restored = np.where(mlm >= 0, mlm, s.input_ids)
        pieces.append(restored[~np.isin(restored, [CLS, SEP, PAD])])
    return np.concatenate(pieces)


def test_without_segment_reordering_every_document_is_read_in_order(doc_task):
    """The ablation's "w/o segment reordering" (configs/ablation.yaml: task_options.max_chunks=1
    and reorder_weight=0): MLM reads each document in its own order in every epoch, with
    reorder label 0, where the default shuffles it; the reordering loss then weighs 0."""
    d = doc(60)
    off, tokenizer = doc_task("task_options.max_chunks=1", "task_options.reorder_weight=0")
    on, _ = doc_task()
    expected = np.asarray(tokenizer.encode(d.text), dtype=np.int64)
    assert off.options["reorder_weight"] == 0 and on.options["reorder_weight"] == 1
    shuffled_epochs = 0
    for epoch in range(6):
        steps = off.document_steps(d, epoch, 0)
        assert np.array_equal(restored_text(steps), expected)
        assert {s.targets["reorder_label"] for s in steps} == {0}
        shuffled_epochs += not np.array_equal(restored_text(on.document_steps(d, epoch, 0)),
                                              expected)
    assert shuffled_epochs >= 3


def test_a_chinese_document_is_read_character_by_character(tmp_path):
    """Chinese pretraining (configs/pretrain/base_zh.yaml, a WordPiece vocabulary): text
    written without spaces is read one CJK character a token, none unknown, whole-word masking
    masks characters, and the rows hold the text in order (reordering off here)."""
    hanzi = list("文档的长度远超过一个片段因此需要记忆")
    (tmp_path / "zh").mkdir()
    (tmp_path / "zh" / "vocab.txt").write_text("\n".join(SPECIALS + hanzi) + "\n",
                                                encoding="utf-8")
    text = "".join(np.random.default_rng(0).choice(hanzi, size=40))
    cfg = load_config(None, ["task=pretrain", "kind=pretraining", f"data_dir={tmp_path}",
                             "max_steps=1", f"max_seq_len={SEQ}", "task_options.max_chunks=1",
                             "task_options.whole_word_mask=true"])
    task = build_task(cfg)
    tokenizer = load_tokenizer(tmp_path / "zh")
    task.setup({"cls": CLS, "sep": SEP, "pad": PAD}, SEQ, None, tokenizer)
    ids = tokenizer.encode(text)
    assert tokenizer.convert_ids_to_tokens(ids) == list(text)
    steps = task.document_steps(CorpusDocument("zh.txt:1", text, "zh.txt", 1), 0, 0)
    assert restored_text(steps).tolist() == ids
    assert sum(int((s.targets["mlm_labels"] >= 0).sum()) for s in steps if s.final) == 6


@pytest.mark.parametrize("n,count", [(4, 1), (7, 1), (10, 2), (33, 5), (100, 15), (130, 20)])
def test_document_steps_mask_count(doc_task, n, count):
    task, _ = doc_task()
    assert _num_to_mask(n, 0.15) == count                 # max(1, floor(0.15 n + 0.5))
    for epoch in range(3):
        steps = task.document_steps(doc(n, seed=n), epoch, 0)
        final = [s for s in steps if s.final]
        labelled = sum(int((s.targets["mlm_labels"] >= 0).sum()) for s in final)
        assert labelled == count
        masks = sum(int((s.input_ids == MASK).sum()) for s in final)
        assert masks <= labelled


def test_document_steps_mask_prob_option(doc_task):
    task, _ = doc_task("task_options.mask_prob=0.5")
    steps = task.document_steps(doc(41), 0, 0)
    labelled = sum(int((s.targets["mlm_labels"] >= 0).sum()) for s in steps if s.final)
    assert labelled == _num_to_mask(41, 0.5) == 21


def test_document_steps_short_documents(doc_task):
    task, _ = doc_task()                        # min_doc_tokens 0 → max_chunks = 4
    assert task.min_doc_tokens == 4
    assert task.document_steps(doc(3), 0, 0) is None
    assert len(task.document_steps(doc(4), 0, 0)) == 2
    task, _ = doc_task("task_options.min_doc_tokens=10")
    assert task.document_steps(doc(9), 0, 0) is None
    assert len(task.document_steps(doc(10), 0, 0)) == 2


# --------------------------------------------------------------------------- 5. StreamSplit

# 11 documents of 5..40 words over three files (1 to 3 windows of 14 tokens each)
CORPUS = {"a.txt": [5, 20, 33, 12], "b/c.txt": [40, 8, 15], "d.txt": [6, 29, 17, 9]}


def entered(split, steps):
    """Run `steps` steps; → per shard the documents in the order they entered a row:
    [(key, epoch, doc_id)]."""
    seen = [dict() for _ in split.shards]
    batches = []
    gen = split.batches()
    for _ in range(steps):
        batches.append(next(gen)[1])
        for shard, keys in zip(split.shards, seen):
            for key, (epoch, doc_id, _, _) in shard.where.items():
                keys.setdefault(key, (key, epoch, doc_id))
    return [sorted(keys.values()) for keys in seen], batches


@pytest.mark.parametrize("buffer", [0, 3, 1000])
def test_shards_cover_the_corpus_once_per_epoch(tmp_path, buffer):
    data = corpus_dir(tmp_path / "corpus", CORPUS)
    everything = sorted(d.doc_id for d in iter_documents(data))
    assert len(everything) == 11
    task, _ = make_task(tmp_path, data, f"reader.shuffle_buffer={buffer}")
    per_shard = []
    for rank in range(2):
        split = StreamSplit(task, rank, 2, 2, SEQ, PAD, 3)
        docs, _ = entered(split, 60)
        assert split.epoch >= 2                         # several corpus epochs were read
        (docs,) = docs
        epochs = [e for _, e, _ in docs]
        assert epochs == sorted(epochs)                 # epoch e+1 starts after epoch e ends
        assert [k for k, _, _ in docs] == list(range(len(docs)))
        per_shard.append(docs)
    for epoch in (0, 1):
        ids = [i for docs in per_shard for _, e, i in docs if e == epoch]
        assert sorted(ids) == everything                # each document once per epoch
    # a shard keeps its documents; with a buffer, epoch 1 reads them in another order
    orders = [[i for _, e, i in per_shard[0] if e == epoch] for epoch in (0, 1)]
    assert sorted(orders[0]) == sorted(orders[1])
    assert (orders[0] != orders[1]) == (buffer > 1)


@pytest.mark.parametrize("buffer", [0, 3])
def test_single_file_epoch_orders(tmp_path, buffer):
    # only the buffer reshuffles an epoch
    data = corpus_dir(tmp_path / "corpus", {"a.txt": [5, 20, 7, 12, 40, 8, 15, 6]})
    in_file = [d.doc_id for d in iter_documents(data)]
    task, _ = make_task(tmp_path, data, f"reader.shuffle_buffer={buffer}", batch_size=2)
    split = StreamSplit(task, 0, 1, 2, SEQ, PAD, 2)
    (docs,), _ = entered(split, 40)
    orders = [[i for _, e, i in docs if e == epoch] for epoch in (0, 1, 2)]
    for order in orders:
        assert sorted(order) == sorted(in_file)
    if buffer == 0:
        assert orders == [in_file] * 3
    else:
        assert len({tuple(o) for o in orders}) == 3      # a new draw every epoch


def test_one_process_with_two_shards_equals_two_ranks(tmp_path):
    data = corpus_dir(tmp_path / "corpus", CORPUS)
    B, steps = 2, 40
    one, _ = make_task(tmp_path, data, "reader.data_shards=2", "reader.shuffle_buffer=3",
                       batch_size=2 * B)
    two, _ = make_task(tmp_path, data, "reader.shuffle_buffer=3", batch_size=B)
    assert one.num_shards(1) == two.num_shards(2) == 2
    joint = take(StreamSplit(one, 0, 1, 2 * B, SEQ, PAD, 11), steps)
    ranks = [take(StreamSplit(two, r, 2, B, SEQ, PAD, 11), steps) for r in range(2)]
    for t in range(steps):
        assert joint[t]["input_ids"].shape == (2 * B, SEQ)
        for r in range(2):
            part = {k: v[r * B:(r + 1) * B] for k, v in joint[t].items()}
            assert_batches_equal(part, ranks[r][t], f"step {t} rank {r}")
    # the two ranks do read different documents
    assert not np.array_equal(ranks[0][0]["input_ids"], ranks[1][0]["input_ids"])


@pytest.mark.parametrize("retro", [True, False])
def test_stream_rows(tmp_path, retro):
    data = corpus_dir(tmp_path / "corpus", CORPUS)
    task, _ = make_task(tmp_path, data, f"retro_feed={str(retro).lower()}",
                        "reader.data_shards=2")
    split = StreamSplit(task, 0, 1, 4, SEQ, PAD, 1)
    assert split.rows_per_shard == 2 and len(split.shards) == 2
    batches = take(split, 50)
    assert split.epoch >= 2
    expected_keys = {"input_ids", "attention_mask", "token_type_ids", "reset_memory",
                     "has_loss", "final", "doc_index", "seg_index", "is_last",
                     "target_mlm_labels", "target_reorder_label"}
    prev = None
    for t, b in enumerate(batches):
        assert set(b) == expected_keys
        assert b["input_ids"].shape == b["target_mlm_labels"].shape == (4, SEQ)
        assert (b["doc_index"] >= 0).all()                       # never a padding row
        first_pass = ~b["final"] if retro else np.ones(4, dtype=bool)
        assert np.array_equal(b["reset_memory"], (b["seg_index"] == 0) & first_pass), t
        assert np.array_equal(b["has_loss"], b["final"])
        assert (b["target_mlm_labels"][np.isin(b["input_ids"], [CLS, SEP, PAD])] == -1).all()
        assert (b["input_ids"][:, -1] == CLS).all()              # cls_last layout
        assert (b["target_reorder_label"] >= 0).all() and (b["target_reorder_label"] < 33).all()
        if prev is not None:                                     # a row carries its document
            go_on = ~b["reset_memory"]
            assert np.array_equal(b["doc_index"][go_on], prev["doc_index"][go_on])
            assert np.array_equal(b["target_reorder_label"][go_on],
                                  prev["target_reorder_label"][go_on])
            # a row resets only after its document's last final segment
            assert (prev["is_last"] & prev["final"])[b["reset_memory"]].all()
        prev = b


# --------------------------------------------------------------------------- 6. resume

@pytest.mark.parametrize("buffer,shards", [(0, 1), (3, 1), (1000, 2)])
def test_resume_continues_identically(tmp_path, buffer, shards):
    # a tiny corpus of 5 documents, read for several epochs
    data = corpus_dir(tmp_path / "corpus", {"a.txt": [5, 30], "b.txt": [16, 9], "c.txt": [44]})
    task, _ = make_task(tmp_path, data, f"reader.shuffle_buffer={buffer}",
                        f"reader.data_shards={shards}", batch_size=2 * shards)
    rows, m, horizon = 2 * shards, 8, 30          # two rows per shard

    def fresh():
        return StreamSplit(task, 0, 1, rows, SEQ, PAD, 5)

    reference = fresh()
    full = take(reference, horizon + m)
    assert reference.epoch >= 2
    crossed = stale_rows = 0
    for k in range(horizon + 1):
        first = fresh()
        head = take(first, k)
        for t in range(k):
            assert_batches_equal(head[t], full[t], f"k={k} step {t}")
        state = first.state_array()
        assert state.dtype == np.uint8
        resumed = fresh()
        resumed.load_state_array(state.copy())
        assert resumed.state() == first.state()
        tail = take(resumed, m)
        for t in range(m):
            assert_batches_equal(tail[t], full[k + t], f"k={k} step {k + t}")
        crossed += resumed.epoch > first.epoch
        stale_rows += any(e < s["epoch"] for s in first.state()["shards"]
                          for e, _, _, _ in s["docs"].values())
    assert crossed > 0            # some resumes continued over a corpus epoch boundary
    assert stale_rows > 0         # some held rows still reading the previous epoch's documents


def test_resume_with_other_shards_is_refused(tmp_path):
    data = corpus_dir(tmp_path / "corpus", CORPUS)
    one, _ = make_task(tmp_path, data, "reader.data_shards=2")
    two, _ = make_task(tmp_path, data, "reader.data_shards=1")
    split = StreamSplit(one, 0, 1, 4, SEQ, PAD, 1)
    take(split, 3)
    error(lambda: StreamSplit(two, 0, 1, 4, SEQ, PAD, 1).load_state_array(split.state_array()),
          "2 shards", "reader.data_shards")


# --------------------------------------------------------------------------- 7. short shards

def test_all_short_documents_raise(tmp_path):
    data = write(tmp_path / "corpus", {"a.txt": "alpha beta\n\ngamma\n\ndelta eta zeta\n"})
    task, _ = make_task(tmp_path, data)
    assert task.check_data(1) == 3        # the corpus check does not tokenize
    split = StreamSplit(task, 0, 1, 4, SEQ, PAD, 1)
    with deadline(10):
        error(lambda: take(split, 1), "shard 0", "shorter than 4 tokens")


def test_one_short_shard_raises_the_other_trains(tmp_path):
    # documents alternate long/short: shard 1 (odd documents) has only short ones
    data = write(tmp_path / "corpus", {"a.txt": "\n\n".join(
        [words(8, 0), "mu nu", words(9, 1), "xi", words(20, 2), "pi rho"]) + "\n"})
    task, _ = make_task(tmp_path, data)
    assert len(take(StreamSplit(task, 0, 2, 2, SEQ, PAD, 1), 20)) == 20
    with deadline(10):
        error(lambda: take(StreamSplit(task, 1, 2, 2, SEQ, PAD, 1), 1),
              "shard 1", "shorter than 4 tokens")


# regression: shard membership used to be redrawn each epoch (files read in a new order),
# so a shard could draw only short documents in a later epoch and stop the run
def test_a_shard_with_no_long_document_in_one_later_epoch_goes_on(tmp_path):
    data = write(tmp_path / "corpus", {
        "a.txt": "alpha beta\n\nalpha beta gamma delta epsilon zeta\n",
        "b.txt": "alpha beta gamma delta epsilon zeta eta\n",
        "c.txt": "mu nu\n"})
    task, _ = make_task(tmp_path, data, batch_size=1)
    split = StreamSplit(task, 0, 2, 1, SEQ, PAD, 0)
    docs, _ = entered(split, 2)
    assert [e for _, e, _ in docs[0]] == [0]            # epoch 0: shard 0 has a long document
    with deadline(10):
        take(split, 40)                                 # raises DataError at epoch 2


# --------------------------------------------------------------------------- 8. bad input

BASE = ["task=pretrain", "kind=pretraining", "max_steps=10", f"max_seq_len={SEQ}",
        "batch_size=4"]


def config_error(overrides, *parts):
    with pytest.raises(ConfigError) as info:
        build_task(load_config(None, BASE + overrides))
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


def test_config_errors(tmp_path):
    data = corpus_dir(tmp_path / "corpus", {"a.txt": [10, 12]})
    d = f"data_dir={data}"
    config_error([d, "task_options.max_chunks=5"], "max_chunks", "153", "33")
    assert build_task(load_config(None, BASE + [d, "task_options.max_chunks=5",
                                                "task_options.reorder_classes=153"]))
    config_error([d, "reader.shuffle_bufer=3"], "shuffle_bufer")
    config_error([d, "task_options.mask_probability=0.2"], "mask_probability")
    config_error([d, "task_options.mask_prob=0"], "mask_prob")
    config_error([d, "reader.format=markdown"], "reader.format", "markdown")
    config_error([d, "reader.shuffle_buffer=-1"], "reader.shuffle_buffer")
    config_error([], "data_dir")
    task = build_task(load_config(None, BASE + [d, "reader.data_shards=3"]))
    for call in (lambda: task.num_shards(2), lambda: task.check_data(2)):
        with pytest.raises(ConfigError, match="data_shards 3") as info:
            call()
        assert "(2)" in str(info.value)
    task, _ = make_task(tmp_path, data, "reader.data_shards=3")
    with pytest.raises(ConfigError, match="data_shards 3"):
        StreamSplit(task, 0, 2, 4, SEQ, PAD, 1)
    # 4 shards cannot share the 2 × 1 rows of a global batch
    task = build_task(load_config(None, BASE[:-1] + [d, "batch_size=1", "reader.data_shards=4"]))
    with pytest.raises(ConfigError, match="divide"):
        task.num_shards(2)


@pytest.mark.parametrize("check", [True, False])
def test_empty_corpus(tmp_path, check):
    empty = tmp_path / "empty"
    empty.mkdir()
    task = build_task(load_config(None, BASE + [f"data_dir={empty}",
                                                f"reader.check_corpus={str(check).lower()}"]))
    error(lambda: task.check_data(1), str(empty), "empty corpus")


def test_non_utf8_file(tmp_path):
    data = write(tmp_path / "corpus", {"a.txt": words(10, 0) + "\n\n" + words(10, 1) + "\n",
                                       "b.txt": b"alpha beta gamma delta\n\nbad \xff byte\n"})
    task, _ = make_task(tmp_path, data)
    error(lambda: task.check_data(1), f"{data / 'b.txt'}:3", "UTF-8")
    # the stream meets it too: the same file:line
    error(lambda: take(StreamSplit(task, 0, 1, 4, SEQ, PAD, 1), 10), f"{data / 'b.txt'}:3")


def test_max_doc_tokens_cuts_pretraining_documents_and_counts_them(tmp_path, caplog):
    """A corpus document longer than max_doc_tokens is read up to it (whole words are
    one token each here), and the cut documents are logged per shard and corpus epoch."""
    import logging
    data = corpus_dir(tmp_path / "corpus", {"a.txt": [40, 10, 60]})
    task, _ = make_task(tmp_path, data, "max_doc_tokens=20", "retro_feed=false")
    docs = list(iter_documents(str(data)))
    lengths = [len(task.document_steps(doc, 0, i)) for i, doc in enumerate(docs)]
    # windows of 14 advancing by 14 (no memory overlap here): 20 tokens → 2, 10 → 1
    assert lengths == [2, 1, 2]
    cuts = task.take_cuts()
    assert len(cuts) == 2 and cuts.tokens == (40 - 20) + (60 - 20) and not len(task.cuts)
    split = StreamSplit(task, 0, 1, 1, SEQ, PAD, 1)
    with caplog.at_level(logging.INFO):
        take(split, 12)   # more than one corpus epoch (5 steps each)
    assert any("corpus epoch 0: 2 documents longer than max_doc_tokens 20 were cut to it "
               "(60 tokens not read)" in r.getMessage() for r in caplog.records)
