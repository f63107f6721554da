"""Where a batch comes from: the one protocol every split implements, and the document split.

A split, built for one rank, says how many micro-steps epoch e has (`num_steps(e)`, None when
endless), what they are (`batches(e, start)`) and how they are scored (`evaluation(task)`,
`protocol(model)`). `DocumentSplit` reads whole documents; `pretraining.stream.StreamSplit` and
`kinds.lm` are the streams. Details: docs/design-notes.md, "Training: splits"."""
import contextlib
from collections import defaultdict
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ernie_doc.data.collate import collate
from ernie_doc.data.schedule import Schedule, epoch_schedule
from ernie_doc.data.segment import step_members

Batch = Dict[str, np.ndarray]


class Split:
    """The split protocol, with the defaults of a finite split that needs no resume state and
    no evaluation set-up. Subclasses set `name` and implement `num_steps` and `batches`."""
    name: str = ""
    endless: bool = False   # a stream: no epochs, runs until max_steps

    def num_steps(self, epoch: int) -> Optional[int]:
        """Micro-steps this rank reads in `epoch` (None for an endless stream)."""
        raise NotImplementedError

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Tuple[int, Batch]]:
        """(epoch the batch belongs to, batch) for micro-steps `start`, `start` + 1, ... of
        `epoch` (a stream ignores `epoch` and reports the corpus pass it is on)."""
        raise NotImplementedError

    def describe(self) -> str:
        """One phrase for the run's summary line."""
        return self.name

    def state_array(self) -> Optional[np.ndarray]:
        """The position a checkpoint must keep beyond the micro-step index (uint8 bytes), or
        None when the micro-step index says it all."""
        return None

    def load_state_array(self, array: np.ndarray) -> None:
        """Restore the position `state_array` saved."""

    def protocol(self, model) -> contextlib.AbstractContextManager:
        """A context in which `model` reads this split for evaluation."""
        return contextlib.nullcontext()

    def evaluation(self, task) -> "Evaluation":
        """A fresh collector of this split's predictions under `task`."""
        raise NotImplementedError(f"split {self.name!r} is read for training only")


class Evaluation:
    """Collects one rank's predictions batch by batch; `finish` merges every rank's part."""

    def add(self, batch: Batch, tensors: Dict[str, Any], out) -> None:
        raise NotImplementedError

    def part(self):
        """This rank's collected state (picklable: it is gathered over ranks)."""
        raise NotImplementedError

    def finish(self, parts: List[Any]) -> Tuple[Dict[str, float], Optional[List[dict]]]:
        """All ranks' parts → (metrics, per-document predictions or None)."""
        raise NotImplementedError


class DocumentSplit(Split):
    """A split ready to schedule: `docs` and `passes[d]` (steps: Segments or lockstep tuples of
    `group`). `rows` per rank; each epoch's schedule is drawn from (seed, epoch)."""

    def __init__(self, name: str, docs: Sequence, passes: Sequence[Sequence], group: int = 1,
                 rows: int = 1, seq_len: int = 0, pad_id: int = 0, rank: int = 0,
                 world: int = 1, seed: int = 0, shuffle: bool = False):
        self.name, self.docs, self.passes, self.group = name, docs, passes, group
        self.slots = rows // group          # schedule slots: one example (group of rows) each
        self.seq_len, self.pad_id = seq_len, pad_id
        self.rank, self.world, self.seed, self.shuffle = rank, world, seed, shuffle
        self.lengths = [len(p) for p in passes]   # steps (segment reads) per document
        # the targets a padding row carries (zeros shaped like a real segment's)
        self.template = step_members(passes[0][0])[0].targets if passes else {}
        self._schedules: Dict[int, Schedule] = {}

    def schedule(self, epoch: int) -> Schedule:
        """This rank's slots at each step of `epoch` (doc / seg / reset: [steps, slots])."""
        if epoch not in self._schedules:   # counted by the step plan, then read: build once
            self._schedules = {epoch: epoch_schedule(
                self.lengths, self.slots, self.world, self.shuffle, self.seed,
                epoch).rank_rows(self.rank, self.slots)}
        return self._schedules[epoch]

    def num_steps(self, epoch: int) -> int:
        return len(self.schedule(epoch))

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Tuple[int, Batch]]:
        schedule, g = self.schedule(epoch), self.group
        for step in range(start, len(schedule)):
            rows, resets = [], []
            for d, s, reset in zip(schedule.doc[step], schedule.seg[step],
                                   schedule.reset[step]):
                rows.extend([None] * g if d < 0 else step_members(self.passes[d][s]))
                resets.extend([reset] * g)
            yield epoch, collate(rows, resets, self.seq_len, self.pad_id, self.template)

    def describe(self) -> str:
        return f"{self.name} {len(self.docs)} docs / {sum(self.lengths)} segment reads"

    def evaluation(self, task) -> "DocumentEvaluation":
        return DocumentEvaluation(task, self)


def predicted_rows(batch: Batch) -> np.ndarray:
    """bool [B]: rows of a real document in its predicted (`final`) pass."""
    return batch["final"] & (batch["doc_index"] >= 0)


class RowOutputs:
    """One document's predicted rows as collect_row_outputs appends them, (segment index,
    output) pairs, read back as the list of pairs it stands for (len, iteration, indexing).
    While every output is an array of one shape and dtype, they are copied into one array
    that doubles when full: a long document holds its outputs (C floats a segment for
    classification), not an object per segment or the batch arrays each was cut from."""

    def __init__(self):
        self.count = 0
        self.indices: Optional[np.ndarray] = None   # int64 [capacity]
        self.values: Optional[np.ndarray] = None    # [capacity, ...] (the outputs' shape)
        self.pairs: Optional[list] = None           # the pairs, once an output does not fit

    def append(self, pair: Tuple[int, Any]) -> None:
        seg, value = pair
        if self.pairs is None and isinstance(value, np.ndarray) and (
                self.values is None or (value.shape == self.values.shape[1:]
                                        and value.dtype == self.values.dtype)):
            if self.values is None or self.count == len(self.values):
                self._grow(value)
            self.indices[self.count], self.values[self.count] = seg, value
            self.count += 1
            return
        if self.pairs is None:
            self.pairs = list(self)
        self.pairs.append(pair)

    def _grow(self, value: np.ndarray) -> None:
        capacity = max(4, 2 * self.count)
        indices = np.empty(capacity, dtype=np.int64)
        values = np.empty((capacity,) + value.shape, dtype=value.dtype)
        if self.count:
            indices[:self.count], values[:self.count] = self.indices[:self.count], \
                self.values[:self.count]
        self.indices, self.values = indices, values

    def arrays(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """(segment indices [n], outputs [n, ...]) when every output was an array of one
        shape, else None."""
        if self.pairs is not None:
            return None
        if self.values is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return self.indices[:self.count], self.values[:self.count]

    def __len__(self) -> int:
        return len(self.pairs) if self.pairs is not None else self.count

    def __getitem__(self, i: int) -> Tuple[int, Any]:
        if self.pairs is not None:
            return self.pairs[i]
        if not -self.count <= i < self.count:
            raise IndexError(f"row {i} of {self.count}")
        i %= self.count
        return int(self.indices[i]), self.values[i]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def collect_row_outputs(task, batch: Batch, tensors: Dict[str, Any], out, group: int,
                        rows: Dict[int, Any]) -> List[int]:
    """Append each predicted row's output (task.row_outputs) to rows[doc_index] (a list or a
    RowOutputs) as (segment index, output) → the doc indices that got one."""
    predicted = predicted_rows(batch)
    if not predicted.any():
        return []
    outputs = task.row_outputs(out, tensors)   # [B // group, ...]
    docs = []
    for r in np.nonzero(predicted)[0]:
        if r % group == 0:   # a group's first row stands for the group
            doc = int(batch["doc_index"][r])
            rows[doc].append((int(batch["seg_index"][r]), outputs[r // group]))
            docs.append(doc)
    return docs


class DocumentEvaluation(Evaluation):
    """Per document, its predicted rows' outputs in segment order and their loss; the task then
    makes predictions and the split's metrics."""

    def __init__(self, task, split: DocumentSplit):
        self.task, self.split = task, split
        self.rows = defaultdict(list)   # doc index → [(segment index, row output)]
        self.loss_sum, self.loss_rows = 0.0, 0.0

    def add(self, batch: Batch, tensors: Dict[str, Any], out) -> None:
        import paddle
        predicted = predicted_rows(batch)
        if not predicted.any():
            return
        weight = paddle.to_tensor(predicted.astype("float32"))
        self.loss_sum += float(self.task.loss(out, tensors, weight)) * float(predicted.sum())
        self.loss_rows += float(predicted.sum())
        collect_row_outputs(self.task, batch, tensors, out, self.split.group, self.rows)

    def part(self):
        return dict(self.rows), self.loss_sum, self.loss_rows

    def finish(self, parts):
        merged = defaultdict(list)
        for part_rows, _, _ in parts:
            for doc, items in part_rows.items():
                merged[doc].extend(items)
        metrics, predictions = self.task.evaluate(self.split.docs, merged, self.split.passes)
        metrics["loss"] = sum(p[1] for p in parts) / max(1.0, sum(p[2] for p in parts))
        return metrics, predictions
