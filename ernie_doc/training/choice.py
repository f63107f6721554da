"""Task kinds whose example occupies several batch rows read in lockstep, each row its own
memory stream (Task.group_size > 1).

`multiple_choice` (C3): one row per choice, `[CLS] context-window [SEP] question [SEP]
choice [SEP]`; every choice's row reads the same context windows, so the rows advance
together; one logit per row from [CLS], softmax over the choices (missing choices of a
question with fewer than `num_choices` are masked out). The question is the mean of its
segments' choice probabilities, like a classified document.

`pair_matching` (CAIL2019-SCM): rows (A,B) and (A,C), each `[CLS] A-window [SEP] X-window
[SEP]` with windows of (T−3)/2 tokens taken at the same step in A and X (a text that has
ended contributes nothing); the difference of the two [CLS] outputs → one logit, binary
cross-entropy per segment ("B" is closer = 1). Unlike the official reader, no text is cut
to the shortest of the three.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle.nn.functional as F

from ernie_doc.config import ConfigError
from ernie_doc.data import DataError
from ernie_doc.data.segment import Segment, pack_row, windows
from ernie_doc.heads import ErnieDocForMultipleChoice, ErnieDocForPairMatching
from ernie_doc.metrics.classification import accuracy, aggregate_segments
from ernie_doc.training.tasks import DocumentTask, masked_mean, with_gold, without_training

NEG = -1e9


def truncate_pair(first, second, budget):
    """Drop tokens from the end of the longer of two lists until both fit `budget`."""
    first, second = list(first), list(second)
    while len(first) + len(second) > budget:
        (first if len(first) >= len(second) else second).pop()
    return first, second


class _GroupTask(DocumentTask):
    main_metric = "accuracy"
    metric_names = ("accuracy",)

    def setup(self, special_ids, max_seq_len, stride, tokenizer=None):
        self.special, self.seq_len, self.stride = special_ids, max_seq_len, stride

    def model_config_overrides(self):
        return {"cls_token_idx": 0}

    def _row(self, parts):
        sp = self.special
        return pack_row(parts, self.seq_len, sp["cls"], sp["sep"], sp["pad"])

    def _label(self, doc):
        if doc.label is None or doc.label not in self.label_ids:
            raise DataError(f"example {doc.doc_id!r}: label {doc.label!r} is not one of "
                            f"{self.labels}")
        return self.label_ids[doc.label]

    def _steps(self, doc_index, parts_per_row, targets):
        """parts_per_row: per step, the parts of each of the group's rows → [tuple of
        Segments]."""
        n = len(parts_per_row)
        steps = []
        for k, rows in enumerate(parts_per_row):
            members = []
            for parts in rows:
                ids, mask = self._row(parts)
                members.append(Segment(ids, mask, doc_index, k, n, targets=dict(targets)))
            steps.append(tuple(members))
        return steps


class MultipleChoiceTask(_GroupTask):
    head_class = ErnieDocForMultipleChoice
    option_defaults = {"num_choices": 4, "max_query_len": 64}
    input_fields = ("context", "question", "choices")

    def __init__(self, cfg, reader):
        super().__init__(cfg, reader)
        self.check_options(("num_choices", "max_query_len"))
        self.group_size = self.options["num_choices"]
        if len(self.labels) != self.group_size:
            raise ConfigError(f"{cfg.source}: task_options.num_choices "
                              f"{self.group_size}: the reader has {len(self.labels)} labels")

    def model_kwargs(self):
        return {"num_choices": self.group_size}

    def tokenizer_texts(self, doc):
        return [doc.fields["context"], doc.fields["question"]] + list(doc.fields["choices"])

    def document_segments(self, doc, doc_index, tokenizer):
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
        question = tokenizer.encode(doc.fields["question"])
        pairs = [truncate_pair(question, tokenizer.encode(c), self.options["max_query_len"])
                 for c in choices]
        pairs += [(question[:self.options["max_query_len"]], [])] * \
            (self.group_size - len(choices))
        room = self.seq_len - max(len(q) + len(c) for q, c in pairs) - 4   # context tokens
        if room < 1:
            raise DataError(f"question {doc.doc_id!r}: max_seq_len {self.seq_len} leaves no "
                            "room for the context")
        mask = np.zeros(self.group_size, dtype=np.float32)
        mask[:len(choices)] = 1.0
        spans = windows(len(context), room, self.stride)
        rows = [[(context[a:b], q, c) for q, c in pairs] for a, b in spans]
        steps = self._steps(doc_index, rows, {"label": label, "choice_mask": mask})
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
        g = self.group_size
        return out.logits.astype("float32") + (1.0 - batch["target_choice_mask"][::g]) * NEG

    def loss(self, out, batch, weight):
        g = self.group_size
        ce = F.cross_entropy(self._masked(out, batch), batch["target_label"][::g].unsqueeze(-1),
                             reduction="none").reshape([-1])
        return masked_mean(ce, weight[::g])

    def row_outputs(self, out, batch=None):
        return out.logits.astype("float32").numpy()   # [B / g, g]; masked in evaluate

    def predict_document(self, doc, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence] = None) -> Dict[str, Any]:
        """→ {doc_id, pred: the chosen choice's index as a string (the label), choice: its
        text, probs: [n choices] (mean, or last, segment softmax over the question's own
        choices, 6 decimals), segments}."""
        choices = doc.fields["choices"]
        per_segment = [(s, _softmax(lg[:len(choices)])) for s, lg in rows]
        p = aggregate_segments(per_segment, self.cfg.doc_prediction)
        k = int(p.argmax())
        return {"doc_id": doc.doc_id, "pred": str(k), "choice": choices[k],
                "probs": [round(float(x), 6) for x in p], "segments": len(rows)}

    def evaluate(self, docs, rows, passes=None):
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

    def __init__(self, cfg, reader):
        super().__init__(cfg, reader)
        if self.positive not in self.label_ids or len(self.labels) != 2:
            raise ConfigError(f"{cfg.source}: pair matching needs the labels ['B', 'C'], the "
                              f"reader gives {self.labels}")

    def tokenizer_texts(self, doc):
        return [doc.fields[k] for k in ("A", "B", "C")]

    def document_segments(self, doc, doc_index, tokenizer):
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
        steps = self._steps(doc_index, rows, {"label": np.float32(label)})
        return steps if doc.label is not None else without_training(steps)

    def loss(self, out, batch, weight):
        bce = F.binary_cross_entropy_with_logits(out.logits.astype("float32"),
                                                 batch["target_label"][::2], reduction="none")
        return masked_mean(bce.reshape([-1]), weight[::2])

    def row_outputs(self, out, batch=None):
        return F.sigmoid(out.logits.astype("float32")).numpy()   # [B / 2]: P(B is closer)

    def predict_document(self, doc, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence] = None) -> Dict[str, Any]:
        """→ {doc_id, pred: "B" when P(B is closer) > 0.5 else the other label, prob_B: that
        probability (mean, or last, of the segments'; 6 decimals), segments}."""
        other = [x for x in self.labels if x != self.positive][0]
        p = float(aggregate_segments([(s, np.atleast_1d(v)) for s, v in rows],
                                     self.cfg.doc_prediction)[0])
        return {"doc_id": doc.doc_id, "pred": self.positive if p > 0.5 else other,
                "prob_" + self.positive: round(p, 6), "segments": len(rows)}

    def evaluate(self, docs, rows, passes=None):
        predictions = self.predict(docs, rows, passes)
        pred = [p["pred"] for p in predictions]
        gold = [d.label for d in docs]
        return {"accuracy": accuracy(pred, gold)}, [with_gold(p, label=d.label)
                                                     for p, d in zip(predictions, docs)]


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()
