"""ErnieDocModel: the encoder, its memory contract and the pooler.

    out = model(input_ids, memories=None, token_type_ids=None, attention_mask=None,
                reset_memory=None, memory_mask=None)

input_ids [B,T] int64 · memories [L,B,M,H] or None (= zeros) · token_type_ids [B,T] ·
attention_mask [B,T] (1 = token) · reset_memory [B] bool (memory zeroed first) · memory_mask
[B,M] (mask_empty_memory only). Returns ErnieDocOutput(sequence_output [B,T,H], pooled_output
[B,H], memories [L,B,M,H] detached or None under recurrence "none", memory_mask [B,M] or None).
Inputs are never modified. A call without memories is the first reading of a segment: a
fine-tuned model's own reading of a one-segment document is `model.read(...)`, and a longer
document is read by `ernie_doc.pipeline` or `ernie_doc.segment_batches` (modeling/reading.py)."""
from collections import namedtuple
from typing import Callable, List, Optional, Tuple

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.distributed.fleet.utils import recompute

from ernie_doc import resources
from ernie_doc.config import ErnieDocConfig
from ernie_doc.errors import ModelInputError
from ernie_doc.modeling.attention import (RelativeMultiHeadAttention, relative_position_ids,
                                          truncated_normal)
from ernie_doc.modeling.embeddings import ErnieDocEmbeddings
from ernie_doc.modeling.linear import Linear
from ernie_doc.modeling.masks import encoder_attention_bias
from ernie_doc.modeling.memory import check_reset_memory, memory_source, reset_rows, update_memory
from ernie_doc.modeling.pretrained import PretrainedMixin
from ernie_doc.modeling.reading import SegmentReader, check_plain_call

# The r_w / r_r / r_t biases [H] when the encoder owns them for every layer.
SharedBiases = Tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]

ErnieDocOutput = namedtuple("ErnieDocOutput",
                            ["sequence_output", "pooled_output", "memories", "memory_mask"])


def activation(name: str) -> Callable[[paddle.Tensor], paddle.Tensor]:
    """config.hidden_act → the function (elementwise, any shape)."""
    if name == "gelu":
        return lambda x: F.gelu(x, approximate=False)  # the official exact erf form
    if name in ("gelu_new", "gelu_approximate"):
        return lambda x: F.gelu(x, approximate=True)
    return getattr(F, name)


class FeedForward(nn.Layer):
    def __init__(self, config: ErnieDocConfig):
        super().__init__()
        std = config.initializer_range
        self.linear1 = Linear(config.hidden_size, config.intermediate_size,
                                 weight_attr=truncated_normal(std))
        self.linear2 = Linear(config.intermediate_size, config.hidden_size,
                                 weight_attr=truncated_normal(std))
        self.act = activation(config.hidden_act)
        # 0 in the official code (hard-coded); PaddleNLP configs may set it.
        self.dropout = nn.Dropout(config.relu_dropout, mode="upscale_in_train")

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """[B,T,H] → [B,T,H]."""
        return self.linear2(self.dropout(self.act(self.linear1(x))))


class ErnieDocLayer(nn.Layer):
    """Post-LN block: y1 = LN(x + drop(attn)); y = LN(y1 + drop(ffn(y1)))."""

    def __init__(self, config: ErnieDocConfig,
                 shared_biases: Optional[SharedBiases] = None):
        super().__init__()
        self.attn = RelativeMultiHeadAttention(config, shared_biases)
        self.ffn = FeedForward(config)
        self.norm1 = nn.LayerNorm(config.hidden_size, epsilon=config.epsilon)
        self.norm2 = nn.LayerNorm(config.hidden_size, epsilon=config.epsilon)
        self.dropout1 = nn.Dropout(config.hidden_dropout_prob, mode="upscale_in_train")
        self.dropout2 = nn.Dropout(config.hidden_dropout_prob, mode="upscale_in_train")

    def forward(self, x: paddle.Tensor, memory: Optional[paddle.Tensor], pos_emb: paddle.Tensor,
                task_emb: Optional[paddle.Tensor], key_task_ids: Optional[paddle.Tensor],
                mask_bias: Optional[paddle.Tensor]) -> paddle.Tensor:
        """x [B,T,H] → [B,T,H]; the other arguments as RelativeMultiHeadAttention.forward."""
        x = self.norm1(x + self.dropout1(
            self.attn(x, memory, pos_emb, task_emb, key_task_ids, mask_bias)))
        return self.norm2(x + self.dropout2(self.ffn(x)))


class ErnieDocEncoder(nn.Layer):
    """The layers, and the r_w / r_r / r_t biases when the layers share them."""

    def __init__(self, config: ErnieDocConfig):
        super().__init__()
        shared = None
        if config.rel_pos_params_sharing:
            std = config.initializer_range
            self.r_w_bias = self.create_parameter([config.hidden_size], attr=truncated_normal(std))
            self.r_r_bias = self.create_parameter([config.hidden_size], attr=truncated_normal(std))
            self.r_t_bias = self.create_parameter([config.hidden_size], attr=truncated_normal(std))
            shared = (self.r_w_bias, self.r_r_bias, self.r_t_bias)
        self.layers = nn.LayerList([ErnieDocLayer(config, shared)
                                    for _ in range(config.num_hidden_layers)])


class ErnieDocPooler(nn.Layer):
    """tanh(dense(h[:, cls_token_idx])); the official reader puts [CLS] last (index -1)."""

    def __init__(self, config: ErnieDocConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size,
                               weight_attr=truncated_normal(config.initializer_range))
        self.cls_token_idx = config.cls_token_idx

    def forward(self, sequence_output: paddle.Tensor) -> paddle.Tensor:
        """[B,T,H] → [B,H]."""
        return paddle.tanh(self.dense(sequence_output[:, self.cls_token_idx]))


def _int_shape(t: paddle.Tensor) -> List[int]:
    """t.shape as Python ints: what the dygraph input checks compare and print."""
    return [int(d) for d in t.shape]


class ErnieDocModel(SegmentReader, PretrainedMixin, nn.Layer):
    """The ERNIE-Doc encoder (the official `ernie-doc/model/static/ernie.py` and
    `transformer_encoder.py`)."""

    def __init__(self, config: ErnieDocConfig):
        super().__init__()
        if not isinstance(config, ErnieDocConfig):
            config = ErnieDocConfig.from_any(config)
        self.config = config
        # Refuse weights that cannot fit before allocating them (a hostile or mistyped
        # config.json can ask for terabytes).
        resources.check_fits({"weights": 4 * config.min_parameters},
                             f"ErnieDocModel(hidden_size={config.hidden_size}, num_hidden_layers="
                             f"{config.num_hidden_layers}, vocab_size={config.vocab_size})")
        # Built in the same order as PaddleNLP so state_dict orders match.
        self.encoder = ErnieDocEncoder(config)
        self.embeddings = ErnieDocEmbeddings(config)
        self.pooler = ErnieDocPooler(config)
        # Activation recompute (gradient checkpointing) of each encoder layer in training;
        # a runtime switch, not a config field: saved configs and state_dict are unchanged.
        self.recompute = False
        # Keep the memories attached (gradients reach earlier segments): an explanation's
        # gradient pass only (ernie_doc.explain); a runtime switch like `recompute`.
        self.memory_gradient = False
        # Whether every row has one task type, set by a compiled step (it cannot look at the
        # values while tracing); None = look.
        self.uniform_task_types: Optional[bool] = None

    @property
    def memory_len(self) -> int:
        return 0 if self.config.recurrence == "none" else self.config.memory_len

    def init_memories(self, batch_size: int, dtype: str = "float32") -> Optional[paddle.Tensor]:
        """Zero memories [L,B,M,H] (the official start state), or None without recurrence."""
        if not self.memory_len:
            return None
        c = self.config
        return paddle.zeros([c.num_hidden_layers, batch_size, self.memory_len, c.hidden_size],
                            dtype=dtype)

    # -- input checks (dygraph only: exported programs see symbolic shapes) -------------------
    def _check_inputs(self, input_ids, memories, token_type_ids, attention_mask, reset_memory,
                      memory_mask):
        c = self.config
        if len(input_ids.shape) != 2:
            raise ModelInputError(f"input_ids must be [batch, seq_len] int64, got shape "
                                  f"{_int_shape(input_ids)}")
        if input_ids.dtype not in (paddle.int64, paddle.int32):
            raise ModelInputError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
        batch, seg_len = _int_shape(input_ids)
        if seg_len > c.max_position_embeddings:
            raise ModelInputError(f"input_ids has seq_len {seg_len} > max_position_embeddings "
                                  f"{c.max_position_embeddings}: split the document into segments")
        if self.memory_len and seg_len < 1:
            raise ModelInputError("input_ids has seq_len 0")
        if batch and seg_len:
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= c.vocab_size:
                raise ModelInputError(f"input_ids values must be in [0, {c.vocab_size}), got "
                                      f"min {lo} max {hi}")
        for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
            if t is not None and _int_shape(t) != [batch, seg_len]:
                raise ModelInputError(f"{name} must have the shape of input_ids "
                                      f"{[batch, seg_len]}, got {_int_shape(t)}")
        if token_type_ids is not None and batch and seg_len:
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi >= c.task_type_vocab_size:
                raise ModelInputError(f"token_type_ids values must be in [0, "
                                      f"{c.task_type_vocab_size}), got min {lo} max {hi}")
        check_reset_memory(reset_memory, batch)
        if memories is not None and self.memory_len:
            want = [c.num_hidden_layers, batch, self.memory_len, c.hidden_size]
            if _int_shape(memories) != want:
                raise ModelInputError(f"memories must be [layers, batch, memory_len, hidden] = "
                                      f"{want}, got {_int_shape(memories)}")
        if memory_mask is not None:
            if not c.mask_empty_memory:
                raise ModelInputError("memory_mask given but config.mask_empty_memory is False")
            if _int_shape(memory_mask) != [batch, self.memory_len]:
                raise ModelInputError(f"memory_mask must be [batch, memory_len] = "
                                      f"{[batch, self.memory_len]}, got {_int_shape(memory_mask)}")

    def _memory_keys(self, memories: Optional[paddle.Tensor],
                     reset_memory: Optional[paddle.Tensor], token_type_ids: paddle.Tensor,
                     batch: int) -> Tuple[Optional[paddle.Tensor], paddle.Tensor]:
        """→ (the memories this segment reads [L, B, M, H]: given, reset where asked, or fresh
        (None without memory); the task type of every key, memory slots first [B, M+T])."""
        mem_len = self.memory_len
        if mem_len:
            if memories is None:
                memories = self.init_memories(batch)
            elif reset_memory is not None:
                memories = reset_rows(memories, reset_memory, batch_axis=1)
            # Memory slots take the task type of the row's first token (the official code
            # takes batch row 0's for every row).
            key_task_ids = paddle.concat(
                [paddle.expand(token_type_ids[:, :1], [batch, mem_len]), token_type_ids], axis=1)
        else:
            memories = None
            key_task_ids = token_type_ids
        return memories, key_task_ids

    def forward(self, input_ids: paddle.Tensor, memories: Optional[paddle.Tensor] = None,
                token_type_ids: Optional[paddle.Tensor] = None,
                attention_mask: Optional[paddle.Tensor] = None,
                reset_memory: Optional[paddle.Tensor] = None,
                memory_mask: Optional[paddle.Tensor] = None) -> ErnieDocOutput:
        """The contract is the module docstring's: input_ids [B,T] … → ErnieDocOutput."""
        c = self.config
        if paddle.in_dynamic_mode():
            self._check_inputs(input_ids, memories, token_type_ids, attention_mask,
                               reset_memory, memory_mask)
            check_plain_call(self, input_ids, memories, reset_memory, attention_mask)
        input_ids = input_ids.astype("int64")
        batch, seg_len = input_ids.shape[0], input_ids.shape[1]
        mem_len = self.memory_len
        memories_given = memories is not None
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids)
        token_type_ids = token_type_ids.astype("int64")

        memories, key_task_ids = self._memory_keys(memories, reset_memory, token_type_ids,
                                                   batch)

        # Additive mask [B,n,T,K]: −1e9 unless query and key are real.
        mask_bias, new_memory_mask = encoder_attention_bias(
            attention_mask, memory_mask, reset_memory, memories_given, batch, seg_len, mem_len,
            c.num_attention_heads, c.mask_empty_memory)

        pos_ids = relative_position_ids(seg_len, mem_len, c.max_position_embeddings,
                                        c.relative_position_mapping)
        x = self.embeddings.words(input_ids)
        pos_emb = self.embeddings.positions(pos_ids, batch)
        task_emb, task_ids = self.embeddings.tasks(key_task_ids)
        uniform = self.uniform_task_types
        if uniform is None:
            uniform = paddle.in_dynamic_mode() and \
                bool((token_type_ids == token_type_ids[:, :1]).all())
        if task_ids is not None and uniform:
            # One task type per row: the term cancels in the softmax. Skipping it also keeps
            # the task parameters without a gradient, so Adam and weight decay leave them be.
            task_emb = None

        new_memories = []
        for i, layer in enumerate(self.encoder.layers):
            mem_i = memories[i] if mem_len else None
            if self.recompute and paddle.in_dynamic_mode() and paddle.is_grad_enabled():
                # Keep only the layer inputs; backward reruns the layer (same RNG state, so
                # the same dropout masks): activation memory traded for a second forward.
                # Wherever a graph is built: training, or an explanation's gradient pass.
                out = recompute(layer, x, mem_i, pos_emb, task_emb, task_ids, mask_bias)
            else:
                out = layer(x, mem_i, pos_emb, task_emb, task_ids, mask_bias)
            if mem_len:
                new_memories.append(update_memory(mem_i, memory_source(c.recurrence, x, out),
                                                  mem_len, detach=not self.memory_gradient))
            x = out
        pooled = self.pooler(x)
        return ErnieDocOutput(x, pooled, paddle.stack(new_memories) if mem_len else None,
                              new_memory_mask)
