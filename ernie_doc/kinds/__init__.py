"""Task kinds: the contract the trainer, evaluation and prediction drive (base.Task), the
built-in kinds, and the one registry that maps a config's `kind:` to its class.

    kind_class("span")        → ernie_doc.kinds.span.SpanTask
    kind_name(value)          → a config's kind checked (ValueError listing the known ones)
    kind_names()              → every known kind, sorted
    build_task(cfg[, reader]) → the kind of `cfg` over its reader

Built-in kinds are imported on first use (they import paddle); task folders register their own
(`@register_kind("hotpotqa")`) from their `register_kinds()`. The registry is closed: a name
read from a config, task.json or a sidecar is only looked up, never imported. Details:
docs/design-notes.md, "Registries"."""
import functools
from typing import Any, Callable, Dict, List, Optional, Type

from ernie_doc.config import TASK_FILE  # noqa: F401  (the kinds' door to it)
from ernie_doc.errors import ConfigError
from ernie_doc.kinds.folders import K, load_task_folders, register
from ernie_doc.utils import clip, did_you_mean

_kinds: Dict[str, type] = {}      # the task folders' kinds (the built-in ones are not in it)


@functools.lru_cache(maxsize=None)
def builtin_kinds() -> Dict[str, type]:
    """{name: class} of the package's own kinds."""
    from ernie_doc.kinds.choice import MultipleChoiceTask, PairMatchingTask
    from ernie_doc.kinds.classification import ClassificationTask
    from ernie_doc.kinds.lm import LanguageModelTask
    from ernie_doc.kinds.pretraining import PretrainingTask
    from ernie_doc.kinds.span import SpanTask
    return {"classification": ClassificationTask, "span": SpanTask,
            "multiple_choice": MultipleChoiceTask, "pair_matching": PairMatchingTask,
            "pretraining": PretrainingTask, "language_model": LanguageModelTask}


def register_kind(name: str) -> Callable[[K], K]:
    """Class decorator: register a task folder's kind under `name` (`kind: name` in configs);
    a built-in kind's name is a ValueError."""
    def register_class(cls: K) -> K:
        if not isinstance(cls, type):
            raise TypeError(f"register_kind({name!r}): {cls!r} is not a class")
        if name in builtin_kinds():
            raise ValueError(f"kind name {name!r} is a built-in kind")
        return register(_kinds, "kind", name, cls)
    return register_class


def kind_names() -> List[str]:
    """Every kind a config may name: the built-in ones and the task folders' own, sorted."""
    load_task_folders("task kinds", "register_kinds")
    return sorted([*builtin_kinds(), *_kinds])


def kind_name(value: object) -> str:
    """`value` when it names a registered kind; a ConfigError listing the known kinds (and
    the nearest) otherwise. Nothing is imported but the kinds' own modules."""
    if isinstance(value, str) and (value in builtin_kinds() or value in kind_names()):
        return value
    known = kind_names()
    raise ConfigError(f"{clip(repr(value), 80)} is not a task kind{did_you_mean(value, known)}; "
                      f"known kinds: {', '.join(known)}")


def kind_class(name: object) -> Type[Any]:
    """The task kind class `name` names (kind_name: a registered name)."""
    name = kind_name(name)
    return builtin_kinds().get(name) or _kinds[name]


def saved_kind(name: object) -> Type[Any]:
    """The class of a saved folder's kind; DocumentTask for a name no kind has (loading the
    folder then says so)."""
    try:
        return kind_class(name)
    except ValueError:
        from ernie_doc.kinds.base import DocumentTask
        return DocumentTask


def build_task(cfg: Any, reader: Optional[Any] = None) -> Any:
    """The task kind of `cfg` over its reader: tasks/<cfg.task>/reader.py, or `reader` when
    given (predict: a saved model's labels)."""
    from ernie_doc.kinds.base import load_reader
    try:
        kind = kind_name(cfg.kind)
    except ValueError as e:   # validate() has said so already, for a config it checked
        raise ConfigError(f"{cfg.source}: kind: {e}") from None
    if reader is None and kind_class(kind).task_reader:
        reader = load_reader(cfg.task)
    return kind_class(kind)(cfg, reader)
