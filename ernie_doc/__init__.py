"""ERNIE-Doc for PaddlePaddle: the long-document Transformer with enhanced recurrence."""
from ernie_doc.config import ErnieDocConfig, ConfigError, PRESETS  # noqa: F401
from ernie_doc.modeling import ErnieDocModel, ErnieDocOutput  # noqa: F401

__version__ = "0.1.0"
