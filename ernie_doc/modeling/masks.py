"""The encoder's attention mask: which (query, key) pairs may attend, as an additive bias.

Keys are [memory (M); segment (T)], K = M + T. A segment key is real where attention_mask is 1;
a memory slot is always real, unless config.mask_empty_memory tracks which slots hold document
content (memory_mask [B,M], carried from segment to segment like the memories). A pair is
allowed when both the query and the key are real; disallowed pairs get −MASK_VALUE added to
their score, the official recipe."""
from typing import List, Optional, Tuple

import paddle

from ernie_doc.modeling.attention import MASK_VALUE
from ernie_doc.modeling.memory import reset_rows, update_memory


def memory_slot_mask(memory_mask: Optional[paddle.Tensor], batch: int, mem_len: int,
                     memories_given: bool,
                     reset_memory: Optional[paddle.Tensor]) -> paddle.Tensor:
    """Which memory slots hold content → [B,M] float32. Without memory_mask the zero start
    state is empty and given memories full; reset_memory [B] rows are emptied."""
    if memory_mask is None:
        memory_mask = paddle.full([batch, mem_len], 1.0 if memories_given else 0.0,
                                  dtype="float32")
    memory_mask = memory_mask.astype("float32")
    if reset_memory is not None:
        memory_mask = reset_rows(memory_mask, reset_memory, batch_axis=0)
    return memory_mask


def additive_mask(query_mask: paddle.Tensor, key_mask: paddle.Tensor,
                  bias_shape: List[int]) -> Optional[paddle.Tensor]:
    """query_mask [B,T], key_mask [B,K] → detached bias [B,n,T,K] (0 where both real, else
    −MASK_VALUE); in dygraph None when every key is real."""
    # One exit, no early return: the function is traced by paddle.jit under export.
    bias = None
    if not (paddle.in_dynamic_mode() and bool(key_mask.min() > 0)):
        allowed = query_mask.unsqueeze([1, 3]) * key_mask.unsqueeze([1, 2])
        # Expanded over heads once here: a broadcasting add per layer is slow on CPU.
        bias = paddle.expand(((allowed - 1.0) * MASK_VALUE).detach(), bias_shape)
    return bias


def encoder_attention_bias(
        attention_mask: Optional[paddle.Tensor], memory_mask: Optional[paddle.Tensor],
        reset_memory: Optional[paddle.Tensor], memories_given: bool, batch: int, seg_len: int,
        mem_len: int, num_heads: int, mask_empty_memory: bool
) -> Tuple[Optional[paddle.Tensor], Optional[paddle.Tensor]]:
    """attention_mask [B,T] or None, memory_mask [B,M] or None, reset_memory [B] or None →
    (mask_bias [B,n,T,M+T] or None when nothing is masked, new_memory_mask [B,M] float32
    under mask_empty_memory with memory, else None: the last M of [memory_mask; attention_mask])."""
    use_memory_mask = bool(mask_empty_memory and mem_len)
    mask_bias, new_memory_mask = None, None
    # Without padding or tracked memory every pair is allowed: no bias tensor at all.
    if attention_mask is not None or use_memory_mask:
        query_mask = (paddle.ones([batch, seg_len], dtype="float32") if attention_mask is None
                      else attention_mask.astype("float32"))
        if not mem_len:
            key_mask = query_mask
        elif use_memory_mask:
            memory_mask = memory_slot_mask(memory_mask, batch, mem_len, memories_given,
                                           reset_memory)
            key_mask = paddle.concat([memory_mask, query_mask], axis=1)
            new_memory_mask = update_memory(memory_mask, query_mask, mem_len)
        else:   # memory slots are always real
            key_mask = paddle.concat([paddle.ones([batch, mem_len], dtype="float32"),
                                      query_mask], axis=1)
        mask_bias = additive_mask(query_mask, key_mask,
                                  [batch, num_heads, seg_len, mem_len + seg_len])
    return mask_bias, new_memory_mask
