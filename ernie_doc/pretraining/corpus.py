"""The pretraining corpus: documents streamed from files, sharded deterministically over ranks.

Files are JSON lines or plain text, in sorted order; document i goes to rank i % world_size.
Call `check_corpus` on EVERY rank before the first collective call, so an empty corpus fails
everywhere. Details: docs/design-notes.md, "Pretraining: the corpus"."""
import logging
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from ernie_doc.data.document import (NOT_REGULAR, Skips, file_kind, parse_json_line, utf8_lines,
                                     where)
from ernie_doc.errors import ConfigError, DataError

log = logging.getLogger("ernie_doc.pretrain")

PathArg = Union[str, os.PathLike]
JSON_SUFFIXES = (".jsonl", ".json")
SPLITS = ("blank_lines", "wikitext", "file")


@dataclass(frozen=True)
class CorpusDocument:
    """One document: `doc_id` ("relative path:line"), its text, its file and first line."""
    doc_id: str
    text: str
    path: str
    line: int


def _as_list(paths) -> List[str]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return [os.fspath(p) for p in paths]


def _describe(paths) -> str:
    return ", ".join(paths) if paths else "(no paths)"


def corpus_files(paths, skipped: Optional[Skips] = None) -> List[Tuple[str, str]]:
    """[(file path, relative name)] of the corpus in sorted order; non-regular entries counted
    in `skipped`, else logged once."""
    paths = _as_list(paths)
    own = skipped is None
    if own:
        skipped = Skips(_describe(paths), "entries")
    found, names, seen = [], {}, set()
    listed = 0
    for arg in paths:
        kind = file_kind(arg)
        if kind is None:
            entries = [(arg, os.path.basename(arg))]
        elif kind == "a directory":
            root = os.path.normpath(arg)
            prefix = os.path.basename(os.path.abspath(root))
            entries = []
            for directory, subdirs, files in os.walk(root):
                subdirs[:] = [d for d in subdirs if not d.startswith(".")]
                for name in files:
                    if name.startswith("."):
                        continue
                    full = os.path.join(directory, name)
                    listed += 1
                    if file_kind(full) is not None:  # a FIFO, socket, device, broken link
                        skipped.add(NOT_REGULAR, full)
                        continue
                    rel = os.path.relpath(full, root).replace(os.sep, "/")
                    entries.append((full, f"{prefix}/{rel}"))
            # Sort on path components, not on the os.walk order (file-system dependent).
            entries.sort(key=lambda e: e[1].split("/"))
        elif kind == "missing":
            raise DataError(f"{arg}: corpus path does not exist")
        else:
            raise DataError(f"{arg}: corpus path is {kind}, not a regular file or a directory")
        for full, rel in entries:
            real = os.path.realpath(full)
            if real in seen:  # a file named twice (itself and via its directory) is read once
                continue
            if rel in names:
                raise DataError(f"{full}: same relative name {rel!r} as {names[rel]}; "
                                f"their document ids would collide")
            seen.add(real)
            names[rel] = full
            found.append((full, rel))
    if own:
        skipped.report(listed, log)
    return found


def is_wikitext_heading(line: str) -> bool:
    """True for a top-level WikiText heading " = Title = " (not " = = Section = = ")."""
    s = line.strip()
    return (len(s) > 4 and s.startswith("= ") and s.endswith(" =")
            and not s.startswith("= =") and not s.endswith("= ="))


def _text_documents(path, split) -> Iterator[Tuple[int, str]]:
    """(first line, text) of a plain-text file."""
    if split == "file":   # the whole file is one document
        text = "\n".join(line.rstrip() for _, line in utf8_lines(path)).strip("\n")
        if text.strip():
            yield 1, text
        return
    start, lines = None, []
    for number, line in utf8_lines(path):
        line = line.rstrip()
        if split == "wikitext":
            if is_wikitext_heading(line) and lines:
                yield start, "\n".join(lines)
                start, lines = None, []
            if not line:
                continue  # paragraph breaks inside an article: the article goes on
        elif not line:
            if lines:
                yield start, "\n".join(lines)
            start, lines = None, []
            continue
        if start is None:
            start = number
        lines.append(line)
    if lines:
        yield start, "\n".join(lines)


def _json_documents(path, text_field) -> Iterator[Tuple[int, str]]:
    """(line, text) of a JSON-lines file."""
    for number, raw in utf8_lines(path):
        if not raw.strip():
            continue
        record = parse_json_line(raw, path, number)
        if text_field not in record:
            raise DataError(f"{where(path, number)}: no field {text_field!r} "
                            f"(fields: {sorted(record)[:10]})")
        text = record[text_field]
        if not isinstance(text, str):
            raise DataError(f"{where(path, number)}: field {text_field!r} must be a string, "
                            f"got {type(text).__name__}")
        yield number, text


def _check_args(rank, world_size, split, min_chars):
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive int, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank!r}")
    if split not in SPLITS:
        raise DataError(f"corpus split {split!r} is not one of {list(SPLITS)}")
    if min_chars < 0:
        raise ConfigError(f"min_chars must be >= 0, got {min_chars}")


def _file_documents(path, text_field, split) -> Iterator[Tuple[int, str]]:
    if path.lower().endswith(JSON_SUFFIXES):
        return _json_documents(path, text_field)
    return _text_documents(path, split)


def _all_documents(paths, text_field, min_chars, split, skips) -> Iterator[CorpusDocument]:
    """Every kept document in the global order (no sharding)."""
    # An empty (whitespace-only) document is never kept, even with min_chars=0.
    least = max(min_chars, 1)
    reason = "empty" if least == 1 else f"shorter than {least} characters"
    for path, rel in corpus_files(paths):
        for line, text in _file_documents(path, text_field, split):
            if len(text.strip()) < least:
                skips.add(reason, where(path, line))
                continue
            yield CorpusDocument(f"{rel}:{line}", text, path, line)


def iter_documents(paths: Union[PathArg, Sequence[PathArg]], rank: int = 0,
                   world_size: int = 1, text_field: str = "text", min_chars: int = 1,
                   split: str = "blank_lines",
                   skips: Optional[Skips] = None) -> Iterator[CorpusDocument]:
    """Stream this rank's documents (document i → rank i % world_size); skips counted in
    `skips`, else logged. No document: DataError at the end."""
    paths = _as_list(paths)
    _check_args(rank, world_size, split, min_chars)
    own_skips = skips is None
    if own_skips:
        skips = Skips(_describe(paths), "documents")
    total = 0
    for i, doc in enumerate(_all_documents(paths, text_field, min_chars, split, skips)):
        total = i + 1
        if i % world_size == rank:
            yield doc
    if own_skips and rank == 0:
        skips.report(total + len(skips), log)
    if total == 0:
        raise _empty(paths, skips)


def document_at(doc_id: str, path: str, line: int, text_field: str = "text",
                split: str = "blank_lines") -> CorpusDocument:
    """Read back the one document that starts at `path:line` (a resumed run rebuilds the
    documents its rows were reading from this)."""
    for number, text in _file_documents(path, text_field, split):
        if number == line:
            return CorpusDocument(doc_id, text, path, line)
        if number > line:
            break
    raise DataError(f"{where(path, line)}: no document starts there any more (the corpus "
                    f"changed since the checkpoint was written)")


def _empty(paths, skips):
    why = f" ({len(skips)} skipped: too short)" if len(skips) else ""
    return DataError(f"{_describe(paths)}: empty corpus, no documents{why}")


def _count(paths, world_size, text_field, min_chars, split):
    _check_args(0, world_size, split, min_chars)
    skips = Skips(_describe(paths), "documents")
    return sum(1 for _ in _all_documents(paths, text_field, min_chars, split, skips)), skips


def count_documents(paths: Union[PathArg, Sequence[PathArg]], text_field: str = "text",
                    min_chars: int = 1, split: str = "blank_lines") -> int:
    """The number of documents `iter_documents` keeps over all ranks (a full read, no
    sharding); the same on every rank. Bad data raises the same DataError as iterating."""
    return _count(_as_list(paths), 1, text_field, min_chars, split)[0]


def check_corpus(paths: Union[PathArg, Sequence[PathArg]], world_size: int = 1,
                 text_field: str = "text", min_chars: int = 1,
                 split: str = "blank_lines") -> int:
    """The document count; DataError when fewer than `world_size`. Deterministic: call it on
    every rank before the first collective call."""
    paths = _as_list(paths)
    n, skips = _count(paths, world_size, text_field, min_chars, split)
    if n == 0:
        raise _empty(paths, skips)
    if n < world_size:
        raise DataError(f"{_describe(paths)}: {n} documents for {world_size} ranks; every "
                        f"rank needs at least one")
    return n


__all__ = ["CorpusDocument", "iter_documents", "document_at", "count_documents", "check_corpus",
           "corpus_files", "is_wikitext_heading"]
