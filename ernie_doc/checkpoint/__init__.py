"""Checkpoint formats: official static LoDTensor files, PaddleNLP .pdparams, ours (safetensors).

Models load and save through `Model.from_pretrained` / `model.save_pretrained`
(ernie_doc.modeling.pretrained), and ernie_doc.auto says which class a checkpoint was saved
from; this package holds the formats and the name map, and imports no model class.
"""
from ernie_doc.checkpoint.errors import CheckpointError  # noqa: F401
from ernie_doc.checkpoint.io import (FORMATS, Checkpoint, detect_format,  # noqa: F401
                                     read_checkpoint, write_checkpoint)
from ernie_doc.checkpoint.lodtensor import (LoDTensorFormatError, read_lodtensor,  # noqa: F401
                                            read_official_dir, write_lodtensor, write_official_dir)
