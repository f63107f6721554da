"""The task folders (tasks/ in a checkout, `ernie_doc_tasks` when installed): where they are,
which there are, and a checkout module path → the one to import.

Imports nothing from ernie_doc, so the registries (ernie_doc.auto) and the task code can both
use it.
"""
import importlib
import importlib.util
import os
from typing import List, Optional

# ernie_doc/ is imported from here: a source checkout (tasks/ beside it) or site-packages (the
# installed copy ernie_doc_tasks/ beside it)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHECKOUT_TASKS = os.path.join(_ROOT, "tasks")
_INSTALLED_TASKS = os.path.join(_ROOT, "ernie_doc_tasks")
_MARKER = "ERNIE_DOC_TASKS = True"


def _ours(folder: str) -> bool:
    """Whether `folder` is a copy of our task folders (its __init__.py carries the marker)."""
    init = os.path.join(folder, "__init__.py")
    if not os.path.isfile(init):
        return False
    with open(init, encoding="utf-8") as f:
        return _MARKER in f.read()


def _same_file(origin: Optional[str], folder: str) -> bool:
    return bool(origin) and os.path.realpath(origin) == \
        os.path.realpath(os.path.join(folder, "__init__.py"))


def _load_installed() -> None:
    """Make `ernie_doc_tasks` the copy installed beside this package (site-packages), or this
    checkout's tasks/ (an editable install maps it there), never one that comes first on
    sys.path: under `python -m` that is the current directory."""
    import sys
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
    module = importlib.util.module_from_spec(spec)
    sys.modules["ernie_doc_tasks"] = module
    spec.loader.exec_module(module)


def task_package() -> str:
    """Where the task folders are imported from: `tasks` when it is the tasks/ folder of the
    checkout this package lives in (tests and tools/*.py import it so; its __init__.py carries
    the ERNIE_DOC_TASKS marker), else the installed copy `ernie_doc_tasks` (setup.py installs
    tasks/ under that name, never as a generic top-level `tasks`), loaded from beside this
    package. Decided without importing anything from sys.path: a `tasks` or
    `ernie_doc_tasks` package elsewhere (the current directory under `python -m`, another
    distribution) is never imported."""
    try:
        spec = importlib.util.find_spec("tasks")
    except (ImportError, ValueError):
        spec = None
    if _same_file(getattr(spec, "origin", None), _CHECKOUT_TASKS) and _ours(_CHECKOUT_TASKS):
        return "tasks"
    _load_installed()
    return "ernie_doc_tasks"


def task_module(name: str) -> str:
    """A module path written against the checkout (`tasks.hotpotqa.task`) → the one to import."""
    if name == "tasks" or name.startswith("tasks."):
        return task_package() + name[len("tasks"):]
    return name


def task_names() -> List[str]:
    """The task folders (those with a config.yaml), sorted."""
    folder = os.path.dirname(importlib.import_module(task_package()).__file__)
    return sorted(n for n in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, n, "config.yaml")))


def task_config(name: str) -> Optional[str]:
    """The config.yaml of the task folder `name`, or None when there is no such task."""
    if not name.isidentifier():
        return None
    folder = os.path.dirname(importlib.import_module(task_package()).__file__)
    path = os.path.join(folder, name, "config.yaml")
    return path if os.path.isfile(path) else None
