"""WikiText-103 language-model data: vocabulary, cached token streams, Segatron positions and
Transformer-XL's ordered batch iterator. Pure numpy (no paddle).

Every line, blank ones included, ends with `<eos>` (Transformer-XL's WikiText convention); id
0 is `<eos>`, the other tokens follow by decreasing count. Details: docs/design-notes.md,
"Language model: corpus"."""
import hashlib
import json
import logging
import os
from array import array
from dataclasses import dataclass, field
from typing import (Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import numpy as np

from ernie_doc.data.document import open_regular, require_file, utf8_lines
from ernie_doc.errors import CheckpointError, ConfigError, DataError
from ernie_doc.utils import atomic_path, atomic_write_text

log = logging.getLogger("ernie_doc.lm")

PathArg = Union[str, os.PathLike]

EOS = "<eos>"
UNK = "<unk>"
CACHE_VERSION = 2   # a cache written under another version is rebuilt
HASH_CHUNK = 1 << 20
SPLITTER_VERSION = 1

__all__ = ["EOS", "UNK", "Vocabulary", "read_token_lines", "wikitext_sentences",
           "sega_positions", "to_global", "load_corpus", "Corpus", "LMStreams", "LMBatch"]


# --- reading -------------------------------------------------------------------------------------

def read_token_lines(path: PathArg) -> Iterator[List[str]]:
    """The whitespace tokens of each line of a UTF-8 file (no `<eos>`). Missing file, empty file,
    invalid UTF-8 (named "path:line") or a file of blank lines only raise DataError."""
    path = os.fspath(path)
    require_file(path, "token file")
    if os.path.getsize(path) == 0:
        raise DataError(f"{path}: empty file")
    yield from _lines_tokens((line for _, line in utf8_lines(path)), path,
                             "no tokens (only blank lines)")


def _lines_tokens(lines: Iterable[str], name="<lines>",
                  empty="no tokens") -> Iterator[List[str]]:
    any_token = False
    for line in lines:
        tokens = line.split()
        any_token = any_token or bool(tokens)
        yield tokens
    if not any_token:
        raise DataError(f"{name}: {empty}")


def _token_lines(source) -> Iterator[List[str]]:
    """A path (str/PathLike) or an iterable of text lines -> token lists per line."""
    if isinstance(source, (str, os.PathLike)):
        return read_token_lines(source)
    return _lines_tokens(source)


# --- vocabulary ----------------------------------------------------------------------------------

class Vocabulary:
    """Token <-> id map. `tokens` in id order; must hold `<eos>` (id 0) and `<unk>`, no duplicates.
    Build with `build` (files) or `from_lines`, or `load` a saved one."""

    def __init__(self, tokens: Sequence[str], name: str = "<vocabulary>"):
        tokens = list(tokens)
        index: Dict[str, int] = {}
        for i, token in enumerate(tokens):
            if not token or any(c.isspace() for c in token):
                raise DataError(f"{name}:{i + 1}: token {token!r} is empty or contains whitespace")
            if token in index:
                raise DataError(f"{name}:{i + 1}: duplicate token {token!r} "
                                f"(also line {index[token] + 1})")
            index[token] = i
        if not tokens or tokens[0] != EOS:
            raise DataError(f"{name}: the first token must be {EOS}")
        if UNK not in index:
            raise DataError(f"{name}: no {UNK} token")
        self.tokens: List[str] = tokens
        self.index = index
        self.eos_id = 0
        self.unk_id = index[UNK]

    # building
    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_freq: int = 1,
                    max_size: Optional[int] = None) -> "Vocabulary":
        """From token counts in first-occurrence order (a dict or Counter filled in text order)."""
        if max_size is not None and max_size < 2:
            raise ConfigError(f"max_size must be at least 2 ({EOS} and {UNK}), got {max_size}")
        order = {token: i for i, token in enumerate(counts)}
        ranked = sorted((t for t in counts if t != EOS), key=lambda t: (-counts[t], order[t]))
        kept = [t for t in ranked if counts[t] >= min_freq or t == UNK]
        if UNK not in kept:
            kept.append(UNK)
        if max_size is not None and len(kept) > max_size - 1:
            cut = kept[:max_size - 1]
            if UNK not in cut:
                cut[-1] = UNK
            kept = cut
        return cls([EOS] + kept)

    @staticmethod
    def count(sources) -> Dict[str, int]:
        """Token counts (with one `<eos>` per line) over one source or a list of sources; each
        source a path or an iterable of lines. Dict order = first occurrence."""
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        counts: Dict[str, int] = {}
        get = counts.get
        for source in sources:
            for tokens in _token_lines(source):
                for token in tokens:
                    counts[token] = get(token, 0) + 1
                counts[EOS] = get(EOS, 0) + 1
        return counts

    @classmethod
    def build(cls, paths, min_freq: int = 1, max_size: Optional[int] = None) -> "Vocabulary":
        """From one `.tokens` path or a list of them (counted together, in order)."""
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        paths = list(paths)
        if not paths:
            raise DataError("no file to build the vocabulary from")
        for path in paths:
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"Vocabulary.build takes paths, got {type(path).__name__}; "
                                "use Vocabulary.from_lines for text")
        return cls.from_counts(cls.count(paths), min_freq, max_size)

    @classmethod
    def from_lines(cls, lines: Iterable[str], min_freq: int = 1,
                   max_size: Optional[int] = None) -> "Vocabulary":
        """From text lines (one `<eos>` per line)."""
        return cls.from_counts(cls.count([lines]), min_freq, max_size)

    # file
    def save(self, path: PathArg):
        """One token per line, id order (written atomically)."""
        atomic_write_text(path, "\n".join(self.tokens) + "\n")

    @classmethod
    def load(cls, path: PathArg) -> "Vocabulary":
        path = os.fspath(path)
        require_file(path, "vocabulary file")
        tokens = []
        for number, line_tokens in enumerate(read_token_lines(path), 1):
            if len(line_tokens) != 1:
                raise DataError(f"{path}:{number}: expected one token per line, "
                                f"got {len(line_tokens)}")
            tokens.append(line_tokens[0])
        return cls(tokens, name=path)

    # lookup
    def __len__(self):
        return len(self.tokens)

    def __contains__(self, token):
        return token in self.index

    def __eq__(self, other):
        return isinstance(other, Vocabulary) and self.tokens == other.tokens

    def __repr__(self):
        return f"Vocabulary({len(self)} tokens, unk_id={self.unk_id})"

    def id(self, token: str) -> int:
        return self.index.get(token, self.unk_id)

    def token(self, i: int) -> str:
        return self.tokens[i]

    def decode(self, ids) -> List[str]:
        return [self.tokens[int(i)] for i in ids]

    @property
    def fingerprint(self) -> str:
        """sha256 of the token list (the cache key of everything encoded with it)."""
        return hashlib.sha256("\n".join(self.tokens).encode("utf-8")).hexdigest()

    # encoding
    def encode_lines(self, lines, return_oov: bool = False):
        """Ids (int64) of token lines (a path, text lines or token lists), `<eos>` after each;
        with return_oov also the number of tokens mapped to `<unk>`."""
        if isinstance(lines, (str, os.PathLike)):
            token_lines = read_token_lines(lines)
        else:
            token_lines = (line.split() if isinstance(line, str) else line for line in lines)
        index, unk, eos = self.index, self.unk_id, self.eos_id
        out = array("q")
        oov = 0
        for tokens in token_lines:
            ids = [index.get(t, -1) for t in tokens]
            if -1 in ids:
                oov += ids.count(-1)
                ids = [unk if i < 0 else i for i in ids]
            out.extend(ids)
            out.append(eos)
        ids = np.frombuffer(out, dtype=np.int64).copy() if len(out) else np.zeros(0, np.int64)
        return (ids, oov) if return_oov else ids

    def encode_file(self, path: PathArg, return_oov: bool = False):
        """`encode_lines` of a `.tokens` file (DataError: missing, empty, not UTF-8)."""
        return self.encode_lines(os.fspath(path), return_oov=return_oov)


# --- Segatron positions --------------------------------------------------------------------------

_END_MARKS = frozenset((".", "?", "!"))
_CLOSERS = frozenset((")", "]", "}", "”", "’"))
_QUOTES = frozenset(('"', "'"))
_NO_START = frozenset((",", ";", ":"))


def wikitext_sentences(tokens: Sequence[str]) -> List[Tuple[int, int]]:
    """Sentence spans [(start, end)] covering `tokens` (one WikiText line, no `<eos>`); rules in
    the module docstring. An empty list for an empty line."""
    n = len(tokens)
    spans = []
    start = 0
    i = 0  # the first token not yet looked at
    for mark in [k for k, t in enumerate(tokens) if t in _END_MARKS]:
        if mark < i:  # taken in by the previous end mark
            continue
        j = mark + 1
        while j < n:
            t = tokens[j]
            if t in _END_MARKS or t in _CLOSERS:
                j += 1
            elif t in _QUOTES and tokens[start:j].count(t) % 2 == 1:
                j += 1
            else:
                break
        i = j
        if j < n:
            nxt = tokens[j]
            if nxt in _NO_START or nxt[0].islower():
                continue
            spans.append((start, j))
            start = j
    if start < n:
        spans.append((start, n))
    return spans


def _sentence_runs(token_lines: Iterable[List[str]]):
    """Per sentence of the stream (with `<eos>` tokens): its length and its paragraph."""
    lengths: List[int] = []
    paras: List[int] = []
    pending = 0
    para = -1
    for tokens in token_lines:
        if not tokens:  # a blank line: its <eos> joins the sentence before it
            if lengths:
                lengths[-1] += 1
            else:
                pending += 1
            continue
        para += 1
        spans = wikitext_sentences(tokens)
        line_lengths = [end - begin for begin, end in spans]
        line_lengths[-1] += 1  # the line's <eos>
        line_lengths[0] += pending
        pending = 0
        lengths.extend(line_lengths)
        paras.extend([para] * len(line_lengths))
    if pending or not lengths:
        raise DataError("no paragraph (only blank lines)")
    return np.asarray(lengths, np.int64), np.asarray(paras, np.int64)


def sega_positions(source, scheme: str = "local") -> np.ndarray:
    """[3, N] int32 (paragraph, sentence, token) per token of `encode_file`'s stream for the
    same source; scheme "local" or "global" (module docstring)."""
    if scheme not in ("local", "global"):
        raise ConfigError(f"scheme must be 'local' or 'global', got {scheme!r}")
    if isinstance(source, (str, os.PathLike)):
        token_lines = read_token_lines(source)
    else:
        token_lines = (line.split() if isinstance(line, str) else list(line) for line in source)
    lengths, paras = _sentence_runs(token_lines)
    n_sent = len(lengths)
    n = int(lengths.sum())
    sentence = np.repeat(np.arange(n_sent), lengths)
    out = np.empty((3, n), np.int32)
    out[0] = paras[sentence]
    if scheme == "global":
        out[1] = sentence
        out[2] = np.arange(n)
    else:
        first_of_para = np.searchsorted(paras, paras, side="left")
        out[1] = (np.arange(n_sent) - first_of_para)[sentence]
        starts = np.cumsum(lengths) - lengths
        out[2] = np.arange(n) - starts[sentence]
    return out


def to_global(local: np.ndarray) -> np.ndarray:
    """Local positions of a whole file -> global ones (a sentence starts where token == 0)."""
    local = np.asarray(local)
    out = np.empty_like(local)
    out[0] = local[0]
    out[1] = np.cumsum(local[2] == 0) - 1
    out[2] = np.arange(local.shape[1])
    return out


# --- corpus cache --------------------------------------------------------------------------------

def _file_fingerprint(path) -> dict:
    """A cached file's key: its size and a BLAKE2b digest of its bytes (not path or mtime,
    which an edit can preserve)."""
    digest = hashlib.blake2b(digest_size=32)
    size = 0
    with open_regular(path, "token file") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "blake2b": digest.hexdigest()}


class _Fingerprints(dict):
    """`_file_fingerprint` of each path, computed once per `load_corpus` call (the train file
    keys both the vocabulary and its own split)."""

    def __missing__(self, path):
        value = self[path] = _file_fingerprint(path)
        return value

    def check_unchanged(self, path):
        """DataError when the file's bytes changed since it was fingerprinted (an edit during
        encoding would otherwise cache tokens under the key of other bytes)."""
        if _file_fingerprint(path) != self[path]:
            raise DataError(f"{path}: the file changed while it was being read; run again")


def _read_json(path) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _save_npy(path, value: np.ndarray):
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:  # a file object: np.save would append ".npy" to a name
            np.save(f, value)


def _load_npy(path, n, mmap):
    try:
        value = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return value if value.shape[-1] == n else None


@dataclass
class Corpus:
    """What `load_corpus` returns. `data[split]`: int64 ids; `positions[split]`: [3, N] int32
    (only when asked for); `oov[split]`: tokens mapped to `<unk>`; `from_cache[split]`."""
    vocab: Vocabulary
    data: Dict[str, np.ndarray]
    positions: Dict[str, np.ndarray] = field(default_factory=dict)
    oov: Dict[str, int] = field(default_factory=dict)
    from_cache: Dict[str, bool] = field(default_factory=dict)


def _build_vocab(paths, vocab_from, min_freq, max_size, cache_dir, fingerprints):
    names = [vocab_from] if isinstance(vocab_from, str) else list(vocab_from)
    missing = [n for n in names if n not in paths]
    if missing or not names:
        raise DataError(f"no vocabulary: give vocab_path or the split(s) {missing or names} "
                        f"to build it from (splits given: {sorted(paths)})")
    files = [os.fspath(paths[n]) for n in names]
    for path in files:
        require_file(path, "token file")
    key = {"version": CACHE_VERSION, "sources": [fingerprints[p] for p in files],
           "min_freq": min_freq, "max_size": max_size}
    if cache_dir is not None:
        vocab_file = os.path.join(cache_dir, "vocab.txt")
        meta_file = os.path.join(cache_dir, "vocab.json")
        meta = _read_json(meta_file)
        if meta is not None and meta.get("key") == key and os.path.isfile(vocab_file):
            try:
                vocab = Vocabulary.load(vocab_file)
            except DataError:
                vocab = None
            if vocab is not None and vocab.fingerprint == meta.get("fingerprint"):
                return vocab
    log.info("building the vocabulary from %s", ", ".join(files))
    vocab = Vocabulary.build(files, min_freq=min_freq, max_size=max_size)
    if cache_dir is not None:
        for path in files:
            fingerprints.check_unchanged(path)
        vocab.save(vocab_file)
        atomic_write_text(meta_file, json.dumps({"key": key, "fingerprint": vocab.fingerprint,
                                                 "size": len(vocab)}, indent=1) + "\n")
    return vocab


def load_corpus(paths: Mapping[str, PathArg], vocab_path: Optional[PathArg] = None,
                cache_dir: Optional[PathArg] = None, *, positions: Optional[str] = None,
                vocab_from: Union[str, Sequence[str]] = "train", min_freq: int = 1,
                max_size: Optional[int] = None, mmap: bool = False) -> Corpus:
    """Vocabulary + encoded splits (`paths`: {split: .tokens path}), cached under `cache_dir`
    and re-encoded when source or vocabulary changed. `positions`: None, "local", "global"."""
    if positions not in (None, "local", "global"):
        raise ConfigError(f"positions must be None, 'local' or 'global', got {positions!r}")
    if not paths:
        raise DataError("load_corpus: no split given")
    if cache_dir is not None:
        cache_dir = os.fspath(cache_dir)
        os.makedirs(cache_dir, exist_ok=True)
    fingerprints = _Fingerprints()
    if vocab_path is not None:
        vocab = Vocabulary.load(vocab_path)
    else:
        vocab = _build_vocab(paths, vocab_from, min_freq, max_size, cache_dir, fingerprints)
    corpus = Corpus(vocab, {})
    for split, path in paths.items():
        path = os.fspath(path)
        require_file(path, f"{split} token file")
        key = None
        if cache_dir is not None:
            key = {"version": CACHE_VERSION, "source": fingerprints[path],
                   "vocab": vocab.fingerprint}
        ids, pos, meta = _cached_split(split, path, key, cache_dir, positions, mmap,
                                       fingerprints)
        cached = ids is not None
        if not cached:
            ids, pos, meta = _encode_split(split, path, key, vocab, cache_dir, positions,
                                           fingerprints)
        if pos is not None and len(pos[0]) != len(ids):
            raise DataError(f"{path}: {len(pos[0])} positions for {len(ids)} tokens")
        corpus.data[split] = ids
        corpus.oov[split] = int(meta["oov"])
        corpus.from_cache[split] = cached
        if pos is not None:
            corpus.positions[split] = to_global(pos) if positions == "global" else pos
        if corpus.oov[split]:
            log.info("%d tokens of %s mapped to %s", corpus.oov[split], split, UNK)
    return corpus


def _cached_split(split: str, path: str, key: Optional[dict], cache_dir: Optional[str],
                  positions: Optional[str], mmap: bool, fingerprints: "_Fingerprints"
                  ) -> Tuple[Optional[np.ndarray], Optional[np.ndarray], Optional[dict]]:
    """(ids, positions or None, meta) of a split from the cache when its key matches (missing
    positions computed now); (None, None, None) when it must be encoded."""
    if cache_dir is None:
        return None, None, None
    pos = None
    ids_file = os.path.join(cache_dir, f"{split}.ids.npy")
    pos_file = os.path.join(cache_dir, f"{split}.pos.npy")
    meta_file = os.path.join(cache_dir, f"{split}.json")
    meta = _read_json(meta_file)
    if meta is None or meta.get("key") != key:
        return None, None, None
    n = meta.get("tokens")
    ids = _load_npy(ids_file, n, mmap)
    if ids is not None and positions is not None:
        if meta.get("splitter") == SPLITTER_VERSION:
            pos = _load_npy(pos_file, n, mmap)
        if pos is None:  # positions not cached yet (or stale): add them
            pos = sega_positions(path)
            fingerprints.check_unchanged(path)
            _save_npy(pos_file, pos)
            meta["splitter"] = SPLITTER_VERSION
            atomic_write_text(meta_file, json.dumps(meta, indent=1) + "\n")
    return ids, pos, meta


def _encode_split(split: str, path: str, key: Optional[dict], vocab: Vocabulary,
                  cache_dir: Optional[str], positions: Optional[str],
                  fingerprints: "_Fingerprints") -> Tuple[np.ndarray, Optional[np.ndarray], dict]:
    """(ids, positions or None, meta) of a split encoded from its token file, written to the
    cache (when there is one) with its JSON last."""
    log.info("encoding %s (%s)", split, path)
    ids, oov = vocab.encode_file(path, return_oov=True)
    meta = {"key": key, "tokens": int(len(ids)), "oov": int(oov), "splitter": None}
    pos = None
    if positions is not None:
        pos = sega_positions(path)
        meta["splitter"] = SPLITTER_VERSION
    if cache_dir is not None:
        fingerprints.check_unchanged(path)
        _save_npy(os.path.join(cache_dir, f"{split}.ids.npy"), ids)
        if pos is not None:
            _save_npy(os.path.join(cache_dir, f"{split}.pos.npy"), pos)
        atomic_write_text(os.path.join(cache_dir, f"{split}.json"),
                          json.dumps(meta, indent=1) + "\n")
    return ids, pos, meta


# --- ordered batches -----------------------------------------------------------------------------

class LMBatch(NamedTuple):
    """input [bsz, L] (seq_len + ext_len context), target [bsz, seq_len], seq_len, positions
    [K, bsz, L] or None."""
    input: np.ndarray
    target: np.ndarray
    seq_len: int
    positions: Optional[np.ndarray]


class LMStreams:
    """Transformer-XL's ordered LM iterator, batch-major: row b holds tokens b*n .. (b+1)*n−1
    (n = len // bsz), targets one step later; resumable (`state`/`load_state`)."""

    def __init__(self, data: np.ndarray, bsz: int, tgt_len: int, ext_len: int = 0,
                 positions: Optional[np.ndarray] = None):
        data = np.asarray(data)
        if data.ndim != 1:
            raise ConfigError(f"data must be 1-D, got shape {data.shape}")
        if bsz < 1 or tgt_len < 1 or ext_len < 0:
            raise ConfigError(f"need bsz >= 1, tgt_len >= 1, ext_len >= 0 "
                              f"(got {bsz}, {tgt_len}, {ext_len})")
        self.bsz, self.tgt_len, self.ext_len = int(bsz), int(tgt_len), int(ext_len)
        self.n_step = len(data) // self.bsz
        if self.n_step < 2:
            raise DataError(f"{len(data)} tokens are too few for batch size {bsz} "
                            "(need 2 per row)")
        used = self.n_step * self.bsz
        self.data = data[:used].reshape(self.bsz, self.n_step)
        self.positions = None
        if positions is not None:
            positions = np.asarray(positions)
            if positions.ndim != 2 or positions.shape[1] != len(data):
                raise ConfigError(f"positions must be [K, {len(data)}], got {positions.shape}")
            self.positions = positions[:, :used].reshape(len(positions), self.bsz, self.n_step)
        self.n_batch = -(-(self.n_step - 1) // self.tgt_len)
        self._next = 0

    def __len__(self):
        return self.n_batch

    def batch(self, i: int) -> LMBatch:
        if not 0 <= i < self.n_batch:
            raise IndexError(f"batch {i} of {self.n_batch}")
        beg = i * self.tgt_len
        seq_len = min(self.tgt_len, self.n_step - 1 - beg)
        end = beg + seq_len
        first = max(0, beg - self.ext_len)
        pos = None if self.positions is None else self.positions[:, :, first:end]
        return LMBatch(self.data[:, first:end], self.data[:, beg + 1:end + 1], seq_len, pos)

    def __iter__(self) -> Iterator[LMBatch]:
        if self._next >= self.n_batch:
            self._next = 0
        while self._next < self.n_batch:
            i = self._next
            self._next = i + 1
            yield self.batch(i)

    def state(self) -> dict:
        """The next batch to yield (and the layout it refers to)."""
        return {"batch": self._next, "bsz": self.bsz, "tgt_len": self.tgt_len,
                "n_step": self.n_step}

    def load_state(self, state: Mapping):
        for name in ("bsz", "tgt_len", "n_step"):
            if name in state and state[name] != getattr(self, name):
                raise CheckpointError(f"state is for {name}={state[name]}, these streams have "
                                      f"{getattr(self, name)}")
        batch = int(state["batch"])
        if not 0 <= batch <= self.n_batch:
            raise CheckpointError(f"state batch {batch} outside 0..{self.n_batch}")
        self._next = batch
