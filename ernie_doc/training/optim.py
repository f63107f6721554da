"""AdamW with decoupled weight decay, layer-wise LR decay and the warmup/decay schedules.

Layer-wise decay is done with parameter groups (the group learning rate is a ratio of the
scheduled one), which works on CPU, unlike AdamW's `lr_ratio` (GPU/XPU only in paddle). The two
rules (`layer_decay_rule`: "official", ratios by official name; "paddlenlp", by our name):
docs/fine-tuning.md and `group_weight_decay`."""
import math
import re
from typing import Any, Dict, List, Set, Tuple

import paddle

from ernie_doc.checkpoint import names
from ernie_doc.errors import ConfigError
from ernie_doc.run_keys import TrainConfig

_LAYER = re.compile(r"(?:^|\.)encoder\.layers\.(\d+)\.")


def official_ratio(official: str, num_layers: int, decay: float) -> float:
    """LR ratio of an official parameter name (`model/optimization.py`): `encoder_layer_l_*`
    gets decay^(L−l); a name containing "embedding" (word_, pos_, task_embedding)
    decay^(L+1); all else 1: the `pre_encoder_*` LayerNorms, pooled_fc, the heads and the
    shared `encoder_r_*_bias`."""
    if official.startswith("encoder_layer_"):
        return decay ** (num_layers - int(official.split("_")[2]))
    if "embedding" in official:
        return decay ** (num_layers + 1)
    return 1.0


def paddlenlp_ratio(name: str, num_layers: int, decay: float) -> float:
    """LR ratio of a parameter by our structured name (= PaddleNLP's, whose
    `layerwise_lr_decay` reads it): encoder layer l of L gets decay^(L−l), everything under
    `embeddings.` (the embedding LayerNorms too) decay^(L+1), everything else 1."""
    if decay == 1.0:
        return 1.0
    match = _LAYER.search(name)
    if match:
        return decay ** (num_layers - int(match.group(1)))
    if ".embeddings." in "." + name:
        return decay ** (num_layers + 1)
    return 1.0


def layer_ratios(model: paddle.nn.Layer, num_layers: int, decay: float,
                 rule: str = "official") -> Dict[str, float]:
    """{name in model.named_parameters(): LR ratio} under `rule` ("official": by the official
    name, through ernie_doc.checkpoint.names; a parameter that has none, a head of ours, gets
    1 as the official heads do; ValueError when no parameter is an encoder layer's, as the
    ratios would silently all be 1. "paddlenlp": by our name)."""
    params = [name for name, _ in model.named_parameters()]
    if decay == 1.0:
        return dict.fromkeys(params, 1.0)
    if rule == "paddlenlp":
        return {name: paddlenlp_ratio(name, num_layers, decay) for name in params}
    if rule != "official":
        raise ConfigError(f"layer_decay_rule: {rule!r} is not one of ['official', 'paddlenlp']")
    inner = getattr(model, "_layers", model)   # paddle.DataParallel names its model _layers
    head_names = getattr(type(inner), "official_names", {})
    ratios, layers = {}, 0
    for name in params:
        key = name[len("_layers."):] if inner is not model else name
        official = names.ours_to_official(key, head_names) or ""
        layers += official.startswith("encoder_layer_")
        ratios[name] = official_ratio(official, num_layers, decay)
    if not layers:
        raise ConfigError("layer_decay: no ERNIE-Doc encoder layer among the model's parameters")
    return ratios


def decays(param: paddle.Tensor) -> bool:
    """No weight decay on biases and LayerNorm scales/shifts (all the 1-D tensors: fc biases,
    LN weights, the r_w/r_r/r_t biases); the official code's name rules (names containing
    layer_norm or ending in _bias, _b, .b_0) pick the same set (tests/test_optim.py)."""
    return len(param.shape) > 1


def run_warmup(cfg: TrainConfig, total_steps: int) -> int:
    """The warmup steps of a run of `total_steps`: warmup_steps when > 0, else
    int(total_steps × warmup_proportion), as the official scripts count them."""
    return cfg.warmup_steps or int(total_steps * cfg.warmup_proportion)


# model/optimization.py: with warmup, Adam (ε 1e-8) and no clipping; without (a constant LR),
# Adam with ε 1e-6 and GradientClipByGlobalNorm(1.0). (max_grad_norm, adam_epsilon) of each.
OFFICIAL_WITH_WARMUP = (0.0, 1e-8)
OFFICIAL_WITHOUT_WARMUP = (1.0, 1e-6)


def clip_and_epsilon(cfg: TrainConfig, warmup: int) -> Tuple[float, float]:
    """(max_grad_norm, adam_epsilon) of a run with `warmup` warmup steps: the config's values;
    a null (or missing) one takes the official code's for that warmup (OFFICIAL_WITH_WARMUP,
    OFFICIAL_WITHOUT_WARMUP). max_grad_norm 0 = no clipping."""
    official = OFFICIAL_WITH_WARMUP if warmup > 0 else OFFICIAL_WITHOUT_WARMUP
    given = (cfg.max_grad_norm, cfg.adam_epsilon)
    return (float(official[0] if given[0] is None else given[0]),
            float(official[1] if given[1] is None else given[1]))


def describe_optimizer(cfg: TrainConfig, total_steps: int) -> str:
    """The optimiser a run of `total_steps` builds, for its log: schedule, warmup, clipping
    and epsilon, saying which values the official rule chose for a null key."""
    warmup = run_warmup(cfg, total_steps)
    clip, eps = clip_and_epsilon(cfg, warmup)
    ruled = [k for k in ("max_grad_norm", "adam_epsilon") if getattr(cfg, k) is None]
    rule = (f" ({' and '.join(ruled)} null: the official code's values "
            f"{'with' if warmup else 'without'} warmup)" if ruled else "")
    clipping = f"gradients clipped to global norm {clip:g}" if clip else "no gradient clipping"
    return (f"optimizer: AdamW, {cfg.lr_schedule} schedule, peak lr {cfg.learning_rate:g}, "
            f"warmup {warmup} of {total_steps} steps, {clipping}, epsilon {eps:g}{rule}")


def lr_lambda(schedule, warmup_steps, total_steps):
    """Multiplier of the peak LR at optimizer step g (0-based), g/warmup during warmup, then:
    linear to 0 at total_steps; official 1 − g/total, or 1 throughout when there is no warmup
    (model/optimization.py's constant-LR branch); cosine (1 + cos(π g/total)) / 2."""
    total = max(1, total_steps)
    if schedule == "official" and warmup_steps <= 0:
        return lambda g: 1.0

    def f(g):
        if g < warmup_steps:
            return g / max(1, warmup_steps)
        if schedule == "official":
            return max(0.0, 1.0 - min(g, total) / total)
        if schedule == "cosine":   # Transformer-XL: the cosine runs over all steps
            return 0.5 * (1.0 + math.cos(math.pi * min(g, total) / total))
        return max(0.0, (total - g) / max(1, total - warmup_steps))

    return f


class GlobalNormClip(paddle.nn.ClipGradByGlobalNorm):
    """Clip by the norm of ALL gradients, across parameter groups: paddle clips each group by
    its own norm, and our groups are an implementation detail."""

    def __init__(self, clip_norm: float, groups):
        super().__init__(clip_norm)
        self._params = [p for params in groups for p in params]
        self._group_of = {id(p): i for i, params in enumerate(groups) for p in params}
        self._pending: Set[int] = set()    # groups not clipped yet in the current step
        self._scale = None

    @paddle.no_grad()
    def _dygraph_clip(self, params_grads):
        if not params_grads:
            return params_grads
        group = self._group_of.get(id(params_grads[0][0]))
        if group is None or group not in self._pending:   # a group seen again: a new step
            self._scale = self._global_scale()
            self._pending = set(self._group_of.values())
        self._pending.discard(group)
        return [(p, g) if g is None or getattr(p, "need_clip", True) is False
                else (p, g * self._scale.astype(g.dtype)) for p, g in params_grads]

    def _global_scale(self):
        squares = [paddle.sum(paddle.square(p.grad.astype("float32"))) for p in self._params
                   if p.grad is not None and getattr(p, "need_clip", True) is not False]
        clip = paddle.full([], self.clip_norm, dtype="float32")
        if not squares:
            return clip / clip
        return clip / paddle.maximum(paddle.sqrt(paddle.add_n(squares)), clip)


def group_weight_decay(weight_decay: float, ratio: float, rule: str) -> float:
    """The AdamW coefficient of a decayed group whose LR is ratio × the scheduled lr. Paddle's
    AdamW steps p ← p_old·(1 − ratio·lr·c) + Δ_adam(ratio·lr), and Δ_adam is linear in its
    LR, = ratio·Δ_adam(lr); so c = wd/ratio gives the official p_old + ratio·Δ_adam(lr) −
    wd·lr·p_old, and c = wd PaddleNLP's decay of ratio·lr."""
    return weight_decay / ratio if rule == "official" else weight_decay


def build_optimizer(model: paddle.nn.Layer, cfg: TrainConfig, total_steps: int,
                    num_layers: int) -> Tuple[paddle.optimizer.AdamW, Any]:
    """→ (AdamW, LRScheduler). cfg: learning_rate, warmup_proportion (or warmup_steps),
    lr_schedule, weight_decay, layer_decay, layer_decay_rule, max_grad_norm and adam_epsilon
    (null: clip_and_epsilon's official rule)."""
    warmup = run_warmup(cfg, total_steps)
    max_grad_norm, epsilon = clip_and_epsilon(cfg, warmup)
    scheduler = paddle.optimizer.lr.LambdaDecay(
        cfg.learning_rate, lr_lambda(cfg.lr_schedule, warmup, total_steps))
    weight_decay = float(cfg.weight_decay)   # paddle 2.6's AdamW refuses an int (0)
    rule = cfg.layer_decay_rule
    ratios = layer_ratios(model, num_layers, cfg.layer_decay, rule)
    groups: Dict[Tuple[float, float], List[paddle.Tensor]] = {}
    for name, param in model.named_parameters():
        if param.stop_gradient:
            continue
        ratio = ratios[name]
        key = (ratio, group_weight_decay(weight_decay, ratio, rule) if decays(param) else 0.0)
        groups.setdefault(key, []).append(param)
    # a list of paddle's parameter-group dicts (its stub's TypedDict is private)
    param_groups: List[Any] = [{"params": params, "learning_rate": ratio, "weight_decay": wd}
                               for (ratio, wd), params in sorted(groups.items())]
    clip = (GlobalNormClip(max_grad_norm, [g["params"] for g in param_groups])
            if max_grad_norm else None)
    optimizer = paddle.optimizer.AdamW(learning_rate=scheduler, parameters=param_groups,
                                       beta1=0.9, beta2=0.999, epsilon=epsilon,
                                       weight_decay=weight_decay, grad_clip=clip)
    return optimizer, scheduler
