"""ErnieDocConfig: the one place model hyper-parameters live.

Reads the official `ernie_config.json` keys and PaddleNLP's `config.json` keys, and adds the
options of this project (`recurrence`, `mask_empty_memory`, `rel_pos_params_sharing`,
`relative_position_mapping`, `cls_token_idx`) and how a fine-tuned model reads a segment
(`retro_feed`, `cls_token_id`: recorded by fine-tuning, None in a pretrained model)."""
import copy
import json
import logging
import math
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Type

from ernie_doc import releases as registry  # a released name: its config (no download)
from ernie_doc.errors import CheckpointError, ConfigError
from ernie_doc.utils import atomic_write_text, clip, did_you_mean, read_json

# Config files: ours and PaddleNLP's, PaddleNLP's older name, the official one.
CONFIG_FILES = ("config.json", "model_config.json", "ernie_config.json")
# Warnings about configs other tools wrote go to the checkpoint loader's log.
logger = logging.getLogger("ernie_doc.checkpoint")

RECURRENCE_MODES = ("enhanced", "xl", "none")
# Paddle's kernels take 32-bit shapes: a larger dimension is an IndexError deep inside paddle
# (even under paddle.LazyGuard), so no size may pass this.
MAX_DIM = 2 ** 31 - 1
# The most classes or choices a head takes: far beyond any task, refused before allocation.
MAX_HEAD_SIZE = 1 << 16
# The head arguments a saved "architecture" may carry as sizes, each bounded by MAX_HEAD_SIZE.
HEAD_SIZE_ARGUMENTS = ("num_labels", "num_choices", "num_reorder_classes")
# The config keys that size a model's tensors: weights saved with other values do not load.
_SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings", "task_type_vocab_size", "num_labels")
POSITION_MAPPINGS = ("pretrained", "official")
# The attention takes its queries in blocks of this many rows: a block of s queries needs only
# K+s−1 of the 2T+M position rows, and the score tensors stay small (cost.py counts by it).
QUERY_BLOCK = 256

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
    "bos_token_id", "eos_token_id", "sep_token_id", "mask_token_id",
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
    # how the model was fine-tuned to read a segment (None: not recorded): twice, under the
    # retrospective feed (paper §3.1), and with the [CLS] id at cls_token_idx
    retro_feed=None,
    cls_token_id=None,
)
# The sub-folders of a run's OUTPUT_DIR that hold a saved model, in the order they are taken.
RUN_MODEL_FOLDERS = ("best", "final")
TASK_FILE = "task.json"   # beside a fine-tuned model: its task, kind, labels and run config
RUN_CONFIG_FILE = "run_config.yaml"   # what marks a run's OUTPUT_DIR
TRAINER_STATE = "trainer_state.json"   # what marks a trainer checkpoint (checkpoints/step-N)
LM_CONFIG_FILE = "lm_config.json"      # what marks a saved language model (Transformer-XL)
MAX_TASK_FILE_BYTES = 16 << 20



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


# -- config files as other tools spell them ------------------------------------------------------
def _flatten_legacy(raw):
    """Old PaddleNLP (≤2.4) model_config.json nests the encoder's arguments in "init_args"
    (a list whose dict entries may nest again); top-level keys win."""
    flat = {k: v for k, v in raw.items() if k != "init_args"}
    args = raw.get("init_args")
    if isinstance(args, dict):
        args = [args]
    for arg in args if isinstance(args, (list, tuple)) else []:
        if isinstance(arg, dict):
            for key, value in _flatten_legacy(arg).items():
                flat.setdefault(key, value)
    return flat


def _architecture(raw: Dict[str, Any], flat: Dict[str, Any], source: str,
                  error: Type[Exception]) -> Optional[Dict[str, Any]]:
    """The model class a config names → {"class", "kwargs"} (a copy) or None: our own
    "architecture" (checked), else PaddleNLP's "architectures"[0] or "init_class"."""
    architecture = raw.get("architecture")
    if architecture is not None and not (isinstance(architecture, dict)
                                         and isinstance(architecture.get("class"), str)):
        raise error(f"{source}: 'architecture' must be an object with a 'class'")
    if architecture is None:
        cls_name = flat.get("init_class")
        archs = flat.get("architectures")
        if isinstance(archs, (list, tuple)) and archs and isinstance(archs[0], str):
            cls_name = archs[0]
        if isinstance(cls_name, str):
            architecture = {"class": cls_name, "kwargs": {}}
    if architecture is not None:
        kwargs = architecture.get("kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise error(f"{source}: 'architecture.kwargs' must be an object (argument: value), "
                        f"got {type(kwargs).__name__}")
        for key in HEAD_SIZE_ARGUMENTS:
            problem = (integer_problem(kwargs[key], 1, MAX_HEAD_SIZE)
                       if kwargs and key in kwargs else None)
            if problem:
                raise error(f"{source}: 'architecture.kwargs.{key}' {problem}")
        architecture = {"class": architecture["class"], "kwargs": dict(kwargs or {})}
    return architecture


def parse_config_dict(raw: Any, source: str = "config", error: Type[Exception] = ValueError
                      ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """A config JSON object in any supported spelling → (ErnieDocConfig kwargs, architecture);
    other tools' unknown keys are dropped with a warning. `error` naming `source` otherwise."""
    if not isinstance(raw, dict):
        raise error(f"{source}: expected a JSON object, got {type(raw).__name__}")
    ours = "architecture" in raw and "model_type" not in raw
    flat = _flatten_legacy(raw) if "init_args" in raw else dict(raw)
    architecture = _architecture(raw, flat, source, error)

    # PaddleNLP: num_labels lives in id2label; old API: num_classes.
    if flat.get("num_labels") is None:
        if isinstance(flat.get("num_classes"), int):
            flat["num_labels"] = flat["num_classes"]
        elif isinstance(flat.get("id2label"), dict) and flat["id2label"]:
            flat["num_labels"] = len(flat["id2label"])
    if architecture is not None and not ours:
        for key in ("num_choices", "dropout"):
            if flat.get(key) is not None:
                architecture["kwargs"].setdefault(key, flat[key])

    values = {}
    unknown = []
    known = known_keys(ignored=True)
    for key, value in flat.items():
        if key == "architecture" or value is None:
            continue  # PaddleNLP writes null for "use the default"
        if key not in known:
            unknown.append(key)
            continue
        values[key] = value
    if unknown:
        if ours:
            raise error(f"{source}: unknown config keys {', '.join(sorted(unknown))}")
        logger.warning("%s: ignoring config keys this model does not use: %s", source,
                       ", ".join(sorted(unknown)))
    return values, architecture


def read_config_file(path: "str | os.PathLike[str]", error: Type[Exception] = ValueError
                     ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """JSON config file → (ErnieDocConfig kwargs, architecture or None); `error` names it."""
    return parse_config_dict(read_json(path, error), os.fspath(path), error)


def run_model_folder(path: str) -> str:
    """The saved model a local folder stands for: the first of it, its best/ and its final/
    that holds task.json (a fine-tuned model: what `pipeline` and `predict` take); else the
    folder when it holds a model config, else its best/ or final/ with one; else `path`."""
    if not os.path.isdir(path):
        return path
    candidates = [path] + [os.path.join(path, name) for name in RUN_MODEL_FOLDERS]
    for marker in (TASK_FILE, None):
        for folder in candidates:
            names = [marker] if marker else CONFIG_FILES if folder == path else CONFIG_FILES[:1]
            if any(os.path.isfile(os.path.join(folder, name)) for name in names):
                return folder
    if os.path.isfile(os.path.join(path, RUN_CONFIG_FILE)):
        raise CheckpointError(f"{path}: a run's OUTPUT_DIR with no best/ or final/ (a run "
                              f"saves its model there at its first evaluation and at its end; "
                              f"an eval_only run saves none)")
    return path


def training_checkpoint_problem(path: str) -> Optional[str]:
    """The one line for a trainer checkpoint (a run's checkpoints/step-N or latest: weights,
    optimizer and trainer state, no config) given where a saved model is expected; else None."""
    names = (TASK_FILE,) + tuple(CONFIG_FILES)
    if not os.path.isfile(os.path.join(path, TRAINER_STATE)) or any(
            os.path.isfile(os.path.join(path, name)) for name in names):
        return None
    parent = os.path.dirname(os.path.normpath(path))
    run = f"the run's folder {os.path.dirname(parent) or os.curdir}" \
        if os.path.basename(parent) == "checkpoints" else "the run's OUTPUT_DIR"
    return (f"{path}: a training checkpoint (what `--resume` continues), not a saved model; "
            f"give {run}, or its best/ or final/")


def language_model_problem(path: str) -> Optional[str]:
    """The one line for a saved language model (lm_config.json, no ERNIE-Doc config) given
    where an ERNIE-Doc model or its tokenizer is expected; else None."""
    if not os.path.isfile(os.path.join(path, LM_CONFIG_FILE)) or any(
            os.path.isfile(os.path.join(path, name)) for name in CONFIG_FILES):
        return None
    return (f"{path}: a language model ({LM_CONFIG_FILE}: a Transformer-XL with a word "
            f"vocabulary, no tokenizer), not an ERNIE-Doc model; read text with "
            f"pipeline({path!r}), load it with ernie_doc.lm.model.TransformerXLLM")


def saved_reading(folder: str) -> Dict[str, Any]:
    """How the run that saved `folder` read a segment, from its task.json: {"retro_feed",
    "max_seq_len", "max_doc_tokens", "stride" (when set), and for a classifier "segment_layout"};
    {} without a readable one (predict reports a broken task.json itself). For folders whose
    config.json and tokenizer_config.json do not record it."""
    path = os.path.join(folder, TASK_FILE)
    try:
        if os.path.getsize(path) > MAX_TASK_FILE_BYTES:
            return {}
        record = read_json(path, ValueError)
    except (OSError, ValueError):
        return {}
    config = record.get("config") if isinstance(record, dict) else None
    if not isinstance(config, dict):
        return {}
    reading = {}
    if isinstance(config.get("retro_feed"), bool):
        reading["retro_feed"] = config["retro_feed"]
    for key, low in (("max_seq_len", 3), ("max_doc_tokens", 0), ("stride", 1)):
        if integer_problem(config.get(key), low) is None:
            reading[key] = config[key]
    if record.get("kind") == "classification" and "max_seq_len" in reading:
        layout = config.get("segment_layout", "cls_last")
        if layout in ("cls_first", "cls_last"):
            reading["segment_layout"] = layout
    return reading


def _config_file(path: str) -> Optional[str]:
    """The config file of a local model path: the .json file itself, else the first of
    CONFIG_FILES in its folder (or the one above `params/`, or a run's best/ or final/); None
    when there is none."""
    if os.path.isfile(path) and path.endswith(".json"):
        return path
    return next((os.path.join(f, n) for f in model_folders(run_model_folder(path))
                 for n in CONFIG_FILES if os.path.isfile(os.path.join(f, n))), None)


def model_folders(path: str) -> List[str]:
    """Where the files of a local checkpoint path lie: its folder (the path itself, or a
    file's folder) and, above a folder named params/ (the official layout), its parent."""
    folder = path if os.path.isdir(path) else os.path.dirname(path) or os.curdir
    parent = os.path.normpath(os.path.abspath(folder))
    return [folder] + ([os.path.dirname(parent)] if os.path.basename(parent) == "params" else [])


def integer_problem(value: object, low: int = 0, high: int = MAX_DIM,
                    nullable: bool = False) -> Optional[str]:
    """Why `value` cannot be an integer setting in [low, high] (None allowed when `nullable`),
    or None. A bool is never an integer; `high` defaults to MAX_DIM."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
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
                    f"unknown config key {key!r}{did_you_mean(key, sorted(_DEFAULTS))}; "
                    f"known keys: {', '.join(sorted(_DEFAULTS))}")
            values[key] = value
        self.__dict__.update(values)
        self.validate()

    if TYPE_CHECKING:   # the type checker: the keys of _DEFAULTS, which __init__ sets
        def __getattr__(self, name: str) -> Any: ...

    # -- checks ------------------------------------------------------------------------------
    def validate(self):
        def integer(name, low, high=MAX_DIM):
            problem = integer_problem(getattr(self, name), low, high)
            if problem:
                raise ConfigError(f"{name} {problem}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings", "task_type_vocab_size"):
            integer(name, 1)
        integer("num_labels", 1, MAX_HEAD_SIZE)
        integer("memory_len", 0)
        integer("pad_token_id", 0)
        integer("cls_token_idx", -MAX_DIM)
        if self.cls_token_id is not None:
            integer("cls_token_id", 0, self.vocab_size - 1)
        if self.retro_feed is not None and not isinstance(self.retro_feed, bool):
            raise ConfigError(f"retro_feed must be true, false or null, got "
                              f"{self.retro_feed!r}")
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
        """A lower bound on the encoder's parameter count without building it: the word
        embeddings and 12·H² per layer."""
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
        return cls.from_dict(read_json(path, ConfigError), source=os.fspath(path))

    def to_json(self, path=None):
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
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
            release = registry.release(spec)
            if release is not None:
                return cls.from_any(release.preset, **overrides)
        if isinstance(spec, (str, os.PathLike)) and os.path.isdir(spec):
            spec = run_model_folder(os.fspath(spec))
            for name in ("config.json", "ernie_config.json"):
                if os.path.isfile(os.path.join(spec, name)):
                    spec = os.path.join(spec, name)
                    break
        if isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec):
            cfg = cls.from_json(spec)
            return cfg.replace(**overrides) if overrides else cfg
        raise ConfigError(f"not a preset name or a config file: {spec!r} "
                          f"(presets: {', '.join(PRESETS)})")

    @classmethod
    def from_pretrained(cls, path: "str | os.PathLike[str]", **overrides) -> "ErnieDocConfig":
        """The config of a saved or released model (a checkpoint directory or file, a config
        JSON, a released name or preset). overrides: config keys. ConfigError, one line."""
        spec = os.fspath(path)
        if os.path.exists(spec):
            found = _config_file(spec)
            folder = spec if os.path.isdir(spec) else os.path.dirname(spec) or os.curdir
            problem = training_checkpoint_problem(folder)
            if problem and (found is None or os.path.basename(found) == TRAINER_STATE):
                raise ConfigError(problem)
            if found is None:
                raise ConfigError(f"{spec}: no config file ({', '.join(CONFIG_FILES)})")
            values, _ = read_config_file(found, ConfigError)
            return cls.from_dict({**values, **overrides}, source=found)
        if spec not in PRESETS and registry.release(spec) is None:
            raise ConfigError(f"{spec}: no such file or directory, and not a released name or "
                              f"preset ({', '.join(PRESETS)})")
        try:   # a preset or a released name: what fails now is the overrides'
            return cls.from_any(spec, **overrides)
        except ConfigError as e:
            raise ConfigError(f"{spec}: {e}") from None

    def save_pretrained(self, directory: "str | os.PathLike[str]") -> "str | os.PathLike[str]":
        """Write config.json into `directory` (atomic, other files kept) → `directory`; keys of
        an existing config.json this config does not own (head class, labels) are kept."""
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, CONFIG_FILES[0])
        values = self.to_dict()
        if os.path.isfile(target):
            old_values, _ = read_config_file(target, ConfigError)   # refuses a broken file
            raw = read_json(target, ConfigError)
            owned = set(_DEFAULTS) | set(_ALIASES) | {"num_classes", "init_args"}
            kept = {k: v for k, v in raw.items() if k not in owned}
            for key in ("id2label", "label2id"):
                if isinstance(kept.get(key), dict) and len(kept[key]) != self.num_labels:
                    del kept[key]   # another count of classes: it would contradict num_labels
            changed = [k for k in _SIZE_KEYS
                       if k in old_values and old_values[k] != values[k]]
            if changed:
                logger.warning("%s: the config written differs from the one replaced in %s; "
                               "weights saved beside it no longer fit", target,
                               ", ".join(f"{k} ({old_values[k]} -> {values[k]})"
                                         for k in changed))
            values = {**kept, **values}
            for alias, key in _ALIASES.items():   # a PaddleNLP spelling stays, up to date
                if alias in raw:
                    values[alias] = values[key]
        atomic_write_text(target, json.dumps(values, indent=2, sort_keys=True) + "\n")
        return directory

    def __eq__(self, other):
        return isinstance(other, ErnieDocConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"ErnieDocConfig({self.to_dict()})"
