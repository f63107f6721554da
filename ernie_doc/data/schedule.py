"""The row scheduler: which document segment each batch row reads at each step.

Every row is a stream of whole documents (official "memory-friendly" batching, §4.4): a
document occupies one row from its first to its last segment, so the row's memory carries it;
the next document starts in the row that frees first, with `reset` set. Unlike the official
reader, nothing is dropped or counted twice (finished rows are padded). With R ranks, rank r
reads rows r·B … r·B+B−1 of R·B, so all ranks run the same number of steps."""
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from ernie_doc.errors import CheckpointError, ConfigError


@dataclass
class Schedule:
    """doc [S, R·B]: document per step and global row (−1 = padding); seg [S, R·B]: segment
    index in it; reset [S, R·B]: the row starts a new document (or is padding)."""
    doc: np.ndarray
    seg: np.ndarray
    reset: np.ndarray

    def __len__(self):
        return self.doc.shape[0]

    def rank_rows(self, rank, rows_per_rank):
        cols = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
        return Schedule(self.doc[:, cols], self.seg[:, cols], self.reset[:, cols])


def document_order(num_docs, shuffle, seed, epoch):
    """The order documents enter the rows: a permutation drawn from (seed, epoch) alone, so
    any epoch can be rebuilt on resume without replaying the earlier ones."""
    if not shuffle:
        return np.arange(num_docs)
    return np.random.default_rng([seed, epoch]).permutation(num_docs)


class RowScheduler:
    """Online greedy row assignment (a free row takes the next document, lowest row first).
    `step(next_doc)`: next_doc() → (key, steps) or None; → [(key, segment, reset) or None]."""

    def __init__(self, rows: int):
        if rows < 1:
            raise ConfigError(f"rows must be positive, got {rows}")
        self.rows = rows
        self.current = [None] * rows     # key of the document in each row
        self.position = [0] * rows       # its next step
        self.remaining = [0] * rows

    def step(self, next_doc):
        out = []
        for r in range(self.rows):
            reset = False
            if self.remaining[r] == 0:
                nxt = next_doc()
                if nxt is not None:
                    key, length = nxt
                    if length < 1:
                        raise ValueError(f"document {key!r} has no segment")
                    self.current[r], self.position[r], self.remaining[r] = key, 0, length
                    reset = True
                else:
                    self.current[r] = None
            if self.remaining[r] == 0:
                out.append((None, 0, True))
                continue
            out.append((self.current[r], self.position[r], reset))
            self.position[r] += 1
            self.remaining[r] -= 1
        return out

    def drop_idle(self) -> List[int]:
        """After a step: remove the rows that read nothing in it → the indices (among the
        rows before) of those kept, in order. A row is idle only once next_doc found no
        document, so with a source that stays exhausted it would stay idle for good
        (predict's pipeline, where idle rows are computed for nothing)."""
        kept = [r for r in range(self.rows) if self.current[r] is not None]
        if len(kept) < self.rows:
            self.current = [self.current[r] for r in kept]
            self.position = [self.position[r] for r in kept]
            self.remaining = [self.remaining[r] for r in kept]
            self.rows = len(kept)
        return kept

    def state(self):
        """Json-able: the row contents (key, next step, remaining)."""
        return [[k, p, n] for k, p, n in zip(self.current, self.position, self.remaining)]

    def load_state(self, rows):
        if len(rows) != self.rows:
            raise CheckpointError(f"a state of {len(rows)} rows for a scheduler of {self.rows}")
        for r, (key, pos, rem) in enumerate(rows):
            self.current[r], self.position[r], self.remaining[r] = key, pos, rem


def schedule_rows(lengths: Sequence[int], rows: int, order: Sequence[int] = None) -> Schedule:
    """Greedy row assignment for documents of `lengths` segments (in `order`) over `rows`
    global rows."""
    order = list(range(len(lengths))) if order is None else list(order)
    if any(lengths[d] < 1 for d in order):
        raise ValueError("every document needs at least one segment")
    queue = iter(order)
    scheduler = RowScheduler(rows)

    def next_doc():
        d = next(queue, None)
        return None if d is None else (d, lengths[d])

    docs, segs, resets = [], [], []
    while True:
        step = scheduler.step(next_doc)
        if all(key is None for key, _, _ in step):
            break
        docs.append([-1 if k is None else k for k, _, _ in step])
        segs.append([s for _, s, _ in step])
        resets.append([r for _, _, r in step])
    shape = (len(docs), rows)
    return Schedule(np.asarray(docs, dtype=np.int64).reshape(shape),
                    np.asarray(segs, dtype=np.int64).reshape(shape),
                    np.asarray(resets, dtype=bool).reshape(shape))


def epoch_schedule(lengths, rows_per_rank, world_size=1, shuffle=False, seed=0, epoch=0):
    """The global schedule of one epoch (all ranks' rows)."""
    order = document_order(len(lengths), shuffle, seed, epoch)
    return schedule_rows(lengths, rows_per_rank * world_size, order)
