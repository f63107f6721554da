"""Finding, reading and writing checkpoints in the three supported layouts.

    "official"     one LoDTensor file per parameter (or in `params/`) + `ernie_config.json`
    "paddlenlp"    `model_state.pdparams` + `config.json` or `model_config.json`
    "safetensors"  ours: `model.safetensors` + `config.json` with an "architecture" entry

Only tensors named as stored and a config dict come out of here, never a model class; an
unreadable file is a CheckpointError naming it. Details: docs/design-notes.md, "Checkpoints:
layouts"."""
import json
import logging
import os
import re
import shutil
import tempfile
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, List, Optional, Set, Tuple

import numpy as np
from safetensors.numpy import load_file, save_file

from ernie_doc import config as config_module
from ernie_doc.checkpoint import lodtensor, names, safe_pickle
from ernie_doc.checkpoint.lodtensor import PathLike
from ernie_doc.errors import CheckpointError, ConfigError, LoDTensorFormatError
from ernie_doc.utils import atomic_write_text

if TYPE_CHECKING:   # for the annotations only
    from ernie_doc.config import ErnieDocConfig

logger = logging.getLogger("ernie_doc.checkpoint")

FORMATS = ("safetensors", "paddlenlp", "official")
FORMAT_ALIASES = {"ours": "safetensors", "safetensor": "safetensors", "pdparams": "paddlenlp",
                  "static": "official"}

SAFETENSORS_FILE = "model.safetensors"
PDPARAMS_FILE = "model_state.pdparams"
CONFIG_FILE, LEGACY_CONFIG_FILE, OFFICIAL_CONFIG_FILE = config_module.CONFIG_FILES

# The keys of the official ernie_config.json, in its order; sent_type_vocab_size is unused.
OFFICIAL_CONFIG_KEYS = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob",
                        "hidden_size", "initializer_range", "max_position_embeddings",
                        "num_attention_heads", "num_hidden_layers", "sent_type_vocab_size",
                        "task_type_vocab_size", "vocab_size", "memory_len", "epsilon")


@dataclass
class Checkpoint:
    """Tensors as stored (name → ndarray) and what the directory says about the model."""
    format: str
    path: str                       # file or directory the tensors were read from
    tensors: Dict[str, np.ndarray]
    config: Optional[Dict[str, Any]] = None   # ErnieDocConfig keyword arguments, or None
    config_path: Optional[str] = None
    architecture: Optional[Dict[str, Any]] = None   # {"class": name, "kwargs": {...}} or None
    ignored: List[str] = field(default_factory=list)


def normalize_format(fmt: str) -> str:
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown checkpoint format {fmt!r}; choose one of "
                          f"{', '.join(FORMATS)} (or 'ours' = safetensors)")
    return fmt


# -- config files -------------------------------------------------------------------------------
# Config spellings are read by ernie_doc.config; here their errors are CheckpointErrors.
def parse_config_dict(raw: Any, source: str = "config"
                      ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """config.parse_config_dict: (ErnieDocConfig kwargs, architecture); CheckpointError."""
    return config_module.parse_config_dict(raw, source, CheckpointError)


def read_config_file(path: PathLike) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """JSON config file → (ErnieDocConfig kwargs, architecture or None); CheckpointError."""
    return config_module.read_config_file(path, CheckpointError)


# -- detection ----------------------------------------------------------------------------------
def _first_file(directories, filenames):
    for d in directories:
        for n in filenames:
            p = os.path.join(d, n)
            if os.path.isfile(p):
                return p
    return None


def all_official_names() -> Set[str]:
    """Every official head parameter name (names.OFFICIAL_HEADS and OTHER_OFFICIAL_HEAD_NAMES);
    ernie_doc.auto.official_head_names adds every registered head's."""
    return names.official_head_names()


def _is_official_param(name, head_names):
    return names.official_to_backbone(name) is not None or name in head_names


def detect_format(path: PathLike, head_names: Optional[Collection[str]] = None
                  ) -> Tuple[str, str, Optional[str]]:
    """path → (format, weights path, config path or None); CheckpointError listing what was
    looked for. head_names: official head names marking a parameter file (default: all)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        directory = os.path.dirname(os.path.abspath(path))
        if path.endswith(".safetensors"):
            return "safetensors", path, _first_file([directory], [CONFIG_FILE])
        if path.endswith(".pdparams"):
            return "paddlenlp", path, _first_file([directory], [CONFIG_FILE, LEGACY_CONFIG_FILE])
        raise CheckpointError(f"{path}: not a checkpoint file (expected *.safetensors or "
                              f"*.pdparams, or a checkpoint directory)")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: no such file or directory")

    weights = os.path.join(path, SAFETENSORS_FILE)
    if os.path.isfile(weights):
        return "safetensors", weights, _first_file([path], [CONFIG_FILE])
    weights = os.path.join(path, PDPARAMS_FILE)
    pdparams = sorted(n for n in os.listdir(path)
                      if n.endswith(".pdparams") and not n.startswith(".")
                      and os.path.isfile(os.path.join(path, n)))
    if os.path.isfile(weights) or len(pdparams) == 1:
        if not os.path.isfile(weights):
            weights = os.path.join(path, pdparams[0])  # e.g. ernie-doc-base-en.pdparams
        return "paddlenlp", weights, _first_file([path], [CONFIG_FILE, LEGACY_CONFIG_FILE])

    tensor_dir = lodtensor.params_dir(path)
    if head_names is None:
        head_names = all_official_names()
    # Any file named like a parameter counts, readable or not (read_checkpoint then says
    # which one is broken).
    if any(_is_official_param(n, head_names) for n in lodtensor.list_regular_files(tensor_dir)):
        searched = [tensor_dir]
        if tensor_dir != path:
            searched.append(path)  # tensors in path/params: the config sits in path
        elif os.path.basename(os.path.normpath(os.path.abspath(path))) == "params":
            searched.append(os.path.dirname(os.path.normpath(os.path.abspath(path))))
        return "official", tensor_dir, _first_file(searched, [OFFICIAL_CONFIG_FILE])

    found = ""
    tensor_files = lodtensor.list_tensor_files(tensor_dir)   # only for the message
    if tensor_files:
        found = (f" (found {len(tensor_files)} LoDTensor files, none with an official "
                 f"ERNIE-Doc name, e.g. {', '.join(tensor_files[:3])})")
    elif len(pdparams) > 1:
        found = f" (found several .pdparams files: {', '.join(pdparams)}; pass one of them)"
    raise CheckpointError(
        f"{path}: no ERNIE-Doc checkpoint found{found}. Looked for: {SAFETENSORS_FILE} + "
        f"{CONFIG_FILE} (ours); {PDPARAMS_FILE} + {CONFIG_FILE} or {LEGACY_CONFIG_FILE} "
        f"(PaddleNLP); per-parameter LoDTensor files such as word_embedding, in the directory "
        f"or its params/ subdirectory, + {OFFICIAL_CONFIG_FILE} (official)")


# -- reading ------------------------------------------------------------------------------------
def read_safetensors(path: PathLike) -> Dict[str, np.ndarray]:
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: cannot read safetensors file ({e})") from None


def _read_pdparams(path):
    """A paddle.save state dict → ({name: ndarray}, [skipped]), read by safe_pickle (nothing
    runs; anything else is a CheckpointError); bfloat16 bits come back as float32."""
    state = safe_pickle.load_state_dict(path)
    tensors, skipped = {}, []
    for key, value in state.items():
        if isinstance(key, str) and isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            tensors[key] = lodtensor.bf16_to_fp32(value) if value.dtype == np.uint16 else value
        else:
            skipped.append(str(key))  # e.g. a name table or a step counter
    return tensors, skipped


def _read_official(directory, upcast, head_names):
    """The LoDTensor files of an official directory → ({official name: ndarray}, [ignored]);
    a file named like a parameter must be a valid LoDTensor file."""
    tensors, ignored = {}, []
    for name in lodtensor.list_regular_files(directory):
        if names.is_ignored_official(name):
            ignored.append(name)  # optimizer state can be twice the model: not read
            continue
        path = os.path.join(directory, name)
        if not _is_official_param(name, head_names) and not lodtensor.looks_like_lodtensor(path):
            continue
        try:
            tensors[name] = lodtensor.read_lodtensor(path, upcast=upcast)
        except LoDTensorFormatError as e:
            raise CheckpointError(str(e)) from None
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    return tensors, ignored


def read_checkpoint(path: PathLike, upcast: bool = True,
                    head_names: Optional[Collection[str]] = None) -> Checkpoint:
    """Any supported layout → Checkpoint (tensors named as stored). upcast: official FP16 /
    BF16 as float32. head_names: as for detect_format."""
    if head_names is None:
        head_names = all_official_names()
    fmt, weights, config_path = detect_format(path, head_names)
    config = architecture = None
    if config_path is not None:
        config, architecture = read_config_file(config_path)
    ignored = []
    if fmt == "safetensors":
        tensors = read_safetensors(weights)
    elif fmt == "paddlenlp":
        tensors, ignored = _read_pdparams(weights)
    else:
        tensors, ignored = _read_official(weights, upcast, head_names)
    return Checkpoint(fmt, weights, tensors, config, config_path, architecture, ignored)


def encoder_gaps(ckpt: Checkpoint) -> List[str]:
    """The official names of encoder tensors `ckpt` lacks (its layer count and bias layout
    from its config, else from its own tensors)."""
    present = set()
    for name in ckpt.tensors:
        official = name if ckpt.format == "official" else \
            names.backbone_to_official(names.strip_prefix(name))
        if official:
            present.add(official)
    if ckpt.config is not None:
        layout = config_module.ErnieDocConfig.from_any(ckpt.config)
    else:
        layers = [int(m.group(1)) for m in map(re.compile(r"encoder_layer_(\d+)_").match,
                                                present) if m]
        layout = types.SimpleNamespace(
            num_hidden_layers=max(layers, default=0) + 1,
            rel_pos_params_sharing=any(n in present for n in names.SHARED_BIAS_NAMES.values()))
    return [n for n in names.expected_backbone_names(layout) if n not in present]


# -- writing ------------------------------------------------------------------------------------
def commit_files(directory: PathLike, writers: Dict[str, Callable[[str], None]]) -> None:
    """Write several files into `directory` all or nothing: each writer(tmp_path) fills a file
    in a hidden staging folder, moved into place (os.replace) once all succeeded."""
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: exists and is not a directory")
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".tmp-save-", dir=directory)
    try:
        for name, write in writers.items():
            write(os.path.join(stage, name))
        for name in writers:
            os.replace(os.path.join(stage, name), os.path.join(directory, name))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not os.listdir(directory):
            os.rmdir(directory)  # leave no trace of a failed save
        raise
    shutil.rmtree(stage, ignore_errors=True)


def _json_writer(obj):
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"

    def write(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return write


def official_config_dict(config: "ErnieDocConfig",
                         architecture: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """ErnieDocConfig → the official ernie_config.json keys, + our "architecture" when given
    (the official code ignores it; it tells apart heads sharing official names)."""
    values = config.to_dict()
    out = {k: values[k] for k in OFFICIAL_CONFIG_KEYS if k in values}
    out["sent_type_vocab_size"] = 4  # present in every official config, read by nothing
    out = {k: out[k] for k in OFFICIAL_CONFIG_KEYS}
    if architecture is not None:
        out["architecture"] = architecture
    return out


def paddlenlp_config_dict(config: "ErnieDocConfig", architecture: Dict[str, Any]
                          ) -> Dict[str, Any]:
    """ErnieDocConfig → a PaddleNLP-style config.json (PaddleNLP spells the attention dropout
    attention_dropout_prob and reads num_labels from id2label)."""
    values = config.to_dict()
    values["attention_dropout_prob"] = values.pop("attention_probs_dropout_prob")
    num_labels = values.pop("num_labels")
    values["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    values["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    values["model_type"] = "ernie_doc"
    values["architectures"] = [architecture["class"]]
    values["architecture"] = architecture  # ours: head arguments PaddleNLP has no slot for
    return values


def write_config(directory: PathLike, fmt: str, config: Any) -> str:
    """Write `config` (an ErnieDocConfig or a preset name) into a `fmt` checkpoint directory
    that has none → the file name (ernie_config.json for "official", else config.json)."""
    config = config_module.ErnieDocConfig.from_any(config)
    if fmt == "official":
        text, name = json.dumps(official_config_dict(config), indent=2), OFFICIAL_CONFIG_FILE
    else:
        text, name = json.dumps(config.to_dict(), indent=2, sort_keys=True), CONFIG_FILE
    atomic_write_text(os.path.join(os.fspath(directory), name), text + "\n")
    return name


def write_checkpoint(directory: PathLike, fmt: str, tensors: Dict[str, Any],
                     config: "ErnieDocConfig", architecture: Dict[str, Any]) -> None:
    """Write tensors ({name: ndarray}, named for `fmt`; paddle Tensors too for "paddlenlp")
    and the config into `directory`, all or nothing."""
    fmt = normalize_format(fmt)
    if fmt == "safetensors":
        arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        meta = dict(config.to_dict(), architecture=architecture)
        writers = {SAFETENSORS_FILE: lambda p: save_file(arrays, p, metadata={"format": "np"}),
                   CONFIG_FILE: _json_writer(meta)}
    elif fmt == "paddlenlp":
        import paddle
        state = {k: v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v)
                 for k, v in tensors.items()}
        writers = {PDPARAMS_FILE: lambda p: paddle.save(state, p),
                   CONFIG_FILE: _json_writer(paddlenlp_config_dict(config, architecture))}
    else:
        for name in tensors:
            if not name or "/" in name or os.sep in name or name.startswith("."):
                raise CheckpointError(f"{name!r} cannot be a parameter file name")
        writers = {name: (lambda p, a=array: lodtensor.write_lodtensor(p, a))
                   for name, array in tensors.items()}
        writers[OFFICIAL_CONFIG_FILE] = _json_writer(official_config_dict(config,
                                                                            architecture))
        stale = [n for n in (lodtensor.list_tensor_files(directory)
                             if os.path.isdir(directory) else [])
                 if n not in tensors and not names.is_ignored_official(n)]
        if stale:
            logger.warning("%s already holds tensor files this save does not write (they will "
                           "be read as unexpected): %s", directory, ", ".join(stale[:10]))
    commit_files(directory, writers)

