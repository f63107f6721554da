"""Segment-level recurrence: which tensor each layer caches, reset and update (the paper's core).

- enhanced (ERNIE-Doc, paper eq. 3): layer n caches its own output h_n, so layer n at step τ+1
  attends to [SG(h_n^τ); h_{n-1}^{τ+1}] and context grows without bound.
- xl (Transformer-XL): layer n caches its input h_{n-1}; context grows one segment per layer.
- none: no memory.

Memory carries no gradient, except in an explanation's gradient pass (`detach=False`, the
model's `memory_gradient` switch), which follows a prediction back through it. A row whose
document ends is reset to zeros, exactly the official start-of-evaluation state; nothing here
keeps hidden state."""
from typing import Optional

import paddle

from ernie_doc.errors import ModelInputError


def memory_source(mode: str, layer_input: paddle.Tensor,
                  layer_output: paddle.Tensor) -> paddle.Tensor:
    """The tensor layer n caches under recurrence `mode`."""
    return layer_output if mode == "enhanced" else layer_input


def update_memory(prev: Optional[paddle.Tensor], current: paddle.Tensor,
                  mem_len: int, detach: bool = True) -> paddle.Tensor:
    """Last mem_len positions of [prev; current] along time, detached unless `detach` is False:
    prev [B,M,*] or None, current [B,T,*] → [B,M,*]."""
    seg_len = current.shape[1]
    if prev is None or (isinstance(seg_len, int) and seg_len >= mem_len):
        new = current[:, -mem_len:]
    else:
        new = paddle.concat([prev, current], axis=1)[:, -mem_len:]
    return new.detach() if detach else new


def reset_rows(tensor: paddle.Tensor, reset: paddle.Tensor, batch_axis: int) -> paddle.Tensor:
    """Zero the rows of `tensor` (along batch_axis) where reset [B] is true (bool or 0/1)."""
    shape = [1] * len(tensor.shape)
    shape[batch_axis] = -1
    # A multiply rather than where/expand_as on a bool mask: that does not export on 2.6.2.
    keep = 1.0 - reset.astype(tensor.dtype).reshape(shape)
    return tensor * keep


def check_reset_memory(reset_memory: Optional[paddle.Tensor], batch: int) -> None:
    """reset_memory must be None or [batch] (one flag per row)."""
    if reset_memory is not None and [int(d) for d in reset_memory.shape] != [batch]:
        raise ModelInputError(f"reset_memory must be [batch] = [{batch}], got "
                              f"{[int(d) for d in reset_memory.shape]}")
