"""The OpenKP head: n-gram CNNs over the first sub-token of each word (JointKPE / ETC setting,
as the ERNIE-Doc paper describes it: five CNNs with kernel sizes 1..5, binary cross-entropy).

    sequence [B, T, H] ─dropout─▶ gather word_index [B, T] ─▶ words [B, T, H]
      ─Conv1D(H, H, kernel n) + ReLU, n = 1..5─▶ n-grams [B, T−n+1, H]
      ─dropout─▶ linear_n(H, 1) ─pad to T─▶ logits [B, T, 5]

logits[b, i, n−1] scores the n-gram that starts at the i-th word of row b's window. Only the
n-grams whose n words all lie in the window mean anything; the task masks the rest.

`word_index` is a per-segment target: the task hands it to forward through
Task.model_inputs, so the n-gram layers run inside forward (data parallelism must see every
parameter used there). Every parameter lives in this layer, so from_pretrained /
save_pretrained cover the whole model, and the n-gram sizes follow from the config alone (a
saved model rebuilds without arguments).

Export (ernie_doc.predict.engine) feeds word_index [B, T] int64 after the encoder's inputs (the head
declares it in export_inputs) and returns logits [B, T, 5]; the Predictor checks its values lie
in [0, T).
"""
from collections import namedtuple
from typing import List

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ernie_doc.auto import register_head
from ernie_doc.heads import ExportInput, Head
from ernie_doc.modeling.attention import truncated_normal

MAX_GRAM = 5   # longest phrase scored (the paper's kernel sizes 1..5)

KeyphraseOutput = namedtuple("KeyphraseOutput",
                             ["logits", "memories", "memory_mask", "encoder"])
KeyphraseOutput.__doc__ = """logits [B, T, 5] float32 (None when forward got no word_index) ·
memories [L, B, M, H] · memory_mask [B, M] or None · encoder: the ErnieDocOutput without its
pooled_output (None)."""


@register_head("keyphrase")   # the task folders' register_heads() imports this module
class ErnieDocForKeyphrase(Head):
    """Encoder + five n-gram CNNs (kernel 1..5, H → H channels, ReLU) + one linear scorer per
    n-gram length."""
    uses_pooled = False
    exportable = True   # with word_index as an extra input (export_inputs)

    def __init__(self, config, dropout=None):
        super().__init__(config, dropout)
        H, std = self.config.hidden_size, self.config.initializer_range
        self.ngram_convs = nn.LayerList([
            # NCL, paddle's default layout: oneDNN (paddle.inference) runs an NLC conv in the
            # wrong layout on paddle 2.6. The weights [H, H, n] are the same either way.
            nn.Conv1D(H, H, n, weight_attr=truncated_normal(std))
            for n in range(1, MAX_GRAM + 1)])
        self.ngram_scorers = nn.LayerList([self._linear(1) for _ in range(MAX_GRAM)])

    def logits_shape(self, batch: int, seq_len: int) -> List[int]:
        return [batch, seq_len, MAX_GRAM]

    def export_inputs(self, batch: int, seq_len: int) -> List[ExportInput]:
        # int64 like the encoder's integer inputs (the task's int32 target is cast in
        # score_words either way); a position past the window would gather out of bounds
        return [ExportInput("word_index", [batch, seq_len], "int64", seq_len,
                            "[batch, seq_len]: token position of each window word, 0 on "
                            "padding")]

    def score_words(self, sequence_output, word_index):
        """sequence_output [B, T, H], word_index [B, T] (token position of each window word,
        padding anywhere, e.g. 0) → n-gram logits [B, T, 5] float32."""
        B, T = word_index.shape[0], word_index.shape[1]
        seq = self.dropout(sequence_output)
        index = word_index.astype("int64").unsqueeze(-1).expand([B, T, seq.shape[-1]])
        words = paddle.take_along_axis(seq, index, axis=1)            # [B, T, H]
        channels = words.transpose([0, 2, 1])                          # [B, H, T]
        logits = []
        for n, (conv, scorer) in enumerate(zip(self.ngram_convs, self.ngram_scorers), 1):
            grams = F.relu(conv(channels)).transpose([0, 2, 1])        # [B, T−n+1, H]
            score = scorer(self.dropout(grams))                        # [B, T−n+1, 1]
            if n > 1:
                # n-grams running past the last slot do not exist: zeros up to T (masked by
                # the task). Concatenated rather than F.pad: paddle 2.6's static pad takes no
                # 2-D input, and 3.x's oneDNN pad kernel rejects the 3-D one at inference.
                # T ≥ 5 > n − 1 (the segmenter's minimum), so `words` has the rows to copy.
                zeros = paddle.zeros_like(words[:, :n - 1, :1], dtype=score.dtype)
                score = paddle.concat([score, zeros], axis=1)          # [B, T, 1]
            logits.append(score.squeeze(-1))                           # [B, T]
        return paddle.stack(logits, axis=-1).astype("float32")

    def forward(self, input_ids, memories=None, token_type_ids=None, attention_mask=None,
                reset_memory=None, memory_mask=None, word_index=None):
        """The encoder's arguments + word_index [B, T] → KeyphraseOutput."""
        enc = self.ernie_doc(input_ids, memories, token_type_ids, attention_mask, reset_memory,
                             memory_mask)
        logits = None if word_index is None else self.score_words(enc.sequence_output,
                                                                  word_index)
        return KeyphraseOutput(logits, enc.memories, enc.memory_mask, self._visible(enc))
