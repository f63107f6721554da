"""Span-extraction task kind (`kind: span`): TriviaQA, CMRC2018, DRCD, DuReader.

Every segment reads `[CLS] context-window [SEP] question [SEP]` (or `[q] question [/q]`);
the head scores each token as a start and an end; the answer is the best-scoring span over
all the example's predicted segments, mapped back to the original context text.

Loss: the negative log of the summed probability of all gold starts (and ends) of a
segment, softmax over [CLS] and the context tokens (Clark & Gardner 2018; with one gold
span it is the usual cross-entropy). A segment without a gold span points at [CLS]
(official). Unlike the official loss, question and padding positions are masked out of the
softmax, so probability is spread over the positions a span can take.
"""
from typing import Any, Dict, List, Sequence, Tuple

import paddle

from ernie_doc.config import ConfigError
from ernie_doc.data import DataError
from ernie_doc.data.segment import step_members
from ernie_doc.data.span import SpanSegmenter, best_spans, tokenize_with_offsets
from ernie_doc.heads import ErnieDocForQuestionAnswering
from ernie_doc.training.tasks import DocumentTask, masked_mean, with_gold, without_training

NEG = -1e9


def _logsumexp_where(logits, mask):
    """log Σ exp(logits) over positions where mask = 1: [B, T] → [B]."""
    return paddle.logsumexp(logits + (1.0 - mask) * NEG, axis=-1)


def span_nll(logits, batch):
    """logits [B, T, 2] → per-row loss [B]: mean of the start and end negative log of the
    summed gold probability."""
    logits = logits.astype("float32")
    allowed = batch["target_allowed"]
    loss = 0.0
    for k, gold in enumerate((batch["target_start_gold"], batch["target_end_gold"])):
        lg = logits[:, :, k]
        loss = loss + _logsumexp_where(lg, allowed) - _logsumexp_where(lg, gold * allowed)
    return loss / 2.0


class SpanTask(DocumentTask):
    head_class = ErnieDocForQuestionAnswering
    main_metric = "f1"
    input_fields = ("context", "question")
    option_defaults = {
        "question_format": "sep",   # sep: [SEP] q [SEP] · markers: [q] q [/q] (TriviaQA)
        "max_query_len": 64,        # question tokens kept (official)
        "max_answer_len": 30,       # tokens in a predicted answer
        "n_best": 20,               # start / end candidates per segment
        "metric": "cmrc",           # cmrc (CMRC2018 script: EM, F1 with LCS) | triviaqa
    }
    METRICS = ("cmrc", "triviaqa")
    REPORTS = {"cmrc": ("em", "f1", "avg", "total", "skipped"),   # metrics.cmrc.evaluate
               "triviaqa": ("em", "f1", "total", "missing")}     # metrics.triviaqa.evaluate
    FORMATS = {"sep": ("[SEP]", "[SEP]"), "markers": ("[q]", "[/q]")}

    def __init__(self, cfg, reader):
        super().__init__(cfg, reader)
        self.check_options(("max_query_len", "max_answer_len", "n_best"),
                           {"question_format": self.FORMATS, "metric": self.METRICS})
        self.metric_names = self.REPORTS[self.options["metric"]]
        self._word_cache = {}

    def setup(self, special_ids, max_seq_len, stride, tokenizer=None):
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
                                       self.options["max_query_len"])

    def model_config_overrides(self):
        return {"cls_token_idx": 0}

    def tokenizer_texts(self, doc):
        return [doc.fields["context"], doc.fields["question"]]

    def document_segments(self, doc, doc_index, tokenizer):
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

    def loss(self, out, batch, weight):
        return masked_mean(span_nll(out.logits, batch), weight)

    def row_outputs(self, out, batch=None):
        return out.logits.astype("float32").numpy()

    def predict_document(self, doc, rows: List[Tuple[int, Any]],
                         steps: Sequence) -> Dict[str, Any]:
        """→ {doc_id, question, pred: the best span's text ("" when no span qualifies),
        score: its start + end logit (4 decimals; None without a span), start / end: its
        character offsets into the context (context[start:end] == pred; None without a
        span), n_best: up to task_options.n_best [{text, score, start, end}] best first,
        segments}."""
        metas = {m.seg_index: m.meta for step in steps for m in step_members(step) if m.final}
        got = sorted(rows, key=lambda x: x[0])
        cands = best_spans([metas[s] for s, _ in got], [lg for _, lg in got],
                           self.options["n_best"], self.options["max_answer_len"])
        context = doc.fields["context"]
        n_best = [{"text": context[a:b], "score": round(score, 4), "start": a, "end": b}
                  for score, a, b in cands[:self.options["n_best"]]]
        best = n_best[0] if n_best else {"text": "", "score": None, "start": None, "end": None}
        return {"doc_id": doc.doc_id, "question": doc.fields["question"], "pred": best["text"],
                "score": best["score"], "start": best["start"], "end": best["end"],
                "n_best": n_best, "segments": len(rows)}

    def references(self, doc) -> List[str]:
        if self.options["metric"] == "triviaqa" and doc.fields.get("answer"):
            from ernie_doc.metrics.triviaqa import ground_truths
            return ground_truths(doc.fields["answer"])
        return list(doc.fields.get("references", []))

    def evaluate(self, docs, rows, passes):
        predictions = self.predict(docs, rows, passes)
        refs = {d.doc_id: self.references(d) for d in docs}
        scored = {k: v for k, v in refs.items() if v}
        answers = {p["doc_id"]: p["pred"] for p in predictions}
        if self.options["metric"] == "triviaqa":
            from ernie_doc.metrics.triviaqa import evaluate
        else:
            from ernie_doc.metrics.cmrc import evaluate
        # a split without answers (DuReader's test) is predicted but not scored
        metrics = {k: float(v) for k, v in evaluate(answers, scored).items()
                   if isinstance(v, (int, float))} if scored else {}
        return metrics, [with_gold(p, references=refs[d.doc_id])
                         for p, d in zip(predictions, docs)]
