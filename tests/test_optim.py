"""Optimiser rules through the trainer and `training.optim`, each against numbers worked out
here: gradient accumulation equals the k-times batch, `max_grad_norm` clips the gradients
AdamW steps with, null clipping and epsilon follow the official rule for the warmup, steps
without loss still advance Adam's moments and apply weight decay,
`lr_schedule: official` is the LR of every step, and the two `layer_decay_rule`s take the
steps restated from model/optimization.py and from PaddleNLP."""
import json
import re
from dataclasses import replace

import numpy as np
import pytest
from helpers import tiny_config, tiny_longdep
from safetensors.numpy import load_file

from ernie_doc.run_keys import TrainConfig

BETA1, BETA2 = 0.9, 0.999   # AdamW's betas (training.optim)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def train(out, *overrides):
    """A fine-tuning run in this process → (parameters before training, parameters after),
    numpy by structured name."""
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    from ernie_doc.training.trainer import Trainer
    run = prepare(load_config(None, [*overrides, f"output_dir={out}"]))
    before = {k: v.numpy().copy() for k, v in run.model.state_dict().items()}
    Trainer(run).train()
    return before, {k: v.numpy() for k, v in run.model.state_dict().items()}


def test_grad_accum_steps_equal_a_k_times_batch(tmp_path):
    # One-segment documents read without the retrospective feed: every row is a fresh
    # document whose memory is reset, so micro-steps of 4 rows read exactly the documents
    # one step of 8 rows reads, and every row trains (equal counts: the accumulated loss is
    # the mean of the micro-steps' means, which equals the 8-row mean only then). Adam's
    # epsilon of 1 keeps the update close to linear in the gradient, so a gradient that is
    # not divided by k (or a step taken per micro-step) moves the parameters visibly.
    common = tiny_longdep("retro_feed=false", "adam_epsilon=1.0", "eval_splits=[dev]",
                          train_docs=16, segments=1)
    init, big = train(tmp_path / "big", *common, "batch_size=8", "grad_accum_steps=1")
    init2, accum = train(tmp_path / "accum", *common, "batch_size=4", "grad_accum_steps=2")
    moved = max(float(np.abs(big[k] - init[k]).max()) for k in big)
    assert moved > 1e-3   # the updates are 1000 times the tolerance below
    for k in big:
        np.testing.assert_array_equal(init[k], init2[k], err_msg=k)
        np.testing.assert_allclose(accum[k], big[k], rtol=1e-5, atol=1e-6, err_msg=k)
    a = read_jsonl(tmp_path / "big" / "train_log.jsonl")
    b = read_jsonl(tmp_path / "accum" / "train_log.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):   # the logged loss is the mean over the same 8 rows
        assert ra["lr"] == rb["lr"] and ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)


@pytest.mark.parametrize("layer_decay", [1.0, 0.5])
def test_max_grad_norm_clips_the_global_gradient_norm(layer_decay):
    """The first AdamW step equals the one computed by hand from the gradients scaled by
    max_grad_norm / (their global norm), with every parameter group (layer ratio x decay or
    not) scaled alike -- paddle clips group by group, which once scaled each group by its
    own norm."""
    import paddle
    import paddle.nn.functional as F

    from ernie_doc import ErnieDocForSequenceClassification
    from ernie_doc.training.optim import build_optimizer, paddlenlp_ratio
    model = ErnieDocForSequenceClassification(
        tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    relu_dropout=0.0, classifier_dropout=0.0), num_labels=2)
    ids = paddle.to_tensor(np.random.default_rng(0).integers(5, 60, (3, 16)))
    out = model(ids, model.ernie_doc.init_memories(3))
    F.cross_entropy(out.logits, paddle.to_tensor([[0], [1], [1]])).backward()
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    assert len(params) > 20
    grads = {n: p.grad.numpy().astype(np.float64) for n, p in params}
    before = {n: p.numpy().astype(np.float64) for n, p in params}
    norm = np.sqrt(sum((g ** 2).sum() for g in grads.values()))
    clip = norm / 4   # every gradient is scaled by clip / norm = 1/4
    lr, wd, eps = 0.1, 0.01, 1.0   # epsilon 1: Adam's first step depends on the scale
    cfg = TrainConfig(learning_rate=lr, warmup_proportion=0.0, lr_schedule="linear",
                      weight_decay=wd, layer_decay=layer_decay, layer_decay_rule="paddlenlp",
                      max_grad_norm=clip, adam_epsilon=eps)
    optimizer, _ = build_optimizer(model, cfg, total_steps=10, num_layers=2)
    assert len(optimizer._param_groups) >= (2 if layer_decay == 1.0 else 6)
    optimizer.step()

    def adamw_first_step(name, g):
        # step 1: m̂ = g, v̂ = g²; PaddleNLP's rule: the group's LR ratio scales the step and
        # the decoupled decay, which only matrices get
        rate = lr * paddlenlp_ratio(name, 2, layer_decay)
        decay = wd if before[name].ndim > 1 else 0.0
        return before[name] * (1 - rate * decay) - rate * g / (np.abs(g) + eps)

    far = 0.0
    for name, p in params:
        clipped = grads[name] * clip / max(norm, clip)
        np.testing.assert_allclose(p.numpy(), adamw_first_step(name, clipped), rtol=1e-5,
                                   atol=2e-7, err_msg=name)
        far = max(far, float(np.abs(adamw_first_step(name, grads[name])
                                    - adamw_first_step(name, clipped)).max()))
    assert far > 1e-3   # without clipping the update would be visibly different
    # the next step clips by the next gradients' norm (the clip notices a new step)
    optimizer.clear_grad()
    out = model(ids, model.ernie_doc.init_memories(3))
    (F.cross_entropy(out.logits, paddle.to_tensor([[1], [0], [0]])) * 100).backward()
    grads = [p.grad.numpy().astype(np.float64) for _, p in params]
    scale = clip / np.sqrt(sum((g ** 2).sum() for g in grads))
    clipped = optimizer._grad_clip([(p, p.grad) for _, p in params])
    for (name, _), g, (_, c) in zip(params, grads, clipped):
        np.testing.assert_allclose(c.numpy(), g * scale, rtol=1e-5, atol=1e-9, err_msg=name)


def test_clipping_and_epsilon_default_to_the_official_rule_for_the_warmup():
    """model/optimization.py: with warmup steps, Adam with ε 1e-8 and no clipping; without
    (its constant-LR branch), ε 1e-6 and GradientClipByGlobalNorm(1.0). max_grad_norm and
    adam_epsilon default to null, which follows that rule for the run's warmup (a run too
    short for one warmup step, 9 x 0.1, has none, as in the official scripts); a value given
    is kept whatever the warmup; the log line says which."""
    from ernie_doc.run_config import DEFAULTS
    from ernie_doc.training.optim import build_optimizer, describe_optimizer
    assert DEFAULTS["max_grad_norm"] is None and DEFAULTS["adam_epsilon"] is None
    model, _ = tiny_classifier()
    base = TrainConfig(learning_rate=1e-3, lr_schedule="official", weight_decay=0.0,
                       layer_decay=1.0, layer_decay_rule="official", warmup_proportion=0.1,
                       max_grad_norm=None, adam_epsilon=None)

    def built(total_steps, **given):
        optimizer, _ = build_optimizer(model, replace(base, **given), total_steps, num_layers=0)
        clip = optimizer._grad_clip
        return (clip.clip_norm if clip is not None else None), optimizer._epsilon

    assert built(20) == (None, 1e-8)                        # warmup 2
    assert built(20, warmup_proportion=0.0) == (1.0, 1e-6)
    assert built(9) == (1.0, 1e-6)                          # int(9 x 0.1) = 0
    assert built(9, warmup_steps=3) == (None, 1e-8)
    assert built(9, max_grad_norm=0.0, adam_epsilon=1e-8) == (None, 1e-8)
    assert built(20, max_grad_norm=0.5, adam_epsilon=1e-6) == (0.5, 1e-6)
    assert describe_optimizer(base, 9) == (
        "optimizer: AdamW, official schedule, peak lr 0.001, warmup 0 of 9 steps, gradients "
        "clipped to global norm 1, epsilon 1e-06 (max_grad_norm and adam_epsilon null: the "
        "official code's values without warmup)")
    assert describe_optimizer(replace(base, adam_epsilon=1e-6), 20) == (
        "optimizer: AdamW, official schedule, peak lr 0.001, warmup 2 of 20 steps, no gradient "
        "clipping, epsilon 1e-06 (max_grad_norm null: the official code's values with warmup)")


# -- a run whose steps 1, 2, 5, 6 carry no loss (skim pass) and steps 3, 4, 7, 8 do -----------
STEPS, WARMUP, PEAK, DECAY = 8, 2, 0.01, 0.1


def official_lr(step):
    """The official schedule (ERNIE-Doc's model/optimization.py, linear_warmup_decay): the
    LR of the optimizer step `step` (1-based) reads the global step g = step − 1: g/warmup
    during warmup, then 1 − g/total (it jumps at the end of warmup)."""
    g = step - 1
    return PEAK * (g / WARMUP if g < WARMUP else 1.0 - g / STEPS)


@pytest.fixture(scope="module")
def skim_run(tmp_path_factory):
    """8 documents of 2 segments over 4 rows with the retrospective feed: each row reads
    skim, skim, retro, retro twice, all rows in step (8 steps)."""
    out = tmp_path_factory.mktemp("skim") / "run"
    train(out, *tiny_longdep("lr_schedule=official", "warmup_proportion=0.25",
                             f"weight_decay={DECAY}", f"learning_rate={PEAK}",
                             "save_steps=1", f"keep_checkpoints={STEPS + 2}"))
    return out


def test_lr_schedule_official_through_the_trainer(skim_run):
    log = read_jsonl(skim_run / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, STEPS + 1))
    assert [r["lr"] for r in log] == pytest.approx([official_lr(s) for s in log and
                                                    range(1, STEPS + 1)], rel=1e-6)
    # 0, .005, then the jump to (1 - 2/8) of the peak where a linear decay would give the peak
    assert log[2]["lr"] == pytest.approx(0.0075)
    assert ["loss" in r for r in log] == [False, False, True, True] * 2


def test_steps_without_loss_still_update_adam_moments_and_weight_decay(skim_run):
    """README: "steps whose rows carry no loss (e.g. all rows skimming) still update Adam's
    moments and apply weight decay" (as the official optimizer does). Step 5 carries no loss
    (a new document's skim pass) after two steps that did: its update is AdamW's with a zero
    gradient, counted as step 5 in the bias corrections."""
    ckpt = skim_run / "checkpoints"
    p4, p5 = (load_file(str(ckpt / f"step-{s}" / "model.safetensors")) for s in (4, 5))
    o4, o5 = (load_file(str(ckpt / f"step-{s}" / "optimizer.safetensors")) for s in (4, 5))
    lr, t = official_lr(5), 5
    decayed = undecayed = moved = 0
    trained = [name for name in p4 if f"{name}_moment1_0" in o4]
    # the task-type path (token types, its norm and attention term) never runs on all-zero
    # token types (the model's shortcut): no gradient ever, so no Adam state and no weight
    # decay either -- paddle skips a parameter without a gradient
    untouched = sorted(set(p4) - set(trained))
    assert len(trained) >= 24 and untouched and all(
        any(part in n for part in ("token_type", "norms.2", "r_t_bias", "t_proj"))
        for n in untouched), untouched
    for name in untouched:
        np.testing.assert_array_equal(p5[name], p4[name], err_msg=name)
    for name in trained:
        m4, v4 = o4[f"{name}_moment1_0"], o4[f"{name}_moment2_0"]
        assert np.abs(m4).max() > 0, name   # steps 3 and 4 trained every parameter
        m5, v5 = BETA1 * m4, BETA2 * v4     # a zero gradient: the moments only decay
        np.testing.assert_allclose(o5[f"{name}_moment1_0"], m5, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(o5[f"{name}_moment2_0"], v5, rtol=1e-6, err_msg=name)
        # paddle keeps beta^(t+1) after step t: step 5 was counted
        assert o5[f"{name}_beta1_pow_acc_0"] == pytest.approx(BETA1 ** (t + 1), rel=1e-6)
        assert o5[f"{name}_beta2_pow_acc_0"] == pytest.approx(BETA2 ** (t + 1), rel=1e-6)
        m_hat = m5.astype(np.float64) / (1 - BETA1 ** t)
        v_hat = v5.astype(np.float64) / (1 - BETA2 ** t)
        decay = DECAY if p4[name].ndim > 1 else 0.0   # no decay on biases and LayerNorms
        decayed += decay > 0
        undecayed += decay == 0
        expected = p4[name] * (1 - lr * decay) - lr * m_hat / (np.sqrt(v_hat) + 1e-8)
        np.testing.assert_allclose(p5[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
        moved = max(moved, float(np.abs(p5[name] - p4[name]).max()))
    assert decayed > 5 and undecayed > 5 and moved > 1e-3   # a real step, far above rounding


# -- layer-wise decay and weight decay: ERNIE-Doc's model/optimization.py, restated ----------
# The official optimiser runs paddle's Adam at the scheduled lr (p_adam = p_old + Δ_adam(lr)),
# then appends, for every parameter:
#   1. layer-wise decay: p = p_old + ratio·(p_adam − p_old), the ratio by the OFFICIAL name:
#      encoder_layer_l_* → decay^(L−l); a name containing "embedding" (word_, pos_,
#      task_embedding) → decay^(L+1); everything else 1 (the pre_encoder_* LayerNorms, pooled_fc,
#      the heads, the shared encoder_r_*_bias);
#   2. decoupled weight decay: p = p − wd·lr·p_old, the GLOBAL scheduled lr and the value
#      before the step, except names containing "layer_norm" or ending in _bias, _b or .b_0.
# Net per step: p ← p_old + ratio·Δ_adam(lr) − wd·lr·p_old.
# PaddleNLP (`layer_decay_rule: paddlenlp`): the ratio by our name (everything under
# `embeddings.`, its LayerNorms too, gets decay^(L+1)), and AdamW's lr_ratio scales the decay
# as well: p ← p_old + ratio·Δ_adam(lr) − wd·ratio·lr·p_old.
LAYERS, LAYER_DECAY, WD, LD_PEAK, EPS, N_STEPS = 2, 0.8, 0.01, 0.05, 1e-8, 4


def official_rule_ratio(official):
    if official.startswith("encoder_layer"):
        return LAYER_DECAY ** (LAYERS - int(official.split("_")[2]))
    return LAYER_DECAY ** (LAYERS + 1) if "embedding" in official else 1.0


def paddlenlp_rule_ratio(name):
    layer = re.match(r"ernie_doc\.encoder\.layers\.(\d+)\.", name)
    if layer:
        return LAYER_DECAY ** (LAYERS - int(layer.group(1)))
    return LAYER_DECAY ** (LAYERS + 1) if name.startswith("ernie_doc.embeddings.") else 1.0


def official_decays(official):
    return not ("layer_norm" in official or official.endswith(("_bias", "_b", ".b_0")))


class AdamByHand:
    """Paddle's Adam for one parameter, in float64: the moments, the step count t, and
    lr_t = lr·√(1−β2^t)/(1−β1^t), Δ = −lr_t·m/(√v + ε·√(1−β2^t)) (= −lr·m̂/(√v̂ + ε))."""

    def __init__(self):
        self.m = self.v = 0.0
        self.t = 0

    def delta(self, grad, lr):
        self.t += 1
        self.m = BETA1 * self.m + (1 - BETA1) * grad
        self.v = BETA2 * self.v + (1 - BETA2) * grad * grad
        correction = np.sqrt(1 - BETA2 ** self.t)
        lr_t = lr * correction / (1 - BETA1 ** self.t)
        return -lr_t * self.m / (np.sqrt(self.v) + EPS * correction)


def tiny_classifier():
    """A 2-layer classifier without dropout, seeded, and its {name: official name} (every
    parameter has one)."""
    import paddle

    from ernie_doc import ErnieDocForSequenceClassification
    from ernie_doc.checkpoint.names import official_name_map
    paddle.seed(7)
    model = ErnieDocForSequenceClassification(
        tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    relu_dropout=0.0, classifier_dropout=0.0), num_labels=2)
    names = [n for n, _ in model.named_parameters()]
    return model, official_name_map(names, type(model).official_names, prefixed=True)


def backward(model, step):
    """One forward and backward on 3 rows of 16 tokens whose task types vary within each row
    (so the task-embedding path trains too), labels drawn per step."""
    import paddle
    import paddle.nn.functional as F
    rng = np.random.default_rng(step)
    ids = paddle.to_tensor(rng.integers(5, 60, (3, 16)))
    types = paddle.to_tensor(rng.integers(0, 3, (3, 16)))
    out = model(ids, model.ernie_doc.init_memories(3), types)
    F.cross_entropy(out.logits, paddle.to_tensor(rng.integers(0, 2, (3, 1)))).backward()


@pytest.mark.parametrize("rule", ["official", "paddlenlp"])
def test_layer_decay_rules_step_by_step(rule):
    """N_STEPS AdamW steps under a linear schedule (the LR changes every step) equal the
    rule's update restated above, step by step; the other rule's update is visibly
    different, for the weight decay of the decayed layers and the embedding LayerNorms'
    ratio alike."""
    from ernie_doc.training.optim import build_optimizer
    model, official = tiny_classifier()
    cfg = TrainConfig(learning_rate=LD_PEAK, warmup_proportion=0.0, lr_schedule="linear",
                      weight_decay=WD, layer_decay=LAYER_DECAY, layer_decay_rule=rule,
                      max_grad_norm=0.0, adam_epsilon=EPS)
    optimizer, scheduler = build_optimizer(model, cfg, total_steps=N_STEPS, num_layers=LAYERS)
    adam = {name: AdamByHand() for name in official}
    ln_far = decay_far = 0.0
    for g in range(N_STEPS):
        backward(model, g)
        params = dict(model.named_parameters())
        assert all(p.grad is not None for p in params.values())   # task embedding included
        old = {n: p.numpy().astype(np.float64) for n, p in params.items()}
        grads = {n: p.grad.numpy().astype(np.float64) for n, p in params.items()}
        lr = LD_PEAK * (N_STEPS - g) / N_STEPS
        assert optimizer.get_lr() == pytest.approx(lr)
        optimizer.step()
        optimizer.clear_grad()
        scheduler.step()
        for name, p in params.items():
            step = adam[name].delta(grads[name], lr)
            decayed = official_decays(official[name])
            ratios = {"official": official_rule_ratio(official[name]),
                      "paddlenlp": paddlenlp_rule_ratio(name)}
            expected = {
                "official": old[name] + ratios["official"] * step - WD * lr * old[name] * decayed,
                "paddlenlp": old[name] + ratios["paddlenlp"] * step
                - WD * ratios["paddlenlp"] * lr * old[name] * decayed}
            np.testing.assert_allclose(p.numpy(), expected[rule], rtol=1e-5, atol=5e-7,
                                       err_msg=f"step {g + 1}: {name}")
            far = float(np.abs(expected["official"] - expected["paddlenlp"]).max())
            if "layer_norm" in official[name] and official[name].startswith("pre_encoder"):
                ln_far = max(ln_far, far)
            elif decayed and ratios["official"] != 1.0:
                decay_far = max(decay_far, far)
    # the rules differ 10 and 10,000 times the tolerance (atol 5e-7 + rtol 1e-5 of |p| < 0.1)
    assert decay_far > 1e-5 and ln_far > 1e-2, (decay_far, ln_far)


def test_decay_exclusions_and_ratios_by_official_name():
    """Our weight decay goes to the tensors of more than one dimension: exactly the set
    model/optimization.py's name rules decay. The official ratios come through the
    checkpoint name map, also for a model held by a wrapper as paddle.DataParallel holds it
    (`_layers.`)."""
    import paddle

    from ernie_doc.training.optim import decays, layer_ratios
    model, official = tiny_classifier()
    params = dict(model.named_parameters())
    assert {n for n in params if decays(params[n])} == \
        {n for n in params if official_decays(official[n])}
    assert sum(map(official_decays, official.values())) > 10
    ratios = layer_ratios(model, LAYERS, LAYER_DECAY, "official")
    assert ratios == pytest.approx({n: official_rule_ratio(official[n]) for n in params})
    assert ratios["ernie_doc.embeddings.norms.0.weight"] == 1.0
    assert ratios["ernie_doc.embeddings.token_type_emb.weight"] == pytest.approx(0.8 ** 3)
    assert ratios["ernie_doc.encoder.layers.0.norm1.weight"] == pytest.approx(0.8 ** 2)

    class Wrapper(paddle.nn.Layer):
        def __init__(self, inner):
            super().__init__()
            self._layers = inner

    wrapped = layer_ratios(Wrapper(model), LAYERS, LAYER_DECAY, "official")
    assert wrapped == {"_layers." + n: r for n, r in ratios.items()}
    with pytest.raises(ValueError, match="no ERNIE-Doc encoder layer"):
        layer_ratios(paddle.nn.Linear(2, 2), LAYERS, LAYER_DECAY, "official")


def test_without_layer_decay_both_rules_train_alike():
    """layer_decay 1: the two rules build the same groups and take bit-identical steps."""
    from ernie_doc.training.optim import build_optimizer
    after = {}
    for rule in ("official", "paddlenlp"):
        model, _ = tiny_classifier()
        cfg = TrainConfig(learning_rate=LD_PEAK, warmup_proportion=0.0, lr_schedule="linear",
                          weight_decay=WD, layer_decay=1.0, layer_decay_rule=rule,
                          max_grad_norm=0.0)
        optimizer, scheduler = build_optimizer(model, cfg, total_steps=N_STEPS, num_layers=0)
        assert sorted((g["learning_rate"], g["weight_decay"]) for g in optimizer._param_groups) \
            == [(1.0, 0.0), (1.0, WD)]
        for g in range(2):
            backward(model, g)
            optimizer.step()
            optimizer.clear_grad()
            scheduler.step()
        after[rule] = {n: p.numpy() for n, p in model.named_parameters()}
    for name, value in after["official"].items():
        np.testing.assert_array_equal(value, after["paddlenlp"][name], err_msg=name)
