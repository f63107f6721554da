"""WikiText-103 (word level, `.tokens` files): which file each split reads.

Options (config `reader`):
    files       {split: file}, relative to data_dir (or to the repository root when data_dir
                is empty; absolute paths are kept). Splits not given keep the official names.
    vocab       a vocabulary file (one token per line, id order); None = build one
    vocab_from  the split(s) the vocabulary is counted on (Transformer-XL: train only)
    min_freq, max_size   vocabulary cut-offs (WT103: 1 and none, 267,735 tokens)
    cache_dir   where the vocabulary and the encoded splits are cached (None = a folder per
                set of files under $ERNIE_DOC_CACHE or ~/.cache/ernie_doc/lm; false = none)

Any corpus of whitespace-separated tokens, one paragraph per line, reads the same way
(`ernie_doc.lm.data`): every line ends with <eos>, tokens outside the vocabulary become <unk>
and are counted.
"""
import os

from ernie_doc.data.document import file_kind
from ernie_doc.errors import DataError, NotSet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULTS = {
    "files": {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens",
              "test": "wiki.test.tokens"},
    "vocab": None,
    "vocab_from": "train",
    "min_freq": 1,
    "max_size": None,
    "cache_dir": None,
}


def options(given):
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise DataError(f"reader: unknown option {unknown[0]!r} (known: {sorted(DEFAULTS)})")
    out = dict(DEFAULTS, **given)
    if not isinstance(out["files"], dict):
        raise DataError(f"reader.files: must map split names to files, got {out['files']!r}")
    out["files"] = dict(DEFAULTS["files"], **out["files"])   # a split given, the rest kept
    return out


def read(data_dir, split, opts):
    """→ the path of `split`'s token file (checked to exist)."""
    files = options(opts)["files"]
    if split not in files:
        raise DataError(f"split {split!r}: no file for it in reader.files "
                        f"(splits: {sorted(files)})")
    path = os.path.join(data_dir or ROOT, os.path.expanduser(str(files[split])))
    kind = file_kind(path)
    if kind == "missing" and not data_dir and not os.path.isabs(str(files[split])):
        raise NotSet(f"the data directory (of wiki.{{train,valid,test}}.tokens) is not set "
                     f"and {path} does not exist")
    if kind is not None:  # only a regular file: a FIFO would block the reader for ever
        kind = "does not exist" if kind == "missing" else f"is {kind}, not a regular file"
        raise DataError(f"{path}: the {split} split's token file {kind} (reader.files.{split}"
                        f" under data_dir {data_dir or ROOT!r})")
    return path
