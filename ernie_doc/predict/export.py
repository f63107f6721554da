"""Export an ERNIE-Doc model for `paddle.inference` (paddle.jit.to_static), run by
ernie_doc.predict.engine.Predictor with explicit memory state.

    info = export(model, "out/ernie_doc", seq_len=512, batch_size=None)   # dynamic batch

The program has a flat signature (input_ids, memories, token_type_ids, attention_mask,
reset_memory, then the head's inputs); T is fixed at export time. A sidecar
`<prefix>.meta.json` records it. Details: docs/design-notes.md, "Export: the program"."""
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import paddle
import paddle.nn as nn
from paddle.static import InputSpec

from ernie_doc import auto
from ernie_doc.checkpoint.lodtensor import PathLike
from ernie_doc.errors import ExportError
from ernie_doc.heads import Head
from ernie_doc.modeling.model import ErnieDocModel
from ernie_doc.utils import atomic_write_text

META_SUFFIX = ".meta.json"
FORMAT_VERSION = 1

Spec = Dict[str, Any]   # {"name": str, "shape": [int] (-1: the dynamic batch), "dtype": str}


# -- export --------------------------------------------------------------------------------
def _encoder_of(model):
    if isinstance(model, ErnieDocModel):
        return model
    if isinstance(model, Head) and model.exportable:
        return model.ernie_doc
    exportable = [auto.head_class(name).__name__ for name in auto.head_names(exportable=True)]
    raise ExportError(f"cannot export {type(model).__name__}: expected ErnieDocModel or one of "
                      f"{', '.join(sorted(exportable))}")


class _FlatExport(nn.Layer):
    """The flat-signature wrapper of every export: encoder inputs, memories, the head's inputs
    in; the head's outputs, then the memories (and mask) out."""

    # paddle.jit.to_static maps InputSpecs onto named positional parameters (no *args), so
    # the slots are spelled out: input_ids + up to 9 more (5 encoder inputs + 4 of the head).
    MAX_INPUTS = 10

    def __init__(self, model, input_names, head_inputs, head_outputs, use_memory_mask):
        """input_names: every input in signature order; head_inputs: the head's own (last);
        head_outputs: the head outputs to return, or None for the bare model."""
        super().__init__()
        if len(input_names) > self.MAX_INPUTS:
            raise ExportError(f"{type(model).__name__}: {len(input_names)} inputs, the export "
                              f"takes at most {self.MAX_INPUTS}")
        self.model = model
        self.input_names = list(input_names)
        self.head_inputs = list(head_inputs)
        self.head_outputs = head_outputs
        self.has_memory = "memories" in input_names
        self.use_memory_mask = use_memory_mask

    def forward(self, input_ids, x1, x2, x3=None, x4=None, x5=None, x6=None, x7=None,
                x8=None, x9=None):
        fed = dict(zip(self.input_names, [input_ids, x1, x2, x3, x4, x5, x6, x7, x8, x9]))
        extra = {}
        for name in self.head_inputs:
            extra[name] = fed[name]
        out = self.model(input_ids, fed.get("memories"), fed["token_type_ids"],
                         fed["attention_mask"], fed.get("reset_memory"),
                         fed.get("memory_mask"), **extra)
        if self.head_outputs is None:
            first = (out.sequence_output, out.pooled_output)
        else:
            first = tuple(getattr(out, name) for name in self.head_outputs)
        if not self.has_memory:
            return first[0] if len(first) == 1 else first
        if self.use_memory_mask:
            return first + (out.memories, out.memory_mask)
        return first + (out.memories,)


def io_signature(model: paddle.nn.Layer, seq_len: int, batch_size: Optional[int] = None
                 ) -> Tuple[List[Spec], List[Spec]]:
    """(inputs, outputs): lists of {"name", "shape", "dtype"} (-1: dynamic batch); encoder
    inputs then the head's export_inputs; the head's export_outputs then the memories."""
    enc = _encoder_of(model)
    c = enc.config
    b = -1 if batch_size is None else int(batch_size)
    t, m, h, n_layers = int(seq_len), enc.memory_len, c.hidden_size, c.num_hidden_layers
    is_head = model is not enc

    def io(name, shape, dtype):
        return {"name": name, "shape": list(shape), "dtype": dtype}

    inputs = [io("input_ids", [b, t], "int64")]
    if m:
        inputs.append(io("memories", [n_layers, b, m, h], "float32"))
    inputs += [io("token_type_ids", [b, t], "int64"), io("attention_mask", [b, t], "float32")]
    if m:
        inputs.append(io("reset_memory", [b], "int64"))
        if c.mask_empty_memory:
            inputs.append(io("memory_mask", [b, m], "float32"))
    if is_head:
        inputs += [io(x.name, x.shape, x.dtype) for x in model.export_inputs(b, t)]
        outputs = [io(name, shape, "float32") for name, shape in model.export_outputs(b, t)]
    else:
        outputs = [io("sequence_output", [b, t, h], "float32"),
                   io("pooled_output", [b, h], "float32")]
    if m:
        outputs.append(io("memories", [n_layers, b, m, h], "float32"))
        if c.mask_empty_memory:
            outputs.append(io("memory_mask", [b, m], "float32"))
    return inputs, outputs


def _input_specs(inputs):
    return [InputSpec([None if d == -1 else d for d in spec["shape"]], spec["dtype"],
                      name=spec["name"]) for spec in inputs]


def _previous_model_file(path):
    """The model file named by an existing sidecar at `path`, or None."""
    try:
        with open(path + META_SUFFIX, encoding="utf-8") as f:
            name = json.load(f).get("model_file")
    except (OSError, ValueError, AttributeError):
        return None
    # Only a plain file name of this prefix: never delete anything else.
    base = os.path.basename(path)
    return name if name in (base + ".json", base + ".pdmodel") else None


def _check_sizes(model: paddle.nn.Layer, is_head: bool, max_positions: int, seq_len: int,
                 batch_size: Optional[int]) -> None:
    """Raise ExportError unless seq_len and batch_size are sizes the model can be exported at."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or \
            not 1 <= seq_len <= max_positions:
        raise ExportError(f"seq_len must be an integer in [1, max_position_embeddings="
                          f"{max_positions}], got {seq_len!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or
                                   not isinstance(batch_size, int) or batch_size < 1):
        raise ExportError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if is_head and batch_size is not None:
        problem = model.rows_problem("batch_size", batch_size)
        if problem:
            raise ExportError(problem)


def _save_program(wrapper: nn.Layer, inputs: List[Spec], tmp_dir: str,
                  base: str) -> Tuple[List[str], str, str]:
    """Trace `wrapper` and save it in `tmp_dir` as `base`: the files written, the model file's
    name and its IR ("pir" or "program")."""
    # full_graph=True: AST conversion, so `paddle.in_dynamic_mode()` is False while tracing
    # and the model takes its general (static) path; the SOT tracer would run it "dynamic".
    static = paddle.jit.to_static(wrapper, input_spec=_input_specs(inputs), full_graph=True)
    paddle.jit.save(static, os.path.join(tmp_dir, base))
    written = sorted(os.listdir(tmp_dir))
    if base + ".json" in written:
        model_file, ir = base + ".json", "pir"
    elif base + ".pdmodel" in written:
        model_file, ir = base + ".pdmodel", "program"
    else:
        raise ExportError(f"paddle.jit.save wrote no model file, only {written}")
    if base + ".pdiparams" not in written:
        raise ExportError(f"paddle.jit.save wrote no parameters file, only {written}")
    return written, model_file, ir


def _sidecar(model: paddle.nn.Layer, seq_len: int, batch_size: Optional[int],
             inputs: List[Spec], outputs: List[Spec], extra: list,
             model_file: str, ir: str) -> Dict[str, Any]:
    """The sidecar (<path>.meta.json) describing an export of `model`."""
    enc = _encoder_of(model)
    c = enc.config
    is_head = model is not enc
    base = os.path.splitext(model_file)[0]
    meta = {
        "format_version": FORMAT_VERSION,
        "paddle_version": paddle.__version__,
        "ir": ir,
        "model_file": model_file,
        "params_file": base + ".pdiparams",
        "model_class": type(model).__name__,
        "config": c.to_dict(),
        "seq_len": seq_len,
        "batch_size": batch_size,
        "memory_shape": ([c.num_hidden_layers, -1 if batch_size is None else batch_size,
                          enc.memory_len, c.hidden_size] if enc.memory_len else None),
        "inputs": inputs,
        "outputs": outputs,
    }
    head_sizes = model.architecture()["kwargs"]
    meta.update({k: head_sizes[k] for k in ("num_labels", "num_choices") if k in head_sizes})
    if is_head and model.rows_per_example > 1 and "num_choices" not in meta:
        meta["rows_per_example"] = model.rows_per_example   # e.g. pair matching: 2
    if extra:   # only then: the sidecars of the other exports stay as they were
        meta["head_inputs"] = {x.name: {"high": x.high, "doc": x.doc} for x in extra}
    return meta


def _move_into_place(tmp_dir: str, path: str, written: List[str], meta: Dict[str, Any]) -> None:
    """Move the export's files from `tmp_dir` to `path`, the sidecar last, and drop the program
    file an earlier export by the other paddle major version left under the same prefix."""
    directory, base = os.path.split(path)
    model_file = meta["model_file"]
    stale = _previous_model_file(path)
    # Every file is complete in the temporary directory before any moves (a full disk
    # fails here, with nothing of this export in place); then the model files, and the
    # sidecar last: a sidecar means a complete export. Renames need no space.
    atomic_write_text(os.path.join(tmp_dir, base + META_SUFFIX),
                      json.dumps(meta, indent=2) + "\n")
    for name in written:
        os.replace(os.path.join(tmp_dir, name), os.path.join(directory, name))
    os.replace(os.path.join(tmp_dir, base + META_SUFFIX), path + META_SUFFIX)
    if stale and stale != model_file:
        # An earlier export here by the other paddle major version: drop its program file
        # so the folder does not hold two different programs under one prefix.
        for name in (stale, base + ".pdiparams.info"):
            if name not in written and os.path.isfile(os.path.join(directory, name)):
                os.remove(os.path.join(directory, name))


def export(model: paddle.nn.Layer, path: PathLike, seq_len: int,
           batch_size: Optional[int] = None) -> Dict[str, Any]:
    """Export `model` (ErnieDocModel or a task head) for paddle.inference at `path` (a prefix).

    seq_len: the fixed segment length T (1 ≤ T ≤ max_position_embeddings). batch_size: a fixed
    B, or None for a dynamic batch. The model is exported in eval mode (its mode is restored).
    Files appear only when complete: `<path>.json` (paddle 3.x) or `<path>.pdmodel` (2.x),
    `<path>.pdiparams`, and last the sidecar `<path>.meta.json`. Returns the sidecar dict with
    absolute "model_path", "params_path" and "meta_path" added.
    """
    enc = _encoder_of(model)
    c = enc.config
    is_head = model is not enc
    _check_sizes(model, is_head, c.max_position_embeddings, seq_len, batch_size)

    inputs, outputs = io_signature(model, seq_len, batch_size)
    head_outputs = [name for name, _ in model.export_outputs(1, seq_len)] if is_head else None
    extra = model.export_inputs(batch_size or -1, seq_len) if is_head else []
    wrapper = _FlatExport(model, [i["name"] for i in inputs], [x.name for x in extra],
                          head_outputs, bool(c.mask_empty_memory))

    path = os.path.abspath(os.fspath(path))
    directory, base = os.path.split(path)
    if not base:
        raise ExportError(f"path must be a file prefix like DIR/model, got {path!r}")
    os.makedirs(directory, exist_ok=True)
    was_training = model.training
    try:
        tmp_dir = tempfile.mkdtemp(prefix=".tmp-export-", dir=directory)
    except OSError as e:   # read-only or full: name the export, not the temporary name
        raise OSError(e.errno, e.strerror, path) from None
    model.eval()
    try:
        written, model_file, ir = _save_program(wrapper, inputs, tmp_dir, base)
        meta = _sidecar(model, seq_len, batch_size, inputs, outputs, extra, model_file, ir)
        _move_into_place(tmp_dir, path, written, meta)
    except OSError as e:
        # paddle.jit.save on a full disk raises without a file name, or names a file in the
        # temporary directory: report the export prefix the caller asked for
        name = e.filename if isinstance(e.filename, str) else None
        if name is None or name.startswith(tmp_dir):
            raise OSError(e.errno, e.strerror, path) from e
        raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if was_training:
            model.train()
    return dict(meta, model_path=os.path.join(directory, model_file),
                params_path=os.path.join(directory, base + ".pdiparams"),
                meta_path=path + META_SUFFIX)
