"""Per-document perplexity and per-token log-probabilities from a trained language model
(kind `language_model`), with the Pipeline interface.

    pipe = LMPipeline.from_pretrained("output/wt103/best")   # the directory with task.json
    pipe(["a document , one paragraph per line ."])  # → [{"doc_id", "ppl", "nll", ...}]

A document is read as evaluation reads a split with one row. Details: docs/design-notes.md,
"Language model: prediction"."""
import dataclasses
import math
import os
from collections import defaultdict
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import paddle

from ernie_doc.assemble import saved_run
from ernie_doc.data.document import Document
from ernie_doc.errors import CheckpointError, ConfigError, DataError, PipelineError
from ernie_doc.explain.lm import LMExplainer
from ernie_doc.kinds import TASK_FILE, saved_kind
from ernie_doc.lm.data import EOS, LMStreams, Vocabulary, sega_positions, to_global
from ernie_doc.lm.model import TransformerXLLM
from ernie_doc.predict.documents import DocumentStream, check_batch_size
from ernie_doc.predict.model_folder import read_task_record

__all__ = ["LMPipeline", "document_lines", "encode_document"]


def document_lines(text: str) -> List[str]:
    """A document's text → its lines, as `utf8_lines` reads a file: split at "\\n" only, no
    empty line after a final "\\n", a leading BOM dropped."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


@dataclasses.dataclass
class EncodedDocument:
    """ids [N] int64 (`<eos>` per line), words [N], positions [3, N] int32 or None, unk
    (`<unk>` ids), oov (unknown words only)."""
    ids: np.ndarray
    words: List[str]
    positions: Optional[np.ndarray]
    unk: int
    oov: int


def encode_document(text: str, vocab: Vocabulary, segment_positions: bool,
                    prepend_eos: bool = False) -> EncodedDocument:
    """Text → what LMStreams reads, encoded as `load_corpus` encodes a `.tokens` file (module
    docstring). DataError for a text without a token."""
    lines = document_lines(text)
    if not any(line.split() for line in lines):
        raise DataError("no tokens (empty or only blank lines)")
    if prepend_eos:
        # a blank line first: its <eos> is the context of the first word (and joins the
        # first sentence in Segatron's positions, as a blank line at a file's start does)
        lines = [""] + lines
    ids, oov = vocab.encode_lines(lines, return_oov=True)
    words = [w for line in lines for w in line.split() + [EOS]]
    positions = to_global(sega_positions(lines)) if segment_positions else None
    return EncodedDocument(ids, words, positions, int((ids == vocab.unk_id).sum()), int(oov))


@dataclasses.dataclass
class _Reading:
    """A document in a batch row: its segments, the next one, its memory slices (None before
    the first segment) and the per-token nll so far."""
    index: int
    doc: Document
    encoded: EncodedDocument
    streams: LMStreams
    step: int = 0
    memories: Optional[paddle.Tensor] = None
    memory_positions: Optional[paddle.Tensor] = None
    nll: List[np.ndarray] = dataclasses.field(default_factory=list)


class LMPipeline(DocumentStream):
    """A trained Transformer-XL language model ready to score documents. `lengths`: the eval
    protocol; `rows`: documents read at once."""

    def __init__(self, model: TransformerXLLM, vocab: Vocabulary, lengths: Dict[str, Any],
                 rows: Any = 1, on_error: str = "record", prepend_eos: bool = False,
                 cfg=None, task=None):
        self.on_error = self.check_on_error(on_error)
        if not isinstance(rows, int) or rows < 1:
            raise PipelineError(f"batch size must be a positive integer, got {rows!r}")
        if len(vocab) != model.config.vocab_size:
            raise PipelineError(f"the vocabulary has {len(vocab)} tokens, the model's "
                                f"vocab_size is {model.config.vocab_size}")
        self.vocab, self.lengths, self.rows = vocab, dict(lengths), rows
        self.prepend_eos, self.cfg, self.task = prepend_eos, cfg, task
        # the eval protocol for good (LMEvalStream.protocol switches it for one reading;
        # this model only ever reads under it)
        model.config = dataclasses.replace(
            model.config, **{k: v for k, v in self.lengths.items() if k != "tgt_len"})
        self.model = model
        self.model.eval()

    @classmethod
    def from_pretrained(cls, directory: str, batch_size: Optional[int] = None,
                        on_error: str = "record", device: str = "cpu",
                        prepend_eos: bool = False) -> "LMPipeline":
        """`directory`: a saved language model with task.json. batch_size None: the run's
        eval_batch_size. PipelineError (one line), memory estimates refused before loading."""
        check_batch_size(batch_size)
        record = read_task_record(directory)
        source = os.path.join(directory, TASK_FILE)
        if not saved_kind(record["kind"]).scores_tokens:
            raise PipelineError(f"{source}: kind {record['kind']!r}, not a language model "
                                f"(use ernie_doc.predict.pipeline.Pipeline)")
        try:
            run = saved_run(directory, record, source, device, batch_size)
        except (ConfigError, DataError, CheckpointError, ValueError) as e:
            raise PipelineError(str(e).splitlines()[0] if str(e) else repr(e)) from None
        assert run.model is not None   # load_saved built it
        return cls(run.model, run.tokenizer, run.task.eval_lengths(), run.eval_rows, on_error,
                   prepend_eos, run.cfg, run.task)

    # -- documents → records ---------------------------------------------------------------
    def open_document(self, doc: Document) -> Tuple[EncodedDocument, LMStreams]:
        """A document → (its encoding, its segments as this model reads them: one row of
        tgt_len windows, ext_len context), DataError: not a document this model can score."""
        if doc.text is None:
            raise DataError("no 'text' (a language model scores text)")
        encoded = encode_document(doc.text, self.vocab, self.model.config.segment_positions,
                                  self.prepend_eos)
        ext = self.lengths["ext_len"]
        if ext and self.model.uses_memory and len(encoded.ids) - 1 <= ext:
            # the model caches all but the last ext_len inputs of a segment
            raise DataError(f"{len(encoded.ids)} tokens: too few for eval_ext_len {ext}")
        return encoded, LMStreams(encoded.ids, 1, self.lengths["tgt_len"], ext,
                                  encoded.positions)

    def _start(self, index: int, doc: Document) -> _Reading:
        """A document → its reading (DataError: not a document this model can score)."""
        return _Reading(index, doc, *self.open_document(doc))

    def record_of(self, doc: Document, index: int = 0) -> dict:
        """One admitted document, read alone → its record (as `stream` gives it; DataError:
        not a document this model can score)."""
        r = self._start(index, doc)
        while r.step < len(r.streams):
            self._step([r])
        return self._record(r)

    def _record(self, r: _Reading) -> dict:
        nll = np.concatenate(r.nll).astype(np.float64)
        words = r.encoded.words[1:]   # targets: every token after the first (module docstring)
        assert len(words) == len(nll), (len(words), len(nll))
        mean = float(nll.sum()) / len(nll)
        return {"doc_id": r.doc.doc_id, "ppl": math.exp(min(mean, 50.0)), "nll": mean,
                "tokens": int(len(nll)), "unk": r.encoded.unk, "oov": r.encoded.oov,
                "token_logprobs": [[w, -float(x)] for w, x in zip(words, nll)],
                "index": r.index}

    def _step(self, readings: List[_Reading]) -> None:
        """Each reading's next segment: rows grouped by (memory length, input length, target
        length), every group one forward pass, memories split back to their documents."""
        groups = defaultdict(list)
        for r in readings:
            batch = r.streams.batch(r.step)
            mlen = 0 if r.memories is None else int(r.memories.shape[2])
            groups[(mlen, batch.input.shape[1], batch.target.shape[1])].append((r, batch))
        for (mlen, _, _), members in groups.items():
            inputs = paddle.to_tensor(np.concatenate([b.input for _, b in members]))
            target = paddle.to_tensor(np.concatenate([b.target for _, b in members]))
            positions = memories = memory_positions = None
            if self.model.config.segment_positions:
                positions = paddle.to_tensor(np.concatenate([b.positions for _, b in members],
                                                            axis=1))
            if mlen:
                # mlen > 0: every row of the group has read a segment, so holds memories
                memories = paddle.concat([r.memories for r, _ in members], axis=1)  # type: ignore[misc]
                if self.model.config.segment_positions:
                    memory_positions = paddle.concat(
                        [r.memory_positions for r, _ in members], axis=1)  # type: ignore[misc]
            with paddle.no_grad():
                out = self.model(inputs, target, memories, None, positions, memory_positions)
            nll = out.nll.astype("float32").numpy()       # [rows, T]
            for row, (r, _) in enumerate(members):
                r.nll.append(nll[row])
                r.step += 1
                if out.memories is not None:
                    r.memories = out.memories[:, row:row + 1]            # [n_layer, 1, M, d]
                if out.memory_positions is not None:
                    r.memory_positions = out.memory_positions[:, row:row + 1]   # [3, 1, M]

    def stream(self, documents: Iterable[Any], skip: Iterable[str] = ()) -> Iterator[dict]:
        """Score documents as they come → records in finishing order ({"doc_id", "ppl", "nll",
        "tokens", "unk", "oov", "token_logprobs", "index"}, or an error record / PipelineError)."""
        skip = self.skip_ids(skip)
        seen: Dict[str, Tuple[bool, int]] = {}   # record names given so far (admit)
        source = enumerate(self.items(documents))
        active: List[_Reading] = []
        exhausted = False
        while True:
            while not exhausted and len(active) < self.rows:
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                index, doc = item[0], self.admit(*item, skip, seen)
                if not isinstance(doc, Document):   # skipped, or an error record
                    yield from [doc] if doc else []
                    continue
                try:
                    active.append(self._start(index, doc))
                except DataError as e:
                    yield self.problem(index, doc.doc_id, str(e))
            if not active:
                return
            self._step(active)
            for r in [r for r in active if r.step == len(r.streams)]:
                active.remove(r)
                yield self._record(r)

    def explain(self, documents: Iterable[Any], **options: Any) -> List[dict]:
        """Which segments and tokens of each document drove the log-probability of a span of
        its tokens → one record per document, in input order
        (ernie_doc.explain.lm.LMExplainer: `method`, `span`, `steps` ...; docs/explain.md,
        "The language model")."""
        return LMExplainer(self, **options)(documents)
