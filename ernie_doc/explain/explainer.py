"""`ernie-doc explain` in Python: one record per document saying which segments and tokens
drove the prediction (ernie_doc.explain.attribution), in the schema docs/explain.md gives.

    from ernie_doc import pipeline
    pipe = pipeline("output/imdb")
    pipe.explain(["a long review ..."], method="gradient")   # → [{"doc_id", "segments", ...}]
"""
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from ernie_doc.data.collate import TensorStage
from ernie_doc.data.document import Document
from ernie_doc.data.segment import step_members
from ernie_doc.errors import DataError, PipelineError
from ernie_doc.explain.attribution import (ALL, EmbeddingProbe, Layout, check_method, deep,
                                           document_layout, gradient_pass, occlusion_deltas,
                                           plan_passes, read_variants, token_attributions)
from ernie_doc.explain.record import explanation_record
from ernie_doc.kinds import builtin_kinds
from ernie_doc.kinds.base import DocumentTask
from ernie_doc.resources import activation_bytes, layer_input_bytes

MAX_SEGMENTS = 256   # occlusion reads a document once per segment: more is refused
TOP_TOKENS = 20


def explains(kind: type) -> bool:
    """Whether the task kind `kind` (a class) says what an explanation follows
    (DocumentTask.explain_target)."""
    return getattr(kind, "explain_target", None) not in (None, DocumentTask.explain_target)


class Explaining:
    """What every kind's explainer shares: documents admitted by its pipeline `self.pipe`
    (its error records, on_error and ids: predict's rules), each explained by
    `explain_document` (DataError: an error record for that document)."""
    pipe: Any

    def explain_document(self, doc: Document) -> dict:
        raise NotImplementedError

    # -- documents → records -------------------------------------------------------------------
    def stream(self, documents: Iterable[Any], skip: Iterable[str] = ()) -> Iterator[dict]:
        """One record per document, in input order, each with its input `index`."""
        pipe = self.pipe
        skip, seen = pipe.skip_ids(skip), {}
        for index, item in enumerate(pipe.items(documents)):
            doc = pipe.admit(index, item, skip, seen)
            if not isinstance(doc, Document):   # skipped, or an error record
                if doc:
                    yield doc
                continue
            try:
                record = self.explain_document(doc)
            except DataError as e:
                record = pipe.problem(index, doc.doc_id, str(e))
            yield dict(record, index=index)

    def __call__(self, documents: Iterable[Any]) -> List[dict]:
        """Explain every document → one record per document, in input order."""
        return sorted(self.stream(documents), key=lambda r: r["index"])


class Explainer(Explaining):
    """Explanations of a Pipeline's predictions (dygraph engine); the pipeline admits the
    documents (its error records, on_error and ids: predict's rules). `method`: occlusion,
    gradient or integrated_gradients; `target`: what to explain (a label, an answer text, a
    choice; None: the prediction); `replace`: pad or mask (occlusion's token, and the
    gradients' baseline); `steps`: integrated gradients' midpoints; `max_memory`: bytes a
    gradient pass may keep (None: what the machine has)."""

    def __init__(self, pipe: Any, method: str = "occlusion", target: Optional[str] = None,
                 replace: str = "pad", steps: int = 16, max_segments: int = MAX_SEGMENTS,
                 top_tokens: int = TOP_TOKENS, max_memory: Optional[int] = None,
                 progress: bool = False):
        check_method(method, replace, steps)
        if not isinstance(pipe.model, paddle.nn.Layer):
            raise PipelineError("explain reads the model on the dygraph engine: give the "
                                "fine-tuned folder, not its export")
        for key, value, least in (("max_segments", max_segments, 1),
                                  ("top_tokens", top_tokens, 0),
                                  ("max_memory", 1 if max_memory is None else max_memory, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise PipelineError(f"{key} must be an integer >= {least}, got {value!r}")
        if not explains(type(pipe.task)):
            have = [name for name, kind in builtin_kinds().items() if explains(kind)]
            raise PipelineError(f"explain: kind {pipe.cfg.kind!r} has no explanation target "
                                f"(the document kinds that have one: {', '.join(have)})")
        self.pipe, self.task, self.cfg, self.model = pipe, pipe.task, pipe.cfg, pipe.model
        self.method, self.target, self.steps = method, target, steps
        self.max_segments, self.top_tokens = max_segments, top_tokens
        self.max_memory, self.progress = max_memory, progress
        self.replacement = self._replacement(replace)
        self.chunk = max(1, pipe.rows // pipe.group)   # variants read side by side
        self.stage = TensorStage()   # every read's step tensors, from buffers it reuses

    def _replacement(self, replace: str) -> int:
        if replace == "pad":
            return self.pipe.pad_id
        found = getattr(self.pipe.tokenizer, "mask_token_id", None)
        if found is None:
            raise PipelineError("replace mask: this model's tokenizer has no [MASK] token; "
                                "use replace pad")
        return int(found)

    def explain_document(self, doc: Document) -> dict:
        """One document → its explanation record (DataError: what it cannot explain)."""
        layout = self.layout_of(doc)
        fields = self.task.field_offsets(doc, self.pipe.tokenizer)
        if self.method == "occlusion":
            return self._occlusion(doc, layout, fields)
        return deep(self._gradients, doc, layout, fields)

    def layout_of(self, doc: Document) -> Layout:
        """The document as prediction reads it (DataError for input it cannot read)."""
        problem = self.task.check_input(doc)
        if problem is not None:
            raise DataError(problem)
        return document_layout(self.task, doc, self.pipe.tokenizer, self.cfg.retro_feed,
                               self.cfg.train_skim)

    def _read(self, layout: Layout, variants: Sequence[Optional[int]],
              probe: Optional[EmbeddingProbe] = None) -> list:
        return read_variants(self.model, self.task, layout, self.cfg.max_seq_len,
                             self.pipe.pad_id, variants, self.replacement, probe, self.stage)

    def _predicted(self, doc: Document, layout: Layout, rows: list) -> Tuple[dict, Any, float]:
        """The unchanged document's rows → (predict's record, the target, its score)."""
        plain = [(s, r.detach().numpy()) for s, r in rows]
        prediction = self.task.predict_document(doc, plain, layout.passes)
        target = self.task.explain_target(doc, layout.passes, plain, prediction, self.target)
        return prediction, target, float(target.score(rows))

    # -- occlusion -------------------------------------------------------------------------------
    def _occlusion(self, doc: Document, layout: Layout, fields: dict) -> dict:
        """Each segment's target(document) − target(segment replaced in every reading)."""
        if layout.segments > self.max_segments:
            raise DataError(f"{layout.segments} segments: more than max_segments "
                            f"{self.max_segments} (occlusion reads the document once per "
                            f"segment); raise it, or use method gradient")
        found: list = []

        def scorer(plain):   # the document's prediction and target, from its own rows
            found.extend(self._predicted(doc, layout, plain))
            return lambda rows: float(found[1].score(rows))
        deltas = self.occlusion_deltas(layout, f"occlude {doc.doc_id}", scorer)
        return self._record(doc, layout, fields, *found, deltas, None, None, {})

    def occlusion_deltas(self, layout: Layout, desc: str,
                         scorer: Callable[[Any], Callable[[Any], float]]) -> np.ndarray:
        """score(document) − score(segment s replaced) for each segment [S]
        (attribution.occlusion_deltas). `scorer`: the document's rows → the score function of
        a variant's rows."""
        with paddle.no_grad():
            return occlusion_deltas(lambda variants: self._read(layout, variants), scorer,
                                    layout.segments, self.chunk, desc, self.progress)[0]

    # -- gradients -------------------------------------------------------------------------------
    def graph_bytes(self, layout: Layout, rows: int, recompute: bool) -> int:
        """What a gradient pass over the document keeps until backward, `rows` rows a step:
        every layer's activations (or, recomputed, each layer's inputs and one layer's
        activations), the memories and the probe's embeddings."""
        c, T = self.model.ernie_doc.config, self.cfg.max_seq_len
        M, H, L = self.model.ernie_doc.memory_len, c.hidden_size, c.num_hidden_layers
        steps = len(layout.passes)
        if recompute:
            kept = steps * layer_input_bytes(L, rows, T + M, H) + \
                activation_bytes(1, rows, T, T + M, H, c.num_attention_heads)
        else:
            kept = steps * activation_bytes(L, rows, T, T + M, H, c.num_attention_heads)
        return kept + steps * rows * (L * M * H + 3 * T * H) * 4

    def _plan(self, layout: Layout) -> Tuple[int, bool]:
        """(variants per pass, recompute) for the gradient passes (plan_passes)."""
        return plan_passes(
            lambda n, recompute: self.graph_bytes(layout, n * layout.group, recompute),
            1 if self.method == "gradient" else self.steps, self.chunk, self.max_memory,
            f"this document ({len(layout.passes)} segment reads)",
            "use method occlusion, or cut the document (max_doc_tokens)")

    def _gradients(self, doc: Document, layout: Layout, fields: dict) -> dict:
        """(x − x') · ∂target/∂z per token and segment: z = x for gradient (its forward is
        the prediction too), the midpoints between x' and x for integrated gradients."""
        per_pass, recompute = self._plan(layout)
        found, extra = None, {"recompute": recompute}
        alphas = [1.0]
        if self.method == "integrated_gradients":
            alphas = [(k + 0.5) / self.steps for k in range(self.steps)]
            with paddle.no_grad():
                plain, baseline = self._read(layout, [None, ALL])
                found = self._predicted(doc, layout, plain)
            extra.update(steps=self.steps, baseline=round(float(found[1].score(baseline)), 6))
        tokens = {f: np.zeros((layout.readings, len(o))) for f, (_, o) in fields.items()}
        segments = np.zeros((layout.segments, layout.readings))
        embedding = self.model.ernie_doc.embeddings.word_emb
        for first in range(0, len(alphas), per_pass):
            part = alphas[first:first + per_pass]
            probe = EmbeddingProbe(embedding, self.replacement, part, layout.group)
            with gradient_pass(self.model, recompute), probe.attached():
                read = self._read(layout, [None] * len(part), probe)
                if found is None:   # gradient: this forward is the document's reading
                    found = self._predicted(doc, layout, read[0])
                paddle.add_n([found[1].score(rows) for rows in read]).backward()
            token_attributions(probe, len(alphas), tokens, segments)
        return self._record(doc, layout, fields, *found, segments.sum(axis=1), segments,
                            {f: v.sum(axis=0) for f, v in tokens.items()}, extra)

    # -- the record ------------------------------------------------------------------------------
    def _record(self, doc: Document, layout: Layout, fields: dict, prediction: dict,
                target: Any, score: float, per_segment: np.ndarray,
                by_reading: Optional[np.ndarray], tokens: Optional[dict], extra: dict) -> dict:
        sources = segment_sources(layout)
        return explanation_record(
            doc.doc_id, self.cfg.kind, self.method,
            {"name": target.name, "label": target.label, "score": round(score, 6)},
            prediction, layout.readings, sources, per_segment, by_reading, tokens, fields,
            self.top_tokens, extra)


def segment_sources(layout: Layout) -> List[List[Tuple[str, int, int]]]:
    """Each segment's sources [(field, first token, end token)]: those of its rows, each
    once, in order (pair matching: A, then B and C)."""
    found = []
    for s in range(layout.segments):
        seen: List[Tuple[str, int, int]] = []
        for member in step_members(layout.passes[s]):   # the first reading's step s
            for field, start, end, _ in member.sources:
                if (field, start, end) not in seen:
                    seen.append((field, start, end))
        found.append(seen or [("text", 0, 0)])
    return found
