"""Checkpoint formats: official static LoDTensor files, PaddleNLP .pdparams, ours (safetensors).

Models load and save through `Model.from_pretrained` / `model.save_pretrained`
(ernie_doc.modeling.pretrained), and ernie_doc.auto says which class a checkpoint was saved
from; this package holds the formats and the name map, and imports no model class."""
from ernie_doc.checkpoint.io import (FORMATS, Checkpoint, detect_format,  # noqa: F401
                                     read_checkpoint, write_checkpoint)
from ernie_doc.checkpoint.lodtensor import (read_lodtensor, read_official_dir,  # noqa: F401
                                            write_lodtensor, write_official_dir)
