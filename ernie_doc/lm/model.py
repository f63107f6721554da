"""Memory-enhanced Transformer-XL language model (paper §4.1), optionally segment-aware (Segatron).

`TransformerXLLM` follows kimiyoung/transformer-xl's mem_transformer.py (adaptive embedding and
softmax, relative attention, its parameter names); the memory follows ernie_doc.modeling.memory.
Details: docs/design-notes.md, "Language model: Transformer-XL"."""
import dataclasses
import json
import math
import operator
import os
from collections import namedtuple
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from safetensors.numpy import save_file

from ernie_doc import resources
from ernie_doc.checkpoint import io
from ernie_doc.config import LM_CONFIG_FILE, MAX_DIM
from ernie_doc.errors import CheckpointError, ConfigError, ModelInputError
from ernie_doc.lm.adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, cluster_layout
from ernie_doc.modeling.memory import check_reset_memory, memory_source, reset_rows, update_memory
from ernie_doc.modeling.pretrained import assign_array, cast_problem
from ernie_doc.utils import atomic_path, atomic_write_text, dtype_name, read_json

__all__ = ["TransformerXLConfig", "TransformerXLLM", "LMOutput", "pad_reshape_rel_shift",
           "causal_mask", "sinusoid", "sega_dims", "LM_PRESETS", "load_lm_config"]

RECURRENCES = ("enhanced", "xl", "none")
SEGA_RELATIVE = ("exact", "segatron")
MASK_VALUE = 1e30   # added (negated) to masked scores: exp underflows to exactly 0
CONFIG_FILE = LM_CONFIG_FILE
WEIGHTS_FILE = "model.safetensors"

# The paper's WikiText-103 models (appendix table; the rest is Transformer-XL's scripts).
LM_PRESETS = {
    "wt103-base": {},   # the dataclass defaults
    "wt103-large": {"n_layer": 18, "d_model": 1024, "n_head": 16, "d_head": 64,
                    "d_inner": 4096, "dropout": 0.2, "dropatt": 0.2, "div_val": 4,
                    "tgt_len": 384, "mem_len": 384},
}

LMOutput = namedtuple("LMOutput", ["nll", "log_probs", "memories", "hidden", "memory_positions"])
# The position term (TransformerXLLM.relative_encoding): ("shared", R [K, d_model]),
# ("batch", R [B, K, d_model]) or ("exact", tables [N, d_c] x3, indices [B, n, T, K] x3).
Rel = Tuple[Any, ...]


# ------------------------------------------------------------------------------------ config
@dataclasses.dataclass
class TransformerXLConfig:
    """Hyper-parameters; defaults are Transformer-XL's WikiText-103 base. Extra keys:
    recurrence ("enhanced", "xl", "none"), segment_positions, sega_relative, untie_r, tie_projs
    (None = WT103's). Checked on construction; ValueError messages start with the key."""
    n_layer: int = 16
    d_model: int = 410
    n_head: int = 10
    d_head: int = 41
    d_inner: int = 2100
    dropout: float = 0.1
    dropatt: float = 0.0
    vocab_size: int = 267735
    cutoffs: List[int] = dataclasses.field(default_factory=lambda: [20000, 40000, 200000])
    div_val: int = 1
    tie_weight: bool = True
    tie_projs: Union[None, bool, List[bool]] = None
    tgt_len: int = 150
    mem_len: int = 150
    ext_len: int = 0
    same_length: bool = False
    clamp_len: int = -1
    pre_lnorm: bool = False
    recurrence: str = "enhanced"
    segment_positions: bool = False
    sega_relative: str = "exact"
    d_embed: Optional[int] = None
    untie_r: bool = False
    init_std: float = 0.02
    proj_init_std: float = 0.01

    def __post_init__(self):
        self.validate()

    # -- checks ------------------------------------------------------------------------------
    @staticmethod
    def _int(key, value, low, high=MAX_DIM):
        """`value` as an int in [low, high]; high: the largest tensor dimension paddle takes
        (config.MAX_DIM)."""
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        try:
            value = operator.index(value)
        except TypeError:
            raise ConfigError(f"{key} must be an integer, got {value!r}") from None
        if value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}")
        if value > high:
            raise ConfigError(f"{key} must be at most {high}, got {value}")
        return value

    @staticmethod
    def _bool(key, value):
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be True or False, got {value!r}")
        return value

    @staticmethod
    def _float(key, value, low, high, high_open):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        value = float(value)
        if not (low <= value and (value < high if high_open else value <= high)):
            bracket = ")" if high_open else "]"
            raise ConfigError(f"{key} must be in [{low}, {high}{bracket}, got {value}")
        return value

    def validate(self) -> "TransformerXLConfig":
        """Check and normalise every field (cutoffs → list of int, tie_projs → list of bool)."""
        for key in ("n_layer", "d_model", "n_head", "d_head", "d_inner", "vocab_size",
                    "div_val", "tgt_len"):
            setattr(self, key, self._int(key, getattr(self, key), 1))
        for key in ("mem_len", "ext_len"):
            setattr(self, key, self._int(key, getattr(self, key), 0))
        self.clamp_len = self._int("clamp_len", self.clamp_len, -1)
        # the largest tensors' dimensions: the attention's n_head·d_head projections and the
        # tgt_len + ext_len + mem_len keys a query sees
        for key, value in (("n_head * d_head", self.n_head * self.d_head),
                           ("tgt_len + ext_len + mem_len",
                            self.tgt_len + self.ext_len + self.mem_len)):
            self._int(key, value, 1)
        for key in ("dropout", "dropatt"):
            setattr(self, key, self._float(key, getattr(self, key), 0.0, 1.0, True))
        for key in ("init_std", "proj_init_std"):
            value = self._float(key, getattr(self, key), 0.0, math.inf, True)
            if value <= 0:
                raise ConfigError(f"{key} must be > 0, got {value}")
            setattr(self, key, value)
        for key in ("tie_weight", "same_length", "pre_lnorm", "segment_positions", "untie_r"):
            self._bool(key, getattr(self, key))
        if self.recurrence not in RECURRENCES:
            raise ConfigError(f"recurrence must be one of {RECURRENCES}, got {self.recurrence!r}")
        if self.sega_relative not in SEGA_RELATIVE:
            raise ConfigError(f"sega_relative must be one of {SEGA_RELATIVE}, got "
                              f"{self.sega_relative!r}")
        if self.d_embed is not None:
            self.d_embed = self._int("d_embed", self.d_embed, 1)
        if self.d_model % 2:
            raise ConfigError(f"d_model must be even (the sinusoid encoding is [sin, cos] "
                              f"halves), got {self.d_model}")
        if isinstance(self.cutoffs, (str, bytes)) or not hasattr(self.cutoffs, "__iter__") \
                or any(isinstance(c, bool) for c in self.cutoffs):
            raise ConfigError(f"cutoffs must be a list of integers, got {self.cutoffs!r}")
        # The adaptive layers' own checks; their messages start with the argument's name.
        self.cutoffs = cluster_layout(self.vocab_size, self.embed_dim, self.d_model,
                                      self.cutoffs, self.div_val)[3]
        n_clusters = len(self.cutoffs) + 1
        tie = self.tie_projs
        if tie is None:
            tie = [False] + [True] * len(self.cutoffs)
        elif isinstance(tie, bool):
            tie = [tie] * n_clusters
        if (isinstance(tie, (str, bytes)) or not hasattr(tie, "__iter__")
                or len(list(tie)) != n_clusters or not all(isinstance(t, bool) for t in tie)):
            raise ConfigError(f"tie_projs must be None, a bool or {n_clusters} bools (one per "
                              f"cluster), got {self.tie_projs!r}")
        self.tie_projs = list(tie)
        if self.same_length and self.mem_len < 1:
            raise ConfigError("same_length needs mem_len >= 1 (a query sees mem_len keys)")
        if self.segment_positions:
            d_t, _, d_p = sega_dims(self.d_model)
            if d_t < 1 or d_p < 1:
                raise ConfigError(f"segment_positions: d_model={self.d_model} is too small to "
                                  "split into token/sentence/paragraph encodings (need >= 6)")
        return self

    @property
    def embed_dim(self) -> int:
        return self.d_model if self.d_embed is None else self.d_embed

    # -- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TransformerXLConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown TransformerXLConfig key "
                              f"(all unknown: {unknown})")
        return cls(**dict(values))


def load_lm_config(source: Union[None, str, Dict[str, Any]] = None,
                   **overrides: Any) -> TransformerXLConfig:
    """A preset name (LM_PRESETS), a JSON file, a saved model directory or a dict (None: the
    defaults), with `overrides` on top → TransformerXLConfig."""
    path = None
    if source is None or isinstance(source, dict):
        values = dict(source or {})
    elif source in LM_PRESETS:
        values = dict(LM_PRESETS[source])
    else:
        path = os.path.join(source, CONFIG_FILE) if os.path.isdir(source) else source
        if not os.path.isfile(path):
            raise ConfigError(f"{source}: not a language-model preset {sorted(LM_PRESETS)}, "
                              f"config JSON or model directory (no {CONFIG_FILE})")
        values = read_json(path, ConfigError)
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(values).__name__}")
    values.update(overrides)
    try:
        return TransformerXLConfig.from_dict(values)
    except ValueError as e:   # name the file the bad value came from
        if path is None:
            raise
        raise ConfigError(f"{path}: {e}") from None


# ------------------------------------------------------------------------------ functions
def sega_dims(d_model: int) -> Tuple[int, int, int]:
    """Segatron's split of d_model into (token, sentence, paragraph) encoding dims."""
    d_t = d_model // 3 + (d_model // 3) % 2
    return d_t, d_t, d_model - 2 * d_t


def sinusoid(pos: paddle.Tensor, dim: int) -> paddle.Tensor:
    """pos [...] float → [..., dim]: [sin(pos·f), cos(pos·f)], f_i = 1/10000^(2i/dim)."""
    inv_freq = 1.0 / (10000.0 ** (paddle.arange(0, dim, 2, dtype="float32") / dim))
    angle = pos.astype("float32").unsqueeze(-1) * inv_freq
    return paddle.concat([paddle.sin(angle), paddle.cos(angle)], axis=-1)


def pad_reshape_rel_shift(x: paddle.Tensor) -> paddle.Tensor:
    """Transformer-XL's relative shift of x [..., T, K], same shape: out[..., i, j] =
    x[..., i, j + T − 1 − i] for the causal keys (j ≤ K − T + i); junk above, to be masked.
    Differs from the encoder's gather_rel_shift only in that junk."""
    lead, (t, k) = list(x.shape[:-2]), list(x.shape[-2:])
    zero = paddle.zeros(lead + [t, 1], dtype=x.dtype)
    padded = paddle.concat([zero, x], axis=-1).reshape(lead + [k + 1, t])
    return padded[..., 1:, :].reshape(lead + [t, k])


def causal_mask(qlen: int, mlen: int, mem_len: int, same_length: bool) -> paddle.Tensor:
    """Allowed (query i, key j) pairs over [memory (mlen); segment (qlen)] → bool [qlen, klen]."""
    klen = mlen + qlen
    i = paddle.arange(qlen, dtype="int64").unsqueeze(1)
    j = paddle.arange(klen, dtype="int64").unsqueeze(0)
    allowed = j <= i + mlen
    if same_length:
        mask_len = klen - mem_len
        shift = qlen - mask_len if mask_len > 0 else qlen
        allowed = paddle.logical_and(allowed, j > i - shift)
    return allowed


def _normal(std, mean=0.0):
    return paddle.ParamAttr(initializer=nn.initializer.Normal(mean=mean, std=std))


def _zeros():
    return paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))


def _shape_list(t: paddle.Tensor) -> List[int]:
    """t.shape as a list, entries as paddle gives them: for expand() targets and messages
    (the encoder's `_int_shape` casts every entry to a Python int for its input checks)."""
    return list(t.shape)


# -------------------------------------------------------------------------------- layers
class RelPartialLearnableMultiHeadAttn(nn.Layer):
    """Transformer-XL's attention (attn_type 0); `rel`: the position term of
    TransformerXLLM.relative_encoding ("shared", "batch" or "exact")."""

    def __init__(self, c: TransformerXLConfig):
        super().__init__()
        self.n_head, self.d_head, self.d_model = c.n_head, c.d_head, c.d_model
        inner = c.n_head * c.d_head
        self.qkv_net = nn.Linear(c.d_model, 3 * inner, weight_attr=_normal(c.init_std),
                                 bias_attr=False)
        self.r_net = nn.Linear(c.d_model, inner, weight_attr=_normal(c.init_std),
                               bias_attr=False)
        self.o_net = nn.Linear(inner, c.d_model, weight_attr=_normal(c.init_std),
                               bias_attr=False)
        self.layer_norm = nn.LayerNorm(c.d_model, weight_attr=_normal(c.init_std, 1.0),
                                       bias_attr=_zeros())
        self.drop = nn.Dropout(c.dropout)
        self.dropatt = nn.Dropout(c.dropatt)
        self.scale = 1.0 / math.sqrt(c.d_head)
        self.pre_lnorm = c.pre_lnorm

    def _heads(self, x):
        """[B, L, n*d] → [B, n, L, d]."""
        return x.reshape([x.shape[0], x.shape[1], self.n_head, self.d_head]).transpose(
            [0, 2, 1, 3])

    def _table(self, r):
        """Projected shared rows [K, d_model] → [n, K, d]."""
        return self.r_net(r).reshape([r.shape[0], self.n_head, self.d_head]).transpose([1, 0, 2])

    def _position_scores(self, q_r, rel):
        batch, _, seg_len, _ = q_r.shape
        kind = rel[0]
        if kind == "shared":
            r = self._table(rel[1])
            # Expanded rather than a broadcasting matmul (whose gradient fails on 3.3.1 CPU).
            r = r.unsqueeze(0).expand([batch] + _shape_list(r))
            return pad_reshape_rel_shift(paddle.matmul(q_r, r, transpose_y=True))
        if kind == "batch":
            r = self._heads(self.r_net(rel[1]))                        # [B, n, K, d]
            return pad_reshape_rel_shift(paddle.matmul(q_r, r, transpose_y=True))
        # exact: r_net(concat_c PE_c) = Σ_c PE_c @ W[rows of c] (r_net has no bias).
        tables, indices = rel[1], rel[2]
        out, start = None, 0
        for table, index in zip(tables, indices):
            dim = table.shape[-1]
            proj = paddle.matmul(table, self.r_net.weight[start:start + dim])
            proj = proj.reshape([table.shape[0], self.n_head, self.d_head]).transpose([1, 0, 2])
            proj = proj.unsqueeze(0).expand([batch] + _shape_list(proj))
            score = paddle.take_along_axis(paddle.matmul(q_r, proj, transpose_y=True), index,
                                           axis=-1)
            out = score if out is None else out + score
            start += dim
        return out

    def attention_scores(self, h: paddle.Tensor, mem: Optional[paddle.Tensor], rel: Rel,
                         r_w_bias: paddle.Tensor, r_r_bias: paddle.Tensor,
                         mask_bias: paddle.Tensor) -> Tuple[paddle.Tensor, paddle.Tensor]:
        """Masked, scaled scores [B, n, T, K] and values [B, n, K, d]."""
        cat = h if mem is None else paddle.concat([mem, h], axis=1)
        if self.pre_lnorm:
            cat = self.layer_norm(cat)
        w_heads = self.qkv_net(cat)
        q, k, v = paddle.split(w_heads, 3, axis=-1)
        q = self._heads(q[:, cat.shape[1] - h.shape[1]:])
        k, v = self._heads(k), self._heads(v)
        ac = paddle.matmul(q + r_w_bias.unsqueeze(1), k, transpose_y=True)
        bd = self._position_scores(q + r_r_bias.unsqueeze(1), rel)
        return (ac + bd) * self.scale + mask_bias, v

    def forward(self, h: paddle.Tensor, mem: Optional[paddle.Tensor], rel: Rel,
                r_w_bias: paddle.Tensor, r_r_bias: paddle.Tensor,
                mask_bias: paddle.Tensor) -> paddle.Tensor:
        """h [B, T, d_model], mem [B, M, d_model] or None, r_*_bias [n, d], mask_bias [T, K]
        → [B, T, d_model]."""
        score, v = self.attention_scores(h, mem, rel, r_w_bias, r_r_bias, mask_bias)
        prob = self.dropatt(F.softmax(score, axis=-1))
        vec = paddle.matmul(prob, v).transpose([0, 2, 1, 3])
        vec = vec.reshape([vec.shape[0], vec.shape[1], self.n_head * self.d_head])
        out = self.drop(self.o_net(vec))
        return h + out if self.pre_lnorm else self.layer_norm(h + out)


class PositionwiseFF(nn.Layer):
    def __init__(self, c: TransformerXLConfig):
        super().__init__()
        self.CoreNet = nn.Sequential(
            nn.Linear(c.d_model, c.d_inner, weight_attr=_normal(c.init_std), bias_attr=_zeros()),
            nn.ReLU(), nn.Dropout(c.dropout),
            nn.Linear(c.d_inner, c.d_model, weight_attr=_normal(c.init_std), bias_attr=_zeros()),
            nn.Dropout(c.dropout))
        self.layer_norm = nn.LayerNorm(c.d_model, weight_attr=_normal(c.init_std, 1.0),
                                       bias_attr=_zeros())
        self.pre_lnorm = c.pre_lnorm

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """[B, T, d_model] → [B, T, d_model]."""
        if self.pre_lnorm:
            return x + self.CoreNet(self.layer_norm(x))
        return self.layer_norm(x + self.CoreNet(x))


class RelPartialLearnableDecoderLayer(nn.Layer):
    def __init__(self, c: TransformerXLConfig):
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(c)
        self.pos_ff = PositionwiseFF(c)

    def forward(self, h: paddle.Tensor, mem: Optional[paddle.Tensor], rel: Rel,
                r_w_bias: paddle.Tensor, r_r_bias: paddle.Tensor,
                mask_bias: paddle.Tensor) -> paddle.Tensor:
        """As RelPartialLearnableMultiHeadAttn.forward, then the feed-forward."""
        return self.pos_ff(self.dec_attn(h, mem, rel, r_w_bias, r_r_bias, mask_bias))


# --------------------------------------------------------------------------------- model
class TransformerXLLM(nn.Layer):
    """The language model; forward's docstring gives its contract."""

    def __init__(self, config: Union[TransformerXLConfig, Dict[str, Any]]):
        super().__init__()
        if isinstance(config, dict):
            config = TransformerXLConfig.from_dict(config)
        if not isinstance(config, TransformerXLConfig):
            raise TypeError(f"config must be a TransformerXLConfig or a dict, got {type(config)}")
        c = self.config = config.validate()
        # Refuse weights that cannot fit before allocating them (a lower bound: attention and
        # feed-forward matrices, and the head cluster's embedding rows).
        attention = 4 * c.n_head * c.d_head * c.d_model + 2 * c.d_model * c.d_inner
        head_rows = (c.cutoffs[0] if c.cutoffs else c.vocab_size) * c.embed_dim
        resources.check_fits({"weights": 4 * (c.n_layer * attention + head_rows)},
                             f"TransformerXLLM(n_layer={c.n_layer}, d_model={c.d_model}, "
                             f"d_inner={c.d_inner}, vocab_size={c.vocab_size})")
        self.word_emb = AdaptiveEmbedding(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs,
                                          c.div_val, c.init_std, c.proj_init_std)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.LayerList([RelPartialLearnableDecoderLayer(c) for _ in range(c.n_layer)])
        shape = ([c.n_layer] if c.untie_r else []) + [c.n_head, c.d_head]
        self.r_w_bias = self.create_parameter(shape, attr=_normal(c.init_std))
        self.r_r_bias = self.create_parameter(shape, attr=_normal(c.init_std))
        self.crit = ProjectedAdaptiveLogSoftmax(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs,
                                                c.div_val, c.init_std, c.proj_init_std)
        self.crit.tie_to(self.word_emb, tie_weight=c.tie_weight, tie_projs=c.tie_projs)
        # Keep the memories attached (gradients reach earlier segments' embeddings): an
        # explanation's gradient pass only (ernie_doc.explain); a runtime switch, never saved.
        self.memory_gradient = False

    # -- weights ---------------------------------------------------------------------------
    def save_pretrained(self, directory: str) -> str:
        """directory/lm_config.json + model.safetensors (the state_dict; no pickle), each
        written atomically; other files, e.g. the vocabulary, are kept → directory."""
        os.makedirs(directory, exist_ok=True)
        arrays = {k: np.ascontiguousarray(v.numpy()) for k, v in self.state_dict().items()}
        with atomic_path(os.path.join(directory, WEIGHTS_FILE)) as tmp:
            save_file(arrays, tmp, metadata={"format": "np"})
        atomic_write_text(os.path.join(directory, CONFIG_FILE),
                          json.dumps(self.config.to_dict(), indent=1) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, directory: Union[str, "os.PathLike[str]"],
                        **overrides: Any) -> "TransformerXLLM":
        """A `save_pretrained` directory → the model (`overrides` replace config keys); every
        tensor of model.safetensors must match by name, shape and dtype, else CheckpointError."""
        directory = os.fspath(directory)
        if not os.path.isfile(os.path.join(directory, CONFIG_FILE)):
            raise CheckpointError(f"{directory}: not a language-model directory (no "
                                  f"{CONFIG_FILE})")
        model = cls(load_lm_config(directory, **overrides))
        path = os.path.join(directory, WEIGHTS_FILE)
        if not os.path.isfile(path):
            raise CheckpointError(f"{directory}: no {WEIGHTS_FILE}")
        state = io.read_safetensors(path)
        own = model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise CheckpointError(f"{path}: tensors missing {missing[:3]} / unexpected "
                                  f"{unexpected[:3]} for this config")
        problems = []
        for name, value in state.items():
            if not isinstance(value, np.ndarray):
                problems.append(f"{name} is a {type(value).__name__}, not a tensor")
            elif list(value.shape) != list(own[name].shape):
                problems.append(f"{name} has shape {list(value.shape)}, the model "
                                f"{list(own[name].shape)}")
            else:
                problem = cast_problem(value, dtype_name(own[name].dtype))
                if problem:
                    problems.append(f"{name}: {problem}")
        if problems:
            raise CheckpointError(f"{path}: " + "; ".join(problems))
        for name, value in state.items():
            assign_array(own[name], value)
        return model

    @property
    def uses_memory(self) -> bool:
        return self.config.recurrence != "none" and self.config.mem_len > 0

    # -- pieces (public for tests and tools) -------------------------------------------------
    def attention_bias(self, qlen: int, mlen: int) -> paddle.Tensor:
        """Additive mask [T, K]: 0 where allowed, −1e30 elsewhere."""
        allowed = causal_mask(qlen, mlen, self.config.mem_len, self.config.same_length)
        return (allowed.astype("float32") - 1.0) * MASK_VALUE

    def _clamp(self, dist):
        clamp = self.config.clamp_len
        return paddle.clip(dist, max=clamp) if clamp > 0 else dist

    def relative_encoding(self, qlen: int, mlen: int, positions: Optional[paddle.Tensor] = None,
                          memory_positions: Optional[paddle.Tensor] = None) -> Rel:
        """The position term every layer uses (before dropout), see RelPartialLearnable...Attn.
        positions [3, B, T] / memory_positions [3, B, M] int (Segatron only)."""
        c = self.config
        klen = qlen + mlen
        if not c.segment_positions:
            dist = self._clamp(paddle.arange(klen - 1, -1, -1, dtype="int64"))
            return ("shared", sinusoid(dist, c.d_model))
        positions = positions.astype("int64")
        key_positions = positions if mlen == 0 else paddle.concat(
            [memory_positions.astype("int64"), positions], axis=2)          # [3, B, K]
        # Components in Segatron's concatenation order: token, sentence, paragraph.
        order = ((2, 0), (1, 1), (0, 2))
        dims = sega_dims(c.d_model)
        if c.sega_relative == "segatron":
            dist = key_positions.max(axis=2, keepdim=True) - key_positions  # [3, B, K]
            dist = self._clamp(dist)
            pieces = [sinusoid(dist[row], dims[k]) for row, k in order]
            return ("batch", paddle.concat(pieces, axis=-1))                # [B, K, d]
        size = klen if c.clamp_len <= 0 else min(klen, c.clamp_len + 1)
        table_pos = paddle.arange(size, dtype="int64")
        tables, indices = [], []
        for row, k in order:
            dist = positions[row].unsqueeze(2) - key_positions[row].unsqueeze(1)  # [B, T, K]
            dist = paddle.clip(dist, min=0, max=size - 1)
            index = dist.unsqueeze(1).expand([dist.shape[0], c.n_head]
                                             + _shape_list(dist)[1:])
            tables.append(sinusoid(table_pos, dims[k]))
            indices.append(index)
        return ("exact", tables, indices)

    def _dropped(self, rel):
        if rel[0] == "exact":
            return ("exact", [self.drop(t) for t in rel[1]], rel[2])
        return (rel[0], self.drop(rel[1]))

    def _biases(self, i):
        if self.config.untie_r:
            return self.r_w_bias[i], self.r_r_bias[i]
        return self.r_w_bias, self.r_r_bias

    # -- checks (dygraph) --------------------------------------------------------------------
    def _check(self, input_ids, target, memories, reset_memory, positions, memory_positions):
        c = self.config
        if len(input_ids.shape) != 2 or input_ids.dtype not in (paddle.int64, paddle.int32):
            raise ModelInputError(f"input_ids must be an int [batch, seq_len] tensor, got "
                                  f"{input_ids.dtype} {_shape_list(input_ids)}")
        batch, seg_len = _shape_list(input_ids)
        if seg_len < 1:
            raise ModelInputError("input_ids has seq_len 0")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= c.vocab_size:
            raise ModelInputError(f"input_ids values must be in [0, {c.vocab_size}), got min {lo} "
                                  f"max {hi}")
        if target is not None:
            if (len(target.shape) != 2 or target.shape[0] != batch
                    or not 1 <= target.shape[1] <= seg_len):
                raise ModelInputError(f"target must be [batch, T'] with 1 <= T' <= seq_len "
                                      f"(= {seg_len}), got {_shape_list(target)}")
            lo, hi = int(target.min()), int(target.max())
            if lo < 0 or hi >= c.vocab_size:
                raise ModelInputError(f"target values must be in [0, {c.vocab_size}), got min {lo} "
                                      f"max {hi}")
        check_reset_memory(reset_memory, batch)
        if c.segment_positions:
            if positions is None:
                raise ModelInputError("positions [3, batch, seq_len] (paragraph, sentence, token "
                                      "running counters) are required when config.segment_positions"
                                      " is True")
            if _shape_list(positions) != [3, batch, seg_len]:
                raise ModelInputError(f"positions must be [3, batch, seq_len] = "
                                      f"{[3, batch, seg_len]}, got {_shape_list(positions)}")
            if seg_len > 1 and not bool((positions[:, :, 1:] >= positions[:, :, :-1]).all()):
                raise ModelInputError("positions must be Segatron's global running counters, "
                                      "non-decreasing along time (sega_positions(..., "
                                      "scheme='global') or to_global), got a decreasing row")
        elif positions is not None or memory_positions is not None:
            raise ModelInputError("positions given but config.segment_positions is False")
        if not self.uses_memory:
            return
        if seg_len <= c.ext_len:
            raise ModelInputError(f"seq_len {seg_len} must exceed ext_len {c.ext_len} (the last "
                                  "ext_len positions are not cached)")
        if memories is not None:
            self._check_memories(memories, memory_positions, batch)

    def _check_memories(self, memories: Union[paddle.Tensor, Sequence[paddle.Tensor]],
                        memory_positions: Optional[paddle.Tensor], batch: int) -> None:
        """ValueError unless `memories` are n_layer [batch, M, d_model] tensors of one shape,
        with their memory_positions [3, batch, M] when segment_positions (and M > 0)."""
        c = self.config
        if len(memories) != c.n_layer:
            raise ModelInputError(f"memories must hold n_layer = {c.n_layer} tensors, got "
                                  f"{len(memories)}")
        mem_shape = _shape_list(memories[0])
        for m in memories:
            if len(m.shape) != 3 or _shape_list(m)[0] != batch \
                    or _shape_list(m)[2] != c.d_model or _shape_list(m) != mem_shape:
                raise ModelInputError(f"memories must be [n_layer, batch, M, d_model] = "
                                      f"[{c.n_layer}, {batch}, M, {c.d_model}], got a layer "
                                      f"{_shape_list(m)}")
        if c.segment_positions and mem_shape[1] > 0:
            if memory_positions is None:
                raise ModelInputError("memory_positions [3, batch, M] are required with "
                                      "memories when config.segment_positions is True "
                                      "(out.memory_positions)")
            if _shape_list(memory_positions) != [3, batch, mem_shape[1]]:
                raise ModelInputError(f"memory_positions must be [3, batch, M] = "
                                      f"{[3, batch, mem_shape[1]]}, got "
                                      f"{_shape_list(memory_positions)}")

    def _read_memories(self, memories: Union[paddle.Tensor, Sequence[paddle.Tensor]],
                       reset_memory: Optional[paddle.Tensor],
                       memory_positions: Optional[paddle.Tensor]
                       ) -> Tuple[List[paddle.Tensor], Optional[paddle.Tensor]]:
        """The memories a segment reads → (one [B, M, d_model] per layer, their positions
        [3, B, M] int64 or None), rows in `reset_memory` zeroed."""
        c = self.config
        if isinstance(memories, paddle.Tensor):
            if reset_memory is not None:
                memories = reset_rows(memories, reset_memory, batch_axis=1)
            mems = [memories[i] for i in range(c.n_layer)]
        else:
            mems = [m if reset_memory is None else reset_rows(m, reset_memory, batch_axis=0)
                    for m in memories]
        mem_pos = None
        if c.segment_positions:
            mem_pos = memory_positions.astype("int64")
            if reset_memory is not None:
                # float64 holds the counters exactly; reset_rows multiplies by 0/1.
                mem_pos = reset_rows(mem_pos.astype("float64"), reset_memory,
                                     batch_axis=1).astype("int64")
        return mems, mem_pos

    # -- forward -----------------------------------------------------------------------------
    def forward(self, input_ids: paddle.Tensor, target: Optional[paddle.Tensor] = None,
                memories: Union[None, paddle.Tensor, Sequence[paddle.Tensor]] = None,
                reset_memory: Optional[paddle.Tensor] = None,
                positions: Optional[paddle.Tensor] = None,
                memory_positions: Optional[paddle.Tensor] = None,
                return_log_probs: bool = False) -> LMOutput:
        """input_ids [B, T] → LMOutput; target [B, T'] or None; memories [n_layer, B, M, d_model]
        (or a list) or None; reset_memory [B]; positions [3, B, T] iff segment_positions."""
        c = self.config
        if paddle.in_dynamic_mode():
            self._check(input_ids, target, memories, reset_memory, positions, memory_positions)
        input_ids = input_ids.astype("int64")
        seg_len = input_ids.shape[1]
        use_memory = self.uses_memory
        mems, mem_pos = None, None
        if use_memory and memories is not None and memories[0].shape[1] > 0:
            mems, mem_pos = self._read_memories(memories, reset_memory, memory_positions)
        mlen = 0 if mems is None else mems[0].shape[1]

        mask_bias = self.attention_bias(seg_len, mlen)
        rel = self._dropped(self.relative_encoding(seg_len, mlen, positions, mem_pos))
        core = self.drop(self.word_emb(input_ids))
        keep = seg_len - c.ext_len
        new_mems = []
        for i, layer in enumerate(self.layers):
            mem_i = None if mems is None else mems[i]
            r_w, r_r = self._biases(i)
            out = layer(core, mem_i, rel, r_w, r_r, mask_bias)
            if use_memory:
                source = memory_source(c.recurrence, core, out)
                new_mems.append(update_memory(mem_i, source[:, :keep], c.mem_len,
                                              detach=not self.memory_gradient))
            core = out
        hidden = self.drop(core)

        new_mem_pos = None
        if use_memory and c.segment_positions:
            prev = None if mem_pos is None else mem_pos.transpose([1, 2, 0])
            cur = positions.astype("int64").transpose([1, 2, 0])[:, :keep]
            new_mem_pos = update_memory(prev, cur, c.mem_len).transpose([2, 0, 1])

        nll, log_probs = None, None
        pred = hidden
        if target is not None:
            pred = hidden[:, seg_len - target.shape[1]:]
            nll = self.crit(pred, target.astype("int64"))
        if return_log_probs:
            log_probs = self.crit.log_prob(pred)
        return LMOutput(nll, log_probs, paddle.stack(new_mems) if use_memory else None, hidden,
                        new_mem_pos)
