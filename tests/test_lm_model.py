"""Memory-enhanced Transformer-XL language model (ernie_doc.lm.model)."""
import numpy as np
import paddle
import pytest

from ernie_doc.lm.model import (TransformerXLConfig, TransformerXLLM, causal_mask,
                                pad_reshape_rel_shift, sega_dims)
from ernie_doc.modeling.memory import memory_source, update_memory

V, D, H, DH = 30, 24, 2, 6          # d_model 24 → Segatron dims 8, 8, 8


def make_config(**overrides):
    values = dict(n_layer=2, d_model=D, n_head=H, d_head=DH, d_inner=32, dropout=0.0,
                  dropatt=0.0, vocab_size=V, cutoffs=[10, 20], div_val=1, tgt_len=5, mem_len=5,
                  clamp_len=-1, same_length=False, recurrence="enhanced")
    values.update(overrides)
    return TransformerXLConfig(**values)


def make_model(seed=0, scale=0.3, **overrides):
    """Seeded numpy weights (paddle's RNG differs across versions; the default std 0.02 would
    make every attention near-uniform), eval mode."""
    model = TransformerXLLM(make_config(**overrides))
    rng = np.random.RandomState(seed)
    for p in model.parameters():
        p.set_value((rng.standard_normal(p.shape) * scale).astype("float32"))
    model.eval()
    return model


def ids(rng, shape):
    return paddle.to_tensor(rng.randint(0, V, shape).astype("int64"))


def global_positions(batch, start, seg_len, sent_starts=(), para_starts=(), base=(0, 0)):
    """[3, B, T] int64 running counters: token = start + t; the sentence / paragraph counter
    goes up by one at each index of sent_starts / para_starts (base: their values at t=0)."""
    t = np.arange(seg_len)
    sent = base[1] + np.array([sum(s <= k for s in sent_starts) for k in t])
    para = base[0] + np.array([sum(p <= k for p in para_starts) for k in t])
    pos = np.stack([para, sent, start + t])
    return paddle.to_tensor(np.repeat(pos[:, None], batch, axis=1).astype("int64"))


def np_sinusoid(dist, dim):
    inv = 1.0 / (10000.0 ** (np.arange(0, dim, 2) / dim))
    return np.concatenate([np.sin(dist * inv), np.cos(dist * inv)])


def np_direct_scores(model, layer, h, mem, rel_vector, allowed):
    """score[b, n, i, j] = ((q_i + u)·k_j + (q_i + v)·r(b, i, j)) / sqrt(d_head) for every
    allowed (i, j), computed pair by pair; NaN elsewhere. r = r_net(rel_vector(b, i, j))."""
    attn = model.layers[layer].dec_attn
    cat = np.concatenate([mem, h], axis=1)
    B, K, T = cat.shape[0], cat.shape[1], h.shape[1]
    q, k, _ = np.split(cat @ attn.qkv_net.weight.numpy(), 3, axis=-1)
    q = q[:, K - T:].reshape(B, T, H, DH)
    k = k.reshape(B, K, H, DH)
    w_r = attn.r_net.weight.numpy()
    u, v = model.r_w_bias.numpy(), model.r_r_bias.numpy()
    out = np.full((B, H, T, K), np.nan)
    for b in range(B):
        for i in range(T):
            for j in range(K):
                if allowed[i, j]:
                    r = (rel_vector(b, i, j) @ w_r).reshape(H, DH)
                    out[b, :, i, j] = (((q[b, i] + u) * k[b, j]).sum(-1)
                                       + ((q[b, i] + v) * r).sum(-1)) / np.sqrt(DH)
    return out


def model_scores(model, layer, h, mem, positions=None, memory_positions=None):
    T, M = h.shape[1], mem.shape[1]
    rel = model.relative_encoding(T, M, positions, memory_positions)
    score, _ = model.layers[layer].dec_attn.attention_scores(
        paddle.to_tensor(h), paddle.to_tensor(mem), rel, model.r_w_bias, model.r_r_bias,
        model.attention_bias(T, M))
    return score.numpy()


def assert_scores(got, want, allowed):
    mask = np.broadcast_to(allowed, got.shape)
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-4)
    assert got[~mask].max() < -1e29


def expected_allowed(T, M, mem_len, same_length):
    dist = M + np.arange(T)[:, None] - np.arange(M + T)[None, :]
    return (dist >= 0) & ((dist < mem_len) if same_length else True)


# ------------------------------------------------------------------------------------ config
def test_config_defaults_and_round_trip():
    c = TransformerXLConfig()
    assert (c.n_layer, c.d_model, c.n_head, c.d_head, c.d_inner) == (16, 410, 10, 41, 2100)
    assert c.cutoffs == [20000, 40000, 200000] and c.tie_projs == [False, True, True, True]
    assert (c.tgt_len, c.mem_len, c.ext_len, c.recurrence) == (150, 150, 0, "enhanced")
    small = make_config(tie_projs=True, segment_positions=True, cutoffs=(10, 20))
    assert small.cutoffs == [10, 20] and small.tie_projs == [True, True, True]
    again = TransformerXLConfig.from_dict(small.to_dict())
    assert again == small and again.to_dict() == small.to_dict()
    assert sega_dims(410) == (136, 136, 138) and sega_dims(24) == (8, 8, 8)


@pytest.mark.parametrize("key,value", [
    ("n_layer", 0), ("d_model", 23), ("n_head", "2"), ("d_head", 1.5), ("d_inner", True),
    ("dropout", 1.0), ("dropatt", -0.1), ("vocab_size", 0), ("cutoffs", [20, 10]),
    ("cutoffs", [30]), ("cutoffs", 5), ("div_val", 0), ("tie_weight", 1), ("tie_projs", [True]),
    ("tgt_len", 0), ("mem_len", -1), ("ext_len", -2), ("same_length", "yes"),
    ("clamp_len", -2), ("pre_lnorm", None), ("recurrence", "lstm"),
    ("segment_positions", 1), ("sega_relative", "approx"), ("d_embed", 0), ("untie_r", 0),
    ("init_std", 0.0)])
def test_config_errors_name_the_key(key, value):
    with pytest.raises(ValueError) as info:
        make_config(**{key: value})
    assert str(info.value).startswith(key), str(info.value)


def test_config_cross_field_errors():
    with pytest.raises(ValueError, match="^same_length"):
        make_config(same_length=True, mem_len=0)
    with pytest.raises(ValueError, match="^segment_positions"):
        make_config(d_model=4, segment_positions=True)
    with pytest.raises(ValueError, match="^n_layers: unknown"):
        TransformerXLConfig.from_dict(dict(make_config().to_dict(), n_layers=3))


# ----------------------------------------------------------------------- shift, mask, scores
def test_pad_reshape_rel_shift_is_transformer_xl_shift():
    rng = np.random.RandomState(0)
    T, K = 4, 7
    x = rng.standard_normal([2, 3, T, K]).astype("float32")
    got = pad_reshape_rel_shift(paddle.to_tensor(x)).numpy()
    # Transformer-XL's algorithm, literally: zero column on the left, view, drop a row, view.
    padded = np.concatenate([np.zeros([2, 3, T, 1], "float32"), x], axis=-1)
    want = padded.reshape(2, 3, K + 1, T)[:, :, 1:].reshape(2, 3, T, K)
    np.testing.assert_array_equal(got, want)
    for i in range(T):                       # the shift it stands for, on the causal keys
        for j in range(K - T + i + 1):
            np.testing.assert_array_equal(got[..., i, j], x[..., i, j + T - 1 - i])


@pytest.mark.parametrize("T,M,mem_len", [(4, 6, 6), (8, 0, 3), (3, 0, 5), (4, 2, 6), (2, 5, 3)])
def test_causal_and_same_length_masks(T, M, mem_len):
    K = M + T
    for same_length in (False, True):
        got = causal_mask(T, M, mem_len, same_length).numpy()
        np.testing.assert_array_equal(got, expected_allowed(T, M, mem_len, same_length))
        # Transformer-XL's formula (triu/tril) gives the same masked set.
        masked = np.triu(np.ones([T, K]), 1 + M)
        if same_length:
            mask_len = K - mem_len
            masked = masked + np.tril(np.ones([T, K]), -(T - mask_len if mask_len > 0 else T))
        np.testing.assert_array_equal(got, masked == 0)
    if M == mem_len:        # full memory: every query sees exactly mem_len keys (not mem_len+1)
        assert (causal_mask(T, M, mem_len, True).numpy().sum(1) == mem_len).all()


@pytest.mark.parametrize("same_length,clamp_len", [(False, -1), (True, -1), (False, 3),
                                                   (True, 2)])
def test_scores_equal_direct_relative_computation(same_length, clamp_len):
    """The shift of q·R equals q_i·r(distance(i, j)) for every allowed pair, with memory."""
    model = make_model(same_length=same_length, clamp_len=clamp_len, mem_len=4)
    rng = np.random.RandomState(1)
    T, M = 5, 4
    h = rng.standard_normal([2, T, D]).astype("float32")
    mem = rng.standard_normal([2, M, D]).astype("float32")
    allowed = expected_allowed(T, M, 4, same_length)

    def vector(b, i, j):
        dist = M + i - j
        return np_sinusoid(min(dist, clamp_len) if clamp_len > 0 else dist, D)

    for layer in (0, 1):
        want = np_direct_scores(model, layer, h, mem, vector, allowed)
        assert_scores(model_scores(model, layer, h, mem), want, allowed)


def test_clamp_len_clamps_distances():
    model = make_model(clamp_len=2)
    _, table = model.relative_encoding(4, 3)          # distances 6 ... 0
    table = table.numpy()
    for row, dist in enumerate(range(6, -1, -1)):
        np.testing.assert_allclose(table[row], np_sinusoid(min(dist, 2), D), atol=1e-6)
    # Rows 0..4 are distances 6..2, all clamped to 2; row 5 (distance 1) differs.
    np.testing.assert_array_equal(table[0], table[4])
    assert np.abs(table[4] - table[5]).max() > 0.1


# --------------------------------------------------------------------------------- causality
def run(model, x, target, **kw):
    out = model(x, target, **kw)
    return out, out.nll.numpy(), out.hidden.numpy()


@pytest.mark.parametrize("recurrence", ["enhanced", "xl", "none"])
def test_future_tokens_never_change_the_past(recurrence):
    model = make_model(recurrence=recurrence)
    rng = np.random.RandomState(2)
    prev, x, target = ids(rng, [2, 5]), ids(rng, [2, 6]), ids(rng, [2, 6])
    memories = model(prev).memories
    changed = x.numpy().copy()
    changed[:, 3] = (changed[:, 3] + 7) % V
    for mems in (None, memories):
        _, nll_a, hid_a = run(model, x, target, memories=mems)
        _, nll_b, hid_b = run(model, paddle.to_tensor(changed), target, memories=mems)
        np.testing.assert_allclose(hid_b[:, :3], hid_a[:, :3], atol=1e-6)
        np.testing.assert_allclose(nll_b[:, :3], nll_a[:, :3], atol=1e-6)
        assert np.abs(hid_b[:, 3:] - hid_a[:, 3:]).max(axis=(0, 2)).min() > 1e-4
        assert np.abs(nll_b[:, 3:] - nll_a[:, 3:]).max() > 1e-3


@pytest.mark.parametrize("recurrence", ["enhanced", "xl"])
def test_memory_carries_segment_one_into_segment_two(recurrence):
    model = make_model(recurrence=recurrence)
    rng = np.random.RandomState(3)
    seg1, seg2, tgt2 = ids(rng, [2, 5]), ids(rng, [2, 5]), ids(rng, [2, 5])
    out1 = model(seg1, seg1)
    kept = (out1.nll.numpy().copy(), out1.hidden.numpy().copy(), out1.memories.numpy().copy())
    other1 = seg1.numpy().copy()
    other1[:, 0] = (other1[:, 0] + 5) % V        # the oldest token of segment 1
    mem_other = model(paddle.to_tensor(other1)).memories
    _, nll_a, hid_a = run(model, seg2, tgt2, memories=out1.memories)
    _, nll_b, hid_b = run(model, seg2, tgt2, memories=mem_other)
    assert np.abs(hid_a - hid_b).max(axis=(0, 2)).min() > 1e-4    # every position of seg 2
    assert np.abs(nll_a - nll_b).max() > 1e-3
    # Segment 2 (either variant) leaves segment 1's outputs and memory as they were.
    seg2_other = (seg2.numpy() + 1) % V
    model(paddle.to_tensor(seg2_other), tgt2, memories=out1.memories)
    again = model(seg1, seg1)
    for before, tensor in zip(kept, (out1.nll, out1.hidden, out1.memories)):
        np.testing.assert_array_equal(tensor.numpy(), before)
    np.testing.assert_array_equal(again.memories.numpy(), kept[2])
    np.testing.assert_array_equal(again.nll.numpy(), kept[0])


def test_recurrence_none_ignores_memory():
    model = make_model(recurrence="none")
    rng = np.random.RandomState(4)
    x = ids(rng, [2, 5])
    junk = paddle.to_tensor(rng.standard_normal([2, 2, 5, D]).astype("float32"))
    a, b = model(x, x), model(x, x, memories=junk, reset_memory=paddle.to_tensor([True, False]))
    assert a.memories is None and b.memories is None
    np.testing.assert_array_equal(a.nll.numpy(), b.nll.numpy())
    assert make_model(mem_len=0)(x).memories is None


def segment_embedding_grads(model, segments, target):
    """Read `segments` in turn (memories carried), backpropagate the last one's summed nll →
    max |gradient| on each segment's embedding output (0.0 where none arrived)."""
    leaves = []

    def probe(layer, inputs, output):
        leaf = output.detach()
        leaf.stop_gradient = False
        leaves.append(leaf)
        return leaf

    handle = model.word_emb.register_forward_post_hook(probe)
    try:
        memories = None
        for i, seg in enumerate(segments):
            out = model(seg, target if i == len(segments) - 1 else None, memories=memories)
            memories = out.memories
        out.nll.sum().backward()
    finally:
        handle.remove()
    return [0.0 if leaf.grad is None else float(leaf.grad.abs().max()) for leaf in leaves]


@pytest.mark.parametrize("recurrence", ["enhanced", "xl", "none"])
def test_memory_gradient_switch_reaches_earlier_segments(recurrence):
    """model.memory_gradient (a runtime switch: default False, in neither the config nor the
    state_dict): off, the gradient of the last segment's loss wrt the earlier segments'
    embeddings is exactly 0 (detached memories, as in training); on, it reaches them through
    xl's and enhanced's memories, two segments back too; `none` has no memory: 0 either way."""
    model = make_model(recurrence=recurrence)
    assert model.memory_gradient is False
    rng = np.random.RandomState(7)
    segments = [ids(rng, [2, 5]) for _ in range(3)]
    target = ids(rng, [2, 5])
    off = segment_embedding_grads(model, segments, target)
    assert off[:2] == [0.0, 0.0] and off[2] > 0
    model.memory_gradient = True
    on = segment_embedding_grads(model, segments, target)
    if recurrence == "none":
        assert on[:2] == [0.0, 0.0]
    else:
        assert min(on[:2]) > 1e-6, on
    assert on[2] == pytest.approx(off[2], rel=1e-6)   # the segment's own gradient unchanged
    assert "memory_gradient" not in model.config.to_dict()
    assert not any("memory_gradient" in k for k in model.state_dict())


@pytest.mark.parametrize("segment_positions", [False, True])
def test_xl_recurrence_equals_one_long_causal_pass(segment_positions):
    """Transformer-XL's caching is exact: with mem_len ≥ |segment 1|, segment 2 read with
    segment 1's memory equals the second half of one pass over both (relative positions line up
    across the memory boundary). The enhanced recurrence is not that."""
    rng = np.random.RandomState(5)
    x = ids(rng, [2, 10])
    kw1, kw2, kw_all = {}, {}, {}
    if segment_positions:
        pos = global_positions(2, 100, 10, sent_starts=(3, 7), para_starts=(7,), base=(4, 20))
        kw1, kw2, kw_all = {"positions": pos[:, :, :5]}, {"positions": pos[:, :, 5:]}, \
            {"positions": pos}
    results = {}
    for recurrence in ("xl", "enhanced"):
        model = make_model(recurrence=recurrence, mem_len=5, segment_positions=segment_positions)
        whole = model(x, **kw_all).hidden.numpy()
        first = model(x[:, :5], **kw1)
        np.testing.assert_allclose(first.hidden.numpy(), whole[:, :5], atol=1e-5)
        second = model(x[:, 5:], memories=first.memories,
                       memory_positions=first.memory_positions, **kw2).hidden.numpy()
        results[recurrence] = np.abs(second - whole[:, 5:]).max()
    assert results["xl"] < 1e-4
    assert results["enhanced"] > 1e-2


# ---------------------------------------------------------------------------- outputs, memory
def test_nll_is_minus_log_prob_at_targets():
    model = make_model()
    rng = np.random.RandomState(6)
    x = ids(rng, [3, 6])
    target = paddle.to_tensor(np.array([np.arange(0, 30, 5)] * 3).astype("int64") + np.arange(3)
                              [:, None])                      # every cluster of [10, 20]
    out = model(x, target, return_log_probs=True)
    logp = model.crit.log_prob(out.hidden).numpy()
    np.testing.assert_allclose(out.log_probs.numpy(), logp, atol=1e-6)
    want = -np.take_along_axis(logp, target.numpy()[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(out.nll.numpy(), want, rtol=1e-5, atol=1e-5)
    assert out.nll.shape == [3, 6] and out.hidden.shape == [3, 6, D]
    # A shorter target predicts the last positions (an ext_len prefix is context only).
    short = model(x, target[:, 2:])
    np.testing.assert_allclose(short.nll.numpy(), out.nll.numpy()[:, 2:], atol=1e-6)
    assert model(x).nll is None and model(x).log_probs is None


@pytest.mark.parametrize("recurrence", ["enhanced", "xl"])
def test_memories_are_what_memory_source_says(recurrence):
    model = make_model(recurrence=recurrence, mem_len=4)
    seen = []
    hooks = [layer.register_forward_post_hook(
        lambda layer, inputs, output: seen.append((inputs[0], inputs[1], output)))
        for layer in model.layers]
    rng = np.random.RandomState(7)
    out1 = model(ids(rng, [2, 5]))
    x2 = ids(rng, [2, 3])
    del seen[:]
    out2 = model(x2, memories=out1.memories)
    for hook in hooks:
        hook.remove()
    for i, (layer_in, mem_in, layer_out) in enumerate(seen):
        np.testing.assert_array_equal(mem_in.numpy(), out1.memories[i].numpy())
        want = update_memory(mem_in, memory_source(recurrence, layer_in, layer_out), 4)
        np.testing.assert_array_equal(out2.memories[i].numpy(), want.numpy())
        # What the mode means: own output (enhanced) or own input (xl), last 4 positions of
        # [old memory (4); segment (3)].
        mine = (layer_out if recurrence == "enhanced" else layer_in).numpy()
        np.testing.assert_array_equal(out2.memories[i].numpy()[:, 1:], mine)
        np.testing.assert_array_equal(out2.memories[i].numpy()[:, :1],
                                      out1.memories[i].numpy()[:, -1:])
    if recurrence == "xl":       # layer 0 caches the (scaled) word embedding
        np.testing.assert_allclose(out2.memories[0].numpy()[:, 1:],
                                   model.word_emb(x2).numpy(), atol=1e-6)
    else:                        # the last layer caches the final hidden state
        np.testing.assert_array_equal(out2.memories[-1].numpy()[:, 1:], out2.hidden.numpy())
    assert out2.memories.stop_gradient                # detached


def test_memories_differ_between_enhanced_and_xl():
    rng = np.random.RandomState(8)
    x = ids(rng, [2, 5])
    enh = make_model(recurrence="enhanced")(x).memories.numpy()
    xl = make_model(recurrence="xl")(x).memories.numpy()
    # Same weights, no memory yet: xl's layer-1 memory (its input) is enhanced's layer-0 one
    # (layer 0's output); their layer-0 memories differ (embedding vs layer-0 output).
    np.testing.assert_allclose(xl[1], enh[0], atol=1e-6)
    assert np.abs(xl[0] - enh[0]).max() > 0.1


def test_reset_memory_zeroes_a_rows_memory():
    model = make_model()
    rng = np.random.RandomState(9)
    memories = model(ids(rng, [2, 5])).memories
    snapshot = memories.numpy().copy()
    x = ids(rng, [2, 4])
    reset = paddle.to_tensor([True, False])
    out = model(x, x, memories=memories, reset_memory=reset)
    np.testing.assert_array_equal(memories.numpy(), snapshot)         # input not modified
    zeroed = snapshot.copy()
    zeroed[:, 0] = 0.0
    want = model(x, x, memories=paddle.to_tensor(zeroed))
    plain = model(x, x, memories=memories)
    np.testing.assert_array_equal(out.nll.numpy(), want.nll.numpy())
    np.testing.assert_array_equal(out.memories.numpy(), want.memories.numpy())
    np.testing.assert_array_equal(out.nll.numpy()[1], plain.nll.numpy()[1])
    assert np.abs(out.nll.numpy()[0] - plain.nll.numpy()[0]).max() > 1e-3
    # A list of per-layer memories works the same as the stacked tensor.
    listed = model(x, x, memories=[memories[0], memories[1]], reset_memory=reset)
    np.testing.assert_array_equal(listed.nll.numpy(), out.nll.numpy())


def test_same_length_hides_the_oldest_memory_slot():
    rng = np.random.RandomState(10)
    x, memories = ids(rng, [2, 4]), rng.standard_normal([2, 2, 5, D]).astype("float32")
    other = memories.copy()
    other[:, :, 0] += 3.0          # distance ≥ mem_len from every query
    for same_length, changes in ((True, False), (False, True)):
        model = make_model(same_length=same_length, mem_len=5)
        a = model(x, x, memories=paddle.to_tensor(memories)).nll.numpy()
        b = model(x, x, memories=paddle.to_tensor(other)).nll.numpy()
        assert (np.abs(a - b).max() > 1e-3) == changes


def test_ext_len_positions_are_not_cached():
    model = make_model(ext_len=2, mem_len=3)
    rng = np.random.RandomState(11)
    out = model(ids(rng, [2, 6]))
    np.testing.assert_array_equal(out.memories[-1].numpy(), out.hidden.numpy()[:, 1:4])
    with pytest.raises(ValueError, match="ext_len"):
        model(ids(rng, [2, 2]))


# -------------------------------------------------------------------------------- Segatron
def sega_model(mode="exact", **kw):
    return make_model(segment_positions=True, sega_relative=mode, **kw)


def test_segment_positions_errors():
    model = sega_model()
    rng = np.random.RandomState(12)
    x = ids(rng, [2, 5])
    pos = global_positions(2, 0, 5, sent_starts=(2,))
    with pytest.raises(ValueError, match="positions .* required"):
        model(x)
    with pytest.raises(ValueError, match=r"positions must be \[3, batch, seq_len\]"):
        model(x, positions=pos[:, :, :4])
    local = pos.numpy().copy()
    local[2] = [0, 1, 0, 1, 2]                        # token index within the sentence
    with pytest.raises(ValueError, match="non-decreasing"):
        model(x, positions=paddle.to_tensor(local))
    out = model(x, positions=pos)
    with pytest.raises(ValueError, match="memory_positions"):
        model(x, memories=out.memories, positions=pos + 5)
    with pytest.raises(ValueError, match="segment_positions is False"):
        make_model()(x, positions=pos)
    np.testing.assert_array_equal(out.memory_positions.numpy(), pos.numpy())


def sega_case(seed):
    """A 5-token segment with a 4-slot memory, two rows of global positions."""
    rng = np.random.RandomState(seed)
    T, M = 5, 4
    h = rng.standard_normal([2, T, D]).astype("float32")
    mem = rng.standard_normal([2, M, D]).astype("float32")
    pos = np.stack([global_positions(1, 50, 9, (2, 3, 6), (6,), (1, 9)).numpy()[:, 0],
                    global_positions(1, 80, 9, (5,), (1,), (3, 2)).numpy()[:, 0]], axis=1)
    return T, M, h, mem, pos, expected_allowed(T, M, 4, False)


def test_exact_segatron_scores_equal_direct_computation():
    clamp = 4
    model = sega_model(clamp_len=clamp, mem_len=4)
    T, M, h, mem, pos, allowed = sega_case(13)

    def vector(b, i, j):
        parts = []
        for row, dim in zip((2, 1, 0), sega_dims(D)):
            parts.append(np_sinusoid(min(max(pos[row, b, M + i] - pos[row, b, j], 0), clamp),
                                     dim))
        return np.concatenate(parts)

    got = model_scores(model, 1, h, mem, paddle.to_tensor(pos[:, :, M:]),
                       paddle.to_tensor(pos[:, :, :M]))
    assert_scores(got, np_direct_scores(model, 1, h, mem, vector, allowed), allowed)


def test_segatron_mode_scores_equal_segatron_xl_formula():
    """sega_relative='segatron': R[k] = PE(max(window) − window[k]) per row; query i reads
    key j through R[j + T − 1 − i] (Segatron-XL's rel_shift of a per-batch R)."""
    model = sega_model("segatron", clamp_len=6, mem_len=4)
    T, M, h, mem, pos, allowed = sega_case(14)

    def vector(b, i, j):
        k = j + T - 1 - i
        return np.concatenate([np_sinusoid(min(pos[row, b].max() - pos[row, b, k], 6), dim)
                               for row, dim in zip((2, 1, 0), sega_dims(D))])

    got = model_scores(model, 0, h, mem, paddle.to_tensor(pos[:, :, M:]),
                       paddle.to_tensor(pos[:, :, :M]))
    assert_scores(got, np_direct_scores(model, 0, h, mem, vector, allowed), allowed)


@pytest.mark.parametrize("row", [1, 0])           # sentence, paragraph
def test_segment_index_changes_the_queries_that_attend_to_it(row):
    rng = np.random.RandomState(15)
    x, target = ids(rng, [2, 6]), ids(rng, [2, 6])
    prev = ids(rng, [2, 4])
    base = global_positions(2, 10, 6, (2,), (), (0, 3))
    mem_pos = global_positions(2, 6, 4, (), (), (0, 3))
    shifted = base.numpy().copy()
    shifted[row, :, 4:] += 1                  # a new sentence / paragraph starts at token 4
    shifted = paddle.to_tensor(shifted)
    diffs = {}
    for mode in ("exact", "segatron"):
        model = sega_model(mode)
        mem = model(prev, positions=mem_pos)
        kw = dict(memories=mem.memories, memory_positions=mem.memory_positions)
        a = model(x, target, positions=base, **kw).hidden.numpy()
        b = model(x, target, positions=shifted, **kw).hidden.numpy()
        diffs[mode] = np.abs(a - b).max(axis=(0, 2))     # a new boundary before token 4
        # The index of memory slots 0-1 (seen by every query).
        other_mem = mem.memory_positions.numpy().copy()
        other_mem[row, :, :2] -= 1
        c = model(x, target, positions=base, memories=mem.memories,
                  memory_positions=paddle.to_tensor(other_mem)).hidden.numpy()
        diffs[mode, "memory"] = np.abs(a - c).max(axis=(0, 2))
    # exact: the queries that see a key feel its index change, the others never do.
    assert diffs["exact", "memory"].min() > 1e-4
    assert diffs["exact"][4:].min() > 1e-4 and diffs["exact"][:4].max() < 1e-6
    # Segatron-XL's R is indexed by window row and shifted: query i reads key j's encoding
    # from row j + T − 1 − i, measured from the window's last token. A changed boundary in
    # the segment moves max(window), so every query changes, earlier ones included (later
    # positions, not tokens, leak backwards); R rows 0-1 (the memory slots changed) are read
    # only by queries i ≥ T − 2, so queries 0-3 ignore the index of slots they attend to.
    assert diffs["segatron"].min() > 1e-4
    assert diffs["segatron", "memory"][4:].min() > 1e-4
    assert diffs["segatron", "memory"][:4].max() < 1e-6


def test_segatron_modes_agree_without_sentence_structure():
    rng = np.random.RandomState(16)
    x = ids(rng, [2, 6])
    pos = global_positions(2, 40, 6, (), (), (2, 5))  # one sentence: only token distances
    outs = [sega_model(mode, clamp_len=3)(x, x, positions=pos).nll.numpy()
            for mode in ("exact", "segatron")]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)


def test_pre_lnorm_untied_biases_and_adaptive_clusters():
    model = make_model(pre_lnorm=True, untie_r=True, div_val=2, d_embed=16,
                       tie_projs=[False, True, True], recurrence="xl")
    assert model.r_w_bias.shape == [2, H, DH]
    for i in range(3):
        assert model.crit.out_weights[i] is model.word_emb.emb_weights[i]
    assert model.crit.out_projs[0] is not model.word_emb.emb_projs[0]
    assert model.crit.out_projs[2] is model.word_emb.emb_projs[2]
    rng = np.random.RandomState(17)
    x, target = ids(rng, [2, 6]), ids(rng, [2, 6])
    changed = x.numpy().copy()
    changed[:, 4] = (changed[:, 4] + 3) % V
    mem = model(ids(rng, [2, 5])).memories
    a = model(x, target, memories=mem).nll
    b = model(paddle.to_tensor(changed), target, memories=mem).nll.numpy()
    np.testing.assert_allclose(b[:, :4], a.numpy()[:, :4], atol=1e-6)
    assert np.abs(b[:, 4:] - a.numpy()[:, 4:]).max() > 1e-3
    a.mean().backward()
    grad = model.r_w_bias.grad.numpy()
    assert np.abs(grad[0]).max() > 0 and np.abs(grad[1]).max() > 0


# -------------------------------------------------------------------------------- training
def test_training_on_a_repeating_sequence_reduces_the_loss():
    cfg = make_config(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, vocab_size=20,
                      cutoffs=[8], mem_len=6, dropout=0.0)
    model = TransformerXLLM(cfg)
    model.train()
    pattern = np.array([3, 7, 1, 12, 5, 9, 15])
    stream = np.stack([np.tile(pattern, 4)[k:k + 13] for k in range(4)])
    x, y = paddle.to_tensor(stream[:, :-1]), paddle.to_tensor(stream[:, 1:])
    opt = paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())
    losses = []
    for _ in range(30):
        loss = model(x, y).nll.mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    assert losses[0] > 2.0
    assert losses[-1] < 0.1 * losses[0], losses      # measured: 3.39 → 0.037
