"""Span-extraction task kind (`kind: span`): TriviaQA, CMRC2018, DRCD, DuReader.

Every segment reads `[CLS] context-window [SEP] question [SEP]`; the answer is the best span over
all the example's predicted segments, mapped back to the context text. The loss sums the gold
starts' (ends') probability (Clark & Gardner 2018); decoding and scoring follow the official
code by default. Details: docs/design-notes.md, "Span extraction"."""
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import paddle

from ernie_doc.data.document import Document
from ernie_doc.data.segment import step_members
from ernie_doc.data.span import POOLS, UNITS, SpanSegmenter, best_spans, tokenize_with_offsets
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.heads import ErnieDocForQuestionAnswering
from ernie_doc.kinds.base import (Config, DocumentTask, ExplainTarget, masked_mean, with_gold,
                                  without_training)
from ernie_doc.metrics import cmrc, triviaqa
from ernie_doc.metrics.triviaqa import ground_truths

NEG = -1e9


def _logsumexp_where(logits, mask):
    """log Σ exp(logits) over positions where mask = 1: [B, T] → [B]."""
    return paddle.logsumexp(logits + (1.0 - mask) * NEG, axis=-1)


def span_nll(logits, batch, all_positions: bool = False):
    """logits [B, T, 2] → loss [B]: mean start / end −log of the summed gold probability, the
    softmax over batch["target_allowed"] [B, T], or all T with all_positions (official)."""
    logits = logits.astype("float32")
    allowed = batch["target_allowed"]
    if all_positions:
        allowed = paddle.ones_like(allowed)
    loss = 0.0
    for k, gold in enumerate((batch["target_start_gold"], batch["target_end_gold"])):
        lg = logits[:, :, k]
        loss = loss + _logsumexp_where(lg, allowed) - _logsumexp_where(lg, gold * allowed)
    return loss / 2.0


class SpanTask(DocumentTask):
    head_class = ErnieDocForQuestionAnswering
    main_metric = "f1"
    input_fields = ("context", "question")
    pipeline_tasks = ("question-answering",)
    option_defaults = {
        "question_format": "sep",   # sep: [SEP] q [SEP] · markers: [q] q [/q] (TriviaQA)
        "max_query_len": 64,        # question tokens kept (official)
        "max_answer_len": 30,       # tokens in a predicted answer
        "n_best": 20,               # start / end candidates per segment
        "metric": "cmrc",           # cmrc (CMRC2018 script: EM, F1 with LCS) | triviaqa
        "n_best_pool": "auto",      # auto (= loss_positions) | all (official) | context
        "answer_unit": "token",     # token (official) | word
        "empty_answer": "empty",    # the answer when no span qualifies (official "empty")
        "unreferenced": "count",    # count (official) | skip
        "loss_positions": "context",  # context | all (official softmax over all T)
    }
    METRICS = ("cmrc", "triviaqa")
    REPORTS = {"cmrc": ("em", "f1", "avg", "total", "skipped"),   # metrics.cmrc.evaluate
               "triviaqa": ("em", "f1", "total", "missing")}     # metrics.triviaqa.evaluate
    FORMATS = {"sep": ("[SEP]", "[SEP]"), "markers": ("[q]", "[/q]")}

    def __init__(self, cfg: Config, reader: Any):
        super().__init__(cfg, reader)
        self.check_options(("max_query_len", "max_answer_len", "n_best"),
                           {"question_format": self.FORMATS, "metric": self.METRICS,
                            "n_best_pool": POOLS + ("auto",), "answer_unit": UNITS,
                            "unreferenced": ("count", "skip"),
                            "loss_positions": ("context", "all")})
        if not isinstance(self.options["empty_answer"], str):
            raise self.option_error("empty_answer", f"must be a string, got "
                                                    f"{self.options['empty_answer']!r}")
        self.metric_names = self.REPORTS[self.options["metric"]]
        if self.options["n_best_pool"] == "auto":   # decode where the loss trained
            self.options["n_best_pool"] = self.options["loss_positions"]
        self._word_cache: Dict[str, Any] = {}   # tokenize_with_offsets' cache

    def setup(self, special_ids: Dict[str, int], max_seq_len: int, stride: int,
              tokenizer: Any = None) -> None:
        if tokenizer is None:
            raise ConfigError(f"task {self.cfg.task}: span extraction needs a tokenizer")
        open_tok, close_tok = self.FORMATS[self.options["question_format"]]
        ids = [tokenizer.token_id(t) for t in (open_tok, close_tok)]
        if None in ids:
            raise ConfigError(f"{self.cfg.source}: task_options.question_format "
                              f"{self.options['question_format']!r}: the tokenizer has no "
                              f"{open_tok} / {close_tok} token")
        self.segmenter = SpanSegmenter(max_seq_len, stride, special_ids["cls"],
                                       special_ids["pad"], ids[0], ids[1],
                                       self.options["max_query_len"],
                                       self.options["answer_unit"])

    def model_config_overrides(self) -> Dict[str, Any]:
        return {"cls_token_idx": 0}

    def tokenizer_texts(self, doc: Document) -> List[str]:
        return [doc.fields["context"], doc.fields["question"]]

    def document_segments(self, doc: Document, doc_index: int, tokenizer: Any) -> list:
        context = tokenize_with_offsets(doc.fields["context"], tokenizer, self._word_cache)
        if len(context) == 0:
            raise DataError(f"question {doc.doc_id!r}: the context has no tokens")
        context = self.cap(context, doc)
        question = tokenizer.encode(doc.fields["question"])
        if not question:
            raise DataError(f"question {doc.doc_id!r}: the question has no tokens")
        gold = [(a["start"], a["start"] + len(a["text"])) for a in doc.fields.get("answers", [])]
        try:
            segments = self.segmenter(context, question, gold, doc_index)
        except ValueError as e:
            raise DataError(f"question {doc.doc_id!r}: {e}") from None
        # every reader gives "answers" (maybe []: a question without one trains on [CLS]);
        # a question to predict has none, and its [CLS] targets must not train
        return segments if "answers" in doc.fields else without_training(segments)

    def loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor) -> paddle.Tensor:
        return masked_mean(span_nll(out.logits, batch,
                                    self.options["loss_positions"] == "all"), weight)

    def row_scores(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> paddle.Tensor:
        return out.logits.astype("float32")   # [B, T, 2]

    def field_offsets(self, doc: Document, tokenizer: Any) -> Dict[str, Tuple[str, np.ndarray]]:
        context = doc.fields["context"]
        tokens = tokenize_with_offsets(context, tokenizer, self._word_cache)
        assert tokens.piece_starts is not None and tokens.piece_ends is not None   # it sets both
        return {"context": (context, np.stack([tokens.piece_starts, tokens.piece_ends], 1))}

    def explain_target(self, doc: Document, steps: Sequence, rows: List[Tuple[int, Any]],
                       record: Dict[str, Any], target: Optional[str]) -> ExplainTarget:
        """The start + end logit of the chosen answer (or of the n-best answer whose text is
        `target`), in the segment whose logits gave it its score (the n-best score; ties: the
        segment that gives its tokens the most context, as decoding prefers)."""
        found = [a for a in record["n_best"] if target is None or a["text"] == target][:1]
        if not found:
            raise DataError("no answer span to explain" if target is None else
                            f"--target {target!r} is not among the n-best answers")
        answer = found[0]
        candidates = answer_positions(steps, dict(rows), answer["start"], answer["end"])
        if not candidates:
            raise DataError(f"answer {answer['text']!r}: no segment holds its span")
        # the decoded score is rounded to 4 decimals: the candidate nearest it
        _, _, seg, i, j = min(candidates, key=lambda c: (abs(c[0] - answer["score"]),
                                                         not c[1]))
        return ExplainTarget(f"start + end logit of {answer['text']!r}", answer["text"],
                             lambda got: dict(got)[seg][i, 0] + dict(got)[seg][j, 1])

    def predict_document(self, doc: Document, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence]) -> Dict[str, Any]:
        """→ {doc_id, question, pred (task_options.empty_answer without a span), score (start
        + end logit, 4 decimals), start / end (context[start:end] == pred), n_best, segments}."""
        assert steps is not None   # a span needs the document's segments (its character maps)
        metas = {m.seg_index: m.meta for step in steps for m in step_members(step) if m.final}
        got = sorted(rows, key=lambda x: x[0])
        cands = best_spans([metas[s] for s, _ in got], [lg for _, lg in got],
                           self.options["n_best"], self.options["max_answer_len"],
                           self.options["n_best_pool"], self.options["answer_unit"])
        context = doc.fields["context"]
        n_best: List[Dict[str, Any]] = []   # each text once (the official n-best)
        seen = set()
        for score, a, b in cands:
            if len(n_best) == self.options["n_best"]:
                break
            if context[a:b] in seen:   # the official n-best keeps each text once
                continue
            seen.add(context[a:b])
            n_best.append({"text": context[a:b], "score": round(score, 4), "start": a, "end": b})
        best = n_best[0] if n_best else {"text": self.options["empty_answer"], "score": None,
                                         "start": None, "end": None}
        return {"doc_id": doc.doc_id, "question": doc.fields["question"], "pred": best["text"],
                "score": best["score"], "start": best["start"], "end": best["end"],
                "n_best": n_best, "segments": len(rows)}

    def references(self, doc: Document) -> List[str]:
        if self.options["metric"] == "triviaqa" and doc.fields.get("answer"):
            return ground_truths(doc.fields["answer"])
        return list(doc.fields.get("references", []))

    def evaluate(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                 passes: Any) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        predictions = self.predict(docs, rows, passes)
        refs = {d.doc_id: self.references(d) for d in docs}
        scored = {k: v for k, v in refs.items() if v}
        if scored and self.options["unreferenced"] == "count":
            scored = refs   # the official metric's denominator: every question
        answers = {p["doc_id"]: p["pred"] for p in predictions}
        evaluate = triviaqa.evaluate if self.options["metric"] == "triviaqa" else cmrc.evaluate
        # a split without answers (DuReader's test) is predicted but not scored
        metrics = {k: float(v) for k, v in evaluate(answers, scored).items()
                   if isinstance(v, (int, float))} if scored else {}
        return metrics, [with_gold(p, references=refs[d.doc_id])
                         for p, d in zip(predictions, docs)]


def answer_positions(steps: Sequence, logits: Dict[int, Any], start: int,
                     end: int) -> List[Tuple[float, bool, int, int, int]]:
    """Every place of the final reading that holds the answer characters [start, end) →
    [(start + end logit, whether the window gives it its largest context, segment, start
    position, end position)]."""
    found = []
    for step in steps:
        for m in step_members(step):
            if not m.final or m.meta is None or m.seg_index not in logits:
                continue   # (a target scored on some segments only: the others)
            for lo, hi in (("piece_starts", "piece_ends"), ("starts", "ends")):
                for a in np.flatnonzero(m.meta[lo] == start):
                    for b in np.flatnonzero(m.meta[hi] == end):
                        if a <= b:
                            row = logits[m.seg_index]
                            found.append((float(row[a + 1, 0] + row[b + 1, 1]),
                                          bool(m.meta["max_context"][a]), m.seg_index,
                                          int(a + 1), int(b + 1)))
    return found
