"""Task heads over ErnieDocModel, shared by every task.

Each head holds the encoder as `ernie_doc` (PaddleNLP's prefix) and declares `official_names`;
every forward takes the encoder's arguments and returns the new memories with the logits.
Heads are looked up by name through ernie_doc.auto."""
from collections import namedtuple
from types import MappingProxyType
from typing import List, Mapping, Optional, Tuple, Type, Union

import paddle
import paddle.nn as nn

from ernie_doc.checkpoint import names
from ernie_doc.config import ErnieDocConfig
from ernie_doc.errors import ModelInputError
from ernie_doc.modeling.attention import truncated_normal
from ernie_doc.modeling.embeddings import EMBEDDING_LN_EPS
from ernie_doc.modeling.linear import Linear, add_broadcast
from ernie_doc.modeling.model import ErnieDocModel, activation
from ernie_doc.modeling.pretrained import PretrainedMixin
from ernie_doc.modeling.reading import READ_ADVICE, SegmentReader

NUM_REORDER_CLASSES = 33  # 1! + 2! + 3! + 4!: orderings of up to 4 chunks


class HeadOutput(namedtuple("HeadOutput", ["logits", "memories", "memory_mask", "encoder"])):
    """logits (shape per head) · memories [L,B,M,H] · memory_mask [B,M] or None ·
    encoder: the ErnieDocOutput."""

    @property
    def start_logits(self) -> paddle.Tensor:
        """[B, T] (question answering)."""
        return self.logits[:, :, 0]

    @property
    def end_logits(self) -> paddle.Tensor:
        """[B, T] (question answering)."""
        return self.logits[:, :, 1]


class ExportInput(namedtuple("ExportInput", ["name", "shape", "dtype", "high", "doc"])):
    """An input a head's forward takes beyond the encoder's, fed after them in an export:
    name, shape (batch -1: dynamic), dtype, high (values in [0, high)), doc (for messages)."""


PretrainingOutput = namedtuple("PretrainingOutput",
                               ["mlm_logits", "reorder_logits", "memories", "memory_mask",
                                "encoder"])


class Head(SegmentReader, PretrainedMixin, nn.Layer):
    """The base of every head: the encoder under `ernie_doc.`, from/save_pretrained,
    `official_names`; export reads exportable, export_inputs/outputs, rows_per_example."""
    official_names = {}
    abstract_base = True   # not a head itself: a config naming it names no head
    encoder_prefix = names.PREFIX   # the encoder's keys: "ernie_doc." + ErnieDocModel's
    uses_pooled = True   # False: the head reads the sequence output only
    exportable = False   # True: export traces forward (encoder's inputs + export_inputs)

    def __init__(self, config: Union[ErnieDocConfig, str, dict],
                 dropout: Optional[float] = None):
        super().__init__()
        if not isinstance(config, ErnieDocConfig):
            config = ErnieDocConfig.from_any(config)
        self.config = config
        self.ernie_doc = ErnieDocModel(config)
        self.ernie_doc.plain_call_advice = self.plain_call_advice   # its check says ours
        self.dropout = nn.Dropout(config.classifier_dropout if dropout is None else dropout,
                                  mode="upscale_in_train")

    def _linear(self, out_features):
        return Linear(self.config.hidden_size, out_features,
                         weight_attr=truncated_normal(self.config.initializer_range))

    def _set_num_labels(self, num_labels):
        self.num_labels = num_labels or self.config.num_labels
        self.config = self.config.replace(num_labels=self.num_labels)
        self.linear = self._linear(self.num_labels)

    def logits(self, enc) -> paddle.Tensor:
        """The head proper: ErnieDocOutput → logits."""
        raise NotImplementedError

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        """The shape of `logits` for `batch` rows of `seq_len` tokens (batch -1: dynamic)."""
        raise NotImplementedError

    @property
    def rows_per_example(self) -> int:
        """Consecutive batch rows that make one example (a batch holds a multiple of it)."""
        return 1

    def rows_problem(self, what: str, rows: int) -> Optional[str]:
        """Why `rows` rows (named `what` in the message: "batch rows", "batch_size") cannot
        make a batch of this head, or None."""
        return None

    def export_outputs(self, batch: int, seq_len: int) -> List[Tuple[str, List[int]]]:
        """What an export of this head returns before the memories: (name, shape) each, the
        name a field of forward's output; batch -1 marks a dynamic batch."""
        return [("logits", self.logits_shape(batch, seq_len))]

    def export_inputs(self, batch: int, seq_len: int) -> List[ExportInput]:
        """The inputs forward needs beyond the encoder's, in export order (batch -1: dynamic);
        None: the export's signature is the encoder's alone."""
        return []

    def _grouped(self, batch: int) -> int:
        """Examples in `batch` rows (-1 stays -1: a dynamic batch)."""
        return batch // self.rows_per_example if batch > 0 else -1

    def _visible(self, enc):
        """The encoder output without pooled_output when the head never reads it (data
        parallelism would wait for the pooler's gradients)."""
        if self.uses_pooled:
            return enc
        # Field by field rather than enc._replace: paddle 2.6's static conversion (export)
        # converts namedtuple._replace's own code and fails on it (NameError: _map).
        values = list(enc)
        values[enc._fields.index("pooled_output")] = None
        return type(enc)(*values)

    def forward(self, input_ids: paddle.Tensor, memories: Optional[paddle.Tensor] = None,
                token_type_ids: Optional[paddle.Tensor] = None,
                attention_mask: Optional[paddle.Tensor] = None,
                reset_memory: Optional[paddle.Tensor] = None,
                memory_mask: Optional[paddle.Tensor] = None) -> HeadOutput:
        """input_ids [B, T] and the encoder's other arguments (ErnieDocModel.forward) →
        HeadOutput: logits (shape per head), memories [L, B, M, H], memory_mask [B, M]: one
        segment's reading (modeling/reading.py)."""
        enc = self.ernie_doc(input_ids, memories, token_type_ids, attention_mask, reset_memory,
                             memory_mask)
        return HeadOutput(self.logits(enc), enc.memories, enc.memory_mask, self._visible(enc))


class ErnieDocForSequenceClassification(Head):
    """pooled → dropout (0.1 as official) → linear: logits [B, num_labels]."""
    official_names = dict(names.CLASSIFICATION_HEAD)
    exportable = True
    plain_call_advice = READ_ADVICE   # its folder's tokenizer lays out its segment

    def __init__(self, config: Union[ErnieDocConfig, str, dict],
                 num_labels: Optional[int] = None, dropout: Optional[float] = None):
        super().__init__(config, dropout)
        self._set_num_labels(num_labels)

    def logits(self, enc) -> paddle.Tensor:
        return self.linear(self.dropout(enc.pooled_output))

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        return [batch, self.num_labels]


class ErnieDocForQuestionAnswering(Head):
    """sequence → dropout → linear(H, 2): logits [B, T, 2] (.start_logits / .end_logits)."""
    official_names = dict(names.SPAN_HEAD)
    uses_pooled = False
    exportable = True

    def __init__(self, config: Union[ErnieDocConfig, str, dict],
                 dropout: Optional[float] = None):
        super().__init__(config, dropout)
        self.linear = self._linear(2)

    def logits(self, enc) -> paddle.Tensor:
        return self.linear(self.dropout(enc.sequence_output))

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        return [batch, seq_len, 2]


class ErnieDocForTokenClassification(Head):
    """sequence → dropout → linear: logits [B, T, num_labels]."""
    official_names = dict(names.SEQUENCE_LABELING_HEAD)
    uses_pooled = False
    exportable = True

    def __init__(self, config: Union[ErnieDocConfig, str, dict],
                 num_labels: Optional[int] = None, dropout: Optional[float] = None):
        super().__init__(config, dropout)
        self._set_num_labels(num_labels)

    logits = ErnieDocForQuestionAnswering.logits

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        return [batch, seq_len, self.num_labels]


class ErnieDocForMultipleChoice(Head):
    """One row per (question, choice), each its own memory stream: input [B*C, T] →
    logits [B, C] (one logit per choice row, from the pooled output)."""
    official_names = dict(names.CLASSIFICATION_HEAD)
    exportable = True

    def __init__(self, config: Union[ErnieDocConfig, str, dict], num_choices: int = 4,
                 dropout: Optional[float] = None):
        super().__init__(config, dropout)
        self.num_choices = num_choices
        self.linear = self._linear(1)

    @property
    def rows_per_example(self) -> int:
        return self.num_choices

    def rows_problem(self, what: str, rows: int) -> Optional[str]:
        if rows % self.num_choices:
            return (f"multiple choice: {what} ({rows}) must be a multiple of num_choices "
                    f"({self.num_choices})")
        return None

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        return [self._grouped(batch), self.num_choices]

    def logits(self, enc) -> paddle.Tensor:
        rows = enc.pooled_output
        problem = paddle.in_dynamic_mode() and self.rows_problem("batch rows", rows.shape[0])
        if problem:
            raise ModelInputError(problem)
        return self.linear(self.dropout(rows)).reshape([-1, self.num_choices])


class ErnieDocForPairMatching(Head):
    """Triplet matching (CAIL2019-SCM): rows (A,B), (A,C); pooled(A,B) − pooled(A,C) → dropout →
    linear(H, 1): logits [B/2], > 0 when B is closer (binary cross-entropy)."""
    official_names = dict(names.CLASSIFICATION_HEAD)
    exportable = True
    rows_per_example = 2   # (A,B) and (A,C)

    def __init__(self, config: Union[ErnieDocConfig, str, dict],
                 dropout: Optional[float] = None):
        super().__init__(config, dropout)
        self.linear = self._linear(1)

    def rows_problem(self, what: str, rows: int) -> Optional[str]:
        return f"pair matching: {what} ({rows}) must come in pairs" if rows % 2 else None

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        return [self._grouped(batch)]

    def logits(self, enc) -> paddle.Tensor:
        rows = enc.pooled_output
        problem = paddle.in_dynamic_mode() and self.rows_problem("batch rows", rows.shape[0])
        if problem:
            raise ModelInputError(problem)
        pairs = rows.reshape([-1, 2, self.config.hidden_size])
        return self.linear(self.dropout(pairs[:, 0] - pairs[:, 1])).reshape([-1])


class MaskedLMHead(nn.Layer):
    """dense(H,H) + act → LayerNorm (eps 1e-5, bias starts at 1 as official) → tied output."""

    def __init__(self, config: ErnieDocConfig, word_embedding: nn.Embedding):
        super().__init__()
        self.transform = Linear(config.hidden_size, config.hidden_size,
                                   weight_attr=truncated_normal(config.initializer_range))
        self.act = activation(config.hidden_act)
        self.layer_norm = nn.LayerNorm(
            config.hidden_size, epsilon=EMBEDDING_LN_EPS,
            bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(1.0)))
        self.decoder_bias = self.create_parameter(
            [config.vocab_size], is_bias=True,
            default_initializer=nn.initializer.Constant(0.0))
        self._word_embedding = [word_embedding]  # tied; a list keeps it out of this state_dict

    def forward(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """hidden [N, H] → logits [N, V]."""
        h = self.layer_norm(self.act(self.transform(hidden)))
        return add_broadcast(paddle.matmul(h, self._word_embedding[0].weight, transpose_y=True),
                             self.decoder_bias)


class ErnieDocForPretraining(Head):
    """Masked LM on chosen positions + segment reordering (33 classes) on the pooled output."""
    official_names = dict(names.PRETRAINING_HEAD)

    def __init__(self, config: Union[ErnieDocConfig, str, dict],
                 num_reorder_classes: int = NUM_REORDER_CLASSES):
        super().__init__(config, dropout=0.0)
        self.lm_head = MaskedLMHead(self.config, self.ernie_doc.embeddings.word_emb)
        self.reorder_head = self._linear(num_reorder_classes)

    def forward(self, input_ids: paddle.Tensor, memories: Optional[paddle.Tensor] = None,
                token_type_ids: Optional[paddle.Tensor] = None,
                attention_mask: Optional[paddle.Tensor] = None,
                reset_memory: Optional[paddle.Tensor] = None,
                memory_mask: Optional[paddle.Tensor] = None,
                masked_positions: Optional[paddle.Tensor] = None) -> PretrainingOutput:
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


# The built-in heads by name, read-only (ernie_doc.auto is the registry every caller uses).
HEADS: Mapping[str, Type[Head]] = MappingProxyType({
    "sequence_classification": ErnieDocForSequenceClassification,
    "question_answering": ErnieDocForQuestionAnswering,
    "token_classification": ErnieDocForTokenClassification,
    "multiple_choice": ErnieDocForMultipleChoice,
    "pair_matching": ErnieDocForPairMatching,
    "pretraining": ErnieDocForPretraining,
})
