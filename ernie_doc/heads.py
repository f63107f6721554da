"""Task heads over ErnieDocModel, shared by every task.

Each head holds the encoder as `ernie_doc` (PaddleNLP's prefix, so its .pdparams load as is)
and declares `official_names`: its own parameters → the official static names. Every forward
takes the encoder's arguments and returns the new memories with the logits.
"""
from collections import namedtuple

import paddle
import paddle.nn as nn

from ernie_doc.config import ErnieDocConfig
from ernie_doc.modeling.attention import truncated_normal
from ernie_doc.modeling.embeddings import EMBEDDING_LN_EPS
from ernie_doc.modeling.model import ErnieDocModel, activation
from ernie_doc.modeling.pretrained import PretrainedMixin

NUM_REORDER_CLASSES = 33  # 1! + 2! + 3! + 4!: orderings of up to 4 chunks


class HeadOutput(namedtuple("HeadOutput", ["logits", "memories", "memory_mask", "encoder"])):
    """logits (shape per head) · memories [L,B,M,H] · memory_mask [B,M] or None ·
    encoder: the ErnieDocOutput."""

    @property
    def start_logits(self):
        return self.logits[:, :, 0]

    @property
    def end_logits(self):
        return self.logits[:, :, 1]


PretrainingOutput = namedtuple("PretrainingOutput",
                               ["mlm_logits", "reorder_logits", "memories", "memory_mask",
                                "encoder"])


class Head(PretrainedMixin, nn.Layer):
    """The base of every head (and the extension point of a task's own head, e.g.
    tasks/hotpotqa/head.py): the encoder under `ernie_doc.`, from_pretrained /
    save_pretrained, and `official_names` ({own parameter key: official static name})."""
    official_names = {}
    uses_pooled = True   # False: the head reads the sequence output only

    def __init__(self, config, dropout=None):
        super().__init__()
        if not isinstance(config, ErnieDocConfig):
            config = ErnieDocConfig.from_any(config)
        self.config = config
        self.ernie_doc = ErnieDocModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout if dropout is None else dropout,
                                  mode="upscale_in_train")

    def _linear(self, out_features):
        return nn.Linear(self.config.hidden_size, out_features,
                         weight_attr=truncated_normal(self.config.initializer_range))

    def _set_num_labels(self, num_labels):
        self.num_labels = num_labels or self.config.num_labels
        self.config = self.config.replace(num_labels=self.num_labels)
        self.linear = self._linear(self.num_labels)

    def logits(self, enc):
        """The head proper: ErnieDocOutput → logits."""
        raise NotImplementedError

    def _visible(self, enc):
        """The encoder output handed back, without pooled_output when the head never reads
        it: data parallelism waits for the gradients of every parameter an output depends
        on, and the pooler's never come."""
        return enc if self.uses_pooled else enc._replace(pooled_output=None)

    def forward(self, input_ids, memories=None, token_type_ids=None, attention_mask=None,
                reset_memory=None, memory_mask=None):
        enc = self.ernie_doc(input_ids, memories, token_type_ids, attention_mask, reset_memory,
                             memory_mask)
        return HeadOutput(self.logits(enc), enc.memories, enc.memory_mask, self._visible(enc))


_Head = Head   # its former name, for task heads written against it


class ErnieDocForSequenceClassification(Head):
    """pooled → dropout (0.1 as official) → linear: logits [B, num_labels]."""
    official_names = {"linear.weight": "cls_out_w", "linear.bias": "cls_out_b"}

    def __init__(self, config, num_labels=None, dropout=None):
        super().__init__(config, dropout)
        self._set_num_labels(num_labels)

    def logits(self, enc):
        return self.linear(self.dropout(enc.pooled_output))


class ErnieDocForQuestionAnswering(Head):
    """sequence → dropout → linear(H, 2): logits [B, T, 2] (.start_logits / .end_logits)."""
    official_names = {"linear.weight": "cls_mrc_out_w", "linear.bias": "cls_mrc_out_b"}
    uses_pooled = False

    def __init__(self, config, dropout=None):
        super().__init__(config, dropout)
        self.linear = self._linear(2)

    def logits(self, enc):
        return self.linear(self.dropout(enc.sequence_output))


class ErnieDocForTokenClassification(Head):
    """sequence → dropout → linear: logits [B, T, num_labels]."""
    official_names = {"linear.weight": "cls_seq_label_out_w",
                      "linear.bias": "cls_seq_label_out_b"}
    uses_pooled = False

    def __init__(self, config, num_labels=None, dropout=None):
        super().__init__(config, dropout)
        self._set_num_labels(num_labels)

    logits = ErnieDocForQuestionAnswering.logits


class ErnieDocForMultipleChoice(Head):
    """One row per (question, choice), each its own memory stream: input [B*C, T] →
    logits [B, C] (one logit per choice row, from the pooled output)."""
    official_names = {"linear.weight": "cls_out_w", "linear.bias": "cls_out_b"}

    def __init__(self, config, num_choices=4, dropout=None):
        super().__init__(config, dropout)
        self.num_choices = num_choices
        self.linear = self._linear(1)

    def logits(self, enc):
        rows = enc.pooled_output
        if paddle.in_dynamic_mode() and rows.shape[0] % self.num_choices:
            raise ValueError(f"multiple choice: batch rows ({rows.shape[0]}) must be a "
                             f"multiple of num_choices ({self.num_choices})")
        return self.linear(self.dropout(rows)).reshape([-1, self.num_choices])


class ErnieDocForPairMatching(Head):
    """Triplet matching (CAIL2019-SCM): rows come in pairs (A,B), (A,C), each its own memory
    stream; pooled(A,B) − pooled(A,C) → dropout → linear(H, 1): logits [B/2], > 0 when B is
    the closer one (binary cross-entropy)."""
    official_names = {"linear.weight": "cls_out_w", "linear.bias": "cls_out_b"}

    def __init__(self, config, dropout=None):
        super().__init__(config, dropout)
        self.linear = self._linear(1)

    def logits(self, enc):
        rows = enc.pooled_output
        if paddle.in_dynamic_mode() and rows.shape[0] % 2:
            raise ValueError(f"pair matching: batch rows ({rows.shape[0]}) must come in pairs")
        pairs = rows.reshape([-1, 2, self.config.hidden_size])
        return self.linear(self.dropout(pairs[:, 0] - pairs[:, 1])).reshape([-1])


class MaskedLMHead(nn.Layer):
    """dense(H,H) + act → LayerNorm (eps 1e-5, bias starts at 1 as official) → tied output."""

    def __init__(self, config, word_embedding):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size,
                                   weight_attr=truncated_normal(config.initializer_range))
        self.act = activation(config.hidden_act)
        self.layer_norm = nn.LayerNorm(
            config.hidden_size, epsilon=EMBEDDING_LN_EPS,
            bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(1.0)))
        self.decoder_bias = self.create_parameter(
            [config.vocab_size], is_bias=True,
            default_initializer=nn.initializer.Constant(0.0))
        self._word_embedding = [word_embedding]  # tied; a list keeps it out of this state_dict

    def forward(self, hidden):
        """hidden [N, H] → logits [N, V]."""
        h = self.layer_norm(self.act(self.transform(hidden)))
        return paddle.matmul(h, self._word_embedding[0].weight, transpose_y=True) + \
            self.decoder_bias


class ErnieDocForPretraining(Head):
    """Masked LM on chosen positions + segment reordering (33 classes) on the pooled output."""
    official_names = {
        "lm_head.transform.weight": "mask_lm_trans_fc.w_0",
        "lm_head.transform.bias": "mask_lm_trans_fc.b_0",
        "lm_head.layer_norm.weight": "mask_lm_trans_layer_norm_scale",
        "lm_head.layer_norm.bias": "mask_lm_trans_layer_norm_bias",
        "lm_head.decoder_bias": "mask_lm_out_fc.b_0",
        "reorder_head.weight": "multi_sent_sorted_fc.w_0",
        "reorder_head.bias": "multi_sent_sorted_fc.b_0",
    }

    def __init__(self, config, num_reorder_classes=NUM_REORDER_CLASSES):
        super().__init__(config, dropout=0.0)
        self.lm_head = MaskedLMHead(self.config, self.ernie_doc.embeddings.word_emb)
        self.reorder_head = self._linear(num_reorder_classes)

    def forward(self, input_ids, memories=None, token_type_ids=None, attention_mask=None,
                reset_memory=None, memory_mask=None, masked_positions=None):
        """masked_positions: flat indices into [B*T] (official mask_pos), or None for all.
        Returns mlm_logits [N, V] (or [B, T, V]) and reorder_logits [B, 33]."""
        enc = self.ernie_doc(input_ids, memories, token_type_ids, attention_mask, reset_memory,
                             memory_mask)
        seq = enc.sequence_output
        if masked_positions is None:
            mlm = self.lm_head(seq)
        else:
            flat = seq.reshape([-1, self.config.hidden_size])
            mlm = self.lm_head(paddle.gather(flat, masked_positions.reshape([-1]), axis=0))
        reorder = self.reorder_head(enc.pooled_output)
        return PretrainingOutput(mlm, reorder, enc.memories, enc.memory_mask, enc)


HEADS = {
    "sequence_classification": ErnieDocForSequenceClassification,
    "question_answering": ErnieDocForQuestionAnswering,
    "token_classification": ErnieDocForTokenClassification,
    "multiple_choice": ErnieDocForMultipleChoice,
    "pretraining": ErnieDocForPretraining,
}
