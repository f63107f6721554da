"""Which segments and tokens of a document drove a prediction: occlusion, and gradients that
follow the prediction back through the recurrence memory.

A document is read as prediction reads it, and several *variants* of it are read side by side
as batch rows of one stream (rows never see each other): the document as is, copies with one
segment's tokens replaced (occlusion: target(document) − target(variant)), or copies whose
token embeddings move toward a baseline (gradient × (x − x'), integrated gradients), with the
memories attached for this pass only (`memory_gradient`). Details and costs: docs/explain.md."""
import contextlib
import math
import threading
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from ernie_doc.data.collate import TensorStage, collate
from ernie_doc.data.segment import Segment, reading_passes, step_members
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.resources import available_memory, describe
from ernie_doc.utils import progress_bar

METHODS = ("occlusion", "gradient", "integrated_gradients")
REPLACEMENTS = ("pad", "mask")
ALL = -1   # an occlusion variant that replaces every segment: the baseline document

Rows = List[Tuple[int, Any]]   # a variant's final-reading rows: (segment index, row tensor)


@dataclass
class Layout:
    """One document laid out for an explanation: its reading passes (steps built when read),
    the segments of one reading, the readings (2 under the retrospective feed) and the rows
    one step takes (the kind's group size)."""
    passes: Sequence
    segments: int
    readings: int
    group: int


def document_layout(task: Any, doc: Any, tokenizer: Any, retro_feed: bool,
                    train_skim: bool = False) -> Layout:
    """The layout of `doc` as the task's prediction reads it (DataError for what it refuses)."""
    steps = task.document_segments(doc, 0, tokenizer)
    passes = reading_passes(steps, retro_feed, train_skim)
    return Layout(passes, len(steps), 2 if retro_feed else 1, task.group_size)


def reading_of(layout: Layout, step: int) -> int:
    """Which reading step `step` belongs to: 0 (the skim, or the only one) or 1."""
    return 0 if layout.readings == 1 else int(step >= layout.segments)


def content_mask(member: Segment, seq_len: int) -> np.ndarray:
    """[T] bool: the positions of `member` that hold the document's tokens (its sources)."""
    mask = np.zeros(seq_len, dtype=bool)
    for _, start, end, at in member.sources:
        mask[at:at + end - start] = True
    return mask


def occluded(member: Segment, replacement: int) -> Segment:
    """A copy of `member` whose document tokens are `replacement` (layout, mask, types kept)."""
    ids = np.array(member.input_ids, copy=True)
    ids[content_mask(member, len(ids))] = replacement
    return replace(member, input_ids=ids)


def variant_rows(members: Sequence[Segment], variants: Sequence[Optional[int]],
                 replacement: int) -> List[Segment]:
    """The step's rows for each variant in turn: the members, occluded where the variant
    replaces their segment (None: none, ALL: every one)."""
    rows = []
    for seg in variants:
        for m in members:
            hit = seg == ALL or (seg is not None and m.seg_index == seg)
            rows.append(occluded(m, replacement) if hit else m)
    return rows


def read_variants(model: Any, task: Any, layout: Layout, seq_len: int, pad_id: int,
                  variants: Sequence[Optional[int]], replacement: int,
                  probe: Optional["EmbeddingProbe"] = None,
                  stage: Optional[TensorStage] = None) -> "VariantRows":
    """Read the document once per variant, all side by side → each variant's final-reading
    rows [(segment index, its row of task.row_scores)] (VariantRows). A graph is built when
    gradients are enabled (the caller's choice); `probe` sees every step's rows. `stage`
    turns each step's arrays into tensors (give one stage to every read of an explanation:
    occlusion reads a document once per segment, and a tensor built from an array per step
    costs memory that paddle 3 never returns, see TensorStage)."""
    stage = stage or TensorStage()
    found = VariantRows(len(variants))
    carry: Dict[str, Any] = {}
    rows_per_step = len(variants) * layout.group
    for i in range(len(layout.passes)):
        members = step_members(layout.passes[i])
        rows = variant_rows(members, variants, replacement)
        batch = collate(rows, [i == 0] * rows_per_step, seq_len, pad_id)
        tensors = stage(batch)
        if probe is not None:
            probe.step(reading_of(layout, i), rows,
                       np.stack([content_mask(m, seq_len) for m in rows]))
        out, carry = task.forward(model, tensors, carry)
        if members[0].final:
            found.steps.append((members[0].seg_index, task.row_scores(out, tensors)))
    return found


class VariantRows(SequenceABC):
    """Each variant's final-reading rows [(segment index, row)], sliced from the steps' score
    tensors [variants, ...] when asked for: one tensor a step, since thousands of small tensors
    outliving the read pin the heap pages of every step's temporaries."""

    def __init__(self, variants: int):
        self.variants = variants
        self.steps: List[Tuple[int, Any]] = []   # (segment index, scores [variants, ...])

    def __len__(self) -> int:
        return self.variants

    def __getitem__(self, v: int) -> Rows:
        if not -self.variants <= v < self.variants:
            raise IndexError(f"variant {v} of {self.variants}")
        return [(seg, scores[v % self.variants]) for seg, scores in self.steps]


class EmbeddingProbe:
    """A forward hook on the word embedding: each step's output becomes a leaf tensor that
    keeps its gradient, moved toward the baseline (the replacement token's embedding, at the
    positions the step's mask marks) by `alphas[v]` for variant v's rows (1: the input
    itself). `embedding` is any layer mapping ids [...] to vectors [..., H] (an nn.Embedding,
    the language model's adaptive embedding): the baseline vector is its output for
    `replacement`. `steps` keeps, per step, (reading, rows, leaf z [B,T,H], x − x' [B,T,H])."""

    def __init__(self, embedding: paddle.nn.Layer, replacement: int, alphas: Sequence[float],
                 group: int):
        self.embedding = embedding
        with paddle.no_grad():
            ids = paddle.to_tensor([int(replacement)], dtype="int64")
            self.base_vector = embedding(ids).reshape([-1]).detach()   # x' [H]
        self.alphas = np.repeat(np.asarray(alphas, dtype=np.float32), group)
        self.steps: List[Tuple[int, List[Any], Any, Any]] = []
        self._pending: Optional[Tuple[int, List[Any], np.ndarray]] = None

    def step(self, reading: int, rows: List[Any], mask: np.ndarray) -> None:
        """The next forward's rows (kept for the caller) and mask [B, T] (the positions the
        baseline replaces)."""
        self._pending = (reading, rows, np.asarray(mask, dtype=np.float32))

    def hook(self, layer: Any, inputs: Any, output: paddle.Tensor) -> paddle.Tensor:
        reading, rows, mask = self._pending
        x = output.detach()
        m = paddle.to_tensor(mask).unsqueeze(-1)
        delta = (x - self.base_vector) * m                                   # x − x' [B,T,H]
        alpha = paddle.to_tensor(self.alphas).reshape([-1, 1, 1])
        z = (x - (1.0 - alpha) * delta).detach()   # x itself, bit for bit, at α = 1
        z.stop_gradient = False
        self.steps.append((reading, rows, z, delta))
        return z

    @contextlib.contextmanager
    def attached(self) -> Iterator["EmbeddingProbe"]:
        handle = self.embedding.register_forward_post_hook(self.hook)
        try:
            yield self
        finally:
            handle.remove()


@contextlib.contextmanager
def gradient_pass(model: Any, recompute: bool) -> Iterator[None]:
    """Inside: gradients are built, the memories stay attached (memory_gradient), each layer is
    recomputed in backward when `recompute`, and only the embeddings get a gradient; all restored on
    the way out. `model`: a document model (encoder `.ernie_doc`) or its own encoder (the language
    model, which has no recompute: ValueError when asked for it)."""
    encoder = getattr(model, "ernie_doc", model)
    switches = {"memory_gradient": True}
    if hasattr(encoder, "recompute"):
        switches["recompute"] = recompute
    elif recompute:
        raise ConfigError(f"{type(encoder).__name__} cannot recompute its layers in backward")
    params = [p for p in model.parameters()]
    frozen = [p.stop_gradient for p in params]
    # Paddle (2.6 and 3.x) computes LayerNorm's input gradient as if its scale were 1 when
    # the scale has stop_gradient: those [H] scales keep a gradient, dropped on the way out.
    scales = {id(layer.weight) for layer in model.sublayers()
              if isinstance(layer, paddle.nn.LayerNorm) and layer.weight is not None}
    saved = {k: getattr(encoder, k) for k in switches}
    try:
        for p in params:
            p.stop_gradient = id(p) not in scales
        for k, v in switches.items():
            setattr(encoder, k, v)
        with paddle.enable_grad():
            yield
    finally:
        for k, v in saved.items():
            setattr(encoder, k, v)
        for p, was in zip(params, frozen):
            if id(p) in scales:
                p.clear_gradient(False)
            p.stop_gradient = was


def plan_passes(graph_bytes: Callable[[int, bool], int], wanted: int, chunk: int,
                max_memory: Optional[int], what: str, advice: str,
                recomputable: bool = True) -> Tuple[int, bool]:
    """(variants per gradient pass, recompute): the most variants (up to `wanted`, at most
    `chunk`, else 1) whose graph (`graph_bytes(variants, recompute)`) fits in `max_memory`
    (None: the memory available), without recompute when that fits. DataError with the
    estimate of one variant (recomputed when `recomputable`) when nothing fits: "a gradient
    pass over {what} keeps about …; {advice}"."""
    limit = max_memory if max_memory is not None else available_memory()
    limit = math.inf if limit is None else limit
    options = (False, True) if recomputable else (False,)
    for recompute in options:
        for n in sorted({min(wanted, chunk), 1}, reverse=True):
            if graph_bytes(n, recompute) <= limit:
                return n, recompute
    raise DataError(f"a gradient pass over {what} keeps about "
                    f"{describe(graph_bytes(1, options[-1]))}, more than the "
                    f"{describe(limit)} available; {advice}")


def token_attributions(probe: EmbeddingProbe, variants: int, tokens: Dict[str, np.ndarray],
                       segments: np.ndarray) -> None:
    """Add Σ over the probe's steps of (x − x') · ∂/∂z, divided by `variants` (integrated
    gradients' midpoints), to `tokens` {field: [readings, n]} per token and to `segments`
    [S, readings] per segment, in place."""
    for reading, rows, z, delta in probe.steps:
        if z.grad is None:   # nothing reached this step's embeddings
            continue
        per_position = (z.grad * delta).sum(axis=-1).numpy() / variants   # [B, T]
        for r, m in enumerate(rows):
            for field, start, end, at in m.sources:
                values = per_position[r, at:at + end - start]
                tokens[field][reading, start:end] += values
                segments[m.seg_index, reading] += float(values.sum())


def gradient_norms(probe: EmbeddingProbe, segments: int) -> np.ndarray:
    """‖∂target/∂x‖ over each segment's document positions, both readings → [segments],
    from a probe of one variant."""
    squares = np.zeros(segments)
    for _, rows, z, _ in probe.steps:
        if z.grad is None:
            continue
        g2 = (z.grad * z.grad).sum(axis=-1).numpy()   # [B, T]
        for r, m in enumerate(rows):
            squares[m.seg_index] += float(g2[r][content_mask(m, g2.shape[1])].sum())
    return np.sqrt(squares)


# A long document's graph is a chain through the memories that paddle's C++ autograd walks,
# and frees, recursively: past a few thousand segment reads that overflows the main thread's
# 8 MiB stack (a segfault, no message). Gradient passes run on a thread with this stack.
DEEP_STACK = 1 << 30


def deep(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) on a thread with a DEEP_STACK stack (virtual memory, touched only as deep as
    the graph goes), everything it builds freed there → its result; its exception raised
    here. A daemon thread: Ctrl-C in the caller does not wait for it."""
    result: List[Any] = []
    failed: List[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args))
        except BaseException as e:   # noqa: BLE001 - handed to the caller's thread
            failed.append(e)

    previous = threading.stack_size(DEEP_STACK)
    try:
        worker = threading.Thread(target=run, name="explain-gradients", daemon=True)
        worker.start()
    finally:
        threading.stack_size(previous)
    worker.join()
    if failed:
        raise failed[0]
    return result[0]


def occlusion_chunks(count: int, chunk: int, desc: str, progress: bool
                     ) -> Iterator[List[Optional[int]]]:
    """Occlusion's variants, the document itself (None) then each of `count` segments, in
    parts of `chunk` read side by side; a progress bar of reads when asked and there is more
    than one part."""
    variants: List[Optional[int]] = [None] + list(range(count))
    bar = progress_bar(total=len(variants), unit="read", desc=desc,
                       requested=progress and len(variants) > chunk, leave=False)
    try:
        for first in range(0, len(variants), chunk):
            part = variants[first:first + chunk]
            yield part
            bar.update(len(part))
    finally:
        bar.close()


def occlusion_deltas(read: Callable[[List[Optional[int]]], list],
                     scorer: Callable[[Any], Callable[[Any], float]], count: int, chunk: int,
                     desc: str, progress: bool) -> Tuple[np.ndarray, float]:
    """(score(document) − score(segment s replaced) for each of `count` segments [count], the
    document's score). `read(variants)` → each variant's result, read side by side; `scorer`:
    the document's result → the score function of a result. Every read has the same rows, and
    each variant is compared with the document read at its own row: a batch row's numbers can
    differ in the last bit with its position, and a segment that cannot reach the target must
    score exactly 0."""
    width = min(chunk, count + 1)
    plain = read([None] * width)
    score = scorer(plain[0])
    reference = [score(result) for result in plain]
    deltas = np.zeros(count)
    for part in occlusion_chunks(count, chunk, desc, progress):
        found = read(part + [None] * (width - len(part)))
        for p, v in enumerate(part):
            if v is not None:
                deltas[v] = reference[p] - score(found[p])
    return deltas, reference[0]


def check_method(method: str, replacement: str, steps: int) -> None:
    """DataError (one line) for an unknown method or replacement, or steps < 1."""
    if method not in METHODS:
        raise DataError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if replacement not in REPLACEMENTS:
        raise DataError(f"replace must be one of {', '.join(REPLACEMENTS)}, got "
                        f"{replacement!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise DataError(f"steps (integrated gradients) must be a positive integer, got "
                        f"{steps!r}")
