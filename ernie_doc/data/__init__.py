"""The task-agnostic data path: documents → segments → scheduled batch rows → arrays."""
from ernie_doc.data.batches import SegmentBatch, segment_batches  # noqa: F401
from ernie_doc.data.document import Document, split_by_ratio  # noqa: F401
