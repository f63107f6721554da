"""Checkpoint formats: official static LoDTensor files, PaddleNLP .pdparams, ours (safetensors).

Models load and save through `Model.from_pretrained` / `model.save_pretrained`
(ernie_doc.modeling.pretrained); this package holds the formats and the name map.
"""
from ernie_doc.checkpoint.io import (FORMATS, Checkpoint, CheckpointError,  # noqa: F401
                                     detect_format, guess_model_class, read_checkpoint,
                                     write_checkpoint)
from ernie_doc.checkpoint.lodtensor import (LoDTensorFormatError, read_lodtensor,  # noqa: F401
                                            read_official_dir, write_lodtensor, write_official_dir)
