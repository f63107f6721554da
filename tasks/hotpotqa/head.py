"""The HotpotQA head (both pipeline stages): evidence scorers on the [p] / [SEP] tokens, and
for the answer stage a question-type classifier on the pooled [CLS] and a span layer."""
from collections import namedtuple
from typing import List, Tuple

import paddle.nn as nn

from ernie_doc.auto import register_head
from ernie_doc.heads import Head
from ernie_doc.modeling.attention import truncated_normal
from ernie_doc.modeling.model import activation

STAGES = ("evidence", "answer")
ANSWER_TYPES = ("yes", "no", "span")   # classes of the type classifier, in this order

HotpotOutput = namedtuple("HotpotOutput", ["para_logits", "sent_logits", "type_logits",
                                           "span_logits", "memories", "memory_mask", "encoder"])
HotpotOutput.__doc__ = """para_logits [B, T] · sent_logits [B, T] (one logit per position; the
task reads them at the [p] / [SEP] tokens) · type_logits [B, 3] (yes/no/span) and span_logits
[B, T, 2] (start, end), None in the evidence stage · memories [L, B, M, H] · memory_mask
[B, M] or None · encoder: the ErnieDocOutput."""


class EvidenceScorer(nn.Layer):
    """2-layer feed-forward scorer: Linear(H, H) → the encoder's activation (GELU) →
    Linear(H, 1). hidden [B, T, H] → logits [B, T]."""

    def __init__(self, config):
        super().__init__()
        std = config.initializer_range
        self.dense = nn.Linear(config.hidden_size, config.hidden_size,
                               weight_attr=truncated_normal(std))
        self.act = activation(config.hidden_act)
        self.out = nn.Linear(config.hidden_size, 1, weight_attr=truncated_normal(std))

    def forward(self, hidden):
        return self.out(self.act(self.dense(hidden))).squeeze(-1)


@register_head("hotpotqa")   # the task folders' register_heads() imports this module
class ErnieDocForHotpotQA(Head):
    """stage "evidence": paragraph and sentence scorers only; stage "answer" adds the type
    classifier (pooled [CLS] → dropout → Linear(H, 3)) and the span layer (sequence → dropout
    → Linear(H, 2)). Only the layers a stage trains exist (and the evidence stage hands back
    no pooled output, see Head._visible), so data-parallel runs have no unused trainable
    parameters; the stage is saved with the checkpoint (`architecture`)."""
    exportable = True

    def __init__(self, config, stage="answer", dropout=None):
        super().__init__(config, dropout)
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r}: expected one of {STAGES}")
        self.stage = stage
        self.para_scorer = EvidenceScorer(self.config)
        self.sent_scorer = EvidenceScorer(self.config)
        self.uses_pooled = stage == "answer"
        if stage == "answer":
            self.type_classifier = self._linear(len(ANSWER_TYPES))
            self.span = self._linear(2)

    def export_outputs(self, batch: int, seq_len: int) -> List[Tuple[str, List[int]]]:
        """The stage's logits, as HotpotOutput names them (batch -1: dynamic)."""
        outputs = [("para_logits", [batch, seq_len]), ("sent_logits", [batch, seq_len])]
        if self.stage == "answer":
            outputs += [("type_logits", [batch, len(ANSWER_TYPES)]),
                        ("span_logits", [batch, seq_len, 2])]
        return outputs

    def architecture(self):
        arch = super().architecture()
        arch["kwargs"]["stage"] = self.stage
        return arch

    def forward(self, input_ids, memories=None, token_type_ids=None, attention_mask=None,
                reset_memory=None, memory_mask=None):
        enc = self.ernie_doc(input_ids, memories, token_type_ids, attention_mask, reset_memory,
                             memory_mask)
        seq = self.dropout(enc.sequence_output)
        type_logits = span_logits = None
        if self.stage == "answer":
            type_logits = self.type_classifier(self.dropout(enc.pooled_output))
            span_logits = self.span(seq)
        return HotpotOutput(self.para_scorer(seq), self.sent_scorer(seq), type_logits,
                            span_logits, enc.memories, enc.memory_mask, self._visible(enc))
