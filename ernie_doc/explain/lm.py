"""`ernie-doc explain` for the language model (kind `language_model`): which segments and tokens
of a document drove the log-probability of a span of its tokens.

    from ernie_doc import pipeline
    pipe = pipeline("out/lm")                         # an LMPipeline
    pipe.explain(["a document , one paragraph per line ."], method="gradient", span=(3, 9))

The document is read as LMPipeline reads it (ernie_doc.predict.lm); the segments are its
tgt_len windows. The target is the summed log-probability of the tokens [t0, t1) (−Σ nll;
default: the document's last tgt_len tokens); token indices count the words of each line and an
`<eos>` at each line's end. Occlusion replaces a segment's input tokens by `<unk>`; the gradient
methods use the embedding of `<unk>` as baseline. Segments after the span score exactly 0 and
are not read. Details and costs: docs/explain.md, "The language model"."""
import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from ernie_doc.data.document import Document
from ernie_doc.errors import DataError, PipelineError
from ernie_doc.explain.attribution import (ALL, EmbeddingProbe, check_method, deep, gradient_pass,
                                           occlusion_deltas, plan_passes)
from ernie_doc.explain.explainer import MAX_SEGMENTS, TOP_TOKENS, Explaining
from ernie_doc.explain.record import explanation_record
from ernie_doc.resources import activation_bytes

KIND = "language_model"
Span = Tuple[int, int]


def check_span(span: Any) -> Optional[Span]:
    """None, or (t0, t1) integers with 0 <= t0 < t1 → the span; DataError (one line) else."""
    if span is None:
        return None
    ok = isinstance(span, (tuple, list)) and len(span) == 2 and all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in span)
    if not ok or not 0 <= span[0] < span[1]:
        raise DataError(f"span must be two token indices (t0, t1) with 0 <= t0 < t1, got "
                        f"{span!r}")
    return int(span[0]), int(span[1])


def parse_span(text: str) -> Span:
    """The command line's `T0:T1` → (t0, t1); DataError (one line) for anything else."""
    parts = str(text).split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        span = int(parts[0]), int(parts[1])
    except ValueError:
        raise DataError(f"--target {text!r}: a language model's target is a token span "
                        f"T0:T1 (the tokens whose log-probability is explained, e.g. "
                        f"100:150)") from None
    return check_span(span)


def token_offsets(text: str, prepend_eos: bool) -> np.ndarray:
    """Each token's characters in `text` [N, 2], in the model's reading order (encode_document):
    the words of each line, then its `<eos>` on the newline (zero width after a last line
    without one); a prepended `<eos>` is [0, 0]; a leading BOM is no token."""
    pos = 1 if text.startswith("\ufeff") else 0
    found = [(pos, pos)] if prepend_eos else []
    lines = text[pos:].split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        at = 0
        for word in line.split():
            at = line.index(word, at)
            found.append((pos + at, pos + at + len(word)))
            at += len(word)
        end = pos + len(line)
        found.append((end, min(end + 1, len(text))))
        pos = end + 1
    return np.asarray(found, dtype=np.int64).reshape(-1, 2)


@dataclass
class LMLayout:
    """One document laid out for an explanation: its input ids [N], its segments (`streams`:
    LMStreams of one row), the span [t0, t1), the segments read (those whose tokens precede
    the span's last token) and each segment's input tokens [beg, end)."""
    ids: np.ndarray
    streams: Any
    span: Span
    read: int
    bounds: List[Span]

    @property
    def segments(self) -> int:
        return len(self.bounds)

    def replaced(self, variant: Optional[int]) -> np.ndarray:
        """[N] bool: the tokens variant replaces (None: none, ALL: all, s: segment s's)."""
        mask = np.zeros(len(self.ids), dtype=bool)
        if variant == ALL:
            mask[:] = True
        elif variant is not None:
            mask[slice(*self.bounds[variant])] = True
        return mask


def lm_layout(streams: Any, ids: np.ndarray, tgt_len: int, span: Optional[Span]) -> LMLayout:
    """The layout of a document of len(ids) = N tokens; `span` None: the last tgt_len tokens.
    DataError (one line) for a span outside the predicted tokens 1 … N − 1."""
    n = len(ids)
    if span is None:
        span = (max(1, n - tgt_len), n)
    if span[0] < 1 or span[1] > n:
        raise DataError(f"span {span[0]}:{span[1]}: this document's predicted tokens are 1 to "
                        f"{n - 1} (t0 >= 1, t1 <= {n}; token 0 has no context)")
    bounds = []
    for s in range(len(streams)):
        beg = s * tgt_len
        bounds.append((beg, beg + streams.batch(s).seq_len))
    # input token j is read before target j + 1 only: the last one that matters is t1 − 2
    return LMLayout(ids, streams, span, (span[1] - 2) // tgt_len + 1, bounds)


class LMExplainer(Explaining):
    """Explanations of a language model's log-probability of a token span (module docstring);
    `pipe`: an LMPipeline, which also admits the documents (predict's rules). `method`:
    occlusion, gradient or integrated_gradients; `span`: (t0, t1) token indices, None: each
    document's last tgt_len tokens; `steps`: integrated gradients' midpoints; `max_memory`:
    bytes a gradient pass may keep (None: what the machine has); `max_segments`: occlusion's
    cap on the segments it reads."""

    def __init__(self, pipe: Any, method: str = "occlusion", span: Optional[Span] = None,
                 steps: int = 16, top_tokens: int = TOP_TOKENS,
                 max_memory: Optional[int] = None, progress: bool = False,
                 max_segments: int = MAX_SEGMENTS):
        check_method(method, "pad", steps)
        if not all(hasattr(pipe, k) for k in ("vocab", "lengths", "open_document")):
            raise PipelineError("LMExplainer explains a language model's LMPipeline; a "
                                "document model's is Explainer (pipeline(...).explain)")
        for key, value in (("max_segments", max_segments), ("top_tokens", top_tokens + 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipelineError(f"{key} must be a positive integer, got {value!r}")
        self.pipe, self.model, self.lengths = pipe, pipe.model, pipe.lengths
        self.cfg = pipe.cfg   # the run (None for a pipeline built by hand)
        self.method, self.span, self.steps = method, check_span(span), steps
        self.top_tokens, self.max_memory = top_tokens, max_memory
        self.progress, self.max_segments = progress, max_segments
        self.unk = int(pipe.vocab.unk_id)
        self.chunk = max(1, int(pipe.rows))   # variants read side by side

    def explain_document(self, doc: Document) -> dict:
        """One document → its explanation record (DataError: what it cannot explain)."""
        encoded, streams = self.pipe.open_document(doc)
        layout = lm_layout(streams, encoded.ids, self.lengths["tgt_len"], self.span)
        if self.method == "occlusion":
            return self._occlusion(doc, layout)
        return deep(self._gradients, doc, layout)

    # -- reading ---------------------------------------------------------------------------------
    def _read(self, layout: LMLayout, variants: Sequence[Optional[int]],
              probe: Optional[EmbeddingProbe] = None) -> List[paddle.Tensor]:
        """Read the document once per variant, side by side as rows, up to the span's last
        segment → each variant's Σ log p(span) (a 0-d tensor; a graph when gradients are on).
        `probe` sees every step's rows: [(first input token, inputs)] each."""
        t0, t1 = layout.span
        replaced = np.stack([layout.replaced(v) for v in variants])   # [V, N]
        total: List[Any] = [0.0] * len(variants)
        memories = memory_positions = None
        for i in range(layout.read):
            batch = layout.streams.batch(i)
            beg = layout.bounds[i][0]
            first = beg - (batch.input.shape[1] - batch.seq_len)   # ext_len context first
            cols = np.arange(first, first + batch.input.shape[1])
            inputs = np.where(replaced[:, cols], self.unk, batch.input).astype(np.int64)
            a, b = max(t0, beg + 1) - beg - 1, min(t1, beg + batch.seq_len + 1) - beg - 1
            target = positions = None
            if b > a:   # this segment predicts some of the span
                target = paddle.to_tensor(np.repeat(batch.target, len(variants), axis=0))
            if batch.positions is not None:
                positions = paddle.to_tensor(np.repeat(batch.positions, len(variants), axis=1))
            if probe is not None:
                probe.step(0, [(first, len(cols))] * len(variants), np.ones(inputs.shape))
            out = self.model(paddle.to_tensor(inputs), target, memories, None, positions,
                             memory_positions)
            memories, memory_positions = out.memories, out.memory_positions
            if target is not None:
                span_nll = out.nll[:, a:b].astype("float32").sum(axis=1)   # [V]
                total = [t - span_nll[v] for v, t in enumerate(total)]
        return total

    def _prediction(self, doc: Document) -> dict:
        """LMPipeline's record of the document (read alone, to its end), without `index`."""
        record = self.pipe.record_of(doc)
        return {k: v for k, v in record.items() if k != "index"}

    # -- occlusion -------------------------------------------------------------------------------
    def _occlusion(self, doc: Document, layout: LMLayout) -> dict:
        """Each segment's Σ log p(span | document) − Σ log p(span | segment → <unk>)."""
        if layout.read > self.max_segments:
            raise DataError(f"{layout.read} segments before the span's end: more than "
                            f"max_segments {self.max_segments} (occlusion reads the document "
                            f"once per segment); raise it, or use method gradient")
        deltas = np.zeros(layout.segments)
        with paddle.no_grad(), row_by_row(self.model.word_emb):
            deltas[:layout.read], score = occlusion_deltas(
                lambda variants: self._read(layout, variants), lambda _: float, layout.read,
                self.chunk, f"occlude {doc.doc_id}", self.progress)
        return self._record(doc, layout, score, deltas, None, {})

    # -- gradients -------------------------------------------------------------------------------
    def graph_bytes(self, layout: LMLayout, rows: int) -> int:
        """What a gradient pass keeps until backward, `rows` rows a step: every layer's
        activations (the feed-forward counted at its width d_inner), the memories, the probe's
        embeddings and, on the segments that predict the span, the adaptive softmax's logits
        and log-probabilities (the head, and at most the largest tail cluster, per token)."""
        c, crit = self.model.config, self.model.crit
        T, M, L = self.lengths["tgt_len"], self.lengths["mem_len"], c.n_layer
        inputs = T + self.lengths["ext_len"]
        hidden = max(c.d_model, c.d_inner // 4)
        steps = layout.read
        kept = steps * activation_bytes(L, rows, inputs, inputs + M, hidden, c.n_head)
        kept += steps * rows * (L * M * c.d_model + 3 * inputs * c.d_model) * 4
        ends = list(crit.cutoff_ends)
        tail = max((b - a for a, b in zip(ends[1:], ends[2:])), default=0)
        scoring = min(steps, -(-(layout.span[1] - layout.span[0]) // T) + 1)
        return kept + scoring * rows * T * 2 * (crit.head_size + tail) * 4

    def _gradients(self, doc: Document, layout: LMLayout) -> dict:
        """(x − x') · ∂target/∂z per token and segment: z = x for gradient, the midpoints
        between x' (every input token <unk>) and x for integrated gradients."""
        per_pass, _ = plan_passes(
            lambda n, _: self.graph_bytes(layout, n), 1 if self.method == "gradient"
            else self.steps, self.chunk, self.max_memory,
            f"this document ({layout.read} segments)",
            "use method occlusion, or a shorter span or document", recomputable=False)
        alphas, extra, score = [1.0], {}, None
        if self.method == "integrated_gradients":
            alphas = [(k + 0.5) / self.steps for k in range(self.steps)]
            with paddle.no_grad():
                score, baseline = (float(x) for x in self._read(layout, [None, ALL]))
            extra.update(steps=self.steps, baseline=round(baseline, 6))
        tokens = np.zeros(len(layout.ids))
        for first in range(0, len(alphas), per_pass):
            part = alphas[first:first + per_pass]
            probe = EmbeddingProbe(self.model.word_emb, self.unk, part, 1)
            with gradient_pass(self.model, False), probe.attached():
                read = self._read(layout, [None] * len(part), probe)
                score = float(read[0]) if score is None else score
                paddle.add_n(read).backward()
            lm_token_attributions(probe, len(alphas), tokens)
        segments = np.array([tokens[a:b].sum() for a, b in layout.bounds])
        return self._record(doc, layout, score, segments, tokens, extra)

    # -- the record ------------------------------------------------------------------------------
    def _record(self, doc: Document, layout: LMLayout, score: float, per_segment: np.ndarray,
                tokens: Optional[np.ndarray], extra: dict) -> dict:
        t0, t1 = layout.span
        offsets = token_offsets(doc.text, self.pipe.prepend_eos)
        assert len(offsets) == len(layout.ids), (len(offsets), len(layout.ids))
        by_reading = None if tokens is None else per_segment[:, None]
        return explanation_record(
            doc.doc_id, KIND, self.method,
            {"name": f"log-probability of tokens [{t0}, {t1})", "label": f"{t0}:{t1}",
             "score": round(score, 6)},
            self._prediction(doc), 1, [("text", a, b) for a, b in layout.bounds],
            per_segment, by_reading, None if tokens is None else {"text": tokens},
            {"text": (doc.text, offsets)}, self.top_tokens, dict(extra, span=[t0, t1]))


@contextlib.contextmanager
def row_by_row(embedding: paddle.nn.Layer) -> Iterator[None]:
    """Inside: `embedding` embeds each batch row alone ([B, T] → B calls on [1, T]). The
    adaptive embedding gathers a batch's tokens by cluster, so a row's vectors would otherwise
    depend, in the last bits, on what the other rows hold."""
    def hook(layer: Any, inputs: Any, output: paddle.Tensor) -> paddle.Tensor:
        ids = inputs[0]
        return paddle.concat([layer.forward(ids[r:r + 1]) for r in range(ids.shape[0])])
    handle = embedding.register_forward_post_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def lm_token_attributions(probe: EmbeddingProbe, variants: int, tokens: np.ndarray) -> None:
    """Add Σ over the probe's steps of (x − x') · ∂/∂z, divided by `variants` (integrated
    gradients' midpoints), to `tokens` [N] at each input's token (a token read twice, as
    ext_len context, adds both), in place."""
    for _, rows, z, delta in probe.steps:
        if z.grad is None:   # nothing reached this step's embeddings
            continue
        per_position = (z.grad * delta).sum(axis=-1).numpy() / variants   # [B, T]
        for r, (first, count) in enumerate(rows):
            tokens[first:first + count] += per_position[r, :count]
