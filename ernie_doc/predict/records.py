"""The predictions file: its record lines (JSON, UTF-8), the provenance sidecar written
before the first record, and what `--resume` reads back from a file this tool wrote."""
import hashlib
import json
import os
from typing import Any, List, Optional, Tuple

import numpy as np

from ernie_doc.errors import PipelineError
from ernie_doc.outputs import InputSet, OutputFolder
from ernie_doc.utils import clip, decode_utf8, open_regular, parse_json

# One record per line; what wrote it lives in `<output>.meta.json`, written before the first
# record. --resume continues only a file whose sidecar names this model.
PROVENANCE_SUFFIX = ".meta.json"
WRITTEN_BY = "ernie-doc predict"
_WHOLE_FILE = 16 << 20      # files up to this size are hashed whole
_SAMPLES, _BLOCK = 16, 1 << 20


def provenance_path(output: str) -> str:
    """The sidecar of a predictions file."""
    return os.fspath(output) + PROVENANCE_SUFFIX


def _file_digest(path: str, size: int, digest) -> None:
    """Feed a file's size and bytes to `digest`; over 16 MiB, 16 evenly spread 1 MiB blocks
    (enough to tell two trainings' weights apart)."""
    digest.update(str(size).encode() + b"\0")
    with open_regular(path, "model file", PipelineError) as f:
        if size <= _WHOLE_FILE:
            for block in iter(lambda: f.read(_BLOCK), b""):
                digest.update(block)
            return
        for i in range(_SAMPLES):
            f.seek((size - _BLOCK) * i // (_SAMPLES - 1))
            digest.update(f.read(_BLOCK))


def model_fingerprint(directory: str) -> str:
    """sha256 (hex) of a saved model folder: names and contents of its regular, non-hidden
    files (large ones sampled), so a copy elsewhere has the same fingerprint."""
    digest = hashlib.sha256()
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_file():   # links followed
            continue
        digest.update(entry.name.encode("utf-8", "surrogateescape") + b"\0")
        _file_digest(entry.path, entry.stat().st_size, digest)
    return digest.hexdigest()


def provenance(model_dir: str, answer_dir: Optional[str] = None) -> dict:
    """The sidecar record of predictions by the model in `model_dir` (and, for HotpotQA's two
    stages, the answer model in `answer_dir`)."""
    return {"written_by": WRITTEN_BY, "format": 1, "model": model_fingerprint(model_dir),
            "answer_model": model_fingerprint(answer_dir) if answer_dir else None}


def provenance_bytes(record: dict) -> bytes:
    """The sidecar's content for `record` (provenance)."""
    return (json.dumps(record, indent=1) + "\n").encode("utf-8")


# A sidecar is a few hundred bytes; a record is one line, none longer than MAX_RECORD_LINE.
MAX_SIDECAR = 64 << 10
MAX_RECORD_LINE = 64 << 20


def check_provenance(output: str, record: dict, sidecar: Optional[bytes]) -> None:
    """PipelineError (one line) unless `sidecar` (the bytes of `output`'s sidecar, None when
    there is none) says this tool wrote `output` with the model(s) of `record`."""
    side = provenance_path(output)
    if sidecar is None:
        raise PipelineError(f"--resume: {output} has no {os.path.basename(side)} beside it, so "
                            f"ernie-doc predict did not write it: nothing changed; --overwrite "
                            f"replaces it")
    found = parse_json(decode_utf8(sidecar, side, PipelineError), side, PipelineError)
    writer = record.get("written_by", WRITTEN_BY)
    if not isinstance(found, dict) or found.get("written_by") != writer:
        raise PipelineError(f"--resume: {side}: not a record of {writer}; nothing changed")
    if found.get("settings") != record.get("settings"):   # explain's method, target ...
        raise PipelineError(f"--resume: {output} was written with other settings "
                            f"({clip(json.dumps(found.get('settings')), 200)}, now "
                            f"{clip(json.dumps(record.get('settings')), 200)}): nothing "
                            f"changed; --overwrite replaces it")
    for key, name in (("model", "MODEL"), ("answer_model", "--answer-model")):
        if found.get(key) != record[key]:
            raise PipelineError(f"--resume: {output} was written by a different model (its "
                                f"{key} fingerprint {str(found.get(key))[:12]}, {name}'s "
                                f"{str(record[key])[:12]}): nothing changed; --overwrite "
                                f"replaces it")


def completed_ids(output: str, record: dict, folder=None) -> List[str]:
    """Document ids already in a predictions file written for `record`'s model (sidecar checked
    first); a cut-short last line is removed, other bad lines refused. Read line by line."""
    return completed_records(output, record, folder)[0]


def completed_records(output: str, record: dict, folder=None) -> Tuple[List[str], int]:
    """completed_ids, and how many of those records are predictions (not error records)."""
    own = folder is None
    if own:
        folder = OutputFolder(output, InputSet(), error=PipelineError)
    try:
        if own:
            folder.open_append()
        side = os.path.basename(provenance_path(output))
        check_provenance(output, record, folder.read(side, MAX_SIDECAR))
        return _read_ids(output, folder.file)
    finally:
        if own:
            folder.close()


def _read_ids(output: str, f) -> Tuple[List[str], int]:
    """completed_records' reading of the open predictions file `f` (binary, read-write)."""
    ids, good, number, predicted = [], 0, 0, 0
    while True:
        line = f.readline(MAX_RECORD_LINE + 1)
        if not line:
            break
        number += 1
        if not line.endswith(b"\n"):
            if len(line) > MAX_RECORD_LINE:
                raise PipelineError(f"{output}:{number}: a line over {MAX_RECORD_LINE >> 20} "
                                    f"MiB, not a prediction record; nothing changed")
            f.truncate(good)   # the last line, cut short by an interrupted run
            break
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            item = None
        if not isinstance(item, dict) or "doc_id" not in item:
            raise PipelineError(f"{output}:{number}: not a prediction record; nothing changed")
        ids.append(str(item["doc_id"]))
        predicted += "error" not in item
        good += len(line)
    f.seek(0, os.SEEK_END)
    return ids, predicted


def record_line(record: dict) -> str:
    """One predictions-file line (JSON, UTF-8); a record holding a lone surrogate is written
    with \\uXXXX escapes instead, so writing never fails."""
    line = json.dumps(to_jsonable(record), ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(to_jsonable(record))
    return line + "\n"


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
