"""Documents in, for every predict pipeline (ernie_doc.predict.pipeline for the document
kinds, ernie_doc.predict.lm for the language model): input items turned into Documents and
named (DocumentStream), and input files (txt, a folder of them, TSV, JSON Lines, standard
input) read one document at a time. No model code: both pipelines import it."""
import contextlib
import json
import os
import stat
import sys
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, List, Optional, Set, Union

import numpy as np

from ernie_doc.data.document import TOO_DEEP, Document, without_bom
from ernie_doc.errors import DuplicateKey, PipelineError
from ernie_doc.utils import clip, open_regular, unique_keys

ON_ERROR = ("record", "fail")
ENGINES = ("auto", "dygraph", "inference")
STDIO = "-"   # --input - reads standard input, --output - writes standard output


@dataclass
class InputProblem:
    """An input item that is not a document: with on_error "record" an output line with an
    `error` field; `doc_id` None names it `#<input index>`."""
    doc_id: Optional[str]
    message: str


# The most one input item (a document; a task.json has its own bound) may hold, checked before
# it is read whole:
# 64 MiB is some 15 million words, far beyond any document.
MAX_ITEM_BYTES = 64 << 20


def shown(text: str) -> str:
    """`text` as it can be printed and written as UTF-8: a file name's undecodable bytes
    (Python's surrogate escapes) as \\xNN, any other lone surrogate as \\uNNNN."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _not_unicode(value: Any, key: str = "") -> Optional[str]:
    """The key path of the first string (or key) in `value` that UTF-8 cannot encode (a lone
    surrogate), or None; walked without recursion."""
    stack = [(key, value)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return key or "text"
        elif isinstance(value, dict):
            for k, v in value.items():
                name = f"{key}.{k}" if key else str(k)
                stack.extend([(name, k), (name, v)])
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
    return None


class DocumentStream:
    """What every predict pipeline shares: `stream(documents, skip)`, `__call__` (input order),
    `admit` (what becomes of each item), `problem` (error record or PipelineError)."""
    on_error = "record"

    def check_on_error(self, on_error: str) -> str:
        if on_error not in ON_ERROR:
            raise PipelineError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        return on_error

    # token ids a document may give (`ids`) lie in [0, vocab_size): the model's embedding
    # table; None: the model reads no ids (a language model, a span or choice kind: text)
    vocab_size: Optional[int] = None
    reads_text = True   # False: a pre-tokenized task's model, with no tokenizer

    def stream(self, documents, skip=()) -> Iterator[dict]:
        raise NotImplementedError

    def __call__(self, documents, **options) -> List[dict]:
        """Predict every document → one record per document, in input order. A call takes
        nothing else: a Hugging Face call's options (batch_size, truncation, top_k ...) are a
        TypeError naming where such a choice is made."""
        if options:
            raise TypeError(call_option_problem(sorted(options)[0]))
        return sorted(self.stream(documents), key=lambda r: r["index"])

    @staticmethod
    def skip_ids(skip: Optional[Iterable[Any]]) -> Set[str]:
        """`stream`'s `skip` → the set of document ids not to predict (None: none); a single
        string is refused (it would read as one-character ids)."""
        if skip is None:
            return set()
        if isinstance(skip, (str, bytes)):
            raise PipelineError(f"skip: expected a collection of document ids, got a string "
                                f"({skip[:40]!r})")
        try:
            return {str(doc_id) for doc_id in skip}
        except TypeError:
            raise PipelineError(f"skip: expected a collection of document ids, got "
                                f"{type(skip).__name__}") from None

    def problem(self, index: int, doc_id: str, message: str) -> dict:
        if self.on_error == "fail":
            raise PipelineError(f"document {doc_id!r} (input item {index + 1}): {message}")
        return {"doc_id": doc_id, "index": index, "error": message}

    @staticmethod
    def items(documents: Any) -> Iterable[Any]:
        """`documents` as input items: a single str, dict or Document is one document (as a
        Hugging Face pipeline reads a bare string)."""
        if isinstance(documents, (str, dict, Document, InputProblem)):
            return [documents]
        if isinstance(documents, bytes):
            raise PipelineError("documents: expected text or an iterable of documents, got "
                                "bytes (decode them first)")
        if not isinstance(documents, Iterable):
            raise PipelineError(f"documents: expected text or an iterable of documents, got "
                                f"{type(documents).__name__}")
        return documents

    def admit(self, index: int, item: Any, skip: set, seen: dict) -> Union[Document, dict,
                                                                           None]:
        """An input item → its Document, an error record, or None (its name is in `skip`).
        Details: docs/design-notes.md, "Prediction: naming the records"."""
        doc = to_document(index, item)
        if isinstance(doc, InputProblem):
            given = doc.doc_id is not None
            name = doc.doc_id if doc.doc_id is not None else f"#{index}"
        else:
            given, name = not _positional(item), doc.doc_id
        taken = seen.get(name)
        while name in seen:
            name = f"{name}#{index}"
        seen[name] = (given and taken is None, index)
        if name in skip:
            return None
        if given and taken is not None and taken[0]:
            return self.problem(index, name, f"duplicate document id (first given by input "
                                             f"item {taken[1] + 1})")
        if isinstance(doc, InputProblem):
            return self.problem(index, name, doc.message)
        if name != doc.doc_id:
            doc = replace(doc, doc_id=name)
        problem = document_problem(doc, self.vocab_size, self.reads_text)
        if problem:
            return self.problem(index, name, problem)
        return doc


def call_option_problem(name: str) -> str:
    """The message for a pipeline call given the option `name`."""
    if name == "batch_size":   # each row holds one document's memory while it is read
        return ("pipeline call: batch_size is the pipeline's, set when it is made: "
                "pipeline(RUN, batch_size=N) (a row holds a document's memory while it is read)")
    if name in ("truncation", "max_length", "padding"):
        return (f"pipeline call: {name}: a pipeline reads the whole document, segment by "
                f"segment, as evaluation does (the run's max_doc_tokens cuts it)")
    return (f"pipeline call: unexpected option {clip(repr(name))}: a call takes the documents "
            f"only; the options are pipeline()'s: batch_size, on_error, device, engine, "
            f"precision, threads")


def check_batch_size(batch_size: Optional[int]) -> None:
    """PipelineError unless `batch_size` is None (the run's) or a positive integer; whether it
    fits is the memory estimate's to say."""
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                   or batch_size < 1):
        raise PipelineError(f"batch_size must be a positive integer or None, got "
                            f"{clip(repr(batch_size))}")


def _positional(item: Any) -> bool:
    """Whether an input item gives no id (to_document names it by its position)."""
    return isinstance(item, str) or \
        (isinstance(item, dict) and item.get("doc_id", item.get("id")) is None)


def to_document(index: int, item: Any) -> Union[Document, InputProblem]:
    """A str, Document, or dict of the task's fields → Document, named by its id, else its
    position. InputProblem: both `text` and `ids`, a bad id, invalid Unicode."""
    if isinstance(item, InputProblem):
        return item
    values: Any   # what is checked for Unicode: the item's text and fields
    if isinstance(item, Document):
        doc_id, values = item.doc_id, {"text": item.text, "fields": item.fields}
    elif isinstance(item, str):
        doc_id, values = str(index), item
    elif isinstance(item, dict):
        fields = dict(item)
        doc_id = fields.pop("doc_id", fields.pop("id", None))
        if doc_id is None:
            doc_id = str(index)
        elif isinstance(doc_id, (str, int)) and not isinstance(doc_id, bool):
            doc_id = str(doc_id)
        else:
            return InputProblem(None, f"'id' must be a string or an integer, got "
                                      f"{type(doc_id).__name__}")
        values = fields
    else:
        return InputProblem(None, f"expected text, a Document or a dict, got "
                                  f"{type(item).__name__}")
    if _not_unicode(doc_id) is not None:
        return InputProblem(None, f"'id' {clip(repr(doc_id))} is not valid Unicode (a lone "
                                  f"surrogate)")
    bad = _not_unicode(values)
    if bad is not None:
        return InputProblem(doc_id, f"{clip(repr(bad))} holds a string that is not valid "
                                    f"Unicode (a lone surrogate)")
    if isinstance(item, (Document, str)):
        return item if isinstance(item, Document) else Document(doc_id, text=item)
    text, ids = fields.pop("text", None), fields.pop("ids", None)
    if text is not None and ids is not None:
        return InputProblem(doc_id, "give either ids or text, not both")
    if text is not None and not isinstance(text, str):
        return InputProblem(doc_id, "'text' must be a string")
    return Document(doc_id, text=text, ids=ids, fields=fields)


def ids_problem(ids: Any, vocab_size: int) -> Optional[str]:
    """What is wrong with a document's `ids` in one line, or None: a flat list of integers (no
    bools, floats, strings) in [0, vocab_size)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            return f"'ids' must be a flat list of integers, got an array of {ids.dtype} " \
                   f"with shape {list(ids.shape)}"
        values = ids.tolist()
    elif isinstance(ids, (list, tuple)):
        values = ids
    else:
        return f"'ids' must be a list of token ids, got {type(ids).__name__}"
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            return f"'ids' item {position} must be an integer token id, got " \
                   f"{type(value).__name__}"
        if not 0 <= value < vocab_size:
            shown = int(value) if -2 ** 63 <= value < 2 ** 63 else "beyond int64"
            return f"'ids' item {position} is {shown}: token ids lie in " \
                   f"[0, {vocab_size}) (the model's vocab_size)"
    return None


def document_problem(doc: Document, vocab_size: Optional[int],
                     reads_text: bool = True) -> Optional[str]:
    """What makes a Document unreadable by the model, or None, checked before tokenizing: text
    and ids together, ids it reads none of or not its token ids, no ids without a tokenizer."""
    if doc.ids is None:
        return None if reads_text or doc.text is None else \
            "this model reads token ids ('ids'), not text"
    if doc.text is not None:
        return "give either ids or text, not both"
    if vocab_size is None:
        return "this model reads text, not token ids ('ids')"
    return ids_problem(doc.ids, vocab_size)


# -- input files -------------------------------------------------------------------------------
INPUT_FORMATS = ("auto", "txt", "dir", "tsv", "jsonl")


def input_format(path: str, fmt: str = "auto") -> str:
    """The format of an input path: a directory of .txt files, one .txt document, TSV with a
    header row, or JSON lines."""
    if fmt not in INPUT_FORMATS:
        raise PipelineError(f"input format must be one of {INPUT_FORMATS}, got {fmt!r}")
    if path == STDIO:   # standard input: JSON lines unless told otherwise
        if fmt == "dir":
            raise PipelineError("--format dir: standard input (-) is not a directory")
        return "jsonl" if fmt == "auto" else fmt
    if fmt == "dir" and not os.path.isdir(path):
        raise PipelineError(f"--format dir: {path} is not a directory (a directory of .txt "
                            f"files is)")
    if fmt not in ("auto", "dir") and os.path.isdir(path):
        raise PipelineError(f"--format {fmt}: {path} is a directory (--format dir reads its "
                            f".txt files)")
    if fmt != "auto":
        return fmt
    if os.path.isdir(path):
        return "dir"
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix == ".tsv":
        return "tsv"
    header = _header_in_txt(path)
    if header:
        raise PipelineError(f"--input {shown(path)}: its first line is a tab-separated header "
                            f"({', '.join(header)}), not one document: give --format tsv, or "
                            f"--format task to read it with the task's reader")
    return "txt"


# column names whose presence in a first line with tabs marks a TSV file named .txt (the
# official IMDB layout: qid label score text_a)
_HEADER_COLUMNS = {"qid", "id", "label", "text", "text_a", "text_b", "question", "context"}


def _header_in_txt(path: str) -> Optional[List[str]]:
    """The columns of `path`'s first line when it looks like a TSV header (tab-separated,
    naming a known field), else None. Only a regular file is opened (a FIFO would block)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    columns = [c.strip() for c in without_bom(first.decode("utf-8", "replace")).split("\t")]
    if len(columns) > 1 and _HEADER_COLUMNS & {c.lower() for c in columns}:
        return columns
    return None


def _decode(data: bytes, where: str, first: bool = True,
            doc_id: Optional[str] = None) -> Union[str, InputProblem]:
    """UTF-8 bytes → text, a BOM dropped at a file's start (`first`), or an InputProblem
    (named `doc_id`) naming `where`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return InputProblem(doc_id, f"{where}: not UTF-8 text (byte {e.start})")
    return without_bom(text) if first else text


def _read_document(path: str, name: Optional[str]) -> Union[dict, InputProblem]:
    """A .txt document → {"id": name, "text"}; InputProblem when it is no readable regular file
    (never blocking), exceeds MAX_ITEM_BYTES (never read whole) or is not UTF-8."""
    where = shown(path)
    try:
        with open_regular(path, "input document", PipelineError) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(MAX_ITEM_BYTES + 1) if size <= MAX_ITEM_BYTES else b""
    except PipelineError as e:
        return InputProblem(name, shown(str(e)))
    except OSError as e:
        return InputProblem(name, f"{where}: cannot read ({e.strerror})")
    if size > MAX_ITEM_BYTES or len(data) > MAX_ITEM_BYTES:
        return InputProblem(name, f"{where}: {max(size, len(data)):,} bytes, over the "
                                  f"{MAX_ITEM_BYTES >> 20} MiB one document may hold")
    text = _decode(data, where, doc_id=name)
    return text if isinstance(text, InputProblem) else {"id": name, "text": text}


def _directory_entries(path: str) -> List[str]:
    """The entries of a directory input that are read, sorted: `.txt` entries and non-hidden
    folders (an error record, not silently skipped); other files are passed over."""
    names = []
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                folder = entry.is_dir()   # links followed
            except OSError:   # a link loop: read (and refused) as a .txt entry, if named so
                folder = False
            if entry.name.endswith(".txt") or (folder and not entry.name.startswith(".")):
                names.append(entry.name)
    return sorted(names)


def _lines(f) -> Iterator[tuple]:
    """(line number, the line's bytes without its newline, or None for a line longer than
    MAX_ITEM_BYTES, which is passed over without being held) of an open binary file."""
    number = 0
    while True:
        raw = f.readline(MAX_ITEM_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_ITEM_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):   # the rest of it, 1 MiB at a time
                raw = f.readline(1 << 20)
            yield number, None
            continue
        yield number, raw.rstrip(b"\r\n")


# Official TSV column names (`qid label score text_a`) read as the fields they hold, unless
# the header also has the field's own name.
TSV_ALIASES = {"text_a": "text", "qid": "id"}


def _tsv_header(line: str, where: str) -> List[str]:
    """A TSV input's header row (at `where`) → column names, official ones (TSV_ALIASES)
    renamed when the field's own name is absent; a repeated column is a PipelineError."""
    header = line.split("\t")
    repeated = next((c for i, c in enumerate(header) if c in header[:i]), None)
    if repeated is not None:
        raise PipelineError(f"{where}: the header names column {shown(repeated)!r} twice")
    taken = set(header) | ({"id"} if "doc_id" in header else set())
    return [TSV_ALIASES[c] if TSV_ALIASES.get(c) not in (None, *taken) else c for c in header]


def _open_input(path: str):
    """--input as a binary file object: standard input for `-` (left open), else a regular
    file (ernie_doc.utils.open_regular)."""
    if path == STDIO:
        return contextlib.nullcontext(sys.stdin.buffer)
    return open_regular(path, "--input", PipelineError)


def _item_lines(f, path: str, fmt: str) -> Iterator[tuple]:
    """(where, line, header) of each line of an open JSONL or TSV input that is one item:
    blank lines and a TSV's header row (checked, then given with each row as `header`) are
    none. `line`: the text, an InputProblem (not UTF-8), or None (longer than MAX_ITEM_BYTES,
    not read; before a TSV's header, the last: no row after it can be read)."""
    header, name = None, shown(path)
    for number, raw in _lines(f):
        where = f"{name}:{number}"
        line = None if raw is None else _decode(raw, where, first=number == 1)
        if isinstance(line, str):
            if not line.strip():
                continue
            if fmt == "tsv" and header is None:
                header = _tsv_header(line, where)
                continue
        yield where, line, header
        if line is None and fmt == "tsv" and header is None:
            return


def _file_items(path: str, fmt: str) -> Iterator[Union[dict, InputProblem]]:
    """The items of a JSON Lines or TSV input (a file or standard input), one per line; a line
    that cannot be read is an InputProblem naming it (file:line)."""
    with _open_input(path) as f:
        for where, line, header in _item_lines(f, path, fmt):
            if line is None:
                yield InputProblem(None, f"{where}: a line longer than the "
                                         f"{MAX_ITEM_BYTES >> 20} MiB one document may hold "
                                         f"(not read)")
            elif isinstance(line, InputProblem):
                yield line
            elif fmt == "tsv":
                cells = line.split("\t")
                yield dict(zip(header, cells)) if len(cells) == len(header) else \
                    InputProblem(None, f"{where}: {len(cells)} columns, the header has "
                                       f"{len(header)}")
            else:
                yield _json_item(line, where)


def _json_item(line: str, where: str) -> Union[dict, InputProblem]:
    """A JSON Lines line (at `where`) → its object, or an InputProblem naming it."""
    try:
        item = json.loads(line, object_pairs_hook=unique_keys)
    except DuplicateKey as e:   # json.loads would read the last 'text' without a word
        return InputProblem(None, f"{where}: {e}")
    except ValueError as e:
        return InputProblem(None, f"{where}: invalid JSON ({e})")
    except RecursionError:
        return InputProblem(None, f"{where}: {TOO_DEEP}")
    return item if isinstance(item, dict) else \
        InputProblem(None, f"{where}: expected a JSON object")


def read_inputs(path: str, fmt: str = "auto") -> Iterator[Union[dict, InputProblem]]:
    """Documents from an input path, one at a time (never the whole file in memory, and
    never more than MAX_ITEM_BYTES of one document), as dicts of the task's fields; an item
    that cannot be read is an InputProblem whose message names it (file:line). A directory
    input: one item per `.txt` entry (named by its file name) and per folder
    (_directory_entries); an entry that is not a readable regular file, or whose name is
    not UTF-8, is an error record."""
    fmt = input_format(path, fmt)
    if fmt == "dir":
        for name in _directory_entries(path):
            full = os.path.join(path, name)
            if shown(name) != name:
                yield InputProblem(None, f"{shown(full)}: the file name is not UTF-8")
            elif os.path.isdir(full):
                yield InputProblem(name, f"{shown(full)}: a folder (only the .txt files "
                                         f"directly in the input folder are read)")
            else:
                yield _read_document(full, name)
        return
    if fmt == "txt" and path == STDIO:   # one document: standard input to its end
        data = sys.stdin.buffer.read(MAX_ITEM_BYTES + 1)
        text = InputProblem("stdin", f"standard input: more than the {MAX_ITEM_BYTES >> 20} "
                                     f"MiB one document may hold") \
            if len(data) > MAX_ITEM_BYTES else _decode(data, "standard input", doc_id="stdin")
        yield text if isinstance(text, InputProblem) else {"id": "stdin", "text": text}
        return
    if fmt == "txt":
        name = os.path.basename(path)
        yield _read_document(path, name if shown(name) == name else None)
        return
    yield from _file_items(path, fmt)


def count_inputs(path: str, fmt: str = "auto") -> Optional[int]:
    """How many items read_inputs yields (the progress bar's total: a TSV's header row and
    blank lines are no items), or None for standard input (read once, never counted ahead);
    a TSV header is checked here, before any output is written. One line held at a time."""
    fmt = input_format(path, fmt)
    if fmt == "txt":
        return 1
    if path == STDIO:
        return None
    if fmt == "dir":
        return len(_directory_entries(path))
    with _open_input(path) as f:
        return sum(1 for _ in _item_lines(f, path, fmt))


def no_documents(path: str, fmt: str = "auto") -> str:
    """The line saying why read_inputs yields no item from `path` (count_inputs gave 0, or
    standard input ended at once): `--input PATH: no documents: the file is empty`."""
    fmt = input_format(path, fmt)
    if fmt == "dir":
        why = "the folder holds no .txt files"
    elif path == STDIO:
        why = "standard input is empty (or holds only " + \
            ("a header row and " if fmt == "tsv" else "") + "blank lines)"
    else:   # no item: a line that is not blank can only be a TSV's header (read as JSONL)
        with _open_input(path) as f:
            empty = os.fstat(f.fileno()).st_size == 0
            header = fmt == "tsv" and next(_item_lines(f, path, "jsonl"), None) is not None
        why = "the file is empty" if empty else "the file holds only a header row" if header \
            else "the file holds only blank lines"
    return f"--input {shown(path)}: no documents: {why}"

