"""Names → model classes: the one registry of task heads, and which class a checkpoint holds.

    head_class("sequence_classification")   → ErnieDocForSequenceClassification
    head_names()                            → every registered head name, sorted
    model_class_for(checkpoint)             → the class a checkpoint was saved from
    read_checkpoint(path)                   → checkpoint.io.read_checkpoint, every head known

The built-in heads (ernie_doc.heads.HEADS) are registered here. A task folder that brings its
own head registers it from the head's module, and that module is listed in TASK_HEAD_MODULES:

    @register_head("hotpotqa")
    class ErnieDocForHotpotQA(Head): ...

TASK_HEAD_MODULES are written against the source checkout (`tasks.hotpotqa.head`) and imported
through ernie_doc.training.tasks.task_module, so an installed copy (`ernie_doc_tasks.…`) works
as well; they are imported the first time the registry is asked for more than the built-in
heads. Every command that takes a head by name (convert, export) and every lookup of a saved
architecture goes through here.
"""
import importlib
import logging
from typing import Callable, Collection, Dict, List, Optional, Set, Type, Union

from ernie_doc.checkpoint import io, names
from ernie_doc.checkpoint.errors import CheckpointError
from ernie_doc.checkpoint.io import Checkpoint
from ernie_doc.checkpoint.lodtensor import PathLike
from ernie_doc.heads import HEADS, Head
from ernie_doc.modeling.model import ErnieDocModel

logger = logging.getLogger("ernie_doc.checkpoint")

# Modules (checkout spelling) whose import registers a task's own head.
TASK_HEAD_MODULES = ("tasks.hotpotqa.head", "tasks.openkp.head")

ModelClass = Union[Type[ErnieDocModel], Type[Head]]

_registry: Dict[str, Type[Head]] = {}
_loaded = {"task heads": False}   # whether TASK_HEAD_MODULES have been imported


def register_head(name: str) -> Callable[[Type[Head]], Type[Head]]:
    """Class decorator: register a head class (a subclass of ernie_doc.heads.Head) under
    `name`. Registering the same class again is a no-op, as is a class of the same name and
    qualified name: one task module imported as `tasks.…` and as `ernie_doc_tasks.…` (the first
    stays registered). Another class under a taken name is a ValueError."""
    def register(cls: Type[Head]) -> Type[Head]:
        if not (isinstance(cls, type) and issubclass(cls, Head)):
            raise TypeError(f"register_head({name!r}): {cls!r} is not a subclass of "
                            f"ernie_doc.heads.Head")
        existing = _registry.get(name)
        if existing is None:
            _registry[name] = cls
        elif existing is not cls and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"head name {name!r} is already registered for "
                             f"{existing.__module__}.{existing.__qualname__}")
        return cls
    return register


def _register_builtin_heads() -> None:
    for name, cls in HEADS.items():
        register_head(name)(cls)


_register_builtin_heads()


def _load_task_heads() -> None:
    """Import TASK_HEAD_MODULES once (their import registers their heads). Without any task
    folders (a package installed without them) there is nothing to register; a task module
    that fails to import for any other reason is an error, never skipped."""
    if _loaded["task heads"]:
        return
    from ernie_doc.training.tasks import task_module
    for path in TASK_HEAD_MODULES:
        module = task_module(path)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module.split(".")[0]:
                raise
            logger.debug("no task folders (%s): only the built-in heads are registered", e)
    _loaded["task heads"] = True


def head_classes() -> Dict[str, Type[Head]]:
    """{name: head class} of every registered head, built-in ones first (a copy)."""
    _load_task_heads()
    return dict(_registry)


def head_names(exportable: Optional[bool] = None) -> List[str]:
    """The registered head names, sorted; exportable=True / False: only the heads that
    ernie_doc.inference can / cannot export."""
    return sorted(name for name, cls in head_classes().items()
                  if exportable is None or bool(cls.exportable) == exportable)


def head_class(name: str) -> Type[Head]:
    """The head class registered under `name`; ValueError naming the choices otherwise."""
    cls = _registry.get(name) or head_classes().get(name)
    if cls is None:
        raise ValueError(f"unknown head {name!r}; choose one of {', '.join(head_names())}")
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
    """Names of the registered heads whose official parameters are among `tensors`. A head
    whose official names an earlier head has too (multiple choice and pair matching share
    classification's cls_out_*) cannot be told apart from it: the earlier one stands."""
    found, seen = set(), []
    for name, cls in head_classes().items():
        official = set(cls.official_names.values())
        if not official or official in seen:
            continue
        seen.append(official)
        if any(n in tensors for n in official):
            found.add(name)
    return found


def model_class_for(ckpt: Checkpoint) -> ModelClass:
    """The model class a checkpoint was saved from: its config's architecture when that names
    a known class, else the head tensors present (official names, or `lm_head.` keys), else
    the bare ErnieDocModel. CheckpointError when several heads or an ambiguous `linear.` head
    leave the choice open."""
    if ckpt.architecture:
        cls = model_class(ckpt.architecture["class"])
        if cls is not None:
            return cls
        logger.warning("%s: unknown architecture %r; guessing from the tensor names", ckpt.path,
                       ckpt.architecture["class"])
    found = set()
    if ckpt.format == "official":
        found = _official_heads_present(ckpt.tensors)
    else:
        heads = [n for n in ckpt.tensors
                 if names.backbone_to_official(names.strip_prefix(n)) is None]
        if any(n.startswith(("lm_head.", "reorder_head.")) for n in heads):
            found.add("pretraining")
        if any(n.startswith("linear.") for n in heads):
            raise CheckpointError(f"{ckpt.path}: holds a 'linear' head but no config names its "
                                  f"class; say which head it is")
    if len(found) > 1:
        raise CheckpointError(f"{ckpt.path}: holds several heads ({', '.join(sorted(found))}); "
                              f"say which one to load")
    return head_class(found.pop()) if found else ErnieDocModel
