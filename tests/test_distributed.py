"""Fine-tuning data parallel: two `fleetrun` ranks equal one process on the union of their
rows, as the pretraining and language-model tests check for theirs.

Fine-tuning's loss is the mean over the rank's own training rows, and data parallelism
averages the ranks' gradients: the mean of the ranks' means. That is the mean over the union
when every rank has as many training rows at each micro-step, which holds here (documents of
equal length, as many as the global rows, so all rows read in step). Where the counts differ
(the padded rows of an epoch's last round, rows of documents of other lengths skimming while
others train), a rank's row weighs 1 / (its rank's count) instead of 1 / (all ranks' count),
like the official fleet training; pretraining and the language model normalise over all
ranks instead.
"""
import json
import os

import pytest
from helpers import (assert_two_ranks_equal_one_process, launch_two_ranks, tiny_longdep,
                     train_and_dump)


@pytest.mark.two_ranks
def test_two_ranks_equal_one_process_on_the_union_of_their_rows(tmp_path):
    # 16 documents of 2 segments over 8 global rows: each row reads 2 documents, skim then
    # retrospective pass, 8 micro-steps, 4 optimizer steps (the first micro-step of each
    # skips the gradient all-reduce). A large Adam epsilon keeps the update linear in the
    # gradient (see test_pretrain's test of the same name).
    common = tiny_longdep("grad_accum_steps=2", "adam_epsilon=0.01", "save_steps=0",
                          "shuffle=true", train_docs=16)
    dp, single = tmp_path / "dp", tmp_path / "single"
    proc, logs = launch_two_ranks(tmp_path, [os.path.join("tests", "dp_worker.py"), str(dp),
                                             *common, "batch_size=4"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    single.mkdir()
    train_and_dump(single, [*common, "batch_size=8"])
    a, b = assert_two_ranks_equal_one_process(dp, single)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    # steps 1 and 3 skim (no loss), 2 and 4 train: the logged loss is the union's mean
    assert ["loss" in r for r in a] == ["loss" in r for r in b] == [False, True] * 2
    for ra, rb in zip(a, b):
        assert ra["lr"] == rb["lr"]
        if "loss" in ra:
            assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
    # the evaluation gathers the ranks' documents: the same metrics as one process
    ea = json.loads((dp / "eval_results.json").read_text())
    eb = json.loads((single / "eval_results.json").read_text())
    assert ea["step"] == eb["step"] == 4
    for key in ("accuracy", "loss"):
        assert ea[key] == pytest.approx(eb[key], rel=1e-4, abs=1e-6)


def test_cpu_views_are_dense_and_gpu_flags_are_left_alone(monkeypatch):
    """utils.set_device: on CPU, paddle's stride kernels off (transpose and slicing write
    dense tensors; strided views cost a small model's CPU step about 3x), the same values;
    on a GPU the flag stays the user's. distributed.init picks it for both."""
    import numpy as np
    import paddle

    from ernie_doc import distributed, utils
    flag = "FLAGS_use_stride_kernel"
    before = paddle.get_flags([flag])[flag]
    try:
        x = paddle.to_tensor(np.arange(24, dtype="float32").reshape(2, 3, 4))
        paddle.set_flags({flag: True})
        strided = x.transpose([0, 2, 1])
        assert not strided.is_contiguous()
        utils.set_device("cpu")
        assert paddle.get_flags([flag])[flag] is False
        dense = x.transpose([0, 2, 1])
        assert dense.is_contiguous() and np.array_equal(dense.numpy(), strided.numpy())

        places = []
        monkeypatch.setattr(paddle, "set_device", places.append)
        paddle.set_flags({flag: True})
        utils.set_device("gpu:1")
        assert places == ["gpu:1"] and paddle.get_flags([flag])[flag] is True
        monkeypatch.setattr(distributed, "gpu_problem", lambda: None)
        assert distributed.init("gpu") == "gpu" and places[-1] == "gpu:0"
        assert paddle.get_flags([flag])[flag] is True
        assert distributed.init("cpu") == "cpu" and places[-1] == "cpu"
        assert paddle.get_flags([flag])[flag] is False
    finally:
        paddle.set_flags({flag: before})
