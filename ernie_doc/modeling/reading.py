"""How a fine-tuned model reads one segment (`read`: under the retrospective feed, twice), and
what a call without memories is not: only the first reading, which `check_plain_call` says once
per model, and also when [CLS] is not where the model was fine-tuned to find it or [PAD] comes
without an attention mask."""
import warnings
from typing import Any, Optional

import paddle

from ernie_doc.errors import ModelInputError

# What a plain call is told, at most once per model each. The advice is the head's: a
# classifier's tokenizer lays out its segment from one text (the folder records it), other
# kinds pack several fields their own way.
READ_ADVICE = ("model.read(**inputs) is its reading of a one-segment document laid out by its "
               "folder's tokenizer, ernie_doc.pipeline(<its folder>) of a document of any "
               "length")
PIPELINE_ADVICE = ("ernie_doc.pipeline(<its folder>) reads documents as it was fine-tuned (its "
                   "task lays a segment out from its fields its own way)")
RETRO_FEED = ("this model was fine-tuned to read each segment twice (the retrospective feed): "
              "a call without memories is its first reading only; {advice}")
LAYOUT = ("input_ids: [CLS] (id {id}) is not at position {index} in {rows} of {batch} rows, "
          "where this model was fine-tuned to read it: encode with the tokenizer saved beside "
          "the model (AutoTokenizer.from_pretrained(<its folder>)), or predict with "
          "ernie_doc.pipeline(<its folder>)")
NO_MASK = ("input_ids holds [PAD] (id {id}) in {rows} of {batch} rows and no attention_mask "
           "was given: the model would attend to the padding; pass the tokenizer's "
           "attention_mask too (model(**enc))")


class ReadingWarning(UserWarning):
    """A call to a fine-tuned model that is not the reading it was fine-tuned for."""


class SegmentReader:
    """`read()` for ErnieDocModel and every head: a call of either takes (input_ids, memories,
    token_type_ids, attention_mask, reset_memory, memory_mask, **head inputs) and returns an
    output with `memories` and `memory_mask`. `plain_call_advice`: where a plain call of a
    model that reads twice is sent (the encoder holds its head's)."""
    plain_call_advice = PIPELINE_ADVICE

    def read(self, input_ids: paddle.Tensor, token_type_ids: Optional[paddle.Tensor] = None,
             attention_mask: Optional[paddle.Tensor] = None, retro_feed: Optional[bool] = None,
             **head_inputs: Any) -> Any:
        """input_ids [B, T]: one segment per row, each a whole document laid out as the model's
        own tokenizer lays it → the output (logits [B, ...], memories [L, B, M, H], ...) of the
        reading the model predicts from: the segment from empty memory and, under the
        retrospective feed (config.retro_feed, or `retro_feed`), again with the memory of that
        first reading. Documents longer than one segment: ernie_doc.pipeline or
        ernie_doc.segment_batches."""
        if retro_feed is None:
            retro_feed = bool(getattr(self.config, "retro_feed", None))
        padded = unmasked_padding(self.config, input_ids, attention_mask)
        if padded:
            raise ModelInputError(NO_MASK.format(**padded))
        rows = int(input_ids.shape[0])
        out = self(input_ids, memories=None, token_type_ids=token_type_ids,
                   attention_mask=attention_mask, reset_memory=paddle.ones([rows], "bool"),
                   memory_mask=None, **head_inputs)
        if retro_feed:
            out = self(input_ids, memories=out.memories, token_type_ids=token_type_ids,
                       attention_mask=attention_mask, reset_memory=paddle.zeros([rows], "bool"),
                       memory_mask=out.memory_mask, **head_inputs)
        return out


def unmasked_padding(config: Any, input_ids: paddle.Tensor,
                     attention_mask: Optional[paddle.Tensor]) -> Optional[dict]:
    """Without an attention_mask: the [PAD] id and how many of the rows hold it (NO_MASK's
    fields), or None when no row does (or a mask is given)."""
    if attention_mask is not None or not input_ids.shape[1]:
        return None
    rows = int((input_ids == config.pad_token_id).any(axis=1).astype("int32").sum())
    return {"id": config.pad_token_id, "rows": rows, "batch": input_ids.shape[0]} if rows \
        else None


def check_plain_call(model: Any, input_ids: paddle.Tensor, memories: Any,
                     reset_memory: Any, attention_mask: Any) -> None:
    """On a plain dygraph call (no memories, no reset flags): a ReadingWarning, once per model
    each, when [PAD] comes without an attention_mask and, for a fine-tuned model, when [CLS]
    is not at config.cls_token_idx or the model reads every segment twice (retro_feed)."""
    config = model.config
    if memories is not None or reset_memory is not None or not paddle.in_dynamic_mode():
        return
    said = model.__dict__.setdefault("_reading_said", set())
    padded = unmasked_padding(config, input_ids, attention_mask) if "mask" not in said \
        else None
    if padded:
        said.add("mask")
        warnings.warn(NO_MASK.format(**padded), ReadingWarning)
    if config.cls_token_id is not None and "layout" not in said and input_ids.shape[1]:
        index = config.cls_token_idx
        if -input_ids.shape[1] <= index < input_ids.shape[1]:
            wrong = int((input_ids[:, index] != config.cls_token_id).astype("int32").sum())
            if wrong:
                said.add("layout")
                warnings.warn(LAYOUT.format(id=config.cls_token_id, index=index, rows=wrong,
                                            batch=input_ids.shape[0]), ReadingWarning)
    if config.retro_feed and "retro_feed" not in said:
        said.add("retro_feed")
        warnings.warn(RETRO_FEED.format(advice=model.plain_call_advice), ReadingWarning)
