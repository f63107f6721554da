"""What every predict pipeline shares (ernie_doc.pipeline for the document kinds,
ernie_doc.lm.predict for the language model): finding a saved model's directory and its
task.json, turning inputs into Documents, reading input files one document at a time, and
resuming a predictions file. No model code: both pipelines import it.
"""
import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Union

import numpy as np

from ernie_doc.data.document import Document

TASK_FILE = "task.json"   # beside a saved model: its task, kind, labels and run config
ON_ERROR = ("record", "fail")


class PipelineError(ValueError):
    """A model directory or document that cannot be predicted; the message is one line."""


@dataclass
class InputProblem:
    """An input item that is not a document (undecodable bytes, a bad JSON line ...): with
    on_error "record" it becomes an output line with an `error` field."""
    doc_id: str
    message: str


class DocumentStream:
    """What every predict pipeline shares: `stream(documents, skip)` (each pipeline's own)
    yields one record per document as documents finish; `__call__` gives them in input order;
    `admit` decides what becomes of each input item, and `problem` makes a bad one an error
    record (on_error "record") or a PipelineError naming it ("fail")."""
    on_error = "record"

    def check_on_error(self, on_error: str) -> str:
        if on_error not in ON_ERROR:
            raise PipelineError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        return on_error

    def stream(self, documents, skip=()) -> Iterator[dict]:
        raise NotImplementedError

    def __call__(self, documents) -> List[dict]:
        """Predict every document → one record per document, in input order."""
        return sorted(self.stream(documents), key=lambda r: r["index"])

    def problem(self, index: int, doc_id: str, message: str) -> dict:
        if self.on_error == "fail":
            raise PipelineError(f"document {doc_id!r} (input item {index + 1}): {message}")
        return {"doc_id": doc_id, "index": index, "error": message}

    def admit(self, index: int, item: Any, skip: set, seen: set) -> Union[Document, dict,
                                                                          None]:
        """An input item → the Document to read, an error record (a repeated id, an item
        that is not a document), or None (its id is in `skip`: already predicted). `seen`
        collects the ids admitted so far."""
        doc = to_document(index, item)
        if doc.doc_id in skip:
            return None
        if doc.doc_id in seen:
            return self.problem(index, doc.doc_id, "duplicate document id")
        seen.add(doc.doc_id)
        if isinstance(doc, InputProblem):
            return self.problem(index, doc.doc_id, doc.message)
        return doc


def model_directory(path: str) -> str:
    """A run directory (its best/, else final/) or a saved model directory → the directory
    holding task.json."""
    if not os.path.isdir(path):
        raise PipelineError(f"{path}: not a directory (give a fine-tuning run's OUTPUT_DIR, "
                            f"or its best/ or final/)")
    for candidate in (path, os.path.join(path, "best"), os.path.join(path, "final")):
        if os.path.isfile(os.path.join(candidate, TASK_FILE)):
            return candidate
    raise PipelineError(f"{path}: no {TASK_FILE} here or in best/ or final/: predict needs a "
                        f"model fine-tuned by this version (a released pretrained model has "
                        f"no trained head; fine-tune it first)")


def read_task_record(directory: str) -> dict:
    """task.json of a saved model, checked."""
    path = os.path.join(directory, TASK_FILE)
    from ernie_doc.utils import read_json
    try:
        record = read_json(path)
    except (OSError, ValueError) as e:
        raise PipelineError(f"{path}: {e}") from None
    for key, kind in (("task", str), ("kind", str), ("labels", list), ("config", dict)):
        if not isinstance(record.get(key), kind):
            raise PipelineError(f"{path}: {key!r} must be a {kind.__name__}")
    return record


def to_document(index: int, item: Any) -> Union[Document, InputProblem]:
    """A str (text), a Document, or a dict of the task's fields (`id` / `doc_id`, `text`,
    `ids`, anything else into `fields`) → Document. A dict's `label` stays a field: predict
    reads no gold, so a label outside the model's set is no error."""
    if isinstance(item, (Document, InputProblem)):
        return item
    if isinstance(item, str):
        return Document(str(index), text=item)
    if isinstance(item, dict):
        fields = dict(item)
        doc_id = fields.pop("doc_id", fields.pop("id", None))
        doc_id = str(index) if doc_id is None else str(doc_id)
        text, ids = fields.pop("text", None), fields.pop("ids", None)
        if text is not None and not isinstance(text, str):
            return InputProblem(doc_id, "'text' must be a string")
        return Document(doc_id, text=text, ids=ids, fields=fields)
    return InputProblem(str(index), f"expected text, a Document or a dict, got "
                                    f"{type(item).__name__}")


# -- input files -------------------------------------------------------------------------------
INPUT_FORMATS = ("auto", "txt", "dir", "tsv", "jsonl")


def input_format(path: str, fmt: str = "auto") -> str:
    """The format of an input path: a directory of .txt files, one .txt document, TSV with a
    header row, or JSON lines."""
    if fmt != "auto":
        return fmt
    if os.path.isdir(path):
        return "dir"
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix == ".tsv":
        return "tsv"
    return "txt"


def _decode(data: bytes, where: str) -> Union[str, InputProblem]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return InputProblem(where, f"not UTF-8 text (byte {e.start})")


def read_inputs(path: str, fmt: str = "auto") -> Iterator[Union[dict, InputProblem]]:
    """Documents from an input path, one at a time (never the whole file in memory), as dicts
    of the task's fields; an item that cannot be read is an InputProblem naming it."""
    from ernie_doc.data.document import open_regular, regular_files
    fmt = input_format(path, fmt)
    if fmt == "dir":
        names = sorted(n for n in os.listdir(path) if n.endswith(".txt"))
        for full in regular_files([os.path.join(path, n) for n in names]):
            name = os.path.basename(full)
            with open_regular(full) as f:
                text = _decode(f.read(), name)
            yield text if isinstance(text, InputProblem) else {"id": name, "text": text}
        return
    if fmt == "txt":
        with open_regular(path) as f:
            text = _decode(f.read(), os.path.basename(path))
        yield text if isinstance(text, InputProblem) else \
            {"id": os.path.basename(path), "text": text}
        return
    with open_regular(path) as f:
        header = None
        for number, raw in enumerate(f, 1):
            where = f"{path}:{number}"
            line = _decode(raw.rstrip(b"\r\n"), where)
            if isinstance(line, InputProblem):
                yield line
                continue
            if not line.strip():
                continue
            if fmt == "tsv":
                cells = line.split("\t")
                if header is None:
                    header = cells
                    continue
                if len(cells) != len(header):
                    yield InputProblem(where, f"{len(cells)} columns, the header has "
                                              f"{len(header)}")
                    continue
                yield dict(zip(header, cells))
                continue
            try:
                item = json.loads(line)
            except ValueError as e:
                yield InputProblem(where, f"invalid JSON ({e})")
                continue
            yield item if isinstance(item, dict) else \
                InputProblem(where, "expected a JSON object")


def count_inputs(path: str, fmt: str = "auto") -> Optional[int]:
    """How many items read_inputs will yield, at most (for the progress bar), or None."""
    fmt = input_format(path, fmt)
    if fmt == "txt":
        return 1
    if fmt == "dir":
        return sum(name.endswith(".txt") for name in os.listdir(path))
    lines = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            lines += block.count(b"\n")
    return lines


def completed_ids(output: str) -> List[str]:
    """Document ids already in a predictions file (resume); a last line cut short by an
    interrupted run is removed from the file."""
    ids, good = [], 0
    with open(output, "rb") as f:
        data = f.read()
    for line in data.splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not line.endswith(b"\n") or not isinstance(record, dict) or "doc_id" not in record:
            break
        ids.append(str(record["doc_id"]))
        good += len(line)
    if good != len(data):
        if data[good:].count(b"\n") > 1:
            raise PipelineError(f"{output}: line {len(ids) + 1} is not a prediction record; "
                                f"the file was not written by ernie-doc predict")
        with open(output, "r+b") as f:
            f.truncate(good)
    return ids


def to_jsonable(value: Any) -> Any:
    """numpy scalars and arrays in a record → plain JSON values."""
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value
