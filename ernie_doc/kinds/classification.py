"""The classification kind: one label per document, from its segments' pooled [CLS]."""
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F

from ernie_doc.data.document import Document
from ernie_doc.data.segment import CLS_INDEX, ClassificationSegmenter
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.heads import ErnieDocForSequenceClassification
from ernie_doc.kinds.base import (Config, DocumentTask, ExplainTarget, aggregate_rows, log_odds,
                                  masked_mean, with_gold)
from ernie_doc.metrics.classification import aggregate_segments, classification_metrics


class ClassificationTask(DocumentTask):
    """Document classification: every segment carries the document label; the pooled [CLS]
    feeds a linear layer; the document is the mean (or last) of its segments' softmax."""
    head_class = ErnieDocForSequenceClassification
    main_metric = "accuracy"
    input_fields = ("text",)
    pipeline_tasks = ("text-classification", "sentiment-analysis")

    def __init__(self, cfg: Config, reader: Any):
        super().__init__(cfg, reader)
        self.metric_names = tuple(cfg.metrics)
        unknown = set(self.metric_names) - {"accuracy", "f1", "macro_f1"}
        if not self.metric_names or unknown:
            raise ConfigError(f"{cfg.source}: metrics: unknown {sorted(unknown)}; "
                              "classification has accuracy, f1, macro_f1")
        self.main_metric = self.metric_names[0]
        positive = cfg.positive_label
        if positive is not None and str(positive) not in self.label_ids:
            raise ConfigError(f"{cfg.source}: positive_label {positive!r} is not a label "
                              f"({self.labels[:10]})")
        self.positive = self.label_ids[str(positive)] if positive is not None else 1

    def setup(self, special_ids: Dict[str, int], max_seq_len: int, stride: int,
              tokenizer: Any = None) -> None:
        self.segmenter = ClassificationSegmenter(max_seq_len, stride, special_ids["cls"],
                                                 special_ids["sep"], special_ids["pad"],
                                                 self.cfg.segment_layout)

    def model_kwargs(self) -> Dict[str, Any]:
        return {"num_labels": len(self.labels)}

    def model_config_overrides(self) -> Dict[str, Any]:
        return {"cls_token_idx": CLS_INDEX[self.cfg.segment_layout]}

    def text_segment_layout(self) -> Optional[str]:
        return self.cfg.segment_layout

    def label_id(self, doc: Document) -> int:
        if doc.label is None:
            raise DataError(f"document {doc.doc_id!r} has no label")
        if doc.label not in self.label_ids:
            raise DataError(f"document {doc.doc_id!r}: label {doc.label!r} is not in the "
                            f"label set ({len(self.labels)} labels)")
        return self.label_ids[doc.label]

    def segments(self, doc: Document, doc_index: int, ids: Any) -> list:
        if doc.label is None:   # a document to predict: label 0 is a placeholder, never read
            return self.segmenter(ids, doc_index, {"label": 0}, has_loss=False)
        return self.segmenter(ids, doc_index, {"label": self.label_id(doc)})

    def loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor) -> paddle.Tensor:
        ce = F.cross_entropy(out.logits, batch["target_label"].unsqueeze(-1),
                             reduction="none").reshape([-1])
        return masked_mean(ce, weight)

    def row_scores(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> paddle.Tensor:
        return F.softmax(out.logits.astype("float32"), axis=-1)   # [B, C]

    def explain_target(self, doc: Document, steps: Sequence, rows: List[Tuple[int, Any]],
                       record: Dict[str, Any], target: Optional[str]) -> ExplainTarget:
        """The document's probability of `target` (default: the predicted label), as predict
        gives it: the mean (or last) of its segments' softmax."""
        label = record["pred"] if target is None else str(target)
        if label not in self.label_ids:
            raise DataError(f"--target {label!r} is not a label of this model (labels: "
                            f"{', '.join(self.labels[:20])})")
        k, how = self.label_ids[label], self.cfg.doc_prediction
        return ExplainTarget(f"probability of label {label!r}", label,
                             lambda got: aggregate_rows(got, how)[k],
                             lambda got: log_odds(aggregate_rows(got, how), k))

    def predict_document(self, doc: Document, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence] = None) -> Dict[str, Any]:
        """→ {doc_id, pred: label name, probs: [C] (the document's mean, or last, segment
        softmax, 6 decimals), segments}."""
        probs = aggregate_segments(rows, self.cfg.doc_prediction)
        return {"doc_id": doc.doc_id, "pred": self.labels[int(probs.argmax())],
                "probs": [round(float(x), 6) for x in probs], "segments": len(rows)}

    def evaluate(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                 passes: Any = None) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        predictions = self.predict(docs, rows, passes)
        # label names are unique, so the predicted name gives back the argmax
        pred = np.asarray([self.label_ids[p["pred"]] for p in predictions])
        gold = np.asarray([self.label_id(d) for d in docs])
        metrics = classification_metrics(pred, gold, len(self.labels), self.metric_names,
                                         self.positive)
        return metrics, [with_gold(p, label=d.label) for p, d in zip(predictions, docs)]
