"""Task kinds whose example occupies several batch rows read in lockstep, each row its own
memory stream (Task.group_size > 1).

`multiple_choice` (C3): one row per choice, softmax over the choices' [CLS] logits.
`pair_matching` (CAIL2019-SCM): rows (A,B) and (A,C), one logit from the difference of their
[CLS] outputs. Both follow PaddleNLP's port by default (task_options `token_types`, `window`,
`missing_choices`). Details: docs/design-notes.md, "Multiple choice and pair matching"."""
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F

from ernie_doc.data.document import Document
from ernie_doc.data.segment import Segment, pack_row, windows
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.heads import ErnieDocForMultipleChoice, ErnieDocForPairMatching
from ernie_doc.kinds.base import (Config, DocumentTask, ExplainTarget, aggregate_rows, masked_mean,
                                  text_offsets, with_gold, without_training)
from ernie_doc.metrics.classification import accuracy, aggregate_segments

NEG = -1e9
TOKEN_TYPES = ("paddlenlp",)
WINDOWS = ("paddlenlp", "longest")
MISSING_CHOICES = ("mask", "paddlenlp")
SPECIALS_PER_ROW = 4   # [CLS] context [SEP] question [SEP] choice [SEP]


def truncate_pair(first: Sequence[int], second: Sequence[int], budget: int,
                  tie_cuts_first: bool = True) -> Tuple[list, list]:
    """Drop tokens from the end of the longer of two lists until both fit `budget`; on a tie
    `first` loses a token (tie_cuts_first) or `second` does (PaddleNLP's rule)."""
    first, second = list(first), list(second)
    while len(first) + len(second) > budget:
        longer_first = len(first) >= len(second) if tie_cuts_first else \
            len(first) > len(second)
        (first if longer_first else second).pop()
    return first, second


def question_choice_pairs(question: Sequence[int], choices: Sequence[Sequence[int]],
                          num_choices: int, max_query_len: int,
                          window: str = "paddlenlp") -> List[Tuple[list, list]]:
    """The (question tokens, choice tokens) of each of a question's num_choices rows, cut as
    the `window` rule says (module docstring); missing choices are empty."""
    if window == "paddlenlp":
        budget, tie_cuts_first = max_query_len - 2, False
    else:
        budget, tie_cuts_first = max_query_len, True
    padded = list(choices) + [[]] * (num_choices - len(choices))
    return [truncate_pair(question, c, budget, tie_cuts_first) for c in padded]


def context_window(seq_len: int, pairs: Sequence[Tuple[list, list]],
                   window: str = "paddlenlp") -> int:
    """Context tokens per row (may be < 1: no room). paddlenlp: T − Σ |q + c| − 4 over all
    the pairs; longest: T − max |q + c| − 4."""
    sizes = [len(q) + len(c) for q, c in pairs]
    used = sum(sizes) if window == "paddlenlp" else max(sizes)
    return seq_len - used - SPECIALS_PER_ROW


def first_text_types(ids_len: int, first_len: int, seq_len: int) -> np.ndarray:
    """Token types [T] int64 of a row `[CLS] first [SEP] rest…`: 0 up to the first [SEP], 1 for
    the other real tokens, 0 for padding (as PaddleNLP)."""
    types = np.zeros(seq_len, dtype=np.int64)
    types[first_len + 2:ids_len] = 1
    return types


class _GroupTask(DocumentTask):
    main_metric = "accuracy"
    metric_names = ("accuracy",)

    def setup(self, special_ids: Dict[str, int], max_seq_len: int, stride: int,
              tokenizer: Any = None) -> None:
        self.special, self.seq_len, self.stride = special_ids, max_seq_len, stride

    def model_config_overrides(self) -> Dict[str, Any]:
        return {"cls_token_idx": 0}

    def _row(self, parts):
        """parts → (ids [T], mask [T], token types [T])."""
        sp = self.special
        ids, mask = pack_row(parts, self.seq_len, sp["cls"], sp["sep"], sp["pad"])
        return ids, mask, first_text_types(int(mask.sum()), len(parts[0]), self.seq_len)

    def _label(self, doc):
        if doc.label is None or doc.label not in self.label_ids:
            raise DataError(f"example {doc.doc_id!r}: label {doc.label!r} is not one of "
                            f"{self.labels}")
        return self.label_ids[doc.label]

    def _steps(self, doc_index, parts_per_row, targets, sources=None):
        """parts_per_row: per step, the parts of each of the group's rows → [tuple of Segments];
        sources: per step, each row's Segment.sources (default none)."""
        n = len(parts_per_row)
        steps = []
        for k, rows in enumerate(parts_per_row):
            members = []
            for r, parts in enumerate(rows):
                ids, mask, types = self._row(parts)
                members.append(Segment(ids, mask, doc_index, k, n, token_type_ids=types,
                                       targets=dict(targets),
                                       sources=sources[k][r] if sources else ()))
            steps.append(tuple(members))
        return steps


class MultipleChoiceTask(_GroupTask):
    head_class = ErnieDocForMultipleChoice
    option_defaults = {"num_choices": 4, "max_query_len": 64, "token_types": "paddlenlp",
                       "window": "paddlenlp", "missing_choices": "mask"}
    input_fields = ("context", "question", "choices")
    pipeline_tasks = ("multiple-choice",)

    def __init__(self, cfg: Config, reader: Any):
        super().__init__(cfg, reader)
        self.check_options(("num_choices", "max_query_len"),
                           {"token_types": TOKEN_TYPES, "window": WINDOWS,
                            "missing_choices": MISSING_CHOICES})
        if self.options["window"] == "paddlenlp" and self.options["max_query_len"] < 3:
            raise self.option_error("max_query_len", "the paddlenlp window keeps "
                                    "max_query_len − 2 question + choice tokens: at least 3")
        self.group_size = self.options["num_choices"]
        if len(self.labels) != self.group_size:
            raise ConfigError(f"{cfg.source}: task_options.num_choices "
                              f"{self.group_size}: the reader has {len(self.labels)} labels")

    def model_kwargs(self) -> Dict[str, Any]:
        return {"num_choices": self.group_size}

    def tokenizer_texts(self, doc: Document) -> List[str]:
        return [doc.fields["context"], doc.fields["question"]] + list(doc.fields["choices"])

    def document_segments(self, doc: Document, doc_index: int, tokenizer: Any) -> list:
        choices = list(doc.fields["choices"])
        if not 1 <= len(choices) <= self.group_size:
            raise DataError(f"question {doc.doc_id!r}: {len(choices)} choices (1 to "
                            f"{self.group_size} expected)")
        # a question to predict has no answer: choice 0 is a placeholder target, never read
        label = 0 if doc.label is None else self._label(doc)
        if label >= len(choices):
            raise DataError(f"question {doc.doc_id!r}: the answer is choice {label}, but "
                            f"there are {len(choices)} choices")
        context = self.cap(tokenizer.encode(doc.fields["context"]), doc)
        window = self.options["window"]
        pairs = question_choice_pairs(tokenizer.encode(doc.fields["question"]),
                                      [tokenizer.encode(c) for c in choices], self.group_size,
                                      self.options["max_query_len"], window)
        room = context_window(self.seq_len, pairs, window)
        if room < 1:
            # PaddleNLP's reader would loop forever here
            raise DataError(f"question {doc.doc_id!r}: max_seq_len {self.seq_len} leaves no "
                            f"room for the context (task_options.window {window!r}: "
                            f"{self.seq_len - SPECIALS_PER_ROW - room} question + choice "
                            f"tokens); raise max_seq_len, lower max_query_len or set "
                            f"window: longest")
        mask = np.zeros(self.group_size, dtype=np.float32)
        mask[:len(choices)] = 1.0
        if self.options["missing_choices"] == "paddlenlp":
            mask[:] = 1.0   # empty choices are scored like the others
        spans = windows(len(context), room, self.stride)
        rows = [[(context[a:b], q, c) for q, c in pairs] for a, b in spans]
        sources = [[(("context", a, b, 1),)] * len(pairs) for a, b in spans]
        steps = self._steps(doc_index, rows, {"label": label, "choice_mask": mask}, sources)
        return steps if doc.label is not None else without_training(steps)

    def input_problem(self, name: str, value: Any) -> Optional[str]:
        if name != "choices":
            return super().input_problem(name, value)
        if not isinstance(value, list) or not value or \
                not all(isinstance(c, str) for c in value):
            return "choices must be a non-empty list of strings"
        if len(value) > self.group_size:
            return f"{len(value)} choices, at most {self.group_size} (task_options.num_choices)"
        return None

    def _masked(self, out, batch):
        """→ logits [B / g, g] with the masked choices at −1e9."""
        g = self.group_size
        return out.logits.astype("float32") + (1.0 - batch["target_choice_mask"][::g]) * NEG

    def loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor) -> paddle.Tensor:
        """Cross-entropy of each group's masked softmax [B / g], mean over the groups whose
        first row has weight 1."""
        g = self.group_size
        ce = F.cross_entropy(self._masked(out, batch), batch["target_label"][::g].unsqueeze(-1),
                             reduction="none").reshape([-1])
        return masked_mean(ce, weight[::g])

    def row_scores(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> paddle.Tensor:
        return out.logits.astype("float32")   # [B / g, g]; masked in evaluate

    def explain_target(self, doc: Document, steps: Sequence, rows: List[Tuple[int, Any]],
                       record: Dict[str, Any], target: Optional[str]) -> ExplainTarget:
        """The probability of choice `target` (its index, or its text; default: the chosen
        one), as predict gives it."""
        choices = list(doc.fields["choices"])
        n = self.group_size if self.options["missing_choices"] == "paddlenlp" else len(choices)
        if target is None:
            k = int(record["pred"])
        elif str(target) in choices:   # a choice's text first, then an index
            k = choices.index(str(target))
        elif re.fullmatch(r"[0-9]+", str(target)) and int(target) < n:
            k = int(target)
        else:
            raise DataError(f"--target {str(target)!r}: give a choice's text or its index (0 "
                            f"to {n - 1})")
        label, how = str(k), self.cfg.doc_prediction
        return ExplainTarget(f"probability of choice {k}", label, lambda got: aggregate_rows(
            [(s, F.softmax(lg[:n], axis=-1)) for s, lg in got], how)[k])

    def field_offsets(self, doc: Document, tokenizer: Any) -> Dict[str, Tuple[str, np.ndarray]]:
        return {"context": text_offsets(tokenizer, doc.fields["context"])}

    def predict_document(self, doc: Document, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence] = None) -> Dict[str, Any]:
        """→ {doc_id, pred (the chosen index as a string), choice (its text), probs ([n
        choices], 6 decimals), segments}."""
        choices = doc.fields["choices"]
        n = self.group_size if self.options["missing_choices"] == "paddlenlp" else len(choices)
        per_segment = [(s, _softmax(lg[:n])) for s, lg in rows]
        p = aggregate_segments(per_segment, self.cfg.doc_prediction)
        k = int(p.argmax())
        return {"doc_id": doc.doc_id, "pred": str(k), "choice": choices[k] if k < len(choices)
                else "",
                "probs": [round(float(x), 6) for x in p], "segments": len(rows)}

    def evaluate(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                 passes: Any = None) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        predictions = self.predict(docs, rows, passes)
        gold = [self._label(d) for d in docs]
        pred = [int(p["pred"]) for p in predictions]
        return {"accuracy": accuracy(pred, gold)}, [with_gold(p, label=d.label)
                                                     for p, d in zip(predictions, docs)]


class PairMatchingTask(_GroupTask):
    head_class = ErnieDocForPairMatching
    group_size = 2
    positive = "B"
    input_fields = ("A", "B", "C")
    pipeline_tasks = ("text-classification",)
    option_defaults = {"token_types": "paddlenlp"}

    def __init__(self, cfg: Config, reader: Any):
        super().__init__(cfg, reader)
        self.check_options(choices={"token_types": TOKEN_TYPES})
        if self.positive not in self.label_ids or len(self.labels) != 2:
            raise ConfigError(f"{cfg.source}: pair matching needs the labels ['B', 'C'], the "
                              f"reader gives {self.labels}")

    def tokenizer_texts(self, doc: Document) -> List[str]:
        return [doc.fields[k] for k in ("A", "B", "C")]

    def document_segments(self, doc: Document, doc_index: int, tokenizer: Any) -> list:
        # an unlabelled pair (one to predict): 0 is a placeholder target, never read
        label = 0.0 if doc.label is None else \
            1.0 if self.labels[self._label(doc)] == self.positive else 0.0
        half = (self.seq_len - 3) // 2
        if half < 1:
            raise DataError(f"max_seq_len {self.seq_len} is too short for text pairs")
        texts = [self.cap(tokenizer.encode(doc.fields[k]), doc) for k in ("A", "B", "C")]
        spans = [windows(len(t), half, self.stride) for t in texts]
        n = max(len(s) for s in spans)
        parts = [[t[a:b] for a, b in s] + [[]] * (n - len(s)) for t, s in zip(texts, spans)]
        a, b, c = parts
        rows = [[(a[k], b[k]), (a[k], c[k])] for k in range(n)]
        steps = self._steps(doc_index, rows, {"label": np.float32(label)},
                            pair_sources(spans, n))
        return steps if doc.label is not None else without_training(steps)

    def loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor) -> paddle.Tensor:
        """Binary cross-entropy of each pair's logit [B / 2] (target 1: B is closer), mean
        over the pairs whose (A,B) row has weight 1."""
        bce = F.binary_cross_entropy_with_logits(out.logits.astype("float32"),
                                                 batch["target_label"][::2], reduction="none")
        return masked_mean(bce.reshape([-1]), weight[::2])

    def row_scores(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> paddle.Tensor:
        return F.sigmoid(out.logits.astype("float32"))   # [B / 2]: P(B is closer)

    def explain_target(self, doc: Document, steps: Sequence, rows: List[Tuple[int, Any]],
                       record: Dict[str, Any], target: Optional[str]) -> ExplainTarget:
        """The probability of `target` ("B": B is closer to A, or the other label; default:
        the prediction), as predict gives it."""
        label = record["pred"] if target is None else str(target)
        if label not in self.label_ids:
            raise DataError(f"--target {label!r} is not a label of this model "
                            f"({', '.join(self.labels)})")
        positive, how = label == self.positive, self.cfg.doc_prediction

        def score(got):
            p = aggregate_rows([(s, v.reshape([1])) for s, v in got], how)[0]
            return p if positive else 1.0 - p
        return ExplainTarget(f"probability of label {label!r}", label, score)

    def field_offsets(self, doc: Document, tokenizer: Any) -> Dict[str, Tuple[str, np.ndarray]]:
        return {k: text_offsets(tokenizer, doc.fields[k]) for k in ("A", "B", "C")}

    def predict_document(self, doc: Document, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence] = None) -> Dict[str, Any]:
        """→ {doc_id, pred: "B" when P(B is closer) > 0.5 else the other label, prob_B: that
        probability (mean, or last, of the segments'; 6 decimals), segments}."""
        other = [x for x in self.labels if x != self.positive][0]
        p = float(aggregate_segments([(s, np.atleast_1d(v)) for s, v in rows],
                                     self.cfg.doc_prediction)[0])
        return {"doc_id": doc.doc_id, "pred": self.positive if p > 0.5 else other,
                "prob_" + self.positive: round(p, 6), "segments": len(rows)}

    def evaluate(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                 passes: Any = None) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        predictions = self.predict(docs, rows, passes)
        pred = [p["pred"] for p in predictions]
        gold = [d.label for d in docs]
        return {"accuracy": accuracy(pred, gold)}, [with_gold(p, label=d.label)
                                                     for p, d in zip(predictions, docs)]


def pair_sources(spans: Sequence[Sequence[Tuple[int, int]]], n: int) -> list:
    """Segment.sources of pair matching's n steps from the windows of A, B and C: row (A, B)
    and row (A, C), each `[CLS] a [SEP] b [SEP]` (a window past a text's end is empty)."""
    def window(k, field):
        found = spans["ABC".index(field)]
        return found[k] if k < len(found) else (0, 0)

    steps = []
    for k in range(n):
        a0, a1 = window(k, "A")
        step = []
        for other in "BC":
            b0, b1 = window(k, other)
            step.append((("A", a0, a1, 1), (other, b0, b1, a1 - a0 + 2)))
        steps.append(step)
    return steps


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()
