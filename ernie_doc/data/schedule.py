"""The row scheduler: which document segment each batch row reads at each step.

Every row is a stream of whole documents (official "memory-friendly" batching, §4.4): a
document occupies one row from its first to its last segment, so the row's memory carries it;
when it ends, the next document starts in the row that frees first (lowest row first) with
`reset` set. Unlike the official reader, nothing is dropped or counted twice: once the documents
run out, finished rows are padded (no loss, no prediction) until the longest row ends.

With R ranks the schedule has R·B global rows and rank r reads rows r·B … r·B+B−1, so every rank
keeps its rows' continuity and all ranks run the same number of steps.
"""
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np


@dataclass
class Schedule:
    """doc [S, R·B]: document index per step and global row (−1 = padding);
    seg [S, R·B]: index into that document's segment list; reset [S, R·B]: row starts a new
    document (or is padding) at this step."""
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


def schedule_rows(lengths: Sequence[int], rows: int, order: Sequence[int] = None) -> Schedule:
    """Greedy row assignment for documents of `lengths` segments (in `order`) over `rows`
    global rows."""
    if rows < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    order = list(range(len(lengths))) if order is None else list(order)
    if any(lengths[d] < 1 for d in order):
        raise ValueError("every document needs at least one segment")
    queue = iter(order)
    current = [-1] * rows           # document per row
    position = [0] * rows           # next segment of it
    remaining = [0] * rows
    pending = len(order)
    docs, segs, resets = [], [], []
    while True:
        step_doc, step_seg, step_reset = [], [], []
        for r in range(rows):
            reset = False
            if remaining[r] == 0 and pending:
                current[r] = next(queue)
                position[r], remaining[r] = 0, lengths[current[r]]
                pending -= 1
                reset = True
            if remaining[r] == 0:
                step_doc.append(-1), step_seg.append(0), step_reset.append(True)
                continue
            step_doc.append(current[r]), step_seg.append(position[r]), step_reset.append(reset)
            position[r] += 1
            remaining[r] -= 1
        if all(d == -1 for d in step_doc):
            break
        docs.append(step_doc), segs.append(step_seg), resets.append(step_reset)
    shape = (len(docs), rows)
    return Schedule(np.asarray(docs, dtype=np.int64).reshape(shape),
                    np.asarray(segs, dtype=np.int64).reshape(shape),
                    np.asarray(resets, dtype=bool).reshape(shape))


def epoch_schedule(lengths, rows_per_rank, world_size=1, shuffle=False, seed=0, epoch=0):
    """The global schedule of one epoch (all ranks' rows)."""
    order = document_order(len(lengths), shuffle, seed, epoch)
    return schedule_rows(lengths, rows_per_rank * world_size, order)
