"""AdamW with decoupled weight decay, layer-wise LR decay and the warmup/decay schedules.

Layer-wise decay is done with parameter groups (the group learning rate is a ratio of the
scheduled one), which works on CPU, unlike AdamW's `lr_ratio` (GPU/XPU only in paddle)."""
import math
import re

import paddle

_LAYER = re.compile(r"(?:^|\.)encoder\.layers\.(\d+)\.")


def layer_ratio(name, num_layers, decay):
    """LR ratio of a parameter (structured name): encoder layer l of L gets decay^(L−l),
    the embeddings decay^(L+1), everything else (pooler, heads, shared biases) 1."""
    if decay == 1.0:
        return 1.0
    match = _LAYER.search(name)
    if match:
        return decay ** (num_layers - int(match.group(1)))
    if ".embeddings." in "." + name:
        return decay ** (num_layers + 1)
    return 1.0


def decays(param):
    """No weight decay on biases and LayerNorm scales/shifts (all the 1-D tensors: fc biases,
    LN weights, the r_w/r_r/r_t biases); the official code's name rules pick the same set."""
    return len(param.shape) > 1


def lr_lambda(schedule, warmup_steps, total_steps):
    """Multiplier of the peak LR at optimizer step g (0-based), g/warmup during warmup, then:
    linear to 0 at total_steps; official 1 − g/total; cosine (1 + cos(π g/total)) / 2."""
    total = max(1, total_steps)

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
        self._pending = set()    # groups not clipped yet in the current step
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


def build_optimizer(model, cfg, total_steps, num_layers):
    """→ (AdamW, LRScheduler). cfg: learning_rate, warmup_proportion (or warmup_steps),
    lr_schedule, weight_decay, layer_decay, max_grad_norm, adam_epsilon."""
    warmup = cfg.get("warmup_steps") or int(total_steps * cfg["warmup_proportion"])
    scheduler = paddle.optimizer.lr.LambdaDecay(
        cfg["learning_rate"], lr_lambda(cfg["lr_schedule"], warmup, total_steps))
    weight_decay = float(cfg["weight_decay"])   # paddle 2.6's AdamW refuses an int (0)
    groups = {}
    for name, param in model.named_parameters():
        if param.stop_gradient:
            continue
        key = (layer_ratio(name, num_layers, cfg["layer_decay"]),
               weight_decay if decays(param) else 0.0)
        groups.setdefault(key, []).append(param)
    param_groups = [{"params": params, "learning_rate": ratio, "weight_decay": wd}
                    for (ratio, wd), params in sorted(groups.items(), key=lambda kv: kv[0])]
    clip = (GlobalNormClip(cfg["max_grad_norm"], [g["params"] for g in param_groups])
            if cfg["max_grad_norm"] else None)
    optimizer = paddle.optimizer.AdamW(learning_rate=scheduler, parameters=param_groups,
                                       beta1=0.9, beta2=0.999,
                                       epsilon=cfg.get("adam_epsilon", 1e-8),
                                       weight_decay=weight_decay, grad_clip=clip)
    return optimizer, scheduler
