"""PaddleNLP 2.8.1's ErnieDocModel behind our calling convention: the numerical reference for
parity tests and the baseline of tools/benchmark_model.py. Imports paddlenlp lazily."""
import numpy as np
import paddle

from ernie_doc.modeling.attention import relative_position_ids


def official_position_ids(seg_len, mem_len):
    """The official reader's relative-position ids [2T+M]: T+M ids counting down from
    2T+M−1 to T, then 0 … T−1 (reader/batching.get_related_pos)."""
    return np.concatenate([np.arange(2 * seg_len + mem_len - 1, seg_len - 1, -1),
                           np.arange(seg_len)]).astype("int64")


def paddlenlp_config(config):
    from paddlenlp.transformers import ErnieDocConfig as PNConfig
    return PNConfig(
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        hidden_size=config.hidden_size, hidden_dropout_prob=config.hidden_dropout_prob,
        attention_dropout_prob=config.attention_probs_dropout_prob,
        relu_dropout=config.relu_dropout, hidden_act=config.hidden_act,
        memory_len=config.memory_len, vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        task_type_vocab_size=config.task_type_vocab_size, epsilon=config.epsilon,
        initializer_range=config.initializer_range, pad_token_id=config.pad_token_id,
        cls_token_idx=config.cls_token_idx)


class PaddleNLPReference:
    """Runs PaddleNLP's ErnieDocModel with the weights of one of our models.

    __call__(input_ids [B,T], memories [L,B,M,H] or None, token_type_ids [B,T] or None,
    attention_mask [B,T] or None) → (sequence_output, pooled_output, memories [L,B,M,H]).
    The caller's memories are not touched (PaddleNLP overwrites its list argument).
    """

    def __init__(self, model):
        from paddlenlp.transformers import ErnieDocModel as PNModel
        self.config = model.config
        self.model = PNModel(paddlenlp_config(model.config))
        missing = set(self.model.state_dict()) ^ set(model.state_dict())
        if missing:
            raise ValueError(f"state_dict names differ from PaddleNLP's: {sorted(missing)[:5]}")
        self.model.set_state_dict(model.state_dict())
        self.model.train() if model.training else self.model.eval()

    def eval(self):
        self.model.eval()
        return self

    def train(self):
        self.model.train()
        return self

    def clear_gradients(self):
        self.model.clear_gradients()

    def __call__(self, input_ids, memories=None, token_type_ids=None, attention_mask=None):
        c = self.config
        batch, seg_len = input_ids.shape
        if memories is None:
            memories = paddle.zeros([c.num_hidden_layers, batch, c.memory_len, c.hidden_size])
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = paddle.ones([batch, seg_len], dtype="float32")
        # Our model's table rows (for T = P exactly the official reader's ids, so PaddleNLP's
        # own recipe); for T < P this makes the reference follow relative_position_mapping.
        pos = relative_position_ids(seg_len, c.memory_len, c.max_position_embeddings,
                                    c.relative_position_mapping)
        pos = paddle.expand(pos.reshape([1, -1, 1]), [batch, pos.shape[0], 1])
        seq, pooled, new = self.model(
            input_ids.unsqueeze(-1), [memories[i] for i in range(c.num_hidden_layers)],
            token_type_ids.astype("int64").unsqueeze(-1), pos,
            attention_mask.astype("float32").unsqueeze(-1))
        return seq, pooled, paddle.stack(new)
