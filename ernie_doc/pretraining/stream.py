"""The streamed train split of pretraining: document shards → batch rows, step by step.

S shards (document i → shard i % S; S = reader.data_shards), each read through a seeded shuffle
buffer; they do not depend on the number of ranks, and a resumed shard continues exactly.
Details: docs/design-notes.md, "Pretraining: the stream"."""
import json
import logging

import numpy as np

from ernie_doc.data.collate import collate
from ernie_doc.data.document import Skips
from ernie_doc.data.schedule import RowScheduler
from ernie_doc.data.segment import step_members
from ernie_doc.data.splits import Split
from ernie_doc.errors import DataError
from ernie_doc.pretraining import corpus

log = logging.getLogger("ernie_doc.train")


def shuffled(docs, buffer, rng):
    """Stream shuffle: keep `buffer` documents, emit a random one as each new one arrives."""
    if buffer <= 1:
        yield from docs
        return
    pool = []
    for doc in docs:
        if len(pool) < buffer:
            pool.append(doc)
            continue
        i = int(rng.integers(len(pool)))
        pool[i], doc = doc, pool[i]
        yield doc
    order = rng.permutation(len(pool))
    for i in order:
        yield pool[i]


class ShardStream:
    """Documents of one shard, epoch after epoch, as (key, steps) for a RowScheduler."""

    def __init__(self, task, shard, num_shards, seed, shuffle_buffer):
        self.task, self.shard, self.num_shards = task, shard, num_shards
        self.seed, self.buffer = seed, shuffle_buffer
        self.epoch, self.taken = 0, 0          # documents taken from this epoch's stream
        self.next_key = 0                     # key of the next document that enters a row
        self.steps, self.where = {}, {}       # key → steps; key → [epoch, id, path, line]
        self.skips = Skips(f"shard {shard}", "documents")
        self.used_this_epoch = 0
        self._docs = None

    def _epoch_stream(self, epoch):
        args = self.task.corpus_args()
        docs = corpus.iter_documents(self.task.cfg.data_dir, self.shard, self.num_shards,
                                     skips=Skips("corpus", "documents"), **args)
        rng = np.random.default_rng([self.seed, epoch, self.shard, 1])
        return shuffled(docs, self.buffer, rng)

    def _next_document(self):
        while True:
            if self._docs is None:
                self._docs = self._epoch_stream(self.epoch)
            doc = next(self._docs, None)
            if doc is not None:
                self.taken += 1
                return doc
            if self.used_this_epoch == 0:   # the shard's documents never change: none is
                raise DataError(f"{self.task.cfg.data_dir}: every document of shard "
                                f"{self.shard} is shorter than {self.task.min_doc_tokens} "
                                f"tokens; nothing to train on")
            if len(self.skips):
                self.skips.report(self.taken, log)
                self.skips = Skips(f"shard {self.shard}", "documents")
            cuts = self.task.take_cuts()   # max_doc_tokens
            if len(cuts):
                log.info(f"shard {self.shard}, corpus epoch {self.epoch}: "
                         + cuts.describe(self.task.cfg.max_doc_tokens))
            self.epoch, self.taken, self.used_this_epoch, self._docs = self.epoch + 1, 0, 0, None
            log.info(f"shard {self.shard}: epoch {self.epoch} of the corpus begins")

    def next_doc(self):
        """→ (key, number of steps) of the next trainable document."""
        while True:
            doc = self._next_document()
            key = self.next_key
            steps = self.task.document_steps(doc, self.epoch, key)
            if steps is None:
                self.skips.add(f"shorter than {self.task.min_doc_tokens} tokens",
                               f"{doc.path}:{doc.line}")
                continue
            self.next_key += 1
            self.used_this_epoch += 1
            self.steps[key] = steps
            self.where[key] = [self.epoch, doc.doc_id, doc.path, doc.line]
            return key, len(steps)

    def forget(self, live_keys):
        for key in [k for k in self.steps if k not in live_keys]:
            del self.steps[key], self.where[key]

    def state(self):
        return {"epoch": self.epoch, "taken": self.taken, "next_key": self.next_key,
                "used_this_epoch": self.used_this_epoch,
                "docs": {str(k): v for k, v in self.where.items()}}

    def load_state(self, state):
        self.epoch, self.taken = state["epoch"], state["taken"]
        self.next_key, self.used_this_epoch = state["next_key"], state["used_this_epoch"]
        self._docs = self._epoch_stream(self.epoch)
        for _ in range(self.taken):        # replay the stream without tokenizing
            if next(self._docs, None) is None:
                raise DataError(f"{self.task.cfg.data_dir}: the corpus is shorter than when "
                                f"the checkpoint was written")
        args = self.task.corpus_args()
        self.steps, self.where = {}, {}
        for key, (epoch, doc_id, path, line) in state["docs"].items():
            doc = corpus.document_at(doc_id, path, line, args["text_field"], args["split"])
            self.steps[int(key)] = self.task.document_steps(doc, epoch, int(key))
            self.where[int(key)] = [epoch, doc_id, path, line]


class StreamSplit(Split):
    """This rank's endless train rows over its shards: `batches()` yields (corpus epoch, batch);
    `state()`/`load_state()` carry the position across a resume."""
    name = "train"
    endless = True

    def __init__(self, task, rank, world, rows_per_rank, seq_len, pad_id, seed):
        shards = task.num_shards(world)
        self.source, self.num_shards = task.cfg.data_dir, shards
        per_rank = shards // world
        self.rows_per_shard = rows_per_rank // per_rank
        buffer = task.corpus_options["shuffle_buffer"]
        self.shards = [ShardStream(task, s, shards, seed, buffer)
                       for s in range(rank * per_rank, (rank + 1) * per_rank)]
        self.schedulers = [RowScheduler(self.rows_per_shard) for _ in self.shards]
        self.seq_len, self.pad_id = seq_len, pad_id
        self.template = {"mlm_labels": np.full(seq_len, -1, dtype=np.int64),
                         "reorder_label": 0}

    def _step(self):
        rows, resets = [], []
        for shard, scheduler in zip(self.shards, self.schedulers):
            for key, seg, reset in scheduler.step(shard.next_doc):
                rows.extend(step_members(shard.steps[key][seg]))
                resets.append(reset)
            shard.forget(set(scheduler.current))
        batch = collate(rows, resets, self.seq_len, self.pad_id, self.template)
        return batch

    def num_steps(self, epoch):
        return None

    def batches(self, epoch=0, start=0):
        """`start` is not used: the position is the shards' state (`load_state`)."""
        while True:
            batch = self._step()
            yield self.epoch, batch

    def describe(self):
        return f"train streamed from {self.source} in {self.num_shards} shards"

    @property
    def epoch(self):
        return min(s.epoch for s in self.shards)

    def state(self):
        """Json-able position of this rank's shards."""
        return {"shards": [dict(s.state(), rows=sch.state())
                           for s, sch in zip(self.shards, self.schedulers)]}

    def load_state(self, state):
        if len(state["shards"]) != len(self.shards):
            raise DataError(f"the checkpoint holds {len(state['shards'])} shards for this "
                            f"rank, the run has {len(self.shards)}: resume with the same "
                            f"ranks and reader.data_shards")
        for shard, scheduler, s in zip(self.shards, self.schedulers, state["shards"]):
            shard.load_state(s)
            scheduler.load_state(s["rows"])

    def state_array(self):
        return np.frombuffer(json.dumps(self.state()).encode("utf-8"), dtype=np.uint8)

    def load_state_array(self, array):
        self.load_state(json.loads(bytes(np.asarray(array, dtype=np.uint8)).decode("utf-8")))
