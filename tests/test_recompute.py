"""ErnieDocModel.recompute: per-layer activation recompute gives the same loss, gradients and
memories as the plain run (dropout included: the forward RNG state is replayed in backward)."""
import numpy as np
import paddle
import pytest
from helpers import tiny_config

from ernie_doc import ErnieDocModel


def _inputs(config, batch=3, seed=0):
    """Two segments (ids, types, mask); the second has padding and two token types, so the
    layers see a mask bias and a task-embedding term; the first neither."""
    rng = np.random.RandomState(seed)
    T = config.max_position_embeddings
    segs = []
    for s in range(2):
        ids = rng.randint(4, config.vocab_size, (batch, T)).astype("int64")
        types = np.zeros((batch, T), "int64")
        mask = np.ones((batch, T), "float32")
        if s == 1:
            types[0, T // 2:] = 1
            mask[1, T // 2:] = 0
            ids[mask == 0] = config.pad_token_id
        segs.append((paddle.to_tensor(ids), paddle.to_tensor(types), paddle.to_tensor(mask)))
    return segs


def _run(model, segs, recompute, seed=None):
    """Loss over both segments (memory carried), then backward; returns loss, grads, memories."""
    model.recompute = recompute
    model.clear_gradients()
    if seed is not None:
        paddle.seed(seed)
    H = model.config.hidden_size
    proj = paddle.to_tensor(np.random.RandomState(7).randn(H).astype("float32"))
    mem, loss, memories = None, 0.0, []
    for ids, types, mask in segs:
        out = model(ids, mem, types, mask)
        # A fixed random projection: sum() of a LayerNorm output has near-zero gradients.
        loss = loss + (out.sequence_output * proj).sum(-1).mean() + \
            (out.pooled_output * proj).sum(-1).mean()
        mem = out.memories
        memories.append(None if mem is None else mem.numpy())
    loss.backward()
    grads = {name: (None if p.grad is None else p.grad.numpy())
             for name, p in model.named_parameters()}
    return float(loss), grads, memories


def _assert_same(a, b, atol=1e-6):
    loss_a, grads_a, mems_a = a
    loss_b, grads_b, mems_b = b
    assert abs(loss_a - loss_b) <= atol, (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        ga, gb = grads_a[name], grads_b[name]
        assert (ga is None) == (gb is None), name
        if ga is not None:
            np.testing.assert_allclose(ga, gb, rtol=0, atol=atol, err_msg=name)
    for ma, mb in zip(mems_a, mems_b):
        assert (ma is None) == (mb is None)
        if ma is not None:
            np.testing.assert_allclose(ma, mb, rtol=0, atol=atol)


def _count_layer_calls(model):
    calls = [0]

    def hook(layer, inputs, output):
        calls[0] += 1
    handles = [layer.register_forward_post_hook(hook) for layer in model.encoder.layers]
    return calls, handles


def test_flag_is_runtime_only():
    model = ErnieDocModel(tiny_config())
    assert model.recompute is False
    keys = list(model.state_dict())
    config = model.config.to_dict()
    model.recompute = True
    assert list(model.state_dict()) == keys
    assert "recompute" not in config


@pytest.mark.parametrize("recurrence", ["default", "none"])
def test_recompute_matches_without_dropout(recurrence):
    overrides = {} if recurrence == "default" else {"recurrence": "none"}
    config = tiny_config(**overrides)
    model = ErnieDocModel(config)
    model.train()
    segs = _inputs(config)
    calls, handles = _count_layer_calls(model)
    plain = _run(model, segs, recompute=False)
    assert calls[0] == 2 * config.num_hidden_layers           # 2 segments, 1 call per layer
    calls[0] = 0
    again = _run(model, segs, recompute=True)
    # The layers really were recomputed: a second forward of every layer in backward.
    assert calls[0] == 2 * 2 * config.num_hidden_layers
    for h in handles:
        h.remove()
    assert all(g is not None for g in plain[1].values())
    assert any(np.abs(g).max() > 1e-4 for g in plain[1].values())
    if recurrence == "none":
        assert plain[2] == [None, None]                        # mem_i is None in every layer
    _assert_same(plain, again)


def test_recompute_matches_with_dropout():
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                         relu_dropout=0.1)
    model = ErnieDocModel(config)
    model.train()
    segs = _inputs(config)
    plain = _run(model, segs, recompute=False, seed=42)
    again = _run(model, segs, recompute=True, seed=42)
    _assert_same(plain, again)
    # Dropout is really on: another seed gives another loss.
    other = _run(model, segs, recompute=False, seed=43)
    assert abs(other[0] - plain[0]) > 1e-4


def test_recompute_changes_nothing_in_eval_or_no_grad():
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = ErnieDocModel(config)
    segs = _inputs(config)

    def outputs(recompute, seed):
        model.recompute = recompute
        paddle.seed(seed)
        mem, result = None, []
        with paddle.no_grad():
            for ids, types, mask in segs:
                out = model(ids, mem, types, mask)
                mem = out.memories
                result += [out.sequence_output.numpy(), out.pooled_output.numpy(),
                           mem.numpy()]
        return result

    model.eval()
    for a, b in zip(outputs(False, 1), outputs(True, 2)):
        np.testing.assert_array_equal(a, b)
    # Training mode under no_grad (dropout on, same seed): still the same numbers.
    model.train()
    for a, b in zip(outputs(False, 5), outputs(True, 5)):
        np.testing.assert_array_equal(a, b)
