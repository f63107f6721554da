"""The task-agnostic data path: documents → segments → scheduled batch rows → arrays."""
from ernie_doc.data.document import DataError, Document, split_by_ratio  # noqa: F401
