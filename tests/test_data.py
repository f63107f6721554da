"""Segmenter, reading passes, row scheduler and collation (ernie_doc/data)."""
import numpy as np
import pytest

from ernie_doc.data.collate import collate
from ernie_doc.data.schedule import document_order, epoch_schedule, schedule_rows
from ernie_doc.data.segment import ClassificationSegmenter, reading_passes, windows

CLS, SEP, PAD = 101, 102, 0


def test_windows_follow_the_official_stride():
    # the official ClassifyReader's windows for q=8: windows of 6, stride m=3
    assert windows(5, 6, 3) == [(0, 5)]
    assert windows(14, 6, 3) == [(0, 6), (3, 9), (6, 12), (9, 14)]
    assert windows(3, 6, 3) == [(0, 3)]
    assert windows(12, 6, 6) == [(0, 6), (6, 12)]
    # N > window gives ceil((N - window) / stride) + 1 segments
    for n in range(7, 60):
        assert len(windows(n, 6, 3)) == -(-(n - 6) // 3) + 1


def official_windows(num_tokens, window, stride):
    """The official ClassifyReader's loop, as windows() was first written."""
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, window)
        spans.append((start, start + length))
        if start + length >= num_tokens:
            return spans
        start += min(length, stride)


def test_windows_computed_per_index_equal_the_official_loop():
    """A segment is cut when read, its window computed from its index alone: the same windows
    as the official loop for every length, window and stride."""
    for window in (1, 2, 5, 6):
        for stride in (1, 2, 3, 6, 9):
            for n in range(0, 40):
                assert windows(n, window, stride) == official_windows(n, window, stride), \
                    (n, window, stride)


def test_segments_are_built_when_read():
    """ClassificationSegmenter holds the ids, not the segments: every read builds the same
    rows anew; indices, negative indices and slices as a list's."""
    seg = ClassificationSegmenter(8, 3, CLS, SEP, PAD)
    segs = seg(list(range(20, 34)), doc_index=2, targets={"label": 1}, has_loss=False)
    assert len(segs) == 4 and segs[0] is not segs[0]
    assert segs[-1].input_ids.tolist() == segs[3].input_ids.tolist()
    assert [s.seg_index for s in segs[1:3]] == [1, 2]
    assert all(not s.has_loss and s.targets == {"label": 1} and s.doc_index == 2 for s in segs)
    with pytest.raises(IndexError):
        segs[4]


def test_classification_layout_cls_last_and_cls_first():
    seg = ClassificationSegmenter(8, 3, CLS, SEP, PAD)
    (s,) = seg([11, 12, 13, 14, 15], doc_index=4, targets={"label": 1})
    assert s.input_ids.tolist() == [11, 12, 13, 14, 15, SEP, PAD, CLS]
    assert s.attention_mask.tolist() == [1, 1, 1, 1, 1, 1, 0, 1]
    assert (s.doc_index, s.seg_index, s.num_segments, s.targets) == (4, 0, 1, {"label": 1})
    segs = seg(list(range(20, 34)), doc_index=0)
    assert [x.input_ids[:6].tolist() for x in segs] == [
        list(range(20, 26)), list(range(23, 29)), list(range(26, 32)),
        [29, 30, 31, 32, 33, SEP]]
    assert segs[-1].attention_mask.tolist() == [1, 1, 1, 1, 1, 1, 0, 1]
    assert [x.is_last for x in segs] == [False, False, False, True]
    first = ClassificationSegmenter(8, 3, CLS, SEP, PAD, layout="cls_first")
    (s,) = first([11, 12, 13], doc_index=0)
    assert s.input_ids.tolist() == [CLS, 11, 12, 13, SEP, PAD, PAD, PAD]
    assert s.attention_mask.tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert first.cls_position == 0 and seg.cls_position == 7
    with pytest.raises(ValueError, match="layout"):
        ClassificationSegmenter(8, 3, CLS, SEP, PAD, layout="middle")


def test_reading_passes_skim_then_retrospective():
    segs = ClassificationSegmenter(8, 6, CLS, SEP, PAD)(list(range(4, 20)), 0)
    n = len(segs)
    passes = reading_passes(segs, retro_feed=True)
    assert len(passes) == 2 * n
    assert [p.final for p in passes] == [False] * n + [True] * n
    assert [p.has_loss for p in passes] == [False] * n + [True] * n
    assert [p.seg_index for p in passes] == list(range(n)) * 2
    # both passes read the same rows, built anew at each read
    assert all((a.input_ids == b.input_ids).all() and (a.attention_mask == b.attention_mask).all()
               for a, b in zip(passes[:n], passes[n:]))
    assert passes[-1].seg_index == n - 1 and not passes[0].final
    both = reading_passes(segs, retro_feed=True, train_skim=True)
    assert all(p.has_loss for p in both)
    assert reading_passes(segs, retro_feed=False) == segs


def _check_schedule(lengths, rows, sched, order):
    seen = {}
    for step in range(len(sched)):
        for r in range(rows):
            d, s = sched.doc[step, r], sched.seg[step, r]
            if d < 0:
                assert sched.reset[step, r]
                continue
            seen.setdefault(int(d), []).append((step, r, int(s)))
    # every segment of every document exactly once, in order, in one row, on consecutive steps
    assert sorted(seen) == sorted(order)
    for d, items in seen.items():
        assert [s for _, _, s in items] == list(range(lengths[d]))
        assert len({r for _, r, _ in items}) == 1
        steps = [t for t, _, _ in items]
        assert steps == list(range(steps[0], steps[0] + lengths[d]))
        assert sched.reset[steps[0], items[0][1]]
        assert not any(sched.reset[t, items[0][1]] for t in steps[1:])


def test_schedule_keeps_documents_whole_in_one_row():
    # official example: docs of 1, 4, 1 segments over 2 rows; nothing is dropped
    sched = schedule_rows([1, 4, 1], rows=2)
    assert sched.doc.tolist() == [[0, 1], [2, 1], [-1, 1], [-1, 1]]
    assert sched.seg.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert sched.reset.tolist() == [[True, True], [True, False], [True, False], [True, False]]
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=57).tolist()
    for rows in (1, 3, 8):
        order = document_order(len(lengths), True, 5, 2)
        _check_schedule(lengths, rows, schedule_rows(lengths, rows, order), order)


def test_schedule_shuffle_is_a_function_of_seed_and_epoch():
    a = document_order(50, True, seed=3, epoch=1)
    assert (a == document_order(50, True, seed=3, epoch=1)).all()
    assert not (a == document_order(50, True, seed=3, epoch=2)).all()
    assert not (a == document_order(50, True, seed=4, epoch=1)).all()
    assert sorted(a.tolist()) == list(range(50))
    assert document_order(5, False, 3, 1).tolist() == [0, 1, 2, 3, 4]


def test_ranks_shard_rows_and_run_the_same_number_of_steps():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    full = epoch_schedule(lengths, rows_per_rank=2, world_size=2, shuffle=True, seed=1, epoch=0)
    r0, r1 = full.rank_rows(0, 2), full.rank_rows(1, 2)
    assert len(r0) == len(r1) == len(full)
    assert (np.concatenate([r0.doc, r1.doc], axis=1) == full.doc).all()
    docs0 = set(r0.doc[r0.doc >= 0].tolist())
    docs1 = set(r1.doc[r1.doc >= 0].tolist())
    assert not docs0 & docs1 and docs0 | docs1 == set(range(len(lengths)))


def test_collate_stacks_rows_and_pads_with_no_loss_rows():
    seg = ClassificationSegmenter(6, 4, CLS, SEP, PAD)
    a, = seg([7, 8], 3, {"label": 2})
    b, = seg([9], 5, {"label": 1})
    b.has_loss, b.final = False, False
    batch = collate([a, None, b], [True, False, False], 6, PAD)
    assert batch["input_ids"].tolist() == [[7, 8, SEP, PAD, PAD, CLS], [PAD] * 6,
                                           [9, SEP, PAD, PAD, PAD, CLS]]
    assert batch["attention_mask"][1].sum() == 0
    assert batch["reset_memory"].tolist() == [True, True, False]
    assert batch["has_loss"].tolist() == [True, False, False]
    assert batch["final"].tolist() == [True, False, False]
    assert batch["doc_index"].tolist() == [3, -1, 5]
    assert batch["target_label"].tolist() == [2, 0, 1]
    assert batch["input_ids"].dtype == np.int64 and batch["attention_mask"].dtype == np.float32


def test_collate_all_padding_step_keeps_the_target_keys():
    batch = collate([None, None], [False, False], 4, PAD, template={"label": 0})
    assert batch["target_label"].tolist() == [0, 0] and not batch["has_loss"].any()
    assert batch["reset_memory"].all()


def test_tensor_stage_gives_each_step_its_own_tensors():
    """TensorStage: the tensors paddle.to_tensor gives (values, dtypes, no gradient), and a
    later step's batch never changes an earlier step's tensors (each is a copy)."""
    import paddle

    from ernie_doc.data.collate import TensorStage
    seg = ClassificationSegmenter(6, 4, CLS, SEP, PAD)
    stage = TensorStage()
    first = collate([seg([7, 8], 0, {"label": 1})[0], None], [True, False], 6, PAD)
    kept = stage(first)
    second = collate([None, seg([9], 1, {"label": 0})[0]], [False, True], 6, PAD)
    later = stage(second)
    for batch, tensors in ((first, kept), (second, later)):
        assert sorted(tensors) == sorted(batch)
        for name, array in batch.items():
            reference = paddle.to_tensor(array)
            assert tensors[name].dtype == reference.dtype and tensors[name].stop_gradient
            assert tensors[name].numpy().tolist() == array.tolist(), name


def test_row_outputs_read_back_as_the_pairs_appended():
    """RowOutputs: arrays of one shape go into one growing array, read back (len, iteration,
    indexing) as the pairs appended; an output of another kind turns it into a list of pairs;
    aggregate_segments gives the list form's bits for either."""
    from ernie_doc.data.splits import RowOutputs
    from ernie_doc.metrics.classification import aggregate_segments
    rng = np.random.default_rng(0)
    pairs = [(s, rng.random(3).astype(np.float32)) for s in (2, 0, 1, 4, 3, 5, 6, 7, 8)]
    rows = RowOutputs()
    for pair in pairs:
        rows.append(pair)
    assert len(rows) == 9 and rows.arrays()[1].shape == (9, 3)
    assert [s for s, _ in rows] == [s for s, _ in pairs] and rows[-1][0] == 8
    assert all((a == b).all() for (_, a), (_, b) in zip(rows, pairs))
    for how in ("mean", "last"):
        assert np.array_equal(aggregate_segments(rows, how), aggregate_segments(pairs, how))
    rows.append((9, np.float32(0.5)))   # a scalar (the pair kind's output)
    assert rows.arrays() is None and len(rows) == 10 and rows[9] == (9, np.float32(0.5))
    assert [s for s, _ in rows] == [s for s, _ in pairs] + [9]


def test_segments_are_cut_from_a_copy_of_the_ids():
    """Segments are built when read, from the segmenter's own copy: changing the caller's ids
    afterwards changes nothing."""
    ids = np.arange(20, 34)
    segs = ClassificationSegmenter(8, 3, CLS, SEP, PAD)(ids, doc_index=0)
    ids[:] = 5
    assert segs[0].input_ids[:6].tolist() == list(range(20, 26))
