"""Names → classes: the one registry of task heads and of task kinds, and which class a
checkpoint holds.

    head_class("sequence_classification")   → ErnieDocForSequenceClassification
    model_class_for(checkpoint)             → the class a checkpoint was saved from
    AutoModel.from_pretrained(path)         → an instance of that class, loaded
    kind_class("span")                      → ernie_doc.training.span.SpanTask

Task folders register their own heads and kinds (`@register_head`, `@register_kind`). The
registries are closed: a name read from a config, task.json or a sidecar is only looked up,
never imported. Details: docs/design-notes.md, "Registries".
"""
import difflib
import importlib
import logging
from typing import Any, Callable, Collection, Dict, List, Optional, Sequence, Set, Type, Union

from ernie_doc.checkpoint import io, names
from ernie_doc.checkpoint.io import Checkpoint
from ernie_doc.checkpoint.lodtensor import PathLike
from ernie_doc.errors import CheckpointError
from ernie_doc.heads import HEADS, Head
from ernie_doc.modeling.model import ErnieDocModel
from ernie_doc.utils import clip

logger = logging.getLogger("ernie_doc.checkpoint")

# Modules (checkout spelling) whose import registers a task's own head / kind.
TASK_HEAD_MODULES = ("tasks.hotpotqa.head", "tasks.openkp.head")
TASK_KIND_MODULES = ("tasks.hotpotqa.task", "tasks.openkp.task")

# The package's own kinds: name → (module, class), imported on first use (those modules import
# ernie_doc.training.tasks, which asks this one for its kinds).
BUILTIN_KINDS = {"classification": ("ernie_doc.training.tasks", "ClassificationTask"),
                 "span": ("ernie_doc.training.span", "SpanTask"),
                 "multiple_choice": ("ernie_doc.training.choice", "MultipleChoiceTask"),
                 "pair_matching": ("ernie_doc.training.choice", "PairMatchingTask"),
                 "pretraining": ("ernie_doc.pretraining.task", "PretrainingTask"),
                 "language_model": ("ernie_doc.lm.task", "LanguageModelTask")}

ModelClass = Union[Type[ErnieDocModel], Type[Head]]

_registry: Dict[str, Type[Head]] = {}
_kinds: Dict[str, type] = {}      # the task folders' kinds (BUILTIN_KINDS are not in it)
_loaded = {"task heads": False, "task kinds": False}   # whether TASK_*_MODULES were imported


def _register(registry: Dict[str, type], what: str, name: str, cls: type) -> type:
    """Put `cls` in `registry` under `name`. The same class again is a no-op, as is a class of
    the same name and qualified name: one task module imported as `tasks.…` and as
    `ernie_doc_tasks.…` (the first stays registered). Another class under a taken name is a
    ValueError."""
    existing = registry.get(name)
    if existing is None:
        registry[name] = cls
    elif existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"{what} name {name!r} is already registered for "
                         f"{existing.__module__}.{existing.__qualname__}")
    return cls


def register_head(name: str) -> Callable[[Type[Head]], Type[Head]]:
    """Class decorator: register a head class (a subclass of ernie_doc.heads.Head) under
    `name` (see _register for a name registered twice)."""
    def register(cls: Type[Head]) -> Type[Head]:
        if not (isinstance(cls, type) and issubclass(cls, Head)):
            raise TypeError(f"register_head({name!r}): {cls!r} is not a subclass of "
                            f"ernie_doc.heads.Head")
        return _register(_registry, "head", name, cls)
    return register


def _register_builtin_heads() -> None:
    for name, cls in HEADS.items():
        register_head(name)(cls)


_register_builtin_heads()


def _import_task_modules(what: str, paths: Sequence[str]) -> None:
    """Import the task-folder modules `paths` (TASK_HEAD_MODULES or TASK_KIND_MODULES, fixed
    here) once: their import registers their `what`. Without any task folders (a package
    installed without them) there is nothing to register; a task module that fails to import
    for any other reason is an error, never skipped."""
    if _loaded[what]:
        return
    from ernie_doc.training.task_folders import task_module
    for path in paths:
        module = task_module(path)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module.split(".")[0]:
                raise
            logger.debug("no task folders (%s): only the built-in %s are registered", e,
                         what.split()[-1])
    _loaded[what] = True


def _load_task_heads() -> None:
    _import_task_modules("task heads", TASK_HEAD_MODULES)


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
    leave the choice open (naming the recorded class, when it is an unknown one, and the
    known classes)."""
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
                raise CheckpointError(f"{ckpt.path}: holds a 'linear' head but no config names "
                                      f"its class; say which head it is")
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
    """The model class a checkpoint records, loaded: one door for every head.

        model = AutoModel.from_pretrained("output/imdb/best")   # ErnieDocForSequenceClassification
        model = AutoModel.from_pretrained("ernie-doc-base-en")  # ErnieDocModel (the encoder)

    The class is model_class_for's: the class the checkpoint's config.json records, else the
    official head tensors present, else the bare ErnieDocModel. The pretraining heads alone,
    with no class recorded (the released checkpoints hold them), are a pretrained encoder:
    ErnieDocModel, as Hugging Face's AutoModel; ErnieDocForPretraining.from_pretrained loads
    them with their heads. Not instantiable itself."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("AutoModel is not instantiated: use AutoModel.from_pretrained(path), "
                        "or a model class (ErnieDocModel, ErnieDocFor...) with a config")

    @staticmethod
    def from_pretrained(path: Any, source: Optional[str] = None, **kwargs: Any) -> Any:
        """path, source: as for ErnieDocModel.from_pretrained (a released name, URL, .tar.gz,
        checkpoint directory or file; source picks a released name's weights). kwargs go to
        the chosen class's from_pretrained (config=, strict=, allow_partial=, config keys,
        constructor arguments). Returns the model with `.load_report`; CheckpointError /
        HubError as from_pretrained, and when the checkpoint leaves the class open (several
        heads: load it with the head class instead)."""
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
    from ernie_doc.hub import resolve
    return read_checkpoint(resolve(path, kind="model", source=source))


# -- task kinds --------------------------------------------------------------------------------
def register_kind(name: str) -> Callable[[type], type]:
    """Class decorator: register a task folder's kind (a subclass of
    ernie_doc.training.tasks.Task, which imports this module: not checked here) under `name`,
    which configs then give as `kind: name` (see _register for a name registered twice; a
    built-in kind's name is a ValueError)."""
    def register(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError(f"register_kind({name!r}): {cls!r} is not a class")
        if name in BUILTIN_KINDS:
            raise ValueError(f"kind name {name!r} is a built-in kind")
        return _register(_kinds, "kind", name, cls)
    return register


def kind_names() -> List[str]:
    """Every kind a config may name: the built-in ones and the task folders' own, sorted."""
    _import_task_modules("task kinds", TASK_KIND_MODULES)
    return sorted([*BUILTIN_KINDS, *_kinds])


def kind_name(value: object) -> str:
    """`value` when it is a registered kind's name. Anything else (a "module:Class" string
    included) is a ValueError, one line listing the known kinds (and the nearest, when one is
    close). Nothing is imported but TASK_KIND_MODULES."""
    if isinstance(value, str) and (value in BUILTIN_KINDS or value in kind_names()):
        return value
    known = kind_names()
    close = difflib.get_close_matches(value, known, n=1) if isinstance(value, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"{clip(repr(value), 80)} is not a task kind{hint}; known kinds: "
                     f"{', '.join(known)}")


def kind_class(name: object) -> type:
    """The task kind class `name` names (kind_name: a registered name)."""
    name = kind_name(name)
    if name in BUILTIN_KINDS:
        module, cls = BUILTIN_KINDS[name]
        return getattr(importlib.import_module(module), cls)
    return _kinds[name]
