"""from_pretrained / save_pretrained: the one door for weights.

    model = ErnieDocForSequenceClassification.from_pretrained(path, num_labels=3)
    model.load_report          # .missing / .unexpected / .ignored / .format / .path
    model.save_pretrained(out, format="safetensors" | "paddlenlp" | "official")

`path` may hold any layout of ernie_doc.checkpoint.io. Names are mapped with
ernie_doc.checkpoint.names; the model's own state_dict keys are PaddleNLP's (heads keep the
encoder under `ernie_doc.`). What may load partially: docs/checkpoints.md."""
import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Type, TypeVar

import numpy as np
import paddle

from ernie_doc.checkpoint import io, names
from ernie_doc.checkpoint.lodtensor import PathLike, bf16_to_fp32
from ernie_doc.config import (ErnieDocConfig, known_keys, language_model_problem, saved_reading,
                              training_checkpoint_problem)
from ernie_doc.errors import CheckpointError
from ernie_doc.hub import resolve
from ernie_doc.utils import clip, dtype_name, short_list

logger = logging.getLogger("ernie_doc.checkpoint")

Model = TypeVar("Model", bound="PretrainedMixin")   # from_pretrained returns its own class

# Constructor arguments that a checkpoint's head tensors fix: argument → (head key, axis).
_SIZE_FROM_CHECKPOINT = {"num_labels": ("linear.bias", 0),
                         "num_reorder_classes": ("reorder_head.bias", 0)}


@dataclass(eq=False, repr=False)
class LoadReport:
    """What from_pretrained did. Lists hold checkpoint names (unexpected, ignored) or model
    keys (missing); also usable as a dict (report["missing"])."""
    format: str
    path: str
    config_source: str
    loaded: List[str]
    missing: List[str]
    unexpected: List[str]
    ignored: List[str]
    # the head class the checkpoint records when it is another class's (its tensors are
    # then in `unexpected`, this model's head in `missing`), else None
    other_head: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"format": self.format, "path": self.path, "config_source": self.config_source,
                "other_head": self.other_head,
                "loaded": list(self.loaded), "missing": list(self.missing),
                "unexpected": list(self.unexpected), "ignored": list(self.ignored)}

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def summary(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors from {self.path} ({self.format} format; "
                 f"config from {self.config_source})"]
        if self.missing:
            lines.append(f"missing {len(self.missing)} (newly initialized): "
                         + ", ".join(self.missing))
        if self.unexpected:
            whose = f" (the {self.other_head} head, not used)" if self.other_head else \
                " (not used)"
            lines.append(f"unexpected {len(self.unexpected)}{whose}: "
                         + ", ".join(self.unexpected))
        if self.ignored:
            lines.append(f"ignored {len(self.ignored)} optimizer/LR-state entries")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self):
        return (f"LoadReport(format={self.format!r}, loaded={len(self.loaded)}, "
                f"missing={self.missing}, unexpected={self.unexpected}, "
                f"ignored={len(self.ignored)})")


def _is_bare(cls: type) -> bool:
    """Whether `cls` is the bare encoder: its keys carry no `ernie_doc.` prefix."""
    return not cls.encoder_prefix


def _constructor_params(cls: type) -> List[str]:
    params = inspect.signature(cls.__init__).parameters
    return [p for p in params if p not in ("self", "config")
            and params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                       inspect.Parameter.VAR_KEYWORD)]


def checkpoint_key_map(names_in_checkpoint: Iterable[str], fmt: str,
                       cls: type) -> Dict[str, Optional[str]]:
    """{checkpoint name: model key or None} for `cls`: official names through names.py (and
    cls.official_names), others are model keys with or without `ernie_doc.`."""
    prefixed = not _is_bare(cls)
    head_names = cls.official_names
    out = {}
    for name in names_in_checkpoint:
        if fmt == "official":
            out[name] = names.official_to_ours(name, head_names, prefixed)
            continue
        bare = names.strip_prefix(name)
        if names.backbone_to_official(bare) is not None:  # a backbone tensor
            out[name] = names.PREFIX + bare if prefixed else bare
        else:  # a head tensor: heads keep theirs unprefixed
            out[name] = None if name.startswith(names.PREFIX) else name
    return out


_FLOAT_PARAMS = ("float16", "float32", "float64", "bfloat16")


def cast_problem(array: np.ndarray, param_dtype: str) -> Optional[str]:
    """Why `array` cannot load into a parameter of dtype `param_dtype`, or None: floats cast,
    uint16 is bfloat16 bits; integers, bools and complex never become floats."""
    kind = array.dtype.kind
    if param_dtype in _FLOAT_PARAMS:
        if kind == "f" or array.dtype == np.uint16:
            return None
    else:
        try:
            if np.can_cast(array.dtype, np.dtype(param_dtype), "safe"):
                return None
        except TypeError:
            pass
    return f"a {array.dtype} tensor cannot load into a {param_dtype} parameter"


def assign_array(param: paddle.Tensor, array: np.ndarray) -> None:
    """Copy ndarray `array` into `param` (same shape), cast to the parameter's dtype (uint16 =
    bfloat16 bits, see cast_problem)."""
    if array.dtype == np.uint16 and dtype_name(param.dtype) in _FLOAT_PARAMS:
        array = bf16_to_fp32(array)
    np_dtype = {paddle.float32: np.float32, paddle.float16: np.float16,
                paddle.float64: np.float64}.get(param.dtype)
    if np_dtype is not None:
        param.set_value(np.ascontiguousarray(array, dtype=np_dtype))
    elif dtype_name(param.dtype) == "bfloat16":  # numpy cannot hold it: cast in paddle
        param.set_value(paddle.to_tensor(np.asarray(array, dtype=np.float32))
                        .astype(param.dtype))
    else:
        param.set_value(np.ascontiguousarray(array, dtype=dtype_name(param.dtype)))


def _known_head_modules(cls: type, target: Dict[str, Any],
                        ckpt: io.Checkpoint) -> Optional[Set[str]]:
    """First name components of known heads' tensors (official heads and `cls`'s); None when
    the checkpoint's config names a head class (then every non-encoder tensor is its)."""
    arch = (ckpt.architecture or {}).get("class")
    if arch and arch != "ErnieDocModel":
        return None
    modules = names.official_head_modules()
    if not _is_bare(cls):   # this class's own head (a task's head may have other modules)
        modules.update(k.split(".")[0] for k in target if not k.startswith(names.PREFIX))
    return modules


def _leftover_kind(name: str, fmt: str, cls: type, head_modules: Optional[Set[str]]) -> str:
    """An unused checkpoint tensor: "head" (another known head's), "encoder" (a differing
    config) or "unknown"."""
    if fmt == "official":
        if names.official_to_backbone(name) is not None:
            return "encoder"
        return "head" if name in _official_head_names(cls) else "unknown"
    if name.startswith(names.PREFIX) or name.split(".")[0] in names.ENCODER_MODULES:
        return "encoder" if names.backbone_to_official(names.strip_prefix(name)) else "unknown"
    return "head" if head_modules is None or name.split(".")[0] in head_modules else "unknown"


def _official_head_names(cls: type) -> Set[str]:
    """The official head parameter names a load into `cls` knows: every official head's
    (checkpoint.names) and cls's own."""
    return names.official_head_names(cls.official_names.values())


def model_class_names() -> Set[str]:
    """__name__ of every concrete model class defined so far (ErnieDocModel and the heads);
    bases marked `abstract_base = True` are left out."""
    out, todo = set(), list(PretrainedMixin.__subclasses__())
    while todo:
        c = todo.pop()
        todo.extend(c.__subclasses__())
        if not c.__dict__.get("abstract_base", False):
            out.add(c.__name__)
    return out


def recorded_class(ckpt: io.Checkpoint) -> Optional[str]:
    """The known model class (model_class_names) the checkpoint's config records, else None."""
    recorded = (ckpt.architecture or {}).get("class")
    return recorded if isinstance(recorded, str) and recorded in model_class_names() else None


def describe_class(name: Any) -> str:
    """A recorded class name for a message: quoted, control characters escaped, clipped."""
    return clip(repr(name), 80)


def other_head(cls: type, ckpt: io.Checkpoint, key_map: Dict[str, Optional[str]]
               ) -> Optional[str]:
    """Why the checkpoint's head tensors must not load into `cls`'s head: their class, else
    None. Details: docs/design-notes.md, "Checkpoints: which head loads"."""
    if _is_bare(cls):
        return None
    recorded = recorded_class(ckpt)
    if recorded is not None:
        return None if recorded in {c.__name__ for c in cls.__mro__} else recorded
    if ckpt.format == "official":
        return None
    if not any(key is not None and not key.startswith(names.PREFIX)
               for key in key_map.values()):
        return None    # no head tensor would load: nothing to tell apart
    raw = (ckpt.architecture or {}).get("class")
    return (f"{describe_class(raw)} (an unknown class)" if raw
            else "unnamed (no class recorded)")


def _without_head(key_map: Dict[str, Optional[str]]) -> Dict[str, Optional[str]]:
    """key_map with every head tensor unassigned (None): only the encoder loads."""
    return {name: key if key is not None and key.startswith(names.PREFIX) else None
            for name, key in key_map.items()}


# -- the steps of from_pretrained ------------------------------------------------------------
def _read(cls: type, path: Any, source: Optional[str]) -> io.Checkpoint:
    """`path` (anything ernie_doc.hub.resolve takes, or a Checkpoint already read) → the
    Checkpoint, its tensors named as stored."""
    if isinstance(path, io.Checkpoint):
        return path
    return io.read_checkpoint(resolve(path, kind="model", source=source),
                              head_names=_official_head_names(cls))


def _split_arguments(cls: type, ctor_params: List[str], kwargs: Dict[str, Any]
                     ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """from_pretrained's **kwargs → (constructor arguments, config overrides); TypeError for a
    key that is neither."""
    config_keys = known_keys()
    ctor_kwargs, overrides = {}, {}
    for key, value in kwargs.items():
        if key in ctor_params:
            ctor_kwargs[key] = value
        elif key in config_keys:
            overrides[key] = value
        else:
            raise TypeError(f"{cls.__name__}.from_pretrained: unknown argument {key!r} "
                            f"(neither a config key nor one of {ctor_params})")
    return ctor_kwargs, overrides


def _resolve_config(ckpt: io.Checkpoint, config: Any) -> Tuple[ErnieDocConfig, str]:
    """The model config (the `config` argument wins over the checkpoint's) and where it came
    from; CheckpointError when there is neither."""
    where = ckpt.path
    if config is not None:
        if ckpt.config is not None:
            logger.info("%s: using the given config instead of %s", where, ckpt.config_path)
        return ErnieDocConfig.from_any(config), "the config argument"
    if ckpt.config is not None:
        cfg = ErnieDocConfig.from_dict(ckpt.config, source=ckpt.config_path)
        if cfg.retro_feed is None:   # saved before config.json recorded it: its task.json
            retro_feed = saved_reading(os.path.dirname(ckpt.config_path)).get("retro_feed")
            if isinstance(retro_feed, bool):
                cfg = cfg.replace(retro_feed=retro_feed)
        return cfg, ckpt.config_path
    folder = ckpt.path if os.path.isdir(ckpt.path) else os.path.dirname(ckpt.path) or os.curdir
    problem = training_checkpoint_problem(folder) or language_model_problem(folder)
    if problem:
        raise CheckpointError(problem)
    raise CheckpointError(
        f"{where}: the checkpoint has no config file (looked for {io.CONFIG_FILE}, "
        f"{io.LEGACY_CONFIG_FILE} or {io.OFFICIAL_CONFIG_FILE}); pass config= (a preset "
        f"name, a JSON path or an ErnieDocConfig)")


def _apply_overrides(cfg: ErnieDocConfig, overrides: Dict[str, Any],
                     key_map: Dict[str, Optional[str]], where: str) -> ErnieDocConfig:
    """cfg with from_pretrained's config keys, and rel_pos_params_sharing from the tensor
    names when not given (official configs do not say)."""
    overrides = dict(overrides)
    if "rel_pos_params_sharing" not in overrides:
        layout = names.bias_layout(names.strip_prefix(k) for k in key_map.values() if k)
        if layout is not None and (layout == "shared") != cfg.rel_pos_params_sharing:
            logger.info("%s: the checkpoint holds %s r_w/r_r/r_t biases: setting "
                        "rel_pos_params_sharing=%s", where, layout.replace("_", "-"),
                        layout == "shared")
            overrides["rel_pos_params_sharing"] = layout == "shared"
    return cfg.replace(**overrides) if overrides else cfg


def _head_arguments(ckpt: io.Checkpoint, key_map: Dict[str, Optional[str]],
                    ctor_params: List[str], given: Dict[str, Any],
                    same_head: bool = True) -> Dict[str, Any]:
    """The constructor arguments: given > the checkpoint's head tensors (num_labels,
    num_reorder_classes) > our config's "architecture" kwargs when it records this class."""
    ctor_kwargs = dict(given)
    for arg, (head_key, axis) in _SIZE_FROM_CHECKPOINT.items():
        if arg in ctor_params and arg not in ctor_kwargs:
            for name, key in key_map.items():
                if key == head_key and ckpt.tensors[name].ndim > axis:
                    ctor_kwargs[arg] = int(ckpt.tensors[name].shape[axis])
    if ckpt.architecture and same_head:
        for key, value in ckpt.architecture.get("kwargs", {}).items():
            if key in ctor_params and key not in ctor_kwargs:
                ctor_kwargs[key] = value
    return ctor_kwargs


@dataclass
class TensorMatch:
    """Which checkpoint tensor goes into which model parameter."""
    assigned: Dict[str, str]   # model key → checkpoint name (same shape, castable dtype)
    unexpected: List[str]      # checkpoint names the model does not take
    missing: List[str]         # model keys no checkpoint tensor fills


def _match_tensors(ckpt: io.Checkpoint, key_map: Dict[str, Optional[str]],
                   target: Dict[str, Any]) -> TensorMatch:
    """Pair checkpoint tensors with `target` (the state_dict); shapes must agree and arrays
    cast: CheckpointError listing every tensor that does not, with both shapes."""
    where = ckpt.path
    assigned, unexpected, mismatched, uncastable = {}, [], [], []
    for name, key in key_map.items():
        if key is None or key not in target or key in assigned:
            unexpected.append(name)
            continue
        label = name if name == key else f"{name} (model {key})"
        want = [int(d) for d in target[key].shape]
        have = list(ckpt.tensors[name].shape)
        if want != have:
            mismatched.append(f"{label}: checkpoint {have} vs model {want}")
            continue
        problem = cast_problem(ckpt.tensors[name], dtype_name(target[key].dtype))
        if problem:
            uncastable.append(f"{label}: {problem}")
            continue
        assigned[key] = name
    if mismatched:
        raise CheckpointError(
            f"{where}: {len(mismatched)} tensor shape(s) differ from the model (is the "
            f"config right?): " + short_list(mismatched, 8, "; "))
    if uncastable:
        raise CheckpointError(f"{where}: {len(uncastable)} tensor(s) of a dtype the "
                              f"model cannot take: " + short_list(uncastable, 8, "; "))
    missing = [k for k in target if k not in assigned]
    return TensorMatch(assigned, unexpected, missing)


def _check_strict(where: str, match: TensorMatch) -> None:
    """strict=True: CheckpointError unless every model tensor and checkpoint tensor is used."""
    if match.missing or match.unexpected:
        raise CheckpointError(
            f"{where}: strict load failed: missing {match.missing or 'none'}; "
            f"unexpected {match.unexpected or 'none'}")


def _partial_problems(cls: type, ckpt: io.Checkpoint, target: Dict[str, Any],
                      match: TensorMatch) -> List[str]:
    """What makes the match partial, one phrase each (empty: whole). CheckpointError when no
    encoder tensor matched at all."""
    where, assigned = ckpt.path, match.assigned
    bare = _is_bare(cls)
    encoder_keys = [k for k in target if bare or k.startswith(names.PREFIX)]
    head_keys = [k for k in target if not (bare or k.startswith(names.PREFIX))]
    if not any(k in assigned for k in encoder_keys):
        held = (f"it holds {len(ckpt.tensors)} tensors, e.g. {short_list(ckpt.tensors, 3)}"
                if ckpt.tensors else "it holds no tensors")
        raise CheckpointError(
            f"{where}: none of the {len(encoder_keys)} encoder tensors of {cls.__name__} "
            f"is in the checkpoint ({held}): not an ERNIE-Doc checkpoint of this layout")
    head_modules = _known_head_modules(cls, target, ckpt)
    problems = []
    encoder_missing = [k for k in encoder_keys if k not in assigned]
    if encoder_missing:
        problems.append(f"{len(encoder_missing)} of {len(encoder_keys)} encoder tensors "
                        f"missing ({short_list(encoder_missing)})")
    head_missing = [k for k in head_keys if k not in assigned]
    if head_missing and len(head_missing) < len(head_keys):
        problems.append(f"the {cls.__name__} head is only partly there (missing "
                        f"{short_list(head_missing)})")
    leftover = {"encoder": [], "unknown": [], "head": []}
    for name in match.unexpected:
        leftover[_leftover_kind(name, ckpt.format, cls, head_modules)].append(name)
    if leftover["encoder"]:
        problems.append(f"{len(leftover['encoder'])} encoder tensors this model does not "
                        f"have, is the config right? ({short_list(leftover['encoder'])})")
    if leftover["unknown"]:
        problems.append(f"{len(leftover['unknown'])} tensors that belong to no known head "
                        f"({short_list(leftover['unknown'])})")
    return problems


def _assign(target: Dict[str, Any], match: TensorMatch, tensors: Dict[str, np.ndarray]) -> None:
    """Copy each matched checkpoint array into its parameter."""
    for key, name in match.assigned.items():
        assign_array(target[key], tensors[name])


def _report(cls: type, ckpt: io.Checkpoint, config_source: str, match: TensorMatch,
            problems: List[str], other: Optional[str] = None) -> "LoadReport":
    """The LoadReport of a finished load, logged: a summary line, then warnings for a partial
    load and missing or unused tensors."""
    where = ckpt.path
    report = LoadReport(ckpt.format, where, config_source, sorted(match.assigned),
                        match.missing, match.unexpected, list(ckpt.ignored), other)
    logger.info("%s", report.summary().splitlines()[0])
    if problems:
        logger.warning("%s: partial checkpoint loaded (allow_partial): %s", where,
                       "; ".join(problems))
    if other is not None:
        logger.warning("Some weights of %s were not initialized from the checkpoint at %s and "
                       "are newly initialized: [%s]; the checkpoint's %s head is not used: "
                       "[%s]", cls.__name__, where,
                       ", ".join(match.missing), other, ", ".join(match.unexpected))
        return report
    if match.missing:
        logger.warning("Some weights of %s were not initialized from the checkpoint at %s and "
                       "are newly initialized: [%s]", cls.__name__, where,
                       ", ".join(match.missing))
    if match.unexpected:
        logger.warning("%s: %d checkpoint tensors not used by %s: %s", where,
                       len(match.unexpected), cls.__name__, ", ".join(match.unexpected))
    if ckpt.ignored:
        logger.info("%s: ignored %d optimizer/LR-state entries", where, len(ckpt.ignored))
    return report


class PretrainedMixin:
    """Adds from_pretrained / save_pretrained to ErnieDocModel and every head."""

    official_names = {}  # head classes: {their own parameter key: official static name}
    # Where the encoder's parameters sit in this class's state_dict: "" for the bare
    # ErnieDocModel, names.PREFIX ("ernie_doc.") for a head (heads.Head sets it).
    encoder_prefix = ""

    @classmethod
    def from_pretrained(cls: Type[Model], path: Any, config: Any = None, strict: bool = False,
                        allow_partial: bool = False, source: Optional[str] = None,
                        **kwargs: Any) -> Model:
        """Build `cls` and load a checkpoint into it → the model with `.load_report`. path: any
        ernie_doc.hub.resolve spec or a Checkpoint; source: "official" or "paddlenlp"; config
        wins over the checkpoint's; strict / allow_partial: docs/checkpoints.md. kwargs:
        config keys or constructor arguments. CheckpointError (HubError), one line."""
        ckpt = _read(cls, path, source)
        ctor_params = _constructor_params(cls)
        ctor_kwargs, overrides = _split_arguments(cls, ctor_params, kwargs)
        cfg, config_source = _resolve_config(ckpt, config)
        key_map = checkpoint_key_map(ckpt.tensors, ckpt.format, cls)
        other = other_head(cls, ckpt, key_map)
        if other is not None:   # another class's head: never reused, this one starts fresh
            key_map = _without_head(key_map)
        cfg = _apply_overrides(cfg, overrides, key_map, ckpt.path)
        model = cls(cfg, **_head_arguments(ckpt, key_map, ctor_params, ctor_kwargs,
                                           same_head=other is None))
        target = model.state_dict()

        match = _match_tensors(ckpt, key_map, target)
        if strict:
            _check_strict(ckpt.path, match)
        problems = _partial_problems(cls, ckpt, target, match)
        if problems and not allow_partial:
            raise CheckpointError(
                f"{ckpt.path}: partial checkpoint for {cls.__name__}: " + "; ".join(problems)
                + " (allow_partial=True, or allow_partial_checkpoint: true in a run config, "
                  "loads it anyway)")
        _assign(target, match, ckpt.tensors)
        model.load_report = _report(cls, ckpt, config_source, match, problems, other)
        return model

    def architecture(self) -> Dict[str, Any]:
        """{"class": class name, "kwargs": constructor arguments beyond the config}."""
        params = _constructor_params(type(self))
        kwargs = {}
        for name in ("num_labels", "num_choices"):
            if name in params and getattr(self, name, None) is not None:
                kwargs[name] = int(getattr(self, name))
        if "num_reorder_classes" in params and hasattr(self, "reorder_head"):
            kwargs["num_reorder_classes"] = int(self.reorder_head.weight.shape[1])
        dropout = getattr(self, "dropout", None)
        if "dropout" in params and hasattr(dropout, "p") and \
                float(dropout.p) != float(self.config.classifier_dropout):
            kwargs["dropout"] = float(dropout.p)
        return {"class": type(self).__name__, "kwargs": kwargs}

    def save_pretrained(self, directory: PathLike, format: str = "safetensors") -> PathLike:
        """Write weights and config into `directory` → `directory`; format: "safetensors",
        "paddlenlp" or "official". All files appear together or not at all."""
        fmt = io.normalize_format(format)
        state = self.state_dict()
        if fmt == "paddlenlp":
            tensors = dict(state)  # paddle.save takes the Tensors themselves
        else:
            tensors = {k: (v.astype("float32") if v.dtype == paddle.bfloat16 else v).numpy()
                       for k, v in state.items()}
        if fmt == "official":
            mapping = names.official_name_map(tensors, type(self).official_names,
                                              prefixed=not _is_bare(type(self)))
            tensors = {mapping[k]: v for k, v in tensors.items()}
        io.write_checkpoint(directory, fmt, tensors, self.config, self.architecture())
        return directory
