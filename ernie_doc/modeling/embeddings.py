"""The three embedding tables, each with its own LayerNorm (eps 1e-5) and dropout.

Only the word embedding enters the encoder; positions and task types enter through attention
(official `ernie-doc/model/static/ernie.py`). Names follow PaddleNLP: word_emb, pos_emb,
token_type_emb, norms.{0,1,2}."""
from typing import Optional, Tuple

import paddle
import paddle.nn as nn

from ernie_doc.config import ErnieDocConfig
from ernie_doc.modeling.attention import truncated_normal

EMBEDDING_LN_EPS = 1e-5  # the official code passes no epsilon here


class ErnieDocEmbeddings(nn.Layer):
    def __init__(self, config: ErnieDocConfig):
        super().__init__()
        hidden, std = config.hidden_size, config.initializer_range
        self.word_emb = nn.Embedding(config.vocab_size, hidden, weight_attr=truncated_normal(std))
        self.pos_emb = nn.Embedding(config.num_position_rows, hidden,
                                    weight_attr=truncated_normal(std))
        self.token_type_emb = nn.Embedding(config.task_type_vocab_size, hidden,
                                           weight_attr=truncated_normal(std))
        self.norms = nn.LayerList([nn.LayerNorm(hidden, epsilon=EMBEDDING_LN_EPS)
                                   for _ in range(3)])
        self.dropouts = nn.LayerList([nn.Dropout(config.hidden_dropout_prob,
                                                 mode="upscale_in_train") for _ in range(3)])
        self.dropout_prob = config.hidden_dropout_prob

    def _noisy(self) -> bool:
        return self.training and self.dropout_prob > 0

    def words(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        """[B,T] → [B,T,H], the encoder input."""
        return self.dropouts[0](self.norms[0](self.word_emb(input_ids)))

    def positions(self, position_ids: paddle.Tensor, batch_size: int) -> paddle.Tensor:
        """[R] row ids → [R,H]; with dropout active, [B,R,H] (the official code draws a
        separate dropout mask per batch row)."""
        emb = self.norms[1](self.pos_emb(position_ids))
        if self._noisy():
            emb = self.dropouts[1](emb.unsqueeze(0).expand([batch_size] + list(emb.shape)))
        return emb

    def tasks(self, key_task_ids: paddle.Tensor
              ) -> Tuple[paddle.Tensor, Optional[paddle.Tensor]]:
        """key_task_ids [B,K] → (table [C,H], key_task_ids), or with dropout active
        (per-key vectors [B,K,H], None)."""
        if self._noisy():
            return self.dropouts[2](self.norms[2](self.token_type_emb(key_task_ids))), None
        return self.norms[2](self.token_type_emb.weight), key_task_ids
