"""Task folders: one reader (raw files → Documents) per task, plus its config."""

# Marks this package as ERNIE-Doc's task folders (ernie_doc.kinds.folders.task_package): a
# source checkout imports it as `tasks`, an installed copy as `ernie_doc_tasks`.
ERNIE_DOC_TASKS = True


def register_heads() -> None:
    """Import the folders' own heads: their @register_head registers them (ernie_doc.auto
    calls this the first time it is asked for more than the built-in heads)."""
    from .hotpotqa import head as hotpotqa_head  # noqa: F401
    from .openkp import head as openkp_head  # noqa: F401


def register_kinds() -> None:
    """Import the folders' own kinds: their @register_kind registers them (ernie_doc.kinds
    calls this the first time it is asked for more than the built-in kinds)."""
    from .hotpotqa import task as hotpotqa_task  # noqa: F401
    from .openkp import task as openkp_task  # noqa: F401
