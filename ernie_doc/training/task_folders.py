"""The task folders (tasks/ in a checkout, `ernie_doc_tasks` when installed): where they are,
which there are, and a checkout module path → the one to import.

Imports nothing from ernie_doc, so the registries (ernie_doc.auto) and the task code can both
use it.
"""
import importlib
import importlib.util
import os
from typing import List, Optional

# tasks/ of the source checkout this ernie_doc package was imported from (it need not exist)
_CHECKOUT_TASKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tasks")


def task_package() -> str:
    """Where the task folders are imported from: `tasks` when it is the tasks/ folder of the
    checkout this package lives in (tests and tools/*.py import it so; its __init__.py carries
    the ERNIE_DOC_TASKS marker), else the installed copy `ernie_doc_tasks` (setup.py installs
    tasks/ under that name, never as a generic top-level `tasks`). Decided without importing
    anything: a `tasks` package elsewhere on sys.path (the current directory under
    `python -m`, another distribution) is never imported."""
    try:
        spec = importlib.util.find_spec("tasks")
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    init = os.path.join(_CHECKOUT_TASKS, "__init__.py")
    if origin and os.path.isfile(init) and os.path.realpath(origin) == os.path.realpath(init):
        with open(init, encoding="utf-8") as f:
            if "ERNIE_DOC_TASKS = True" in f.read():
                return "tasks"
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
