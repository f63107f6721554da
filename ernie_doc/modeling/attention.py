"""Relative multi-head attention over [memory; segment] (the official
`ernie-doc/model/static/transformer_encoder.py`).

Scores per head, with s = d^-0.5 and keys j over [memory; segment]:

    S[a, j] = s(q_a + u)·k_j  +  s(q_a + v)·R[row(a, j)]  +  s(q_a + t)·T_j

u, v, t are the r_w / r_r / r_t biases, R the projected relative-position rows, T_j the
projected task embedding of key j. The first and third terms are computed as one product,
s(q_a + u)·(k_j + T_j) + s(t − u)·T_j, which needs no score tensor for the task term; the
position term goes through gather_rel_shift (XLNet's relative shift, done as one gather).
Equal to the official sum up to fp32 rounding."""
from typing import Optional, Tuple

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ernie_doc.config import QUERY_BLOCK, ErnieDocConfig
from ernie_doc.modeling.linear import Linear, add_broadcast

MASK_VALUE = 1e9  # official additive mask constant (PaddleNLP uses 1e8)


def truncated_normal(std: float) -> paddle.ParamAttr:
    """The official initializer: a normal(0, std) cut at two standard deviations."""
    return paddle.ParamAttr(initializer=nn.initializer.TruncatedNormal(mean=0.0, std=std))


def relative_position_ids(seg_len: int, mem_len: int, max_position: int,
                          mapping: str = "pretrained") -> paddle.Tensor:
    """Position-table row per column of the raw score, [2T+M] int64; column c is distance
    δ = M + T − c. δ ≥ 1: row P−1+δ ("pretrained") or T−1+δ ("official"); δ ≤ 0: row −δ."""
    past_base = (max_position if mapping == "pretrained" else seg_len) - 1
    past = paddle.arange(seg_len + mem_len, 0, -1, dtype="int64") + past_base
    future = paddle.arange(0, seg_len, dtype="int64")
    return paddle.concat([past, future])


def gather_rel_shift(x: paddle.Tensor, key_len: int,
                     offset: Optional[int] = None) -> paddle.Tensor:
    """The encoder's relative shift as one gather: [B, n, T, W] → [B, n, T, key_len],
    out[a, b] = x[a, b + offset − a]. offset = T matches the official reshape/slice exactly
    (faster on CPU than the strided copy)."""
    t, w = x.shape[2], x.shape[3]
    offset = t if offset is None else offset
    rows = paddle.arange(t, dtype="int64").unsqueeze(1) * (w - 1) + offset
    index = (rows + paddle.arange(key_len, dtype="int64").unsqueeze(0)).reshape([-1])
    flat = x.reshape([0, 0, t * w]).flatten(0, 1)
    return paddle.gather(flat, index, axis=1).reshape([-1, x.shape[1], t, key_len])


class RelativeMultiHeadAttention(nn.Layer):
    """Attention of one layer. Names follow PaddleNLP (`q_proj` … `out_proj`, `r_*_bias`)."""

    def __init__(self, config: ErnieDocConfig,
                 shared_biases: Optional[Tuple[paddle.Tensor, paddle.Tensor,
                                               paddle.Tensor]] = None):
        super().__init__()
        hidden, std = config.hidden_size, config.initializer_range
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.hidden_size = hidden
        for name in ("q_proj", "k_proj", "v_proj", "r_proj", "t_proj", "out_proj"):
            setattr(self, name, Linear(hidden, hidden, weight_attr=truncated_normal(std)))
        if shared_biases is None:
            self.r_w_bias = self.create_parameter([hidden], attr=truncated_normal(std))
            self.r_r_bias = self.create_parameter([hidden], attr=truncated_normal(std))
            self.r_t_bias = self.create_parameter([hidden], attr=truncated_normal(std))
        else:
            # Shared biases are owned by the encoder; a plain attribute keeps them out of this
            # layer's parameter list (no duplicate state_dict entries).
            self._shared_biases = shared_biases
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob, mode="upscale_in_train")

    def _biases(self):
        if hasattr(self, "_shared_biases"):
            return self._shared_biases
        return self.r_w_bias, self.r_r_bias, self.r_t_bias

    def _heads(self, x):
        """[..., L, H] → [..., n, L, d]."""
        shape = [0] * (len(x.shape) - 1) + [self.num_heads, self.head_dim]
        x = x.reshape(shape)
        perm = list(range(len(shape)))
        perm[-3], perm[-2] = perm[-2], perm[-3]
        return x.transpose(perm)

    def _task_bias(self, task: paddle.Tensor, coef: paddle.Tensor) -> paddle.Tensor:
        """task [B,K,H] · coef [H], summed per head → [B,n,1,K]. In fp32 dygraph as one product
        with the block-diagonal [H, n] matrix of coef (a broadcast multiply's CPU gradient is
        many times slower); elsewhere (a compiled or bf16 step) the multiply and sum."""
        if not (paddle.in_dynamic_mode() and task.dtype == paddle.float32):
            return self._heads(task * coef).sum(axis=-1).unsqueeze(2)
        n, d = self.num_heads, self.head_dim
        diag = coef.reshape([n, d, 1]) * paddle.eye(n, dtype=coef.dtype).reshape([n, 1, n])
        return paddle.matmul(task, diag.reshape([n * d, n])).transpose([0, 2, 1]).unsqueeze(2)

    def forward(self, x: paddle.Tensor, memory: Optional[paddle.Tensor], pos_emb: paddle.Tensor,
                task_emb: Optional[paddle.Tensor], key_task_ids: Optional[paddle.Tensor],
                mask_bias: Optional[paddle.Tensor]) -> paddle.Tensor:
        """x [B,T,H]; memory [B,M,H] or None; pos_emb [2T+M,H] or [B,2T+M,H]; task_emb [C,H] with
        key_task_ids [B,K], [B,K,H], or None; mask_bias [B,n,T,K] or None → [B,T,H]."""
        context = x if memory is None else paddle.concat([memory, x], axis=1)
        key_len = context.shape[1]
        r_w, r_r, r_t = self._biases()
        scale = self.head_dim ** -0.5

        q = self.q_proj(x)
        keys = self.k_proj(context)
        task = None
        if task_emb is not None:
            if key_task_ids is None:
                task = self.t_proj(task_emb)                               # [B,K,H]
            else:
                # Only C distinct task vectors: project the table, then look the keys up.
                task = F.embedding(key_task_ids, weight=self.t_proj(task_emb))
            keys = keys + task
        keys = self._heads(keys)                                           # [B,n,K,d]
        values = self._heads(self.v_proj(context))
        rel = self._heads(self.r_proj(pos_emb))                            # [(B,)n,R,d]

        q_w = self._heads(add_broadcast(q, r_w) * scale)                   # [B,n,T,d]
        q_r = self._heads(add_broadcast(q, r_r) * scale)
        if len(rel.shape) == 3 and (self.training or (paddle.in_dynamic_mode()
                                                      and paddle.is_grad_enabled())):
            # expand, not a broadcasting matmul: its gradient fails on paddle 3.3.1 CPU
            rel = rel.unsqueeze(0).expand([q_w.shape[0]] + list(rel.shape))
        # s(t − u)·T_j: the task term's correction, one value per key and head
        task_bias = None if task is None else self._task_bias(task, (r_t - r_w) * scale)
        seg_len = q_w.shape[2]
        blocks = []
        for start in range(0, seg_len, QUERY_BLOCK):
            size = min(QUERY_BLOCK, seg_len - start)
            # Query a of the block uses raw position columns T−a … T−a+K−1.
            first = seg_len - start - size + 1
            window = rel[..., first:first + key_len + size - 1, :]
            q_blk = q_r[:, :, start:start + size]
            score = paddle.matmul(q_w[:, :, start:start + size], keys, transpose_y=True)
            score = score + gather_rel_shift(paddle.matmul(q_blk, window, transpose_y=True),
                                             key_len, offset=size - 1)
            if task_bias is not None:
                score = add_broadcast(score, task_bias)
            if mask_bias is not None:
                score = score + mask_bias[:, :, start:start + size]
            weights = self.dropout(F.softmax(score, axis=-1))
            blocks.append(paddle.matmul(weights, values))                 # [B,n,s,d]
        out = blocks[0] if len(blocks) == 1 else paddle.concat(blocks, axis=2)
        out = out.transpose([0, 2, 1, 3]).reshape([0, 0, self.hidden_size])
        return self.out_proj(out)
