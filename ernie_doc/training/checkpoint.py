"""Resumable training checkpoints, written atomically.

    OUTPUT_DIR/checkpoints/step-N/   model.pdparams, optimizer.pdopt (with the LR scheduler),
                                     trainer_state.json, rank-R.npz (memories of rank R's rows)
    OUTPUT_DIR/checkpoints/latest -> step-N      (symlink, replaced atomically)
    OUTPUT_DIR/best -> checkpoints/best-step-N   (from_pretrained directory of the best model)

Every rank writes into `step-N.tmp/`; rank 0 renames it to `step-N/` and only then moves the
`latest` link, so a process killed mid-save leaves the previous checkpoint and link intact.
"""
import json
import os
import shutil

import numpy as np
import paddle

from ernie_doc.training import distributed as dist

CHECKPOINTS = "checkpoints"


class CheckpointStateError(RuntimeError):
    """A resume directory without a usable checkpoint."""


def _point(link, target):
    """Atomically make `link` a symlink to `target` (relative to the link's directory)."""
    tmp = f"{link}.tmp-{os.getpid()}"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(os.path.relpath(target, os.path.dirname(os.path.abspath(link))), tmp)
    os.replace(tmp, link)


def _steps(root, prefix):
    out = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            out.append(int(name[len(prefix):]))
    return sorted(out)


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
    """The optimizer's state keyed by structured parameter names (layers.0.pos_ff...):
    paddle keys it by generated names (linear_3.w_0), which depend on how many layers the
    process created before, so another process (or model) could not load it."""
    names = {p.name: n for n, p in model.named_parameters()}
    return dict(_rename(optimizer.state_dict(), names), **{STRUCTURED: True})


def load_optimizer_state(model, optimizer, state):
    if state.pop(STRUCTURED, False):
        state = _rename(state, {n: p.name for n, p in model.named_parameters()})
    optimizer.set_state_dict(state)


def save_training_state(output_dir, step, model, optimizer, trainer_state, rank_arrays, keep=1):
    """Collective: every rank calls it. rank_arrays: this rank's numpy arrays (memories)."""
    root = os.path.join(output_dir, CHECKPOINTS)
    final = os.path.join(root, f"step-{step}")
    tmp = final + ".tmp"
    if dist.rank() == 0:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    dist.barrier()
    np.savez(os.path.join(tmp, f"rank-{dist.rank()}.npz"), **rank_arrays)
    if dist.rank() == 0:
        paddle.save(model.state_dict(), os.path.join(tmp, "model.pdparams"))
        paddle.save(optimizer_state(model, optimizer), os.path.join(tmp, "optimizer.pdopt"))
        with open(os.path.join(tmp, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump(trainer_state, f, indent=1, sort_keys=True)
    dist.barrier()
    if dist.rank() == 0:
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        _point(os.path.join(root, "latest"), final)
        for old in _steps(root, "step-")[:-keep or None]:
            if old != step:
                shutil.rmtree(os.path.join(root, f"step-{old}"), ignore_errors=True)
    dist.barrier()
    return final


def latest_checkpoint(output_dir):
    """The directory `latest` points to, or None when the run never saved one."""
    link = os.path.join(output_dir, CHECKPOINTS, "latest")
    if not os.path.lexists(link):
        return None
    path = os.path.realpath(link)
    if not os.path.isfile(os.path.join(path, "trainer_state.json")):
        raise CheckpointStateError(f"{link}: points to {path}, which is not a complete "
                                   "checkpoint")
    return path


def load_training_state(path, model, optimizer):
    """Restore model and optimizer in place → (trainer_state dict, this rank's arrays)."""
    model.set_state_dict(paddle.load(os.path.join(path, "model.pdparams")))
    load_optimizer_state(model, optimizer, paddle.load(os.path.join(path, "optimizer.pdopt")))
    with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
        state = json.load(f)
    rank_file = os.path.join(path, f"rank-{dist.rank()}.npz")
    if not os.path.isfile(rank_file):
        raise CheckpointStateError(f"{rank_file}: missing; resume with the same number of "
                                   f"ranks as the run that saved {path}")
    with np.load(rank_file) as data:
        arrays = {k: data[k] for k in data.files}
    return state, arrays


def save_best(output_dir, step, model, tokenizer_files=(), extra=None):
    """Rank 0: write the best model (from_pretrained layout) and move OUTPUT_DIR/best to it."""
    root = os.path.join(output_dir, CHECKPOINTS)
    final = os.path.join(root, f"best-step-{step}")
    tmp = final + ".tmp"
    for path in (tmp, final):
        if os.path.exists(path):
            shutil.rmtree(path)
    model.save_pretrained(tmp)
    for src in tokenizer_files:
        shutil.copy2(src, os.path.join(tmp, os.path.basename(src)))
    if extra:
        with open(os.path.join(tmp, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(extra, f, indent=1, sort_keys=True)
    os.rename(tmp, final)
    _point(os.path.join(output_dir, "best"), final)
    for old in _steps(root, "best-step-"):
        if old != step:
            shutil.rmtree(os.path.join(root, f"best-step-{old}"), ignore_errors=True)
    return final


def save_final(output_dir, model, tokenizer_files=()):
    """Rank 0: OUTPUT_DIR/final, the model at the end of the run (from_pretrained layout),
    written next to it and renamed into place."""
    final = os.path.join(output_dir, "final")
    tmp = final + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    for src in tokenizer_files:
        shutil.copy2(src, os.path.join(tmp, os.path.basename(src)))
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final
