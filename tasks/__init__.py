"""Task folders: one reader (raw files → Documents) per task, plus its config."""

# Marks this package as ERNIE-Doc's task folders (ernie_doc.training.task_folders.task_package): a
# source checkout imports it as `tasks`, an installed copy as `ernie_doc_tasks`.
ERNIE_DOC_TASKS = True
