"""The cost of a run before it starts: memory per device and GPU-hours, from its config.

    plan = make_plan(load_config("tasks/imdb/config.yaml"), gpus=8)
    print(describe_plan(plan))          # what `ernie-doc plan` prints

Memory: the trainer's own estimate (resources.training_parts, the numbers its refusal of a
run that cannot fit uses), per device, with and without recompute. Time: the model's matmul
FLOPs per segment row (ernie_doc.cost, plus the head where it reads every token), 3× to
train (4× with recompute, whose backward runs each layer's forward again), times the rows
the run reads, divided by a device's peak rate at a stated utilisation. A fine-tuning run's
rows come from the paper's dataset statistics (appendix, "English / Chinese Datasets
statistics": train examples and token-length percentiles) or from --train-segments. Every
GPU figure is an estimate; nothing here has been timed on a GPU."""
import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ernie_doc import cost, resources
from ernie_doc.config import ErnieDocConfig
from ernie_doc.data.segment import window_count
from ernie_doc.errors import ConfigError
from ernie_doc.kinds import build_task, kind_class
from ernie_doc.resources import describe


@dataclasses.dataclass(frozen=True)
class Device:
    """A GPU: its memory and its dense matmul peak per precision (FLOP/s, the vendor's)."""
    name: str
    memory: int
    peaks: Dict[str, float]
    notes: Dict[str, str]


DEVICES = {
    "v100": Device("V100", 32 << 30, {"fp32": 15.7e12, "fp16": 125e12},
                   {"fp32": "V100 fp32 peak 15.7 TFLOP/s (no tensor cores)",
                    "fp16": "V100 fp16 tensor-core peak 125 TFLOP/s"}),
    "a100": Device("A100", 80 << 30, {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12},
                   {"fp32": "A100 fp32 peak 19.5 TFLOP/s (TF32 not assumed)",
                    "fp16": "A100 fp16 tensor-core peak 312 TFLOP/s",
                    "bf16": "A100 bf16 tensor-core peak 312 TFLOP/s"}),
}
# The share of the peak a well-fed Transformer training step reaches: a range, not a figure.
UTILISATION = (0.3, 0.5)


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A train split as the paper's appendix states it: examples and the context's tokens at
    the 50th, 90th and 95th percentile and the longest."""
    name: str
    examples: int
    percentiles: Tuple[int, int, int, int]


# Paper appendix, "English Datasets statistics" (RoBERTa's tokenizer) and "Chinese Datasets
# statistics" (BERT's): the train split of each task.
TRAIN_LENGTHS = {
    "imdb": Lengths("IMDB", 25_000, (215, 569, 745, 3_084)),
    "hyp": Lengths("Hyperpartisan", 516, (537, 1_519, 1_997, 5_566)),
    "triviaqa": Lengths("TriviaQA", 61_888, (8_685, 25_207, 32_018, 173_302)),
    "hotpotqa": Lengths("HotpotQA", 90_432, (1_279, 1_725, 1_888, 3_733)),
    "openkp": Lengths("OpenKP", 134_894, (894, 3_451, 5_340, 105_548)),
    "iflytek": Lengths("IFLYTEK", 12_133, (243, 507, 563, 3_153)),
    "thucnews": Lengths("THUCNews", 50_000, (656, 1_821, 2_455, 26_659)),
    "cail2019_scm": Lengths("CAIL", 5_102, (1_837, 1_965, 2_008, 2_400)),
    "cmrc2018": Lengths("CMRC2018", 10_121, (423, 745, 827, 970)),
    "dureader": Lengths("DuReader", 15_763, (163, 550, 652, 1_021)),
    "c3": Lengths("C3", 11_869, (96, 591, 697, 1_534)),
    "drcd": Lengths("DRCD", 26_936, (397, 616, 709, 1_678)),
}
QUANTILES = (0.0, 0.5, 0.9, 0.95, 1.0)


def mean_windows(percentiles: Sequence[int], window: int, stride: int,
                 bins: int = 4000, cap: int = 0) -> float:
    """The mean number of windows (data.segment.window_count) of a document whose length is
    spread linearly between the stated percentiles (0 tokens at the 0th, the longest at the
    100th), integrated over `bins` equal slices of the distribution; `cap` > 0: documents cut
    to that many tokens (max_doc_tokens)."""
    points = (0,) + tuple(percentiles)
    total = 0.0
    for b in range(bins):
        p = (b + 0.5) / bins
        i = next(i for i in range(1, len(QUANTILES)) if p <= QUANTILES[i])
        share = (p - QUANTILES[i - 1]) / (QUANTILES[i] - QUANTILES[i - 1])
        tokens = points[i - 1] + share * (points[i] - points[i - 1])
        tokens = int(round(tokens))
        total += window_count(min(tokens, cap) if cap else tokens, window, stride)
    return total / bins


@dataclasses.dataclass
class Plan:
    """What describe_plan prints; every *_flops is per segment row of `tokens` tokens."""
    source: str
    model: str
    params: int
    tokens: int
    rows: int                     # per device and micro-step
    gpus: int
    accum: int
    memory: Dict[str, Dict[str, int]]    # {"without" / "with": training_parts}
    encoder_flops: float
    head_flops: float
    head_note: str
    reads: float                  # segment rows the run reads
    reads_note: List[str]
    recompute: bool               # the config's
    device: Device
    precision: str
    device_memory: int
    utilisation: Tuple[float, float]
    peak: float
    peak_note: str

    @property
    def forward_flops(self) -> float:
        return self.encoder_flops + self.head_flops

    @property
    def training_flops(self) -> float:
        """The whole run: 3 forwards a row (forward, and backward's two products per forward
        one), 4 with recompute."""
        return self.reads * self.forward_flops * (4 if self.recompute else 3)

    def gpu_hours(self) -> Tuple[float, float]:
        """(at the higher utilisation, at the lower)."""
        return tuple(self.training_flops / (self.peak * u) / 3600
                     for u in sorted(self.utilisation, reverse=True))


def _task(cfg: Any) -> Any:
    """The config's task kind; a pretraining corpus is never read, so data_dir may be empty."""
    if not kind_class(cfg.kind).task_reader and not cfg.data_dir:
        cfg = dataclasses.replace(cfg, data_dir="(not read)")
    return build_task(cfg)


def model_config(cfg: Any, task: Any) -> Any:
    """The ERNIE-Doc config the trainer would build (DocumentTask.build_model): init_checkpoint's
    (a released name: its preset, a folder: its config file) or `model`'s, with the task's and
    the config's overrides; tokenizer=train: tokenizer_vocab_size words."""
    overrides = dict(task.model_config_overrides())
    if cfg.tokenizer == "train":
        overrides["vocab_size"] = cfg.tokenizer_vocab_size
    overrides.update(cfg.model_overrides)
    key, spec = ("init_checkpoint", cfg.init_checkpoint) if cfg.init_checkpoint else \
        ("model", cfg.model)
    try:
        return ErnieDocConfig.from_any(spec, **overrides)
    except (ConfigError, ValueError, OSError) as e:
        raise ConfigError(f"{cfg.source}: {key} {spec!r} with model_overrides: {e}") from None


def _precision(cfg: Any, device: Device) -> str:
    precision = "fp32" if cfg.amp is False else ("fp16" if cfg.amp is True else str(cfg.amp))
    if precision not in device.peaks:
        raise ConfigError(f"{cfg.source}: amp: {cfg.amp!r}: the {device.name} has no "
                          f"{precision} tensor cores; --set amp=fp16, or another --device")
    return precision


def _segments(cfg: Any, task: Any, stride: int) -> Tuple[float, List[str]]:
    """(segment rows of one reading of the train split, how they were counted) from the
    paper's statistics of the task."""
    lengths = TRAIN_LENGTHS.get(cfg.task)
    if lengths is None:
        raise ConfigError(f"{cfg.source}: task {cfg.task!r} has no dataset statistics in the "
                          f"paper: give --train-segments N (the segment rows of one pass over "
                          f"its train split)")
    examples = lengths.examples
    cap = (cfg.max_examples or {}).get("train")
    if cap:
        examples = min(examples, cap)
    query = task.options.get("max_query_len", 0) if hasattr(task, "options") else 0
    window = cfg.max_seq_len - (3 + query if query else 2)
    if window < 1:
        raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len} leaves no room for "
                          f"the document's tokens"
                          + (f" beside a {query}-token question" if query else ""))
    stride = stride or window
    cap = cfg.max_doc_tokens or 0
    windows = mean_windows(lengths.percentiles, window, stride, cap=cap)
    each = (f"{windows:.2f} segment rows each" if task.group_size == 1 else
            f"{windows:.2f} segments each × {task.group_size} rows a segment")
    shown = "/".join(f"{n:,}" for n in lengths.percentiles)
    return examples * windows * task.group_size, [
        f"{examples:,} train examples × {each}: the paper's "
        f"{lengths.name} statistics (appendix; tokens at 50/90/95/100 %: {shown}), lengths "
        f"linear between them"
        + (f", cut at max_doc_tokens {cap:,}" if cap else "")
        + f", windows of {window} tokens every {stride}"
        + (f" (room left for a {query}-token question)" if query else "")]


def _reads(cfg: Any, task: Any, rows: int, gpus: int, train_segments: Optional[float],
           stride: int) -> Tuple[float, List[str]]:
    """(segment rows the whole run reads, how they were counted)."""
    per_step = rows * gpus * cfg.grad_accum_steps
    if cfg.max_steps and train_segments is not None:
        raise ConfigError(f"--train-segments: {cfg.source} sets max_steps "
                          f"({cfg.max_steps:,}), which fixes the rows read; give one of them")
    if cfg.max_steps:
        return float(cfg.max_steps * per_step), [
            f"{cfg.max_steps:,} steps × a global batch of {per_step:,} rows ({rows} per device "
            f"× {gpus} GPUs × {cfg.grad_accum_steps} accumulation)"]
    if train_segments is not None:
        segments, notes = float(train_segments), [f"{train_segments:,} train segment rows "
                                                   f"(--train-segments)"]
    else:
        segments, notes = _segments(cfg, task, stride)
    passes = 2 if cfg.retro_feed else 1
    notes.append(f"× {cfg.epochs} epochs × {passes} reading{'s' if passes > 1 else ''}"
                 + (" (retrospective feed: the skim reading shares the batches, so it costs "
                    "a backward too)" if passes > 1 else ""))
    return cfg.epochs * segments * passes, notes


@dataclasses.dataclass
class _Model:
    description: str
    params: int
    memory_plan: tuple            # (build, layers, hidden, heads, tokens, memory length)
    encoder_flops: float          # forward, per segment row
    head_flops: float
    head_note: str
    recomputable: bool
    stride: int = 0               # how far apart a document's windows start (assemble's rule)


def _language_model(task: Any, rows: int) -> _Model:
    plan = task.memory_plan()
    build, layers, _, _, tokens, _ = plan
    c = task.config
    return _Model(f"Transformer-XL LM ({layers} layers, d_model {c.d_model}, {c.n_head} heads, "
                  f"recurrence {c.recurrence})", resources.parameter_count(build, layers), plan,
                  cost.lm_forward_matmul_flops(c, rows, tokens) / rows, 0.0,
                  "the whole model; the adaptive softmax's tail clusters, for the rarer "
                  "words, are not counted", False)


def _ernie_doc(cfg: Any, task: Any, rows: int) -> _Model:
    from ernie_doc.kinds.document import reading_stride
    from ernie_doc.modeling.model import ErnieDocModel
    config = model_config(cfg, task)
    plan = task.memory_plan(config)
    build, layers, hidden, _, tokens, _ = plan
    stride = reading_stride(cfg, config)   # the trainer's refusals first
    params = resources.parameter_count(build, layers)
    encoder = resources.parameter_count(
        lambda n: ErnieDocModel(config.replace(num_hidden_layers=n)), layers)
    head, note = task.head_flops(config, params - encoder, tokens)
    name = cfg.init_checkpoint or cfg.model
    return _Model(f"{name}, {task.head_class.__name__} ({layers} layers, hidden {hidden}, "
                  f"{config.num_attention_heads} heads, recurrence {config.recurrence})",
                  params, plan, cost.forward_matmul_flops(config, rows, tokens) / rows, head,
                  note, True, stride)


def make_plan(cfg: Any, gpus: int = 1, device: str = "v100",
              device_memory: Optional[int] = None, train_segments: Optional[float] = None,
              utilisation: Tuple[float, float] = UTILISATION,
              peak_tflops: Optional[float] = None) -> Plan:
    """The plan of the run `cfg` (run_config.load_config) describes on `gpus` GPUs of
    `device` (DEVICES; device_memory and peak_tflops replace its figures)."""
    from ernie_doc.kinds.base import DocumentTask
    from ernie_doc.run_config import batch_rows
    if device not in DEVICES:
        raise ConfigError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: must be positive")
    for flag, value in (("--train-segments", train_segments), ("--peak-tflops", peak_tflops)):
        if value is not None and not 0 < value < math.inf:   # nan fails too
            raise ConfigError(f"{flag} {value}: must be a positive finite number")
    if not all(0 < u <= 1 for u in utilisation):
        raise ConfigError(f"--utilisation {utilisation}: shares of the peak, in (0, 1]")
    utilisation = tuple(sorted(utilisation))   # printed low–high, whichever came first
    dev = DEVICES[device]
    precision = _precision(cfg, dev)
    task = _task(cfg)
    rows = batch_rows(cfg, task.group_size)
    # an ERNIE-Doc head is costed from its encoder; another model (the language model's
    # Transformer-XL) as a whole
    model = _ernie_doc(cfg, task, rows) if isinstance(task, DocumentTask) else \
        _language_model(task, rows)
    _, layers, hidden, heads, tokens, memory_len = model.memory_plan
    memory = {name: resources.training_parts(model.params, layers, rows, tokens, memory_len,
                                             hidden, heads, recompute=name == "with")
              for name in (("without", "with") if model.recomputable else ("without",))}
    reads, notes = _reads(cfg, task, rows, gpus, train_segments, model.stride)
    peak = dev.peaks[precision] if peak_tflops is None else peak_tflops * 1e12
    peak_note = dev.notes[precision] if peak_tflops is None else \
        f"a given peak of {peak_tflops:g} TFLOP/s ({precision})"
    return Plan(cfg.source, model.description, model.params, tokens, rows, gpus,
                cfg.grad_accum_steps, memory, model.encoder_flops, model.head_flops,
                model.head_note, reads, notes, bool(cfg.recompute) and model.recomputable,
                dev, precision, dev.memory if device_memory is None else device_memory,
                tuple(utilisation), peak, peak_note)


def _size(nbytes: float) -> str:
    return describe(nbytes, gib_from=0.05)


def _duration(hours: Tuple[float, float]) -> str:
    """A range of hours, in days when over two."""
    if hours[1] >= 48:
        return f"{hours[0] / 24:.1f}–{hours[1] / 24:.1f} days"
    if hours[1] >= 1:
        return f"{hours[0]:.1f}–{hours[1]:.1f} hours"
    low, high = hours[0] * 60, hours[1] * 60
    if high < 1:
        return "under a minute"
    return f"{low:.{1 if high < 10 else 0}f}–{high:.{1 if high < 10 else 0}f} minutes"


def _count(n: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f}"


def memory_lines(plan: Plan) -> List[str]:
    """The memory table per device and the verdict against the device's memory."""
    columns = list(plan.memory)
    head = "  ".join(f"{'recompute ' + ('on' if c == 'with' else 'off'):>14}" for c in columns)
    lines = ["memory per device (estimate: the trainer's own, float32 as it counts):",
             f"  {'':<26}{head}"]
    for part in plan.memory["without"]:
        lines.append(f"  {part:<26}" + "  ".join(f"{_size(plan.memory[c][part]):>14}"
                                                for c in columns))
    totals = {c: sum(plan.memory[c].values()) for c in columns}
    lines.append(f"  {'total':<26}" + "  ".join(f"{_size(totals[c]):>14}" for c in columns))
    fits = {c: totals[c] <= plan.device_memory for c in columns}
    where = f"{plan.device.name} {_size(plan.device_memory)}"
    if fits["without"]:
        verdict = "fits" + (" without recompute too (the config's recompute: true runs "
                            "each forward twice; --set recompute=false)" if plan.recompute
                            else "")
    elif "with" not in fits:
        verdict = "does not fit (this model has no recompute): lower batch_size"
    elif fits["with"]:
        verdict = "does not fit; with recompute: fits" + \
            ("" if plan.recompute else " (--set recompute=true)")
    else:
        verdict = "does not fit, not even with recompute: lower batch_size or use more GPUs"
    return lines + [f"  {where}: {verdict}"]


def describe_plan(plan: Plan) -> str:
    """What `ernie-doc plan` prints."""
    low, high = plan.gpu_hours()
    accum = f" × {plan.accum} accumulation" if plan.accum > 1 else ""
    lines = [f"{plan.source}: a cost estimate from the config (nothing here was timed on a GPU)",
             f"model: {plan.model}, {plan.params:,} parameters",
             f"rows of {plan.tokens} tokens; {plan.rows} rows per device and micro-step, "
             f"global batch {plan.rows * plan.gpus * plan.accum:,} rows ({plan.rows} × "
             f"{plan.gpus} GPUs{accum})", ""]
    lines += memory_lines(plan)
    per_token = plan.forward_flops / plan.tokens
    factor = "4 (recompute: the forward runs again in backward)" if plan.recompute else \
        "3 (the backward takes two products per forward one)"
    parts = (f"encoder {_count(plan.encoder_flops / plan.tokens)}, head "
             f"{_count(plan.head_flops / plan.tokens)}: {plan.head_note}") if plan.head_flops \
        else plan.head_note
    lines += ["", "compute (estimate):",
              f"  matmul FLOPs per token, forward: {_count(per_token)} ({parts})",
              f"  training: × {factor}",
              "  rows read: " + "\n    ".join(plan.reads_note),
              f"    = {plan.reads:,.0f} rows = {_count(plan.reads * plan.tokens)} tokens; "
              f"{plan.training_flops:.2e} FLOP in all",
              f"  device: {plan.peak_note} at {plan.utilisation[0]:.0%}–"
              f"{plan.utilisation[1]:.0%} utilisation",
              f"  GPU-hours (estimate): {low:,.0f}–{high:,.0f}" if low >= 10 else
              f"  GPU-hours (estimate): {low:.2f}–{high:.2f}",
              f"  on {plan.gpus} GPU{'s' if plan.gpus > 1 else ''}: "
              f"{_duration((low / plan.gpus, high / plan.gpus))} (estimate; perfect scaling "
              f"assumed)",
              "  not counted: evaluation, data loading, checkpoints, communication"]
    return "\n".join(lines)


_UNITS = {"gib": 1 << 30, "gb": 10 ** 9, "mib": 1 << 20, "mb": 10 ** 6, "tib": 1 << 40,
          "tb": 10 ** 12}


def parse_bytes(text: str, what: str = "--device-memory") -> int:
    """"32GiB", "16 GB", "80gib" → bytes; ConfigError naming `what` for anything else."""
    value = str(text).strip().lower().replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if value.endswith(unit):
            try:
                number = float(value[:-len(unit)])
            except ValueError:
                break
            if number > 0 and math.isfinite(number):
                return int(number * _UNITS[unit])
            break
    raise ConfigError(f"{what} {text!r}: a size with its unit, e.g. 32GiB or 16GB")
