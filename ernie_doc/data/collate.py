"""Stack one step's row segments into the arrays the model and the loss read."""
from typing import Any, Dict, List, Optional

import numpy as np

from ernie_doc.data.segment import Segment


def collate(rows: List[Optional[Segment]], resets, seq_len, pad_id,
            template: Optional[Dict] = None) -> Dict[str, np.ndarray]:
    """rows: B segments (None = padding) → {name: [B, T] or [B] array}, one `target_<name>` per
    target; `template` gives an all-padding step the same keys."""
    B = len(rows)
    batch = {
        "input_ids": np.full((B, seq_len), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((B, seq_len), dtype=np.float32),
        "token_type_ids": np.zeros((B, seq_len), dtype=np.int64),
        "reset_memory": np.asarray(resets, dtype=bool).copy(),
        "has_loss": np.zeros(B, dtype=bool),
        "final": np.zeros(B, dtype=bool),
        "doc_index": np.full(B, -1, dtype=np.int64),
        "seg_index": np.zeros(B, dtype=np.int64),
        "is_last": np.zeros(B, dtype=bool),
    }
    if template is None:
        template = next((s.targets for s in rows if s is not None), {})
    for name, value in template.items():
        value = np.asarray(value)
        batch["target_" + name] = np.zeros((B,) + value.shape, dtype=value.dtype)
    for r, s in enumerate(rows):
        if s is None:
            batch["reset_memory"][r] = True   # padding rows never carry memory
            continue
        batch["input_ids"][r] = s.input_ids
        batch["attention_mask"][r] = s.attention_mask
        if s.token_type_ids is not None:
            batch["token_type_ids"][r] = s.token_type_ids
        batch["has_loss"][r], batch["final"][r] = s.has_loss, s.final
        batch["doc_index"][r], batch["seg_index"][r] = s.doc_index, s.seg_index
        batch["is_last"][r] = s.is_last
        for name, value in s.targets.items():
            batch["target_" + name][r] = value
    return batch


class TensorStage:
    """A stream's numpy batches → paddle tensors, one per name (`stage(batch)`).

    On CPU each name's array is copied into a buffer one zero-copy tensor shares, and that tensor
    is cloned (the caller's own copy): a tensor built from an ndarray per step leaks on paddle 3.x
    (docs/design-notes.md). Elsewhere: paddle.to_tensor."""

    def __init__(self):
        self.slots: Dict[str, tuple] = {}   # name → (buffer, the tensor sharing it)

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        import paddle
        if not paddle.get_device().startswith("cpu"):
            return {k: paddle.to_tensor(v) for k, v in batch.items()}
        return {k: self.tensor(k, np.asarray(v)) for k, v in batch.items()}

    def tensor(self, name: str, array: np.ndarray) -> Any:
        import paddle
        slot = self.slots.get(name)
        if slot is None or slot[0].shape != array.shape or slot[0].dtype != array.dtype:
            buffer = np.empty(array.shape, dtype=array.dtype)
            slot = self.slots[name] = (buffer, paddle.Tensor(
                value=buffer, place=paddle.CPUPlace(), zero_copy=True, stop_gradient=True))
        np.copyto(slot[0], array)
        return slot[1].clone()
