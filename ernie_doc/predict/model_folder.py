"""A saved model's folder (a run's OUTPUT_DIR, its best/ or final/, a save_pretrained
folder) and its task.json: what the model is for, read and checked before any model code."""
import os
from typing import Optional

from ernie_doc.config import (MAX_TASK_FILE_BYTES, ErnieDocConfig, run_model_folder,
                              training_checkpoint_problem)
from ernie_doc.errors import CheckpointError, ConfigError, DataError, NotSet, PipelineError
from ernie_doc.kinds import TASK_FILE
from ernie_doc.kinds.folders import task_config, task_hint, task_names
from ernie_doc.utils import clip, open_regular, parse_json

MODEL_CONFIG = "config.json"   # what save_pretrained writes beside the weights


def model_directory(path: str, task: Optional[str] = None) -> str:
    """A run directory (best/, else final/) or saved model directory → the one with task.json;
    with `task`, also a save_pretrained directory."""
    if not os.path.isdir(path):
        raise PipelineError(f"{path}: not a directory (give a fine-tuning run's OUTPUT_DIR, "
                            f"or its best/ or final/)")
    try:
        folder = run_model_folder(path)   # the one rule AutoModel and AutoTokenizer follow too
    except CheckpointError as e:   # a run's OUTPUT_DIR without a saved model
        raise PipelineError(str(e)) from None
    if os.path.isfile(os.path.join(folder, TASK_FILE)):
        return folder
    if os.path.isfile(os.path.join(folder, MODEL_CONFIG)):
        if task is not None:
            return folder
        raise PipelineError(f"{folder}: a model saved without its task (no {TASK_FILE}): pass "
                            f"--task NAME (task= in Python), one of {', '.join(task_names())}")
    problem = training_checkpoint_problem(path)
    if problem:
        raise PipelineError(problem)
    raise PipelineError(f"{path}: no {TASK_FILE} here or in best/ or final/: predict needs a "
                        f"model fine-tuned by this version (a released pretrained model has "
                        f"no trained head; fine-tune it first)")


def read_task_record(directory: str) -> dict:
    """task.json of a saved model, checked: `task`, `kind` (its config's), `labels`, `config`;
    at most MAX_TASK_FILE_BYTES."""
    path = os.path.join(directory, TASK_FILE)
    try:
        with open_regular(path, TASK_FILE, PipelineError) as f:
            data = f.read(MAX_TASK_FILE_BYTES + 1)
    except OSError as e:
        raise PipelineError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > MAX_TASK_FILE_BYTES:
        raise PipelineError(f"{path}: over {MAX_TASK_FILE_BYTES >> 20} MiB; a task.json "
                            f"holds a task, its kind, labels and config")
    try:
        record = parse_json(data.decode("utf-8"), path, PipelineError)
    except UnicodeDecodeError as e:
        raise PipelineError(f"{path}: invalid UTF-8 (byte {e.start})") from None
    if not isinstance(record, dict):
        raise PipelineError(f"{path}: expected a JSON object (task, kind, labels, config), "
                            f"got {type(record).__name__}")
    for key, kind in (("task", str), ("kind", str), ("labels", list), ("config", dict)):
        if not isinstance(record.get(key), kind):
            raise PipelineError(f"{path}: {key!r} must be a {kind.__name__}")
    if not all(isinstance(label, str) for label in record["labels"]):
        raise PipelineError(f"{path}: 'labels' must be a list of strings")
    inner = record["config"].get("kind", record["kind"])
    if inner != record["kind"]:
        raise PipelineError(f"{path}: 'kind' {clip(repr(record['kind']))} disagrees with "
                            f"config.kind {clip(repr(inner))}")
    return record


def task_record(directory: str, task: Optional[str] = None) -> dict:
    """What a saved model is for: its task.json; without one, with `task` named, that task's
    config.yaml and labels. A task.json naming another task is refused."""
    if os.path.isfile(os.path.join(directory, TASK_FILE)):
        record = read_task_record(directory)
        if task is not None and task != record["task"]:
            raise PipelineError(f"{os.path.join(directory, TASK_FILE)}: the model was "
                                f"fine-tuned for task {record['task']!r}, not {clip(task)!r}")
        return record
    from ernie_doc.run_config import load_yaml
    path = task_config(task) if isinstance(task, str) else None
    if path is None:
        raise PipelineError(f"task {clip(repr(task))}: not a task folder{task_hint(task)} (one "
                            f"of {', '.join(task_names())})")
    try:
        values = load_yaml(path)
        model = ErnieDocConfig.from_json(os.path.join(directory, MODEL_CONFIG))
    except ConfigError as e:
        raise PipelineError(str(e)) from None
    from ernie_doc.kinds.base import load_reader
    labels = None
    reader = load_reader(task)
    if callable(getattr(reader, "labels", None)):
        try:   # most readers know their labels; others read them from a data directory
            labels = [str(x) for x in reader.labels("", dict(values.get("reader") or {}))]
        except (DataError, NotSet, OSError):
            labels = None
    if labels is None:
        labels = [str(i) for i in range(int(getattr(model, "num_labels", 0) or 0))] \
            if callable(getattr(reader, "labels", None)) else []
    limit = model.max_position_embeddings
    if isinstance(values.get("max_seq_len"), int) and values["max_seq_len"] > limit:
        values["max_seq_len"] = limit
    return {"task": task, "kind": values.get("kind"), "labels": labels, "config": values}

