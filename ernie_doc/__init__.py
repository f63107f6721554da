"""ERNIE-Doc for PaddlePaddle: the long-document Transformer with enhanced recurrence.

Names are imported lazily, so `ernie_doc.tokenization` and `ernie_doc.config` work without
importing paddle. `pipeline` is the prediction factory ernie_doc.predict.pipeline.pipeline
(`pipeline(run_dir)(documents)`); no submodule of this package has that name, so the name is
the function whatever was imported before."""
import importlib
import warnings
import zlib  # noqa: F401  paddle 2.6.2 imported before zlib breaks a later scipy/paddlenlp import

from ernie_doc._version import __version__  # noqa: E402,F401

# paddle's own import (paddle.utils.cpp_extension) warns when no C++ compiler cache is on PATH;
# nothing here compiles C++. That one warning is silenced here, before any module of this
# package imports paddle, so importing and using ernie_doc prints nothing on stderr.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning,
                        module=r"paddle\.utils\.cpp_extension")

_EXPORTS = {
    "ErnieDocConfig": "ernie_doc.config", "PRESETS": "ernie_doc.config",
    "ErnieDocError": "ernie_doc.errors", "ConfigError": "ernie_doc.errors",
    "ErnieDocModel": "ernie_doc.modeling", "ErnieDocOutput": "ernie_doc.modeling",
    "ErnieDocForSequenceClassification": "ernie_doc.heads",
    "ErnieDocForQuestionAnswering": "ernie_doc.heads",
    "ErnieDocForTokenClassification": "ernie_doc.heads",
    "ErnieDocForMultipleChoice": "ernie_doc.heads",
    "ErnieDocForPairMatching": "ernie_doc.heads",
    "ErnieDocForPretraining": "ernie_doc.heads",
    "load_tokenizer": "ernie_doc.tokenization",
    "AutoModel": "ernie_doc.auto", "AutoTokenizer": "ernie_doc.tokenization",
    "segment_batches": "ernie_doc.data",
    "pipeline": "ernie_doc.predict.pipeline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ernie_doc' has no attribute {name!r}")
