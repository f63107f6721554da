"""Names → classes: the one registry of task heads, and which class a checkpoint holds.

    head_class("sequence_classification")   → ErnieDocForSequenceClassification
    model_class_for(checkpoint)             → the class a checkpoint was saved from
    AutoModel.from_pretrained(path)         → an instance of that class, loaded
    read_checkpoint(path)                   → checkpoint.io.read_checkpoint, every head known

Task folders register their own heads (`@register_head`); task kinds have their own registry
(ernie_doc.kinds). The registry is closed: a name read from a config, task.json or a sidecar is
only looked up, never imported. Details: docs/design-notes.md, "Registries"."""
import difflib
import logging
import os
from typing import Any, Callable, Collection, Dict, List, Optional, Set, Type, Union

from ernie_doc.checkpoint import io, names
from ernie_doc.checkpoint.io import Checkpoint
from ernie_doc.checkpoint.lodtensor import PathLike
from ernie_doc.config import training_checkpoint_problem
from ernie_doc.errors import CheckpointError, ConfigError
from ernie_doc.heads import HEADS, Head
from ernie_doc.hub import resolve
from ernie_doc.kinds.folders import load_task_folders, register
from ernie_doc.modeling.model import ErnieDocModel
from ernie_doc.utils import clip

logger = logging.getLogger("ernie_doc.checkpoint")

ModelClass = Union[Type[ErnieDocModel], Type[Head]]

_registry: Dict[str, Type[Head]] = {}


def register_head(name: str) -> Callable[[Type[Head]], Type[Head]]:
    """Class decorator: register a head class (a subclass of ernie_doc.heads.Head) under
    `name` (see kinds.folders.register for a name registered twice)."""
    def register_class(cls: Type[Head]) -> Type[Head]:
        if not (isinstance(cls, type) and issubclass(cls, Head)):
            raise TypeError(f"register_head({name!r}): {cls!r} is not a subclass of "
                            f"ernie_doc.heads.Head")
        return register(_registry, "head", name, cls)
    return register_class


def _register_builtin_heads() -> None:
    for name, cls in HEADS.items():
        register_head(name)(cls)


_register_builtin_heads()


def _load_task_heads() -> None:
    load_task_folders("task heads", "register_heads")


def head_classes() -> Dict[str, Type[Head]]:
    """{name: head class} of every registered head, built-in ones first (a copy)."""
    _load_task_heads()
    return dict(_registry)


def head_names(exportable: Optional[bool] = None) -> List[str]:
    """The registered head names, sorted; exportable=True / False: only the heads that
    ernie_doc.predict.export can / cannot export."""
    return sorted(name for name, cls in head_classes().items()
                  if exportable is None or bool(cls.exportable) == exportable)


def head_class(name: str) -> Type[Head]:
    """The head class registered under `name`; ValueError naming the choices otherwise."""
    cls = _registry.get(name) or head_classes().get(name)
    if cls is None:
        raise ConfigError(f"unknown head {name!r}; choose one of {', '.join(head_names())}")
    return cls


def model_class(class_name: str) -> Optional[ModelClass]:
    """The model class whose __name__ is `class_name` (ErnieDocModel or a registered head, as a
    checkpoint's "architecture" names it), or None."""
    if class_name == ErnieDocModel.__name__:
        return ErnieDocModel
    def named(classes):
        return next((cls for cls in classes if cls.__name__ == class_name), None)
    # What is registered already first: a built-in head needs no task module imported.
    return named(list(_registry.values())) or named(head_classes().values())


def official_head_names() -> Set[str]:
    """Every official head parameter name: the official heads' (checkpoint.names), and those
    every registered head class declares (`official_names`)."""
    return names.official_head_names(
        name for cls in head_classes().values() for name in cls.official_names.values())


def read_checkpoint(path: PathLike, upcast: bool = True) -> Checkpoint:
    """checkpoint.io.read_checkpoint with the official head names of every registered head."""
    return io.read_checkpoint(path, upcast=upcast, head_names=official_head_names())


def _official_heads_present(tensors: Collection[str]) -> Set[str]:
    """Names of the registered heads whose official parameters are among `tensors`; of heads
    sharing official names (cls_out_*), the earlier one stands."""
    found, seen = set(), []
    for name, cls in head_classes().items():
        official = set(cls.official_names.values())
        if not official or official in seen:
            continue
        seen.append(official)
        if any(n in tensors for n in official):
            found.add(name)
    return found


def _unnamed_head(path: str) -> str:
    """The one line for a checkpoint whose 'linear' head no config names: a trainer
    checkpoint's own line, else how to name the class."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    linear = [cls.__name__ for cls in head_classes().values()
              if "linear.weight" in cls.official_names]
    return training_checkpoint_problem(folder) or (
        f"{path}: holds a 'linear' head but no config names its class; load it with its class "
        f"({' / '.join(linear)}).from_pretrained(path), or record the class in its "
        f'config.json: "architecture": {{"class": "{linear[0]}"}}')


def model_class_for(ckpt: Checkpoint) -> ModelClass:
    """The model class a checkpoint was saved from: the config's architecture, else the head
    tensors present, else ErnieDocModel. CheckpointError when several heads leave it open."""
    recorded = (ckpt.architecture or {}).get("class")
    if recorded:
        cls = model_class(recorded)
        if cls is not None and cls is not Head:
            return cls
    found = set()
    if ckpt.format == "official":
        found = _official_heads_present(ckpt.tensors)
    else:
        heads = [n for n in ckpt.tensors
                 if names.backbone_to_official(names.strip_prefix(n)) is None]
        if any(n.startswith(("lm_head.", "reorder_head.")) for n in heads):
            found.add("pretraining")
        if any(n.startswith("linear.") for n in heads):
            if not recorded:
                raise CheckpointError(_unnamed_head(ckpt.path))
            known = sorted(model_class_names())
            close = difflib.get_close_matches(recorded, known, n=1) \
                if isinstance(recorded, str) else []
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CheckpointError(f"{ckpt.path}: records an unknown model class "
                                  f"{clip(repr(recorded), 80)}{hint}; known classes: "
                                  f"{', '.join(known)}")
    if len(found) > 1:
        raise CheckpointError(f"{ckpt.path}: holds several heads ({', '.join(sorted(found))}); "
                              f"say which one to load")
    if recorded:
        logger.warning("%s: unknown architecture %s; the tensor names say %s", ckpt.path,
                       clip(repr(recorded), 80), next(iter(found), "ErnieDocModel"))
    return head_class(found.pop()) if found else ErnieDocModel


def model_class_names() -> List[str]:
    """The class names a checkpoint's architecture may record: ErnieDocModel and every
    registered head class."""
    return [ErnieDocModel.__name__, *(cls.__name__ for cls in head_classes().values())]


class AutoModel:
    """The model class a checkpoint records (model_class_for), loaded; released checkpoints
    load as ErnieDocModel, as Hugging Face's AutoModel. Not instantiable itself."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("AutoModel is not instantiated: use AutoModel.from_pretrained(path), "
                        "or a model class (ErnieDocModel, ErnieDocFor...) with a config")

    @staticmethod
    def from_pretrained(path: Any, source: Optional[str] = None, **kwargs: Any) -> Any:
        """As the chosen class's from_pretrained → the model with `.load_report`;
        CheckpointError also when the checkpoint leaves the class open."""
        ckpt = _read_any(path, source)
        cls = model_class_for(ckpt)
        if cls is head_class("pretraining") and not ckpt.architecture:
            cls = ErnieDocModel
        return cls.from_pretrained(ckpt, **kwargs)


def _read_any(path: Any, source: Optional[str]) -> Checkpoint:
    """`path` (anything ernie_doc.hub.resolve takes, or a Checkpoint) read with every
    registered head's official names."""
    if isinstance(path, Checkpoint):
        return path
    return read_checkpoint(resolve(path, kind="model", source=source))
