"""ernie_doc/cost.py: the matmul FLOPs of a forward, against a hand count and against the
products a tiny model's forward actually calls (paddle.matmul and F.linear hooked)."""
import contextlib
import math

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ernie_doc import ErnieDocConfig, ErnieDocModel, cost
from ernie_doc.lm.model import TransformerXLConfig, TransformerXLLM


@contextlib.contextmanager
def counted_products():
    """[FLOPs of each paddle.matmul and F.linear call made inside]: 2 × the output's elements ×
    the contracted dimension (the model's modules look both up at call time)."""
    seen = []
    matmul, linear = paddle.matmul, F.linear

    def counting_matmul(x, y, transpose_x=False, transpose_y=False, name=None):
        out = matmul(x, y, transpose_x, transpose_y)
        seen.append(2 * math.prod(out.shape) * (x.shape[-2] if transpose_x else x.shape[-1]))
        return out

    def counting_linear(x, weight, bias=None, name=None):
        out = linear(x, weight, bias)
        seen.append(2 * math.prod(out.shape) * weight.shape[0])
        return out

    paddle.matmul, F.linear = counting_matmul, counting_linear
    try:
        yield seen
    finally:
        paddle.matmul, F.linear = matmul, linear


def test_forward_matmul_flops_counts_each_product():
    """Hand count for a 1-layer H=4 (I=4H=16) model, B=1, T=3, M=2 (one query block): q and
    out 2·(2·3·4·4), k and v 2·(2·5·4·4), feed-forward 2·(2·3·4·16), scores and the weighted sum
    2·(2·3·5·4), position scores 2·3·(5+2)·4, position rows 2·8·4·4."""
    config = ErnieDocConfig(vocab_size=10, hidden_size=4, num_hidden_layers=1,
                            num_attention_heads=1, memory_len=2, max_position_embeddings=8)
    assert config.intermediate_size == 16
    want = 192 + 320 + 768 + 240 + 168 + 256
    assert cost.forward_matmul_flops(config, 1, 3) == want
    assert cost.forward_matmul_flops(config.replace(num_hidden_layers=3), 2, 3) == \
        3 * (2 * (want - 256) + 256)


@pytest.mark.parametrize("recurrence, seq_len", [("enhanced", 5), ("none", 5), ("xl", 300)],
                         ids=["enhanced", "none", "two-query-blocks"])
def test_ernie_doc_count_equals_the_products_a_forward_calls(recurrence, seq_len):
    """A forward with full memories calls exactly the counted products, plus the pooler's
    (B·H·H, left out of the count); T=300 takes two query blocks (256 + 44)."""
    config = ErnieDocConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2,
                            num_attention_heads=2, memory_len=3, recurrence=recurrence,
                            max_position_embeddings=seq_len)
    model = ErnieDocModel(config)
    model.eval()
    ids = paddle.to_tensor(np.random.RandomState(0).randint(5, 30, (2, seq_len)))
    with paddle.no_grad():
        memories = model(ids, model.init_memories(2)).memories
        with counted_products() as seen:
            model(ids, memories)
    pooler = 2 * 2 * 8 * 8
    assert sum(seen) == cost.forward_matmul_flops(config, 2, seq_len) + pooler


@pytest.mark.parametrize("options", [
    {}, {"segment_positions": True}, {"segment_positions": True, "clamp_len": 4},
    {"segment_positions": True, "sega_relative": "segatron"}, {"recurrence": "none"},
    {"div_val": 2, "d_embed": 16}], ids=["shared", "segatron-exact", "exact-clamped",
                                         "segatron-rows", "no-memory", "div_val"])
def test_language_model_count_equals_the_products_a_forward_calls(options):
    """TransformerXLLM with full memories, every input and target word in the head cluster
    (ids < cutoffs[0]: the tail clusters' softmax, left out of the count, never runs)."""
    config = TransformerXLConfig(n_layer=2, d_model=12, n_head=2, d_head=5, d_inner=20,
                                 vocab_size=40, cutoffs=[20, 30], tgt_len=6, mem_len=4,
                                 **options)
    model = TransformerXLLM(config)
    model.eval()
    batch, seq_len = 2, 6
    rng = np.random.RandomState(0)
    ids = paddle.to_tensor(rng.randint(0, 20, (batch, seq_len)))
    target = paddle.to_tensor(rng.randint(0, 20, (batch, seq_len)))
    positions = np.stack([np.tile(np.arange(seq_len), (batch, 1))] * 3)
    first, second = {}, {}
    if config.segment_positions:
        first = {"positions": paddle.to_tensor(positions)}
        second = {"positions": paddle.to_tensor(positions + seq_len)}
    with paddle.no_grad():
        out = model(ids, target, **first)
        if config.segment_positions:
            second["memory_positions"] = out.memory_positions
        with counted_products() as seen:
            model(ids, target, memories=out.memories, **second)
    assert sum(seen) == cost.lm_forward_matmul_flops(config, batch, seq_len)
