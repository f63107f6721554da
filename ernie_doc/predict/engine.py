"""Run a model exported for `paddle.inference` (ernie_doc.predict.export) with explicit memory
state: the engine choice (device, precision, oneDNN) and the Predictor.

    pred = Predictor("out/ernie_doc", threads=4)    # CPU fp32, oneDNN
    out = pred.run(input_ids)                       # zero memories: a new document
    out = pred.run(next_ids, memories=out["memories"])

Details: docs/design-notes.md, "Export: the program"."""
import os
from collections import Counter
from dataclasses import dataclass
from typing import AbstractSet, Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import paddle
from paddle import inference
from paddle.base import core

from ernie_doc.checkpoint.lodtensor import PathLike, combined_shapes
from ernie_doc.config import ErnieDocConfig
from ernie_doc.errors import EngineError, ExportError, LoDTensorFormatError, PredictorInputError
from ernie_doc.precision import MIN_CAPABILITY, gpu_capability
from ernie_doc.predict.export import FORMAT_VERSION, META_SUFFIX
from ernie_doc.utils import read_json

# paddle 3.x (PIR) inference passes that break this model under oneDNN (seen on 3.3.1):
# constant_folding_pass ("Tensor holds no memory" at create_predictor),
# reshape_transpose_matmul_fuse_pass (dnnl::error on the position rows' broadcast) and
# conv2d_bias_fuse_pass (OpenKP's Conv1D: garbage after the first run).
_BROKEN_ONEDNN_PIR_PASSES = ("constant_folding_pass", "reshape_transpose_matmul_fuse_pass",
                             "conv2d_bias_fuse_pass")


# -- engine choice -------------------------------------------------------------------------
DEVICES = ("cpu", "gpu", "auto")
PRECISIONS = ("fp32", "bf16", "fp16")
# CPU flags (Linux /proc/cpuinfo names) under which oneDNN runs bf16 natively; on others
# oneDNN would emulate it (slower than fp32) or paddle falls back to fp32 on its own.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
GPU_MEMORY_POOL_MB = 256   # paddle.inference's initial GPU pool; it grows on demand


@dataclass(frozen=True)
class InferenceSettings:
    """How a Predictor configures paddle.inference (inference_settings decides); inputs and
    outputs stay float32 / int64 whatever the precision."""
    device: str
    precision: str
    onednn: bool
    gpu_precision: Optional[str] = None
    onednn_bf16: bool = False

    def describe(self) -> str:
        """e.g. "cpu fp32 (oneDNN)", "gpu fp16"."""
        engine = " (oneDNN)" if self.onednn else ""
        return f"{self.device} {self.precision}{engine}"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset:
    """The CPU's feature flags (/proc/cpuinfo); elsewhere paddle's
    supports_bfloat16_fast_performance() stands in for AVX512-BF16; else an empty set."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        return frozenset({"avx512_bf16"}) if core.supports_bfloat16_fast_performance() \
            else frozenset()
    except (ImportError, AttributeError):
        return frozenset()


def inference_settings(device: str = "cpu", precision: str = "fp32",
                       enable_onednn: bool = True, cuda_compiled: bool = False,
                       gpu_count: int = 0, flags: AbstractSet[str] = frozenset(),
                       gpu_capability: Optional[Tuple[int, int]] = None
                       ) -> InferenceSettings:
    """Decide the engine (device "cpu" / "gpu" / "auto", precision "fp32" / "bf16" / "fp16") from
    what the machine has, without paddle calls; EngineError, one line, for what it cannot run."""
    if device not in DEVICES:
        raise EngineError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if precision not in PRECISIONS:
        raise EngineError(f"precision must be one of {', '.join(PRECISIONS)}, got "
                          f"{precision!r}")
    if device == "auto":
        device = "gpu" if cuda_compiled and gpu_count > 0 else "cpu"
    if device == "gpu":
        if not cuda_compiled:
            raise EngineError("device 'gpu': this paddle is not compiled with CUDA "
                              "(paddle.is_compiled_with_cuda() is False); install paddlepaddle-gpu"
                              " or use device='cpu'")
        if gpu_count < 1:
            raise EngineError("device 'gpu': paddle is compiled with CUDA but sees no GPU "
                              "(check CUDA_VISIBLE_DEVICES and the driver)")
        needed = MIN_CAPABILITY["bf16"]   # the rule training's amp follows too
        if precision == "bf16" and gpu_capability is not None and tuple(gpu_capability) < needed:
            raise EngineError(f"precision 'bf16' on GPU needs compute capability "
                              f"{needed[0]}.{needed[1]} or newer (Ampere), this GPU has "
                              f"{gpu_capability[0]}.{gpu_capability[1]}; use precision='fp16'")
        names = {"fp32": "Float32", "fp16": "Half", "bf16": "Bfloat16"}
        return InferenceSettings("gpu", precision, onednn=False,
                                 gpu_precision=names[precision])
    if precision == "fp16":
        raise EngineError("precision 'fp16' runs on GPU only (paddle.inference has no fp16 CPU "
                          "kernels); on CPU use 'fp32' or 'bf16'")
    if precision == "bf16":
        if not enable_onednn:
            raise EngineError("precision 'bf16' on CPU runs through oneDNN: "
                              "enable_onednn must be True")
        if not set(BF16_CPU_FLAGS) & set(flags):
            raise EngineError(f"precision 'bf16' on CPU needs a processor with "
                              f"{' or '.join(BF16_CPU_FLAGS)} (not among this CPU's flags); "
                              f"use precision='fp32'")
        return InferenceSettings("cpu", "bf16", onednn=True, onednn_bf16=True)
    return InferenceSettings("cpu", "fp32", onednn=bool(enable_onednn))


def machine_settings(device: str = "cpu", precision: str = "fp32",
                     enable_onednn: bool = True) -> InferenceSettings:
    """inference_settings for this host and paddle build."""
    cuda = bool(paddle.is_compiled_with_cuda())
    count, capability = 0, None
    if cuda and device in ("gpu", "auto"):
        count = int(paddle.device.cuda.device_count())
        if count and precision == "bf16":
            capability = gpu_capability()
    flags = cpu_flags() if precision == "bf16" else frozenset()
    return inference_settings(device, precision, enable_onednn, cuda, count, flags, capability)


# -- inference -----------------------------------------------------------------------------
def _find_meta(path):
    """The sidecar of an export: `path` is the prefix, the sidecar itself, a model file of the
    export, or a directory holding exactly one export."""
    path = os.fspath(path)
    if path.endswith(META_SUFFIX) and os.path.isfile(path):
        return path
    if os.path.isdir(path):
        found = sorted(f for f in os.listdir(path) if f.endswith(META_SUFFIX))
        if len(found) != 1:
            raise ExportError(f"{path}: expected one exported model (*{META_SUFFIX}), "
                              f"found {found or 'none'}; pass the export prefix")
        return os.path.join(path, found[0])
    for suffix in (".json", ".pdmodel", ".pdiparams"):
        if path.endswith(suffix) and os.path.isfile(path[:-len(suffix)] + META_SUFFIX):
            return path[:-len(suffix)] + META_SUFFIX
    if os.path.isfile(path + META_SUFFIX):
        return path + META_SUFFIX
    raise ExportError(f"no exported model at {path} (looked for {path + META_SUFFIX}; "
                      f"export with tools/export_model.py)")


def _read_meta(meta_path):
    """The sidecar of an export, checked (every key Predictor uses, typed; file names inside
    the export's directory): ExportError naming it and the key otherwise."""
    meta = read_json(meta_path, ExportError)
    if not isinstance(meta, dict):
        raise ExportError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:   # true == 1 in Python
        raise ExportError(f"{meta_path}: unsupported export format "
                          f"{meta.get('format_version')!r} (this version reads "
                          f"{FORMAT_VERSION})")

    def bad(key, want):
        value = meta.get(key, "<missing>")
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ExportError(f"{meta_path}: {key}: expected {want}, got {shown}")

    def positive(value):
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    for key in ("model_file", "params_file"):
        name = meta.get(key)
        if not isinstance(name, str) or not name or os.path.basename(name) != name or \
                name in (".", ".."):
            raise bad(key, "a file name inside the export's directory")
    if meta.get("ir") not in ("pir", "program"):
        raise bad("ir", "'pir' or 'program'")
    if not isinstance(meta.get("config"), dict):
        raise bad("config", "a JSON object")
    if not positive(meta.get("seq_len")):
        raise bad("seq_len", "a positive integer")
    if meta.get("batch_size") is not None and not positive(meta.get("batch_size")):
        raise bad("batch_size", "a positive integer or null")
    for key in ("inputs", "outputs"):
        specs = meta.get(key)
        if not isinstance(specs, list) or not specs or not all(
                isinstance(x, dict) and isinstance(x.get("name"), str)
                and isinstance(x.get("dtype"), str) and isinstance(x.get("shape"), list)
                and all(isinstance(d, int) and not isinstance(d, bool) for d in x["shape"])
                for x in specs):
            raise bad(key, "a list of {name, shape, dtype}")
    if any(x["name"] == "memories" for x in meta["inputs"]):
        shape = meta.get("memory_shape")
        if not isinstance(shape, list) or len(shape) != 4 or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise bad("memory_shape", "[layers, batch, memory_len, hidden]")
    for key in ("num_choices", "rows_per_example"):
        if meta.get(key) is not None and not positive(meta.get(key)):
            raise bad(key, "a positive integer")
    extra = meta.get("head_inputs", {})
    names = {x["name"] for x in meta["inputs"]}
    if not isinstance(extra, dict) or not all(
            name in names and isinstance(x, dict) and isinstance(x.get("doc", ""), str)
            and (x.get("high") is None or positive(x.get("high")))
            for name, x in extra.items()):
        raise bad("head_inputs", "{input name: {high, doc}} of inputs the sidecar lists")
    return meta


def _check_sidecar(meta: Dict[str, Any], config: ErnieDocConfig, meta_path: str,
                   params_path: str) -> None:
    """The sidecar's sizes checked against each other and the parameters file before
    paddle.inference runs, so a hand-edited one never reaches C++. ExportError naming the key."""
    def disagree(key, value, what):
        return ExportError(f"{meta_path}: {key} {value} disagrees with {what} (was the "
                           f"sidecar edited? export again)")

    try:
        shapes = combined_shapes(params_path)
    except LoDTensorFormatError as e:
        raise ExportError(str(e)) from None
    params = os.path.basename(params_path)
    sizes = Counter(d[0] for d in shapes if len(d) == 1)   # biases, LayerNorm: mostly [H]
    hidden, vocab = config.hidden_size, config.vocab_size
    if not sizes or sizes.most_common(1)[0][0] != hidden:
        found = sizes.most_common(1)[0][0] if sizes else None
        raise disagree("config.hidden_size", hidden, f"{params} (its parameters are "
                                                     f"{found} wide)")
    for key, rows in (("config.vocab_size", vocab),
                      ("config.task_type_vocab_size", config.task_type_vocab_size)):
        if [rows, hidden] not in shapes:
            raise disagree(key, rows, f"{params} (no embedding table [{rows}, {hidden}])")
    # one [H, 4H] feed-forward matrix per layer (modeling.model's linear1): the layer count
    # the parameters file holds, before a memory of config.num_hidden_layers is allocated
    layers = sum(d == [hidden, config.intermediate_size] for d in shapes)
    if layers != config.num_hidden_layers:
        raise disagree("config.num_hidden_layers", config.num_hidden_layers,
                       f"{params} (it holds {layers} layers)")
    specs = {s["name"]: s["shape"] for s in meta["inputs"]}
    batch = -1 if meta["batch_size"] is None else meta["batch_size"]
    ids = specs.get("input_ids")
    if not isinstance(ids, list) or len(ids) != 2:
        raise disagree("inputs", "input_ids", f"[batch, seq_len] (the sidecar gives {ids})")
    for key, value, found in (("batch_size", meta["batch_size"], ids[0]),
                              ("seq_len", meta["seq_len"], ids[1])):
        if found != (-1 if value is None else value):
            raise disagree(key, value, f"the input_ids input {ids} [batch, seq_len]")
    if "memories" not in specs:
        return
    memories = specs["memories"]
    if meta["memory_shape"] != memories:
        raise disagree("memory_shape", meta["memory_shape"], f"the memories input {memories}")
    want = {0: ("config.num_hidden_layers", config.num_hidden_layers),
            1: ("batch_size", batch), 2: ("config.memory_len", config.memory_len),
            3: ("config.hidden_size", hidden)}
    for axis, (key, value) in want.items():
        if memories[axis] != value:
            raise disagree(key, value, f"the memories input {memories} "
                                       f"[layers, batch, memory_len, hidden]")


def _float32(arr: np.ndarray, dtype: str) -> np.ndarray:
    """An output as the sidecar's dtype: a float16 or bfloat16 (raw uint16 bits) output is
    widened to float32."""
    if dtype != "float32" or arr.dtype == np.float32:
        return arr
    if arr.dtype == np.uint16:   # bfloat16 bits: the high half of a float32
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def _check_file(path, meta_path, what):
    """A file named by the sidecar: present, a regular file, not empty (paddle's loaders
    crash or report C++ internals on an empty one)."""
    if not os.path.isfile(path):
        raise ExportError(f"{path}: the {what} is missing (named by {meta_path})")
    if os.path.getsize(path) == 0:
        raise ExportError(f"{path}: the {what} is empty")


def _configure(cfg, settings: InferenceSettings, ir: str, threads: int) -> None:
    """Apply `settings` to a paddle.inference.Config (2.6 and 3.x spell these alike)."""
    if settings.device == "gpu":
        # enable_use_gpu's precision_mode runs the auto_mixed_precision pass (paddle ≥ 2.5);
        # inputs and outputs stay float32. The CPU tests cannot run this path.
        assert settings.gpu_precision is not None   # inference_settings names it for a GPU
        precision = getattr(inference.PrecisionType, settings.gpu_precision)
        cfg.enable_use_gpu(GPU_MEMORY_POOL_MB, 0, precision)
    else:
        cfg.disable_gpu()
        cfg.set_cpu_math_library_num_threads(int(threads))
    if settings.onednn:
        cfg.enable_mkldnn()
        if ir == "pir":
            # Only for PIR programs: on a paddle 2.6 program (run by 3.x through the old
            # pass pipeline) these deletions break a later oneDNN fuse instead.
            for name in _BROKEN_ONEDNN_PIR_PASSES:
                cfg.delete_pass(name)
        if settings.onednn_bf16:
            cfg.enable_mkldnn_bfloat16()
    elif settings.device == "cpu":
        cfg.disable_mkldnn()
    cfg.disable_glog_info()


def _check_paddle_bf16() -> None:
    """paddle's own test before enable_mkldnn_bfloat16 (a build without oneDNN, or a CPU it
    judges unable): where it says no, paddle would quietly run fp32 instead."""
    check = getattr(core, "supports_bfloat16", None)
    if check is not None and not check():
        raise EngineError("precision 'bf16': this paddle build cannot run oneDNN bf16 on this "
                          "CPU (paddle.base.core.supports_bfloat16() is False); use 'fp32'")


class Predictor:
    """Runs an exported ERNIE-Doc model with paddle.inference, on CPU or GPU. The recurrence
    state (memories [L,B,M,H], memory_mask [B,M]) is explicit: `run` takes and returns it.
    Errors, one line: EngineError (never a fall back), ExportError, ConfigError."""

    def __init__(self, path: PathLike, threads: int = 1, enable_onednn: bool = True,
                 device: str = "cpu", precision: str = "fp32"):
        self.settings = machine_settings(device, precision, enable_onednn)
        if self.settings.onednn_bf16:
            _check_paddle_bf16()
        meta_path = _find_meta(path)
        self.meta = _read_meta(meta_path)
        directory = os.path.dirname(os.path.abspath(meta_path))
        self.model_path = os.path.join(directory, self.meta["model_file"])
        self.params_path = os.path.join(directory, self.meta["params_file"])
        _check_file(self.model_path, meta_path, "program file")
        _check_file(self.params_path, meta_path, "parameters file")
        if self.meta["ir"] == "pir" and int(paddle.__version__.split(".")[0]) < 3:
            raise ExportError(f"{self.model_path} is a PIR program written by paddle "
                              f"{self.meta.get('paddle_version')}; paddle {paddle.__version__} "
                              f"cannot read it: re-export with this paddle version")
        self.config = ErnieDocConfig.from_dict(self.meta["config"], source=meta_path)
        _check_sidecar(self.meta, self.config, meta_path, self.params_path)
        self.meta_path = meta_path
        self.seq_len = int(self.meta["seq_len"])
        self.batch_size = self.meta["batch_size"]
        self.input_specs = {s["name"]: s for s in self.meta["inputs"]}
        self.head_inputs = dict(self.meta.get("head_inputs", {}))   # {name: {high, doc}}
        self.output_names = [s["name"] for s in self.meta["outputs"]]
        self.has_memory = "memories" in self.input_specs
        self.uses_memory_mask = "memory_mask" in self.input_specs
        self.memory_len = int(self.meta["memory_shape"][2]) if self.has_memory else 0

        cfg = inference.Config(self.model_path, self.params_path)
        _configure(cfg, self.settings, self.meta["ir"], threads)
        self.threads = int(threads)
        self.onednn = self.settings.onednn
        try:
            self._predictor = inference.create_predictor(cfg)
        except (RuntimeError, ValueError, OSError) as e:
            # paddle's loaders report a damaged program or parameters file this way, with a
            # C++ hint block after the first line; keep the first line only
            first = next((line.strip() for line in str(e).splitlines() if line.strip()),
                         type(e).__name__)
            raise ExportError(f"{self.model_path} + {os.path.basename(self.params_path)}: "
                              f"paddle.inference cannot load the export ({first})") from None
        names = list(self._predictor.get_input_names())
        if sorted(names) != sorted(self.input_specs):
            raise ExportError(f"{self.model_path}: program inputs {names} differ from the "
                              f"sidecar's {sorted(self.input_specs)}")
        out_names = list(self._predictor.get_output_names())
        if len(out_names) != len(self.output_names):
            raise ExportError(f"{self.model_path}: program has {len(out_names)} outputs, the "
                              f"sidecar names {self.output_names}")
        self._input_handles = {n: self._predictor.get_input_handle(n) for n in names}
        # paddle.jit.save names outputs by itself; they come back in the order returned.
        self._output_handles = [self._predictor.get_output_handle(n) for n in out_names]

    # -- state --------------------------------------------------------------------------------
    def init_memories(self, batch_size: int) -> Optional[np.ndarray]:
        """Zero memories [L,B,M,H] float32 (the start of a document), or None without memory."""
        if not self.has_memory:
            return None
        c = self.config
        return np.zeros([c.num_hidden_layers, batch_size, self.memory_len, c.hidden_size],
                        dtype="float32")

    # -- validation ---------------------------------------------------------------------------
    def _expected(self, name, batch):
        return [batch if d == -1 else d for d in self.input_specs[name]["shape"]]

    def _check(self, name, value, batch, kind):
        """value as a contiguous array of the exported dtype; kind: 'int', 'float', 'mask'."""
        want = self._expected(name, batch)
        try:
            arr = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - anything that is not array-like
            raise PredictorInputError(f"{name} must be an array of shape {want}, got "
                                      f"{type(value).__name__} ({e})") from None
        if list(arr.shape) != want:
            raise PredictorInputError(f"{name} must have shape {want} ({self._shape_doc(name)}),"
                                      f" got {list(arr.shape)}")
        ok = {"int": arr.dtype.kind in "iub",
              "float": arr.dtype.kind == "f",
              "mask": arr.dtype.kind in "iubf"}[kind]
        if not ok:
            need = {"int": "an integer", "float": "a floating", "mask": "a numeric or bool"}[kind]
            raise PredictorInputError(f"{name} must be {need} array, got dtype {arr.dtype}")
        return np.ascontiguousarray(arr, dtype=self.input_specs[name]["dtype"])

    def _shape_doc(self, name):
        if name in self.head_inputs:
            return self.head_inputs[name].get("doc") or "see the sidecar"
        return {"input_ids": "[batch, seq_len]", "token_type_ids": "[batch, seq_len]",
                "attention_mask": "[batch, seq_len]", "reset_memory": "[batch]",
                "memories": "[layers, batch, memory_len, hidden]",
                "memory_mask": "[batch, memory_len]"}[name]

    @staticmethod
    def _check_range(name, arr, high):
        if arr.size and (arr.min() < 0 or arr.max() >= high):
            raise PredictorInputError(f"{name} values must be in [0, {high}), got min "
                                      f"{arr.min()} max {arr.max()}")

    # -- running ------------------------------------------------------------------------------
    def _batch_rows(self, input_ids: Any) -> Tuple[np.ndarray, int]:
        """input_ids as an array and its batch size, checked against the export's shape and
        rows per example."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[1] != self.seq_len:
            b = self.batch_size if self.batch_size is not None else "batch"
            raise PredictorInputError(f"input_ids must have shape [{b}, {self.seq_len}] "
                                      f"([batch, seq_len], seq_len fixed at export), got "
                                      f"{list(ids.shape)}")
        batch = int(ids.shape[0])
        if self.batch_size is not None and batch != self.batch_size:
            raise PredictorInputError(f"input_ids must have shape [{self.batch_size}, "
                                      f"{self.seq_len}] (batch fixed at export), got "
                                      f"{list(ids.shape)}")
        if batch == 0:
            raise PredictorInputError("input_ids has batch size 0")
        choices = self.meta.get("num_choices")
        if choices and batch % choices:
            raise PredictorInputError(f"input_ids rows ({batch}) must be a multiple of "
                                      f"num_choices ({choices})")
        group = self.meta.get("rows_per_example")
        if group and batch % group:
            raise PredictorInputError(f"input_ids rows ({batch}) must be a multiple of "
                                      f"{group} (the rows of one example)")
        return ids, batch

    def _memory_feeds(self, feeds: Dict[str, Any], batch: int, memories: Any,
                      reset_memory: Any, memory_mask: Any) -> None:
        """Add the checked (or default) memory inputs to `feeds`; refuse them for a model
        without memory."""
        if self.has_memory:
            feeds["memories"] = (self.init_memories(batch) if memories is None
                                 else self._check("memories", memories, batch, "float"))
            feeds["reset_memory"] = (
                np.zeros([batch], "int64") if reset_memory is None
                else self._check("reset_memory", reset_memory, batch, "int"))
            if self.uses_memory_mask:
                if memory_mask is None:
                    # The model's own default: no memories → every slot empty.
                    fill = 0.0 if memories is None else 1.0
                    feeds["memory_mask"] = np.full([batch, self.memory_len], fill, "float32")
                else:
                    feeds["memory_mask"] = self._check("memory_mask", memory_mask, batch, "mask")
            elif memory_mask is not None:
                raise PredictorInputError("memory_mask given but the model was exported "
                                          "without config.mask_empty_memory")
        elif memories is not None or reset_memory is not None or memory_mask is not None:
            raise PredictorInputError("this model has no memory (recurrence 'none'): do not "
                                      "pass memories, reset_memory or memory_mask")

    def _head_feeds(self, feeds: Dict[str, np.ndarray], batch: int,
                    head_inputs: Dict[str, Any]) -> None:
        """Add the checked head inputs to `feeds`: each one the export declares, no other."""
        unknown = sorted(set(head_inputs) - set(self.head_inputs))
        if unknown:
            have = ", ".join(self.head_inputs) or "none"
            raise PredictorInputError(f"unknown input(s) {', '.join(unknown)}: this export "
                                      f"takes head inputs: {have}")
        for name, spec in self.head_inputs.items():
            if head_inputs.get(name) is None:
                raise PredictorInputError(f"{name} is required by this export "
                                          f"({self.meta.get('model_class')}): "
                                          f"{self._shape_doc(name)}")
            kind = "int" if self.input_specs[name]["dtype"].startswith("int") else "float"
            feeds[name] = self._check(name, head_inputs[name], batch, kind)
            if spec.get("high") is not None:
                self._check_range(name, feeds[name], int(spec["high"]))

    def _execute(self, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Run the predictor on `feeds` and return its outputs; paddle's errors become one-line
        ExportErrors."""
        for name, arr in feeds.items():
            handle = self._input_handles[name]
            handle.reshape(list(arr.shape))
            handle.copy_from_cpu(arr)
        try:
            self._predictor.run()
        except (RuntimeError, ValueError, OSError) as e:
            # the program and the sidecar disagree in a way _check_sidecar cannot see (an
            # edited input shape): paddle's message is many lines of C++ context
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            first = next((line for line in lines if "Error" in line),
                         lines[0] if lines else type(e).__name__)
            if any("resourceexhausted" in line.lower() or "out of memory" in line.lower()
                   for line in lines):   # not the sidecar's fault: say what it is
                raise ExportError(f"{self.model_path}: paddle.inference ran out of memory "
                                  f"({first[:200]}); try a smaller batch") from None
            raise ExportError(f"{self.model_path}: paddle.inference cannot run the export "
                              f"({first[:200]}); does {self.meta_path} still describe it?") \
                from None
        return {name: _float32(h.copy_to_cpu(), spec["dtype"])
                for name, h, spec in zip(self.output_names, self._output_handles,
                                         self.meta["outputs"])}

    def run(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None,
            memories: Optional[np.ndarray] = None, reset_memory: Any = None,
            memory_mask: Optional[np.ndarray] = None, **head_inputs: Any
            ) -> Dict[str, np.ndarray]:
        """One segment. input_ids [B,T] (T = the exported seq_len; pad the segment yourself,
        as in training); attention_mask [B,T] 1 = token (default all ones); token_type_ids
        [B,T] (default zeros); memories [L,B,M,H] (default zeros = a new document);
        reset_memory [B] bool/int, rows that start a new document; memory_mask [B,M] under
        mask_empty_memory (default: zeros without memories, ones with them); head_inputs:
        the inputs the head declared at export (self.head_inputs, e.g. OpenKP's word_index
        [B,T] int, values in [0, T)), each required.
        Returns {output name: np.ndarray}, e.g. sequence_output, pooled_output (or logits)
        and "memories" — pass that back as `memories` for the next segment."""
        ids, batch = self._batch_rows(input_ids)
        c = self.config
        feeds = {"input_ids": self._check("input_ids", ids, batch, "int")}
        self._check_range("input_ids", feeds["input_ids"], c.vocab_size)
        feeds["token_type_ids"] = (
            np.zeros([batch, self.seq_len], "int64") if token_type_ids is None
            else self._check("token_type_ids", token_type_ids, batch, "int"))
        self._check_range("token_type_ids", feeds["token_type_ids"], c.task_type_vocab_size)
        feeds["attention_mask"] = (
            np.ones([batch, self.seq_len], "float32") if attention_mask is None
            else self._check("attention_mask", attention_mask, batch, "mask"))
        self._memory_feeds(feeds, batch, memories, reset_memory, memory_mask)
        self._head_feeds(feeds, batch, head_inputs)
        return self._execute(feeds)

    def iter_stream(self, document_segments: Iterable[Any],
                    memories: Optional[np.ndarray] = None,
                    memory_mask: Optional[np.ndarray] = None) -> Iterator[Dict[str, np.ndarray]]:
        """Yield run()'s output per segment (input_ids [B,T] or a dict of run()'s arguments),
        carrying memories and mask; B rows are B documents in step. memories: start state."""
        for i, seg in enumerate(document_segments):
            kwargs = dict(seg) if isinstance(seg, dict) else {"input_ids": seg}
            unknown = set(kwargs) - {"input_ids", "attention_mask", "token_type_ids",
                                     "reset_memory"} - set(self.head_inputs)
            if unknown or "input_ids" not in kwargs:
                extra = "".join(f", {name}" for name in self.head_inputs)
                raise PredictorInputError(f"segment {i}: expected input_ids or a dict with "
                                          f"input_ids and optionally attention_mask, "
                                          f"token_type_ids, reset_memory{extra}; got keys "
                                          f"{sorted(kwargs)}")
            if self.has_memory:
                kwargs["memories"] = memories
                if self.uses_memory_mask:
                    kwargs["memory_mask"] = memory_mask
            try:
                out = self.run(**kwargs)
            except PredictorInputError as e:
                raise PredictorInputError(f"segment {i}: {e}") from None
            memories = out.get("memories")
            memory_mask = out.get("memory_mask")
            yield out

    def stream(self, document_segments: Iterable[Any], memories: Optional[np.ndarray] = None,
               memory_mask: Optional[np.ndarray] = None) -> List[Dict[str, np.ndarray]]:
        """run() over consecutive segments of the same rows, carrying memories; a list of the
        per-segment outputs (the last one's "memories" is the state after the document)."""
        return list(self.iter_stream(document_segments, memories, memory_mask))
