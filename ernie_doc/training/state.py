"""Resumable training checkpoints, written atomically, with no pickle in them.

    OUTPUT_DIR/checkpoints/step-N/   model.safetensors, optimizer.safetensors + optimizer.json,
                                     trainer_state.json, rank-R.npz (memories of rank R's rows)
    OUTPUT_DIR/checkpoints/latest -> step-N      (symlink, replaced atomically)
    OUTPUT_DIR/best -> checkpoints/best-step-N   (from_pretrained directory of the best model)

A kill mid-save leaves the previous checkpoint and link intact, and resuming checks every
tensor and file before using it (CheckpointStateError naming the file). Details:
docs/design-notes.md, "Training: checkpoints"."""
import json
import os
import shutil
import time
import zipfile
from typing import Optional

import numpy as np
import paddle
from safetensors import numpy as st
from safetensors import safe_open
from safetensors.numpy import load_file

from ernie_doc import distributed as dist
from ernie_doc.checkpoint.lodtensor import bf16_to_fp32
from ernie_doc.config import TRAINER_STATE
from ernie_doc.errors import CheckpointStateError
from ernie_doc.kinds import TASK_FILE
from ernie_doc.tokenization.base import CONFIG_FILE as TOKENIZER_CONFIG
from ernie_doc.training import outdir
from ernie_doc.utils import dtype_name, short_list

CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_META = "optimizer.json"
MASTER_PREFIX = "master_weights/"      # optimizer.safetensors keys of AMP master weights


def _point(output_dir, entry, target):
    """Atomically make OUTPUT_DIR/entry a symlink to `target` (relative to the link's
    directory), listed in the run's manifest first."""
    link = os.path.join(output_dir, entry)
    relative = os.path.relpath(target, os.path.dirname(os.path.abspath(link)))
    with outdir.atomic_entry(output_dir, entry) as tmp:
        os.remove(tmp)
        os.symlink(relative, tmp)


def step_number(name: str, prefix: str = "step-") -> Optional[int]:
    """N of a checkpoint folder name `prefix`N ("step-12", "best-step-12"), or None."""
    rest = name[len(prefix):]
    return int(rest) if name.startswith(prefix) and rest.isdigit() else None


def _steps(output_dir, prefix):
    """The N of the checkpoint folders `prefix`N the run's manifest lists in checkpoints/,
    sorted (folders it does not list are never rotated away)."""
    steps = (step_number(name, prefix) for name in outdir.listed_in(output_dir, CHECKPOINTS))
    return sorted(n for n in steps if n is not None)


def _fresh(output_dir, entry):
    """Make way for checkpoint folder `entry` (and its .tmp): both listed in the manifest,
    a leftover of this run removed, anything else in the way refused (ConfigError)."""
    outdir.make_room(output_dir, entry + ".tmp")
    outdir.claim(output_dir, entry + ".tmp", entry)
    return os.path.join(output_dir, entry + ".tmp")


def _into_place(output_dir, entry):
    """Rename the finished `entry`.tmp to `entry` (a listed leftover at `entry` removed)."""
    outdir.make_room(output_dir, entry)
    outdir.rename_entry(output_dir, entry + ".tmp", entry)
    return os.path.join(output_dir, entry)


STRUCTURED = "__keys_by_structured_name__"


def _rename(state, mapping):
    """Optimizer state keys "<param name>_<accumulator>" with the parameter name mapped."""
    out = {}
    for key, value in state.items():
        if key == "master_weights" and isinstance(value, dict):
            out[key] = {mapping.get(k, k): v for k, v in value.items()}
            continue
        owner = max((name for name in mapping if key.startswith(name + "_")), key=len,
                    default=None)
        out[key if owner is None else mapping[owner] + key[len(owner):]] = value
    return out


def optimizer_state(model, optimizer):
    """The optimizer's state keyed by structured parameter names (paddle's generated names
    depend on the process's history)."""
    names = {p.name: n for n, p in model.named_parameters()}
    return dict(_rename(optimizer.state_dict(), names), **{STRUCTURED: True})


def load_optimizer_state(model, optimizer, state):
    if state.pop(STRUCTURED, False):
        state = _rename(state, {n: p.name for n, p in model.named_parameters()})
    optimizer.set_state_dict(state)


# -- tensors <-> files ----------------------------------------------------------------------
def _to_numpy(tensor):
    """paddle Tensor → (ndarray, paddle dtype name); bfloat16 as its uint16 bits."""
    return np.ascontiguousarray(tensor.numpy()), dtype_name(tensor.dtype)


def _from_numpy(array, dtype_name):
    """The inverse of _to_numpy: ndarray (uint16 bits for bfloat16) → paddle Tensor."""
    if dtype_name == "bfloat16":
        return paddle.to_tensor(bf16_to_fp32(array)).astype("bfloat16")  # exact
    return paddle.to_tensor(array)


def _save_tensors(path, arrays, metadata=None):
    """{name: ndarray} → a safetensors file (no pickle; the header is JSON). Looked up at
    call time so a test can stand in for the writer."""
    st.save_file(arrays, path, metadata=metadata)


def _load_tensors(path):
    """A safetensors file → {name: ndarray}; CheckpointStateError naming an unreadable one."""
    if not os.path.isfile(path):
        raise CheckpointStateError(f"{path}: missing")
    try:
        return load_file(path)
    except Exception as e:  # noqa: BLE001  safetensors raises its own error types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointStateError(f"{path}: unreadable ({reason})") from None


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise CheckpointStateError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointStateError(f"{path}: unreadable ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointStateError(f"{path}: expected a JSON object, got "
                                   f"{type(value).__name__}")
    return value


def _jsonable(value, where):
    """An optimizer entry that is not a tensor (the LR scheduler's state) → plain JSON
    values; numpy scalars become Python numbers (exact: JSON keeps the shortest repr)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, where) for k, v in value.items()}
    raise CheckpointStateError(f"optimizer state entry {where!r}: cannot store a "
                               f"{type(value).__name__} in {OPTIMIZER_META}")


def _write_model(path, model):
    arrays, dtypes = {}, {}
    for key, tensor in model.state_dict().items():
        arrays[key], dtypes[key] = _to_numpy(tensor)
    bf16 = sorted(k for k, d in dtypes.items() if d == "bfloat16")
    _save_tensors(path, arrays, {"format": "np", "bfloat16": json.dumps(bf16)})


def _write_optimizer(directory, model, optimizer):
    """optimizer.safetensors (every state tensor, by structured name) and optimizer.json (the
    rest, and {"tensors": {key: [dtype, shape]}} that resume checks)."""
    state = optimizer_state(model, optimizer)
    arrays, listing, entries = {}, {}, {}
    for key, value in state.items():
        if key == "master_weights" and isinstance(value, dict):
            items = [(MASTER_PREFIX + k, v) for k, v in value.items()]
        elif isinstance(value, paddle.Tensor):
            items = [(key, value)]
        else:
            entries[key] = _jsonable(value, key)
            continue
        for name, tensor in items:
            arrays[name], dtype = _to_numpy(tensor)
            listing[name] = [dtype, list(arrays[name].shape)]
    _save_tensors(os.path.join(directory, OPTIMIZER_FILE), arrays, {"format": "np"})
    with open(os.path.join(directory, OPTIMIZER_META), "w", encoding="utf-8") as f:
        json.dump({"entries": entries, "tensors": listing}, f, indent=1, sort_keys=True)


# Test hook (tests/test_peers.py): rank 0 stops for a minute in the middle of writing checkpoint
# step-N, its model file written and the rest not, so that a test can kill it there. Unset
# (every run but that test's), it does nothing.
TEST_PAUSE = "ERNIE_DOC_TEST_PAUSE_IN_SAVE"


def _test_pause(step):
    if os.environ.get(TEST_PAUSE) == str(step):
        time.sleep(60)


def save_training_state(output_dir, step, model, optimizer, trainer_state, rank_arrays, keep=1):
    """Collective: every rank calls it. rank_arrays: this rank's numpy arrays (memories)."""
    entry = f"{CHECKPOINTS}/step-{step}"
    tmp = os.path.join(output_dir, entry + ".tmp")
    if dist.rank() == 0:
        _fresh(output_dir, entry)
        os.makedirs(tmp)
    dist.barrier()
    np.savez(os.path.join(tmp, f"rank-{dist.rank()}.npz"), **rank_arrays)
    if dist.rank() == 0:
        _write_model(os.path.join(tmp, MODEL_FILE), model)
        _test_pause(step)
        _write_optimizer(tmp, model, optimizer)
        with open(os.path.join(tmp, TRAINER_STATE), "w", encoding="utf-8") as f:
            json.dump(trainer_state, f, indent=1, sort_keys=True)
    dist.barrier()
    final = os.path.join(output_dir, entry)
    if dist.rank() == 0:
        _into_place(output_dir, entry)
        _point(output_dir, f"{CHECKPOINTS}/latest", final)
        outdir.remove_entries(output_dir, [f"{CHECKPOINTS}/step-{old}" for old in
                                           _steps(output_dir, "step-")[:-keep or None]
                                           if old != step])
    dist.barrier()
    return final


def latest_checkpoint(output_dir):
    """The directory `latest` points to, or None when the run never saved one."""
    link = os.path.join(output_dir, CHECKPOINTS, "latest")
    if not os.path.lexists(link):
        return None
    path = os.path.realpath(link)
    if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
        raise CheckpointStateError(f"{link}: points to {path}, which is not a complete "
                                   "checkpoint")
    return path


# -- resume ----------------------------------------------------------------------------------
def _load_model(path, model):
    """Check the saved model tensors against the model (all there, nothing else, the same
    shapes and dtypes), then assign them."""
    source = os.path.join(path, MODEL_FILE)
    arrays = _load_tensors(source)
    with safe_open(source, framework="np") as f:
        meta = f.metadata() or {}
    try:
        bf16 = set(json.loads(meta.get("bfloat16", "[]")))
    except ValueError:
        raise CheckpointStateError(f"{source}: corrupt metadata") from None
    own = model.state_dict()
    missing = [k for k in own if k not in arrays]
    unexpected = [k for k in arrays if k not in own]
    wrong = []
    for key, tensor in own.items():
        if key not in arrays:
            continue
        value = arrays[key]
        dtype = dtype_name(tensor.dtype)
        saved = "bfloat16" if key in bf16 else getattr(getattr(value, "dtype", None), "name",
                                                        type(value).__name__)
        shape = list(getattr(value, "shape", ()))
        if saved != dtype or shape != list(tensor.shape):
            wrong.append(f"{key} {saved} {shape} (model {dtype} {list(tensor.shape)})")
    if missing or unexpected or wrong:
        parts = [f"{label} {short_list(items)}"
                 for label, items in (("missing", missing), ("unexpected", unexpected),
                                      ("wrong dtype/shape:", wrong)) if items]
        raise CheckpointStateError(f"{source}: does not match the model being resumed: "
                                   + "; ".join(parts))
    for key, tensor in own.items():
        value = arrays[key]
        if key in bf16:
            value = _from_numpy(value, "bfloat16")
        tensor.set_value(value)


def _load_optimizer(path, model):
    """→ the optimizer state dict, checked: every tensor optimizer.json lists is present with
    its dtype and shape, and fits a parameter of the model (or is [1]: beta powers)."""
    meta_path = os.path.join(path, OPTIMIZER_META)
    meta = _read_json(meta_path)
    listing, entries = meta.get("tensors"), meta.get("entries")
    if not isinstance(listing, dict) or not isinstance(entries, dict):
        raise CheckpointStateError(f"{meta_path}: no 'tensors' and 'entries' objects")
    source = os.path.join(path, OPTIMIZER_FILE)
    arrays = _load_tensors(source)
    missing = [k for k in listing if k not in arrays]
    unexpected = [k for k in arrays if k not in listing]
    wrong = [f"{k} {arrays[k].dtype.name} {list(arrays[k].shape)} (listed {listing[k]})"
             for k in listing if k in arrays and not _as_listed(arrays[k], listing[k])]
    if missing or unexpected or wrong:
        raise CheckpointStateError(
            f"{source}: does not match {OPTIMIZER_META}: missing {missing[:5] or 'none'}; "
            f"unexpected {unexpected[:5] or 'none'}; differing {wrong[:5] or 'none'}")
    state, masters = dict(entries), {}
    for key, array in arrays.items():
        tensor = _from_numpy(array, listing[key][0])
        if key.startswith(MASTER_PREFIX):
            masters[key[len(MASTER_PREFIX):]] = tensor
        else:
            state[key] = tensor
    if masters:
        state["master_weights"] = masters
    if state.get(STRUCTURED):
        _check_owners(source, state, model)
    return state


def _as_listed(array, listed):
    """Whether `array` is what optimizer.json lists: [paddle dtype, shape]."""
    if not (isinstance(listed, list) and len(listed) == 2 and isinstance(listed[1], list)):
        return False
    dtype = "uint16" if listed[0] == "bfloat16" else listed[0]   # bfloat16 is stored as bits
    return array.dtype.name == dtype and list(array.shape) == listed[1]


def _check_owners(source, state, model):
    params = {n: [int(d) for d in p.shape] for n, p in model.named_parameters()}
    bad = []
    for key, value in state.items():
        if key == "master_weights" and isinstance(value, dict):
            owned = [(k, k, v) for k, v in value.items()]
        elif isinstance(value, paddle.Tensor):
            owner = max((n for n in params if key.startswith(n + "_")), key=len, default=None)
            owned = [(key, owner, value)]
        else:
            continue
        for name, owner, tensor in owned:
            shape = [int(d) for d in tensor.shape]
            if owner not in params:
                bad.append(f"{name} (no such parameter)")
            elif shape not in (params[owner], [1], []):   # moments, or a beta power
                bad.append(f"{name} {shape} (parameter {params[owner]})")
    if bad:
        raise CheckpointStateError(f"{source}: optimizer state that does not fit the model: "
                                   + short_list(bad))


def _load_rank_arrays(path):
    rank_file = os.path.join(path, f"rank-{dist.rank()}.npz")
    if not os.path.isfile(rank_file):
        raise CheckpointStateError(f"{rank_file}: missing; resume with the same number of "
                                   f"ranks as the run that saved {path}")
    try:
        with np.load(rank_file, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise CheckpointStateError(f"{rank_file}: unreadable ({e})") from None


def read_training_state(path, model):
    """Check every file of checkpoint `path` against `model`, then restore its weights →
    (trainer_state, this rank's arrays, optimizer state). Nothing is touched before the checks."""
    state = _read_json(os.path.join(path, TRAINER_STATE))
    for key in ("step", "total_steps"):
        if not isinstance(state.get(key), int):
            raise CheckpointStateError(f"{os.path.join(path, TRAINER_STATE)}: no integer "
                                       f"{key!r}")
    arrays = _load_rank_arrays(path)
    opt_state = _load_optimizer(path, model)
    _load_model(path, model)
    return state, arrays, opt_state


def load_training_state(path, model, optimizer):
    """Restore model and optimizer in place → (trainer_state dict, this rank's arrays).
    Everything is read and checked before the model or optimizer is touched."""
    state, arrays, opt_state = read_training_state(path, model)
    load_optimizer_state(model, optimizer, opt_state)
    return state, arrays


def _save_model_dir(path, model, tokenizer_files, task, tokenizer_config=None):
    """A from_pretrained directory at `path`: weights, config, tokenizer files (with
    tokenizer_config.json) and task.json."""
    model.save_pretrained(path)
    for src in tokenizer_files:
        shutil.copy2(src, os.path.join(path, os.path.basename(src)))
    if tokenizer_config is not None:
        with open(os.path.join(path, TOKENIZER_CONFIG), "w", encoding="utf-8") as f:
            json.dump(tokenizer_config, f, indent=2, sort_keys=True)
    if task is not None:
        with open(os.path.join(path, TASK_FILE), "w", encoding="utf-8") as f:
            json.dump(task, f, indent=1, default=str)


def save_best(output_dir, step, model, tokenizer_files=(), extra=None, task=None,
              tokenizer_config=None):
    """Rank 0: write the best model (from_pretrained layout, `task`: task.json's content) and
    move OUTPUT_DIR/best to it."""
    entry = f"{CHECKPOINTS}/best-step-{step}"
    tmp = _fresh(output_dir, entry)
    _save_model_dir(tmp, model, tokenizer_files, task, tokenizer_config)
    if extra:
        with open(os.path.join(tmp, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(extra, f, indent=1, sort_keys=True)
    final = _into_place(output_dir, entry)
    _point(output_dir, "best", final)
    outdir.remove_entries(output_dir, [f"{CHECKPOINTS}/best-step-{old}"
                                       for old in _steps(output_dir, "best-step-") if old != step])
    return final


def save_final(output_dir, model, tokenizer_files=(), task=None, tokenizer_config=None):
    """Rank 0: OUTPUT_DIR/final, the model at the end of the run (from_pretrained layout,
    `task`: task.json's content), written next to it and renamed into place."""
    tmp = _fresh(output_dir, "final")
    _save_model_dir(tmp, model, tokenizer_files, task, tokenizer_config)
    return _into_place(output_dir, "final")
