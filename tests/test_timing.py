"""timing.json (issue 17's "no starved model"): the share of the training steps' wall time
spent waiting for batches, measured around the split's batch iterator."""
import json
import time

import pytest
from helpers import tiny_longdep


def run(out, slow=0.0, *overrides):
    """A tiny fine-tuning run in this process whose training batches each take `slow` extra
    seconds to produce → (timing.json, number of micro-steps read)."""
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    from ernie_doc.training.trainer import Trainer
    prepared = prepare(load_config(None, tiny_longdep(*overrides, f"output_dir={out}")))
    batches, count = prepared.train.batches, [0]

    def slow_batches(epoch, start):
        for item in batches(epoch, start):
            time.sleep(slow)
            count[0] += 1
            yield item

    prepared.train.batches = slow_batches
    Trainer(prepared).train()
    return json.loads((out / "timing.json").read_text()), count[0]


def test_timing_counts_the_wait_for_batches(tmp_path):
    fast, micro = run(tmp_path / "fast")
    log = [json.loads(line) for line in open(tmp_path / "fast" / "train_log.jsonl")]
    assert fast["steps"] == len(log) == micro > 0
    assert 0 <= fast["input_s"] <= fast["train_s"]
    assert fast["input_share"] == pytest.approx(fast["input_s"] / fast["train_s"], abs=1e-3)
    slow, micro = run(tmp_path / "slow", 0.05)
    # every batch's 50 ms is counted as input time, and it is part of the steps' time
    assert slow["input_s"] >= 0.05 * micro
    assert slow["train_s"] >= slow["input_s"]
    assert slow["input_share"] > fast["input_share"]


def test_evaluation_is_not_counted_in_the_next_step(tmp_path, monkeypatch):
    """A step after an evaluation is timed from the evaluation's end: tokens/s and
    timing.json measure training steps only."""
    from ernie_doc.training.trainer import Trainer
    evaluate = Trainer.evaluate

    def slow_evaluate(self, split_name):
        time.sleep(0.5)
        return evaluate(self, split_name)

    monkeypatch.setattr(Trainer, "evaluate", slow_evaluate)
    timing, micro = run(tmp_path / "run", 0.0, "eval_steps=1")
    assert micro >= 2 and timing["steps"] == micro
    assert timing["train_s"] < 0.5 * (micro - 1)   # no step carries an evaluation's 0.5 s
