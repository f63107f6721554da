"""What a task reader returns, and the one error type for bad input data.

A reader turns raw files into `Document`s; everything after that (tokenize, segment, schedule,
collate) is shared. Bad input raises `DataError` with a message that starts with the file and
line ("path:12: ...") so the command line can print one clear line.

Only regular files are read: a FIFO, a device or a socket named as a data file is refused with
one line (`require_file`, `open_regular`) instead of blocking or reading forever, and one met
while listing a directory is skipped and counted (`regular_files`, reason NOT_REGULAR)."""
import difflib
import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Sequence, Tuple

from ernie_doc.errors import DataError, DuplicateKey, NotSet
# file_kind and mode_kind are re-exported: readers import them from here
from ernie_doc.utils import clip, file_kind, mode_kind  # noqa: F401
from ernie_doc.utils import open_regular as _open_regular
from ernie_doc.utils import read_utf8, regular_file_problem, unique_keys

# json.loads recurses once per nesting level: "[[[[..." thousands deep raises RecursionError.
# No input of ours nests more than a few levels, so such a value is bad data, said so.
TOO_DEEP = "JSON nested too deeply"

# The reason every directory listing counts its non-regular entries under.
NOT_REGULAR = "not a regular file (a FIFO, device, socket, directory or broken link)"


@dataclass
class Document:
    """One example: raw `text` or token `ids`, `label` (a string, or None), and `fields` for
    anything else a task needs (question, answers, choices ...)."""
    doc_id: str
    text: Optional[str] = None
    label: Optional[str] = None
    ids: Optional[List[int]] = None
    fields: Dict[str, Any] = field(default_factory=dict)


BOM = "\ufeff"


def without_bom(text: str) -> str:
    """`text` without a leading UTF-8 byte-order mark (Windows editors write one; it would end
    up in a column name, a JSON line or a first word)."""
    return text[1:] if text.startswith(BOM) else text


def where(path, line=None):
    """'path:line' (or 'path') for error messages."""
    return f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)


def open_regular(path, what: str = "file") -> BinaryIO:
    """ernie_doc.utils.open_regular raising DataError: a regular file, never a FIFO."""
    return _open_regular(path, what, DataError)


def utf8_lines(path):
    """(line number, line without "\\n" / "\\r") of a regular file, decoded a line at a time;
    invalid UTF-8 raises DataError naming path:line."""
    with open_regular(path) as f:
        # Binary lines split on b"\n" only, as read_lines does; a UTF-8 multi-byte sequence
        # never contains b"\n", so decoding per line is exact.
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where(path, number)}: invalid UTF-8 (byte {e.start} of "
                                f"the line)") from None
            if number == 1:
                line = without_bom(line)
            yield number, line.rstrip("\n").rstrip("\r")


def require_file(path, what: str = "file"):
    """`path` when it is a regular file; else DataError "<path>: <what> does not exist" (or
    "is a directory, not a file", or "is a FIFO, not a regular file" ...)."""
    problem = regular_file_problem(path, what)
    if problem:
        raise DataError(problem)
    return path


def is_candidate_file(path) -> bool:
    """True for a regular file, False when nothing (or a directory) is there; a FIFO, device
    or socket under a conventional name is a DataError, never opened."""
    kind = file_kind(path)
    if kind is None:
        return True
    if kind in ("missing", "a directory"):
        return False
    require_file(path)  # raises: "<path>: file is a FIFO, not a regular file"
    return False


def regular_files(paths: Iterable, skips: Optional["Skips"] = None) -> List:
    """The regular files among `paths`, in order; the others are counted in `skips` (reason
    NOT_REGULAR) when given."""
    kept = []
    for path in paths:
        kind = file_kind(path)
        if kind is None:
            kept.append(path)
        elif skips is not None:
            skips.add(NOT_REGULAR, os.fspath(path))
    return kept


def require_dir(path, what="data directory"):
    """`path` when it is a directory; NotSet when it is empty, else DataError naming it."""
    if not os.fspath(path):
        raise NotSet(f"the {what} is not set")
    if not os.path.isdir(path):
        raise DataError(f"{os.fspath(path)}: {what} does not exist")
    return path


def read_text(path) -> str:
    """A whole UTF-8 regular file, a leading BOM dropped; invalid UTF-8 raises DataError
    naming the file and line."""
    return without_bom(read_utf8(path, DataError))


def _loads(text: str, path, line: Optional[int] = None) -> Any:
    """`text` (of file `path`, or of its line `line`) parsed as JSON; DataError naming the file
    and line for invalid JSON, a key held twice in one object or nesting too deep."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise DataError(f"{where(path, e.lineno if line is None else line)}: invalid JSON "
                        f"({e.msg})") from None
    except DuplicateKey as e:
        raise DataError(f"{where(path, line)}: {e}") from None
    except RecursionError:
        raise DataError(f"{where(path, line)}: {TOO_DEEP}") from None


def read_json_file(path) -> Any:
    """The JSON value of a UTF-8 regular file; malformed JSON raises DataError naming the
    file and line."""
    return _loads(read_text(path), path)


def read_lines(path):
    """[(line_number, line without its newline)] of a UTF-8 file (no entry for the empty
    string after a final newline)."""
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(i + 1, line.rstrip("\r")) for i, line in enumerate(lines)]


def read_tsv(path, required=()) -> Tuple[List[str], List[Tuple[int, Dict[str, str]]]]:
    """A tab-separated UTF-8 file with a header → (column names, [(line number, {column:
    value})]). DataError naming file and line: empty, missing `required` column, ragged row."""
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{where(path)}: empty file (expected a header row)")
    header = lines[0][1].split("\t")
    for column in required:
        if column not in header:
            raise DataError(f"{where(path, 1)}: header has no {column!r} column (got {header})")
    records = []
    for line, row in lines[1:]:
        if not row.strip():
            continue
        values = row.split("\t")
        if len(values) != len(header):
            raise DataError(f"{where(path, line)}: {len(values)} columns, the header has "
                            f"{len(header)}")
        records.append((line, dict(zip(header, values))))
    return header, records


def parse_json_line(raw, path, line):
    """One line of a JSON-lines file → its object; malformed JSON or a non-object raises
    DataError naming the file and line."""
    record = _loads(raw, path, line)
    if not isinstance(record, dict):
        raise DataError(f"{where(path, line)}: expected a JSON object, got "
                        f"{type(record).__name__}")
    return record


def read_json_lines(path):
    """[(line number, JSON object)] of a JSON-lines file, blank lines skipped; a malformed
    line raises DataError naming the file and line."""
    return [(line, parse_json_line(raw, path, line)) for line, raw in read_lines(path)
            if raw.strip()]


def read_json_list(path, what):
    """A JSON file holding one list (of `what`, for the error message)."""
    records = read_json_file(path)
    if not isinstance(records, list):
        raise DataError(f"{where(path)}: expected a JSON list of {what}, got "
                        f"{type(records).__name__}")
    return records


class Skips:
    """Counted skips of one file: `add(reason, where)` per item, `report(total)` logs one line
    per reason with its count and first location ("skip and report" policy). Items corrected
    and kept are counted apart (`fixed(action, where)`): reported, never called skipped."""

    def __init__(self, path, what="examples"):
        self.path, self.what = os.fspath(path), what
        self.counts, self.fixes, self.first = Counter(), Counter(), {}

    def add(self, reason, location=None):
        self.counts[reason] += 1
        self.first.setdefault(reason, location or self.path)

    def fixed(self, action, location=None):
        """One item kept after `action` (e.g. "realigned the answer_start of")."""
        self.fixes[action] += 1
        self.first.setdefault(action, location or self.path)

    def __len__(self):
        return sum(self.counts.values())

    def report(self, total=None, log=None):
        """Log one line per reason (skipped) and per action (kept) → {reason: count} of the
        skipped."""
        log = log or logging.getLogger("ernie_doc.train")
        of = f" of {total}" if total is not None else ""
        for reason, n in self.counts.most_common():
            log.warning(f"{self.path}: skipped {n}{of} {self.what}: {reason} "
                        f"(first at {self.first[reason]})")
        for action, n in self.fixes.most_common():
            log.warning(f"{self.path}: {action} {n}{of} {self.what} ({self.what} kept; "
                        f"first at {self.first[action]})")
        return dict(self.counts)


def check_text(text, path, line=None, what="document"):
    """An empty or whitespace-only document is an error, never a silent skip."""
    if text is None or not str(text).strip():
        raise DataError(f"{where(path, line)}: empty {what}")
    return text


def check_label(label, labels, path, line=None):
    if label not in labels:
        shown = labels if len(labels) <= 10 else labels[:10] + ["..."]
        raise DataError(f"{where(path, line)}: label {label!r} is not in the label set {shown}")
    return label


def check_ratio(value, name: str = "dev_ratio"):
    """`value` when it is a number in (0, 1) (a reader's dev_ratio / test_ratio option)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise DataError(f"{name} must be a number in (0, 1), got {value!r}")
    return value


def split_by_ratio(documents: Sequence[Document], dev_ratio: float, split: str, seed: int = 0):
    """Deterministic train/dev split of one list: a document goes to dev when the hash of
    (seed, doc_id) falls below dev_ratio, so the split does not depend on file order."""
    check_ratio(dev_ratio)
    if split not in ("train", "dev"):
        raise DataError(f"split {split!r}: a ratio split gives only 'train' and 'dev'")

    def in_dev(doc):
        digest = hashlib.sha1(f"{seed}:{doc.doc_id}".encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < dev_ratio

    return [d for d in documents if in_dev(d) == (split == "dev")]


def check_options(options, known, what="reader options"):
    """The options dict (None → {}); a key outside `known` is an error, so a typo in a config
    is not silently ignored."""
    if options is not None and not isinstance(options, dict):
        raise DataError(f"{what}: expected a mapping, got {type(options).__name__}")
    options = dict(options or {})
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1) \
                if isinstance(key, str) else []
            near = (f"reader.{close[0]}" if what == "reader options" else repr(close[0])) \
                if close else ""
            hint = f" (did you mean {near}?)" if close else ""
            raise DataError(f"{what}: unknown key {clip(repr(key), 80)}{hint} "
                            f"(known: {sorted(known)})")
    return options


SPLITS = ("train", "dev", "test")


def file_name(value: Any, option: str) -> str:
    """A file name given in the reader option `option`: a non-empty string without NUL."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise DataError(f"reader option {option!r}: expected a file name, got {value!r}")
    return value


def check_split(split):
    if split not in SPLITS:
        raise DataError(f"split {split!r} is not one of {list(SPLITS)}")
    return split


def pick_file(data_dir, split, candidates, files=None):
    """The file of `split` under data_dir: files[split] when given (the reader option `files`,
    {split: name}; it must exist), else the first of candidates[split] that exists."""
    require_dir(data_dir)
    check_split(split)
    files = check_options(files, SPLITS, "reader option 'files'")
    if split in files:
        return require_file(os.path.join(data_dir, file_name(files[split], f"files.{split}")))
    for name in candidates[split]:
        path = os.path.join(data_dir, name)
        if is_candidate_file(path):
            return path
    names = " or ".join(candidates[split])
    raise DataError(f"{os.fspath(data_dir)}: no {names} for split {split!r}")
