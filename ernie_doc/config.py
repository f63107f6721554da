"""ErnieDocConfig: the one place model hyper-parameters live.

Reads the official `ernie_config.json` keys and PaddleNLP's `config.json` keys, and adds the
options of this project (`recurrence`, `mask_empty_memory`, `rel_pos_params_sharing`,
`relative_position_mapping`, `cls_token_idx`).
"""
import copy
import json
import math
import os
from typing import Optional

RECURRENCE_MODES = ("enhanced", "xl", "none")
# Paddle hands tensor shapes to its kernels as 32-bit integers: a larger dimension is an
# IndexError deep inside paddle, raised even under paddle.LazyGuard (the memory estimate
# builds the model there), so no size may pass this before a tensor is made of it.
MAX_DIM = 2 ** 31 - 1
POSITION_MAPPINGS = ("pretrained", "official")

# Official / PaddleNLP spellings of the same hyper-parameter.
_ALIASES = {
    "attention_dropout_prob": "attention_probs_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "layer_norm_eps": "epsilon",
    "mem_len": "memory_len",
    "type_vocab_size": "task_type_vocab_size",
}
# Keys that other tools write and that carry no meaning for the model.
_IGNORED = {
    "sent_type_vocab_size",  # official configs: read by nothing
    "architectures", "model_type", "init_class", "init_args", "dtype", "paddlenlp_version",
    "transformers_version", "return_dict", "output_hidden_states", "output_attentions",
    "use_return_dict", "id2label", "label2id", "problem_type", "num_choices",
    "tensor_parallel_degree", "tensor_parallel_rank", "tensor_parallel_output",
    "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id",
    "unk_token_id", "num_classes", "dropout", "fuse_attention_qkv", "use_cache", "architecture",
}

_DEFAULTS = dict(
    vocab_size=50265,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    relu_dropout=0.0,
    max_position_embeddings=512,
    task_type_vocab_size=3,
    memory_len=128,
    epsilon=1e-12,
    initializer_range=0.02,
    pad_token_id=1,
    cls_token_idx=-1,
    normalize_before=False,
    classifier_dropout=0.1,
    num_labels=2,
    recurrence="enhanced",
    mask_empty_memory=False,
    rel_pos_params_sharing=False,
    relative_position_mapping="pretrained",
)



def known_keys(ignored: bool = False) -> set:
    """The config keys ErnieDocConfig takes (its own and their aliases); with `ignored`, also
    the keys other tools write that it accepts and drops (e.g. sent_type_vocab_size)."""
    keys = set(_DEFAULTS) | set(_ALIASES)
    return keys | set(_IGNORED) if ignored else keys


# Official values (PaddlePaddle/ERNIE ernie-doc configs); presets are configs only, no download.
PRESETS = {
    "ernie-doc-small": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                            vocab_size=50265, pad_token_id=1),
    "ernie-doc-base-en": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                              vocab_size=50265, pad_token_id=1),
    "ernie-doc-base-zh": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                              vocab_size=28000, pad_token_id=0, hidden_dropout_prob=0.1,
                              attention_probs_dropout_prob=0.1),
    "ernie-doc-large-en": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               vocab_size=50265, pad_token_id=1),
}


class ConfigError(ValueError):
    """A config key or value that the model cannot use."""


def integer_problem(value: object, low: int = 0, high: int = MAX_DIM,
                    nullable: bool = False) -> Optional[str]:
    """Why `value` cannot be an integer setting in [low, high] (or None, when `nullable`):
    "must be a positive integer, got True", or None when it can. A bool is never an integer
    here (YAML's `true` would read as 1); `high` defaults to MAX_DIM, the largest tensor
    dimension paddle takes."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        from ernie_doc.utils import clip
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(
            low, f"an integer >= {low}")
        return f"must be {what}{' or null' if nullable else ''}, got {clip(repr(value), 80)}"
    if value > high:
        return f"must be at most {high}, got {value}"
    return None


class ErnieDocConfig:
    """Hyper-parameters of ERNIE-Doc. Unknown keys and impossible values raise ConfigError."""

    def __init__(self, **kwargs):
        values = dict(_DEFAULTS)
        for key, value in kwargs.items():
            key = _ALIASES.get(key, key)
            if key in _IGNORED:
                continue
            if key not in _DEFAULTS:
                raise ConfigError(
                    f"unknown config key {key!r}; known keys: {', '.join(sorted(_DEFAULTS))}")
            values[key] = value
        self.__dict__.update(values)
        self.validate()

    # -- checks ------------------------------------------------------------------------------
    def validate(self):
        def integer(name, low, high=MAX_DIM):
            problem = integer_problem(getattr(self, name), low, high)
            if problem:
                raise ConfigError(f"{name} {problem}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings", "task_type_vocab_size", "num_labels"):
            integer(name, 1)
        integer("memory_len", 0)
        integer("pad_token_id", 0)
        integer("cls_token_idx", -MAX_DIM)
        # the largest tensors' dimensions: the feed-forward's 4·H and the position table's
        # 2·max_position_embeddings + memory_len rows
        integer("hidden_size", 1, MAX_DIM // 4)
        if self.num_position_rows > MAX_DIM:
            raise ConfigError(
                f"2 * max_position_embeddings + memory_len (the position table's rows) must be "
                f"at most {MAX_DIM}, got {self.num_position_rows}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "relu_dropout",
                     "classifier_dropout"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {v!r}")
        if not isinstance(self.epsilon, (int, float)) or not self.epsilon > 0 \
                or math.isinf(self.epsilon):
            raise ConfigError(f"epsilon must be a positive float, got {self.epsilon!r}")
        if not isinstance(self.initializer_range, (int, float)) or self.initializer_range <= 0:
            raise ConfigError(
                f"initializer_range must be positive, got {self.initializer_range!r}")
        if self.hidden_act not in ("gelu", "relu", "tanh", "gelu_new", "gelu_approximate"):
            raise ConfigError(f"hidden_act must be one of gelu, gelu_approximate, relu, tanh; "
                              f"got {self.hidden_act!r}")
        if self.recurrence not in RECURRENCE_MODES:
            raise ConfigError(
                f"recurrence must be one of {RECURRENCE_MODES}, got {self.recurrence!r}")
        if self.relative_position_mapping not in POSITION_MAPPINGS:
            raise ConfigError(f"relative_position_mapping must be one of {POSITION_MAPPINGS}, "
                              f"got {self.relative_position_mapping!r}")
        if self.normalize_before:
            raise ConfigError("normalize_before=True (pre-LN) is not part of ERNIE-Doc; "
                              "the released models are post-LN")

    # -- derived -----------------------------------------------------------------------------
    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def intermediate_size(self):
        return 4 * self.hidden_size  # hard-coded in the official code

    @property
    def num_position_rows(self):
        return 2 * self.max_position_embeddings + self.memory_len

    @property
    def min_parameters(self):
        """A lower bound on the encoder's parameter count, known without building it: the
        word embeddings and, per layer, the 12·H² of its attention and feed-forward
        matrices."""
        H = self.hidden_size
        return self.vocab_size * H + self.num_hidden_layers * 12 * H * H

    # -- I/O ---------------------------------------------------------------------------------
    def to_dict(self):
        return {k: copy.deepcopy(getattr(self, k)) for k in _DEFAULTS}

    def replace(self, **kwargs):
        """A copy with some values changed."""
        values = self.to_dict()
        values.update(kwargs)
        return ErnieDocConfig(**values)

    @classmethod
    def from_dict(cls, values, source="config"):
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(values).__name__}")
        try:
            return cls(**values)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path):
        from ernie_doc.utils import read_json
        return cls.from_dict(read_json(path, ConfigError), source=os.fspath(path))

    def to_json(self, path=None):
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            from ernie_doc.utils import atomic_write_text
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def from_any(cls, spec, **overrides):
        """A config from a preset name, a released model's name (its preset), a json path, a
        checkpoint directory (its config.json / ernie_config.json), a dict or a config."""
        if isinstance(spec, ErnieDocConfig):
            return spec.replace(**overrides) if overrides else spec
        if isinstance(spec, dict):
            return cls.from_dict({**spec, **overrides})
        if isinstance(spec, str) and spec in PRESETS:
            return cls.from_preset(spec, **overrides)
        if isinstance(spec, str) and not os.path.exists(spec):
            from ernie_doc.hub import registry  # a released name: its config (no download)
            release = registry.release(spec)
            if release is not None:
                return cls.from_any(release.preset, **overrides)
        if isinstance(spec, (str, os.PathLike)) and os.path.isdir(spec):
            for name in ("config.json", "ernie_config.json"):
                if os.path.isfile(os.path.join(spec, name)):
                    spec = os.path.join(spec, name)
                    break
        if isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec):
            cfg = cls.from_json(spec)
            return cfg.replace(**overrides) if overrides else cfg
        raise ConfigError(f"not a preset name or a config file: {spec!r} "
                          f"(presets: {', '.join(PRESETS)})")

    def __eq__(self, other):
        return isinstance(other, ErnieDocConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"ErnieDocConfig({self.to_dict()})"
