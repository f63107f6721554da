"""Adaptive input embedding and projected adaptive log-softmax (ernie_doc.lm.adaptive)."""
import math

import numpy as np
import paddle
import pytest

from ernie_doc.lm.adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax

V, D_EMBED, D_MODEL = 20, 8, 6     # d_embed != d_model: projections exist with div_val 1 too
CONFIGS = [([], 1), ([5, 12], 1), ([], 2), ([5, 12], 2)]
CONFIG_IDS = [f"cutoffs{c}-div{d}" for c, d in CONFIGS]


def randomize(layer, seed, scale=0.7):
    """Overwrite every parameter with seeded numpy values (paddle's RNG differs across versions,
    and the default std 0.02 gives near-uniform softmaxes that would test little)."""
    rng = np.random.RandomState(seed)
    for p in layer.parameters():
        p.set_value((rng.standard_normal(p.shape) * scale).astype("float32"))
    return layer


def tensor(array, dtype="float32"):
    return paddle.to_tensor(np.asarray(array).astype(dtype))


def softmax_layer(cutoffs, div_val, d_embed=D_EMBED, d_model=D_MODEL, seed=0):
    return randomize(ProjectedAdaptiveLogSoftmax(V, d_embed, d_model, cutoffs, div_val), seed)


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("cutoffs,div_val", CONFIGS, ids=CONFIG_IDS)
def test_log_prob_is_normalised(cutoffs, div_val):
    layer = softmax_layer(cutoffs, div_val)
    hidden = tensor(np.random.RandomState(1).standard_normal([7, D_MODEL]) * 2)
    logp = layer.log_prob(hidden).numpy()
    assert logp.shape == (7, V)
    np.testing.assert_allclose(np.exp(logp.astype("float64")).sum(-1), np.ones(7), atol=1e-5)
    assert logp.std(-1).min() > 0.1      # far from uniform: the check above means something
    # Leading axes are kept: [B, T, d_model] → [B, T, V].
    logp3 = layer.log_prob(hidden.reshape([7, 1, D_MODEL])).numpy()
    assert logp3.shape == (7, 1, V)
    np.testing.assert_allclose(logp3[:, 0], logp, atol=1e-6)


@pytest.mark.parametrize("cutoffs,div_val", CONFIGS, ids=CONFIG_IDS)
def test_forward_nll_matches_log_prob(cutoffs, div_val):
    layer = softmax_layer(cutoffs, div_val)
    rng = np.random.RandomState(2)
    batches = [np.arange(V),                       # every id, so every cluster
               rng.randint(0, 5, 9),               # all in the head (shortlist) cluster
               np.array([13, 1, 19, 3, 12])]       # head + last cluster, middle one empty
    for targets in batches:
        hidden = tensor(rng.standard_normal([len(targets), D_MODEL]) * 2)
        nll = layer(hidden, tensor(targets, "int64")).numpy()
        logp = layer.log_prob(hidden).numpy()
        assert nll.shape == (len(targets),)
        np.testing.assert_allclose(nll, -logp[np.arange(len(targets)), targets], atol=1e-6)
    # [B, T] targets with [B, T, d_model] hidden, in token order.
    hidden = tensor(rng.standard_normal([2, 10, D_MODEL]))
    targets = np.arange(V).reshape(2, 10)[:, ::-1].copy()
    nll = layer(hidden, tensor(targets, "int64")).numpy()
    logp = layer.log_prob(hidden).numpy()
    np.testing.assert_allclose(nll, -np.take_along_axis(logp, targets[..., None], -1)[..., 0],
                               atol=1e-6)


def test_forward_computes_only_needed_tail_clusters(monkeypatch):
    layer = softmax_layer([5, 12], 2)
    calls = []
    original = layer._logits
    monkeypatch.setattr(layer, "_logits", lambda h, i: calls.append((i, h.shape[0])) or
                        original(h, i))
    hidden = tensor(np.random.RandomState(3).standard_normal([6, D_MODEL]))
    layer(hidden, tensor([0, 4, 3, 1, 2, 4], "int64"))
    assert calls == [(0, 6)]                       # head only
    calls.clear()
    layer(hidden, tensor([0, 14, 3, 19, 2, 4], "int64"))
    assert calls == [(0, 6), (2, 2)]               # head + the last cluster, its 2 rows only


def test_single_cluster_tied_equals_log_softmax_by_hand():
    emb = randomize(AdaptiveEmbedding(V, D_EMBED, D_EMBED, []), 4)
    layer = randomize(ProjectedAdaptiveLogSoftmax(V, D_EMBED, D_EMBED, []), 5).tie_to(emb)
    assert len(layer.out_projs) == 0 and len(emb.emb_projs) == 0     # d_embed == d_model
    hidden = np.random.RandomState(6).standard_normal([5, D_EMBED])
    weight = emb.emb_weights[0].numpy().astype("float64")
    bias = layer.out_biases[0].numpy().astype("float64")
    expected = np_log_softmax(hidden @ weight.T + bias)
    np.testing.assert_allclose(layer.log_prob(tensor(hidden)).numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("cutoffs,div_val,d_embed,d_model", [
    ([], 1, D_EMBED, D_EMBED), ([5, 12], 1, D_EMBED, D_EMBED), ([5, 12], 1, D_EMBED, D_MODEL),
    ([5, 12], 2, D_EMBED, D_MODEL), ([5, 12], 2, D_EMBED, D_EMBED)])
def test_embedding_by_hand(cutoffs, div_val, d_embed, d_model):
    emb = randomize(AdaptiveEmbedding(V, d_embed, d_model, cutoffs, div_val), 7)
    ids = np.array([[0, 4, 5, 11], [12, 19, 7, 2], [19, 19, 0, 13]])
    out = emb(tensor(ids, "int64")).numpy()
    assert out.shape == (3, 4, d_model)
    ends = [0] + cutoffs + [V]
    for (b, t), token in np.ndenumerate(ids):
        i = int(np.searchsorted(ends, token, side="right")) - 1       # the id's cluster
        if div_val == 1:
            row, proj = emb.emb_weights[0].numpy()[token], (
                emb.emb_projs[0].numpy() if d_embed != d_model else None)
        else:
            row, proj = emb.emb_weights[i].numpy()[token - ends[i]], emb.emb_projs[i].numpy()
            assert row.shape == (d_embed // div_val ** i,)
        vec = row.astype("float64") if proj is None else row.astype("float64") @ proj
        np.testing.assert_allclose(out[b, t], vec * np.sqrt(d_model), atol=1e-5)


def distinct_params(*layers):
    return len(paddle.nn.LayerList(list(layers)).parameters())


@pytest.mark.parametrize("div_val", [1, 2])
def test_tying_shares_objects_and_sums_gradients(div_val):
    cutoffs, tie_projs = [5, 12], [False, True, True]     # WT103's pattern: head proj untied
    emb = randomize(AdaptiveEmbedding(V, D_EMBED, D_MODEL, cutoffs, div_val), 8)
    crit = randomize(ProjectedAdaptiveLogSoftmax(V, D_EMBED, D_MODEL, cutoffs, div_val), 9)
    untied_count = distinct_params(emb, crit)
    # Untied twins holding the values the tied model will have.
    emb2 = AdaptiveEmbedding(V, D_EMBED, D_MODEL, cutoffs, div_val)
    crit2 = ProjectedAdaptiveLogSoftmax(V, D_EMBED, D_MODEL, cutoffs, div_val)
    emb2.set_state_dict(emb.state_dict())
    crit.tie_to(emb, tie_projs=tie_projs)
    crit2.set_state_dict(crit.state_dict())

    src_proj = (lambda i: emb.emb_projs[0]) if div_val == 1 else (lambda i: emb.emb_projs[i])
    for i in range(len(crit.out_weights)):
        assert crit.out_weights[i] is emb.emb_weights[i]
    for i, tie in enumerate(tie_projs):
        assert (crit.out_projs[i] is src_proj(i)) == tie
    n_tied = len(crit.out_weights) + sum(tie_projs)       # div 1: 1 + 2, div 2: 3 + 2
    assert distinct_params(emb, crit) == untied_count - n_tied
    assert distinct_params(emb2, crit2) == untied_count

    ids = tensor(np.arange(V).reshape(2, 10), "int64")
    targets = tensor(np.arange(V)[::-1].copy(), "int64")
    losses = []
    for e, c in ((emb, crit), (emb2, crit2)):
        loss = c(e(ids).reshape([-1, D_MODEL]), targets).sum()
        loss.backward()
        losses.append(float(loss))
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)

    for i in range(len(crit.out_weights)):
        g_emb, g_out = emb2.emb_weights[i].grad.numpy(), crit2.out_weights[i].grad.numpy()
        assert np.abs(g_emb).max() > 1e-4 and np.abs(g_out).max() > 1e-4   # both contribute
        np.testing.assert_allclose(emb.emb_weights[i].grad.numpy(), g_emb + g_out, atol=1e-5)
    if div_val == 1:      # one embedding projection, tied to two softmax projections
        expected = (emb2.emb_projs[0].grad.numpy() + crit2.out_projs[1].grad.numpy()
                    + crit2.out_projs[2].grad.numpy())
        np.testing.assert_allclose(emb.emb_projs[0].grad.numpy(), expected, atol=1e-5)
    else:
        for i in (1, 2):
            expected = emb2.emb_projs[i].grad.numpy() + crit2.out_projs[i].grad.numpy()
            np.testing.assert_allclose(emb.emb_projs[i].grad.numpy(), expected, atol=1e-5)
    # The untied head projection gets only the softmax's gradient.
    np.testing.assert_allclose(crit.out_projs[0].grad.numpy(), crit2.out_projs[0].grad.numpy(),
                               atol=1e-5)


def test_tie_to_rejects_mismatch():
    emb = AdaptiveEmbedding(V, D_EMBED, D_MODEL, [5, 12], 2)
    with pytest.raises(ValueError, match="embedding"):
        ProjectedAdaptiveLogSoftmax(V, D_EMBED, D_MODEL, [5, 13], 2).tie_to(emb)
    with pytest.raises(ValueError, match="tie_projs"):
        ProjectedAdaptiveLogSoftmax(V, D_EMBED, D_MODEL, [5, 12], 2).tie_to(emb,
                                                                          tie_projs=[True])


@pytest.mark.parametrize("cls", [AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax])
@pytest.mark.parametrize("overrides,name", [
    (dict(cutoffs=[12, 5]), "cutoffs"), (dict(cutoffs=[5, 5]), "cutoffs"),
    (dict(cutoffs=[5, V]), "cutoffs"), (dict(cutoffs=[0, 5]), "cutoffs"),
    (dict(div_val=0), "div_val"), (dict(div_val=1.5), "div_val"),
    (dict(d_embed=10, div_val=2), "d_embed"),          # 10 not divisible by 2**2
    (dict(vocab_size=0), "vocab_size"), (dict(d_model=0), "d_model")])
def test_bad_arguments(cls, overrides, name):
    kwargs = dict(vocab_size=V, d_embed=D_EMBED, d_model=D_MODEL, cutoffs=[5, 12], div_val=1)
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)


# -- the adaptive softmax: tail cluster i's head logit is column head_size - i -------------


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_softmax_maps_two_tail_clusters_to_their_head_columns(div_val):
    # V = 6 in clusters [0, 2) head, [2, 4) tail 1, [4, 6) tail 2. Every weight is 0, so
    # each logit is its bias and the hidden state plays no part.
    layer = ProjectedAdaptiveLogSoftmax(6, 4, 4, [2, 4], div_val=div_val)
    for p in layer.parameters():
        p.set_value(np.zeros(p.shape, "float32"))
    log = math.log
    # head columns: words 0, 1, then the cluster logits; Transformer-XL's layout puts tail
    # cluster i at column head_size - i = 4 - i: tail 1 → column 3 (cluster_bias[1]),
    # tail 2 → column 2 (cluster_bias[0]). Head probabilities 0.1 0.2 | 0.3 (tail 2) 0.4
    # (tail 1); inside tail 1: 0.25 0.75; inside tail 2: 0.4 0.6.
    layer.cluster_bias.set_value(np.array([log(3), log(4)], "float32"))
    word_bias = [[log(1), log(2)], [log(1), log(3)], [log(2), log(3)]]
    if div_val == 1:
        layer.out_biases[0].set_value(np.array(sum(word_bias, []), "float32"))
    else:
        for i, b in enumerate(word_bias):
            layer.out_biases[i].set_value(np.array(b, "float32"))
    expected = np.array([0.1, 0.2, 0.4 * 0.25, 0.4 * 0.75, 0.3 * 0.4, 0.3 * 0.6])
    hidden = paddle.to_tensor(np.random.default_rng(0).standard_normal((6, 4)), "float32")
    with paddle.no_grad():
        probs = np.exp(layer.log_prob(hidden).numpy())
        nll = layer(hidden, paddle.arange(6)).numpy()
    np.testing.assert_allclose(probs, np.tile(expected, (6, 1)), rtol=1e-5)
    np.testing.assert_allclose(nll, -np.log(expected), rtol=1e-5)
