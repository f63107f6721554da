"""Pick the tokenizer of a checkpoint/vocab directory.

A directory that records its tokenizer's type (tokenizer_config.json's `tokenizer_class`)
loads as that type and must hold its files; one without a record is recognised by its files.
A missing file is a TokenizerError, never a fall back to another type (a BPE folder would
otherwise read its vocab.txt as WordPiece, every word [UNK]). Details: docs/design-notes.md,
"Tokenizers: choosing one"."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import List, Optional, Union

from ernie_doc.config import (TASK_FILE, language_model_problem, run_model_folder, saved_reading,
                              training_checkpoint_problem)
from ernie_doc.errors import TokenizerError
from ernie_doc.hub import is_released, is_url, resolve
from ernie_doc.hub.archive import is_archive
from ernie_doc.utils import clip, file_kind

from . import base
from .base import CONFIG_FILE, check_model_max_length
from .bpe import BPETokenizer
from .spm import SentencePieceTokenizer
from .vocab import PathLike, read_tokenizer_json
from .wordpiece import WordPieceTokenizer

__all__ = ["load_tokenizer", "AutoTokenizer"]

log = logging.getLogger("ernie_doc.tokenization")

_BPE_FILES = ("encoder.json", "vocab.bpe", "vocab.txt")
_SPM_PREFERRED = ("spm.model", "sentencepiece.model")
_LOOKED_FOR = ("encoder.json+vocab.bpe+vocab.txt (BPE), *.model (SentencePiece), "
               "vocab.txt (WordPiece)")

Tokenizer = Union[BPETokenizer, SentencePieceTokenizer, WordPieceTokenizer]


def _regular(path: Path) -> bool:
    """Path.is_file() (a regular file, links followed), logging a FIFO, socket or device that
    stands under the name instead."""
    kind = file_kind(path)
    if kind not in (None, "missing", "a directory"):
        log.warning("%s: skipped, %s, not a regular file", path, kind)
    return kind is None


def _find_spm(directory: Path) -> Optional[Path]:
    for name in _SPM_PREFERRED:
        if _regular(directory / name):
            return directory / name
    models = sorted(p for p in directory.glob("*.model") if _regular(p))
    if len(models) > 1:
        raise TokenizerError(
            f"several SentencePiece models in {directory}: {[p.name for p in models]}; "
            "pass the .model file itself"
        )
    return models[0] if models else None


_CLASSES = {cls.__name__: cls for cls in (BPETokenizer, WordPieceTokenizer,
                                           SentencePieceTokenizer)}
_WORDPIECE_OPTIONS = ("do_lower_case", "split_symbols")


def _saved_config(directory: Path) -> dict:
    """tokenizer_config.json (written by save_pretrained), checked; {} when absent."""
    path = directory / CONFIG_FILE
    if not _regular(path):
        return {}
    config = read_tokenizer_json(path, "tokenizer config")
    if not isinstance(config, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    known = {"tokenizer_class", "model_max_length", "segment_layout", "max_doc_tokens",
             "segment_stride", *_WORDPIECE_OPTIONS}
    for key, value in config.items():
        if key not in known:
            raise TokenizerError(f"{path}: unknown key {key!r} (known: {sorted(known)})")
        if key == "tokenizer_class" and value not in _CLASSES:
            raise TokenizerError(f"{path}: tokenizer_class {value!r} is not one of "
                                 f"{sorted(_CLASSES)}")
        if key in _WORDPIECE_OPTIONS and not isinstance(value, bool):
            raise TokenizerError(f"{path}: {key} must be true or false, got {value!r}")
        if key == "model_max_length":
            check_model_max_length(value, str(path))
        if key == "segment_layout" and value not in base.SEGMENT_LAYOUTS:
            raise TokenizerError(f"{path}: segment_layout {value!r} is not one of "
                                 f"{', '.join(base.SEGMENT_LAYOUTS)}")
        if key == "max_doc_tokens" and (isinstance(value, bool) or not isinstance(value, int)
                                        or value < 0):
            raise TokenizerError(f"{path}: max_doc_tokens must be a non-negative integer, "
                                 f"got {clip(repr(value))}")
        if key == "segment_stride" and (isinstance(value, bool) or not isinstance(value, int)
                                        or not 1 <= value <= base.MAX_MODEL_MAX_LENGTH):
            # a stride beyond the longest segment is no run's (a window advances ≤ T−2)
            raise TokenizerError(f"{path}: segment_stride must be a positive integer up to "
                                 f"{base.MAX_MODEL_MAX_LENGTH}, got {clip(repr(value))}")
    return config


def _model_value(directory: Path, key: str) -> Optional[int]:
    """A positive integer `key` of the model config in `directory` ("max_position_embeddings",
    "memory_len"), or None (no config, or one this cannot read: loading the model reports
    that, the tokenizer does not need it)."""
    for name in ("config.json", "ernie_config.json"):
        if _regular(directory / name):
            try:
                config = read_tokenizer_json(directory / name, "model config")
            except (TokenizerError, OSError):
                return None
            value = config.get(key) if isinstance(config, dict) else None
            try:
                return check_model_max_length(value, str(directory / name))
            except TokenizerError:
                return None
    return None


def _missing(directory: Path, names) -> List[str]:
    return [name for name in names if not _regular(directory / name)]


def _from_directory(directory: Path, do_lower_case: Optional[bool]) -> Optional[Tokenizer]:
    """The tokenizer of `directory`: the type its tokenizer_config.json records (its files
    required), else the one its files show; None when it holds no tokenizer."""
    problem = language_model_problem(str(directory))
    if problem:   # its vocab.txt is a word list, no WordPiece vocabulary
        raise TokenizerError(problem)
    config = _saved_config(directory)
    wanted = config.get("tokenizer_class")
    if wanted is not None:   # the record decides: its files must be there
        needs = {"BPETokenizer": _BPE_FILES, "WordPieceTokenizer": ("vocab.txt",),
                 "SentencePieceTokenizer": ()}[wanted]
        missing = _missing(directory, needs)
        if wanted == "SentencePieceTokenizer" and _find_spm(directory) is None:
            missing = ["a *.model file"]
        if missing:
            raise TokenizerError(f"{directory}: {CONFIG_FILE} records {wanted}, which needs "
                                 f"{', '.join(missing)}: not there (or not a regular file)")
    else:
        present = [name for name in _BPE_FILES[:2] if _regular(directory / name)]
        missing = _missing(directory, _BPE_FILES)
        if present and missing:   # part of a BPE tokenizer: never another type over the rest
            raise TokenizerError(f"{directory}: holds {', '.join(present)} of a BPE tokenizer "
                                 f"but not {', '.join(missing)}")
        wanted = "BPETokenizer" if not missing else None
    tokenizer = None
    if wanted == "BPETokenizer":
        tokenizer = _with_files(BPETokenizer.from_dir(directory),
                                [directory / n for n in _BPE_FILES])
    spm_file = _find_spm(directory) if wanted in (None, "SentencePieceTokenizer") else None
    if tokenizer is None and spm_file is not None:
        tokenizer = _with_files(SentencePieceTokenizer(spm_file), [spm_file])
    if tokenizer is None and wanted in (None, "WordPieceTokenizer") and \
            _regular(directory / "vocab.txt"):
        kwargs = {k: config[k] for k in _WORDPIECE_OPTIONS if k in config}
        if do_lower_case is not None:
            kwargs["do_lower_case"] = do_lower_case
        tokenizer = _with_files(WordPieceTokenizer(directory / "vocab.txt", **kwargs),
                                [directory / "vocab.txt"])
    if tokenizer is not None:
        _set_reading(tokenizer, directory, config)
    return tokenizer


def _set_reading(tokenizer: Tokenizer, directory: Path, config: dict) -> None:
    """model_max_length, and a fine-tuned classifier's segment: from tokenizer_config.json,
    else (a folder saved before it recorded them) from the run's task.json."""
    reading = None
    if "segment_layout" not in config:
        reading = saved_reading(str(directory))
        if reading.get("segment_layout") in base.SEGMENT_LAYOUTS:
            config = dict(config, segment_layout=reading["segment_layout"],
                          max_doc_tokens=reading.get("max_doc_tokens") or 0)
            if "model_max_length" not in config:   # the run's, checked naming its file
                config["model_max_length"] = check_model_max_length(
                    reading.get("max_seq_len"), str(directory / TASK_FILE))
    if config.get("segment_layout") and "segment_stride" not in config:
        # saved before the stride was recorded: the run's own, else the model's memory_len
        reading = saved_reading(str(directory)) if reading is None else reading
        stride = reading.get("stride") or _model_value(directory, "memory_len")
        config = dict(config, segment_stride=stride or 0)
    limit = config.get("model_max_length") or _model_value(directory, "max_position_embeddings")
    if limit is not None:
        tokenizer.model_max_length = limit
    tokenizer.segment_layout = config.get("segment_layout")
    tokenizer.max_doc_tokens = config.get("max_doc_tokens") or 0
    tokenizer.segment_stride = config.get("segment_stride") or 0


def _with_files(tokenizer, files):
    # remembered so a trained model can be saved together with its tokenizer
    tokenizer.source_files = [str(f) for f in files]
    return tokenizer


def load_tokenizer(path: PathLike, do_lower_case: Optional[bool] = None,
                   model_max_length: Optional[int] = None) -> Tokenizer:
    """Load the tokenizer at ``path``: a released name, URL or archive (ernie_doc.hub.resolve),
    a directory (its parent searched too; a run's OUTPUT_DIR: its best/, else final/) or a
    file. Priority: encoder.json + vocab.bpe + vocab.txt → BPE, ``*.model`` → SentencePiece,
    vocab.txt → WordPiece."""
    spec = os.fspath(path)
    if is_url(spec) or is_released(spec) or (os.path.isfile(spec) and is_archive(spec)):
        path = resolve(spec, kind="tokenizer")
    path = Path(run_model_folder(os.fspath(path)))   # a run's OUTPUT_DIR: its best/ or final/
    kind = file_kind(path)
    if kind not in (None, "missing", "a directory"):
        raise TokenizerError(f"{path}: tokenizer path is {kind}, not a regular file or a "
                             f"directory")
    tokenizer = _load(path, do_lower_case)
    if model_max_length is not None:
        tokenizer.model_max_length = model_max_length
    return tokenizer


def _load(path: Path, do_lower_case: Optional[bool]) -> Tokenizer:
    if path.is_file():
        if path.suffix == ".model":
            return _with_files(SentencePieceTokenizer(path), [path])
        directory = path.parent
    elif path.is_dir():
        directory = path
    else:
        raise FileNotFoundError(f"tokenizer path does not exist: {path}")

    searched: List[Path] = [directory]
    if directory.name == "params" and directory.parent != directory:
        searched.append(directory.parent)
    for candidate in searched:
        tokenizer = _from_directory(candidate, do_lower_case)
        if tokenizer is not None:
            return tokenizer
    raise FileNotFoundError(training_checkpoint_problem(str(directory)) or (
        f"no tokenizer files in {' or '.join(str(d) for d in searched)}; looked for {_LOOKED_FOR}"))


class AutoTokenizer:
    """`AutoTokenizer.from_pretrained(dir_or_name)`: whichever tokenizer the path holds
    (load_tokenizer). Not instantiated."""

    def __init__(self):
        raise TypeError("AutoTokenizer is not instantiated: use "
                        "AutoTokenizer.from_pretrained(dir_or_name)")

    @staticmethod
    def from_pretrained(path: PathLike, *, do_lower_case: Optional[bool] = None,
                        model_max_length: Optional[int] = None) -> Tokenizer:
        """load_tokenizer(path, do_lower_case, model_max_length)."""
        return load_tokenizer(path, do_lower_case=do_lower_case,
                              model_max_length=model_max_length)


base._loader = load_tokenizer   # for <Class>.from_pretrained (see base._loader)
