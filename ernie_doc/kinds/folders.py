"""The task folders (tasks/ in a checkout, `ernie_doc_tasks` when installed): where they are,
which there are, the registrations they bring (their own heads and kinds), and the
one-line error for a key their run.sh sets (missing_key).

Imports nothing from ernie_doc but its errors and utils, and no paddle, so the registries
(ernie_doc.auto, kinds), run_config and the commands that only list tasks can all use it."""
import importlib
import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any, Dict, List, Optional, TypeVar

from ernie_doc.errors import ConfigError
from ernie_doc.utils import did_you_mean

# ernie_doc/ is imported from here: a source checkout (tasks/ beside it) or site-packages (the
# installed copy ernie_doc_tasks/ beside it)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHECKOUT_TASKS = os.path.join(_ROOT, "tasks")
_INSTALLED_TASKS = os.path.join(_ROOT, "ernie_doc_tasks")
_MARKER = "ERNIE_DOC_TASKS = True"

logger = logging.getLogger("ernie_doc.checkpoint")
K = TypeVar("K", bound=type)
_loaded: Dict[str, bool] = {}   # which of the task folders' register_*() ran


# The run.sh contract (tools/launch.sh): environment variables that set a key.
RUN_SH_VARIABLES = {"data_dir": "DATA_DIR=...", "output_dir": "OUTPUT_DIR=...",
                    "init_checkpoint": "INIT_CHECKPOINT=...", "model": "MODEL_CONFIG=...",
                    "task_options.evidence_file": "STAGE=answer EVIDENCE=..."}


def missing_key(source: str, task: Any, key: str, what: str) -> ConfigError:
    """The one-line error for a required key left empty: the config file (`source`), the key,
    what it holds and how to set it (`--set`, and `task`'s run.sh's environment variable if
    any)."""
    how = f"give it with --set {key}=..."
    variable = RUN_SH_VARIABLES.get(key)
    run_sh = os.path.join("tasks", str(task), "run.sh")
    if variable and os.path.isfile(os.path.join(_ROOT, run_sh)):
        how += f", or {variable} bash {run_sh}"
    return ConfigError(f"{source}: {key} is not set: {what}; {how}")


def _ours(folder: str) -> bool:
    """Whether `folder` is a copy of our task folders (its __init__.py carries the marker)."""
    init = os.path.join(folder, "__init__.py")
    if not os.path.isfile(init):
        return False
    with open(init, encoding="utf-8") as f:
        return _MARKER in f.read()


def _same_file(origin: Optional[str], folder: str) -> bool:
    return origin is not None and os.path.realpath(origin) == \
        os.path.realpath(os.path.join(folder, "__init__.py"))


def _load_installed() -> None:
    """Make `ernie_doc_tasks` the copy installed beside this package (or this checkout's
    tasks/), never one found first on sys.path (the current directory under `python -m`)."""
    folder = next((f for f in (_INSTALLED_TASKS, _CHECKOUT_TASKS) if _ours(f)), None)
    module = sys.modules.get("ernie_doc_tasks")
    if folder is None or (module is not None and
                          _same_file(getattr(module, "__file__", None), folder)):
        return
    for name in [n for n in sys.modules if n == "ernie_doc_tasks" or
                 n.startswith("ernie_doc_tasks.")]:
        del sys.modules[name]   # a copy from elsewhere (its code already ran: nothing to undo)
    spec = importlib.util.spec_from_file_location(
        "ernie_doc_tasks", os.path.join(folder, "__init__.py"),
        submodule_search_locations=[folder])
    assert spec is not None and spec.loader is not None   # a .py file's location has both
    module = importlib.util.module_from_spec(spec)
    sys.modules["ernie_doc_tasks"] = module
    spec.loader.exec_module(module)


def task_package() -> str:
    """Where the task folders come from: this checkout's `tasks` (ERNIE_DOC_TASKS marker), else
    the installed `ernie_doc_tasks`; never a stray package from sys.path."""
    try:
        spec = importlib.util.find_spec("tasks")
    except (ImportError, ValueError):
        spec = None
    if _same_file(getattr(spec, "origin", None), _CHECKOUT_TASKS) and _ours(_CHECKOUT_TASKS):
        return "tasks"
    _load_installed()
    return "ernie_doc_tasks"


def _tasks_folder() -> str:
    return os.path.dirname(importlib.import_module(task_package()).__file__ or "")


def task_names() -> List[str]:
    """The task folders (those with a config.yaml), sorted."""
    folder = _tasks_folder()
    return sorted(n for n in os.listdir(folder)
                  if _task_file(os.path.join(folder, n, "config.yaml")))


def task_variants(name: str) -> List[str]:
    """The other configs of the task folder `name` as names, sorted: its config_large.yaml is
    "imdb:large" (the paper's large model; hotpotqa:answer is its second stage)."""
    folder = os.path.join(_tasks_folder(), name)
    return sorted(f"{name}:{n[len('config_'):-len('.yaml')]}" for n in os.listdir(folder)
                  if n.startswith("config_") and n.endswith(".yaml")
                  and n[len("config_"):-len(".yaml")].isidentifier()
                  and _task_file(os.path.join(folder, n)))


def _task_file(path: str) -> Optional[str]:
    """`path` when it is a file within the task folders, symlinks resolved (a config_x.yaml
    linking to /etc/passwd is no config of a task), else None."""
    root = os.path.realpath(_tasks_folder())
    real = os.path.realpath(path)
    return path if os.path.isfile(real) and os.path.commonpath([root, real]) == root else None


def task_hint(name: object) -> str:
    """What an error about a task name that names no task folder ends with: " (did you mean
    'imdb'?)" for a near miss (for "task:variant", the nearest variant), else ""."""
    if isinstance(name, str) and ":" in name:
        return did_you_mean(name, [v for n in task_names() for v in task_variants(n)])
    return did_you_mean(name, task_names())


def task_config(name: str) -> Optional[str]:
    """The config.yaml of the task folder `name`, or None when there is no such task."""
    if not name.isidentifier():
        return None
    return _task_file(os.path.join(_tasks_folder(), name, "config.yaml"))


def named_config(name: str) -> Optional[str]:
    """A config of a task folder by name: "imdb" its config.yaml (task_config), "imdb:large"
    the variant beside it, config_large.yaml; None when there is no such task or variant."""
    task, colon, variant = name.partition(":")
    if not colon or task_config(task) is None or not variant.isidentifier():
        return None if colon else task_config(name)
    return _task_file(os.path.join(_tasks_folder(), task, f"config_{variant}.yaml"))


def task_folders_package() -> Optional[ModuleType]:
    """The task folders' package (task_package), or None when this installation has none."""
    package = task_package()
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as e:
        if e.name != package:
            raise
        return None


def register(registry: Dict[str, type], what: str, name: str, cls: K) -> K:
    """Put `cls` in `registry` under `name`. The same class (or one task module imported as
    `tasks.…` and `ernie_doc_tasks.…`) is a no-op; another class under a taken name: ValueError."""
    existing = registry.get(name)
    if existing is None:
        registry[name] = cls
    elif existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"{what} name {name!r} is already registered for "
                         f"{existing.__module__}.{existing.__qualname__}")
    return cls


def load_task_folders(what: str, register_all: str) -> None:
    """Run the task folders' `register_all` once (explicit imports of the modules that register
    their `what`); nothing without task folders."""
    if _loaded.get(what):
        return
    package = task_folders_package()
    if package is None:
        logger.debug("no task folders: only the built-in %s are registered", what.split()[-1])
    else:
        getattr(package, register_all)()
    _loaded[what] = True
