"""How far back a trained language model looks: its loss on an evaluation stream as a function
of the memory length allowed at test time, and the context length beyond which more memory
stops helping.

    curve = memory_curve("out/wt103-enhanced", "wiki.test.tokens", [0, 64, 128, 192])
    curve["points"]   # [{"mem_len": 0, "loss": ..., "ppl": ..., "seconds": ...}, ...]
    effective_context({p["mem_len"]: p["loss"] for p in curve["points"]})
    recl({"xl": xl_curve["token_nll"], "enhanced": curve["token_nll"]}, r=0.1)

`memory_curve` reads the stream under the run's own evaluation protocol (its tgt_len,
clamp_len, same_length, ext_len and eval rows) with only the memory length changed, so every
memory length predicts the same tokens. Under same_length a query attends to exactly M keys
(Transformer-XL's "attention length"); M = 0 reads each segment alone (same_length then does
not apply). Cost: one evaluation pass over the stream per memory length.

`recl` is Transformer-XL's relative effective context length (Dai et al., 2019,
"Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context", ACL, §4.3 and
Appendix C). Details: docs/explain.md, "The language model: how far back it looks"."""
import dataclasses
import math
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import paddle

from ernie_doc.errors import ConfigError, DataError
from ernie_doc.kinds.lm import VOCAB_FILE, LMEvalStream
from ernie_doc.lm.data import load_corpus
from ernie_doc.predict.lm import LMPipeline
from ernie_doc.predict.model_folder import model_directory
from ernie_doc.utils import progress_bar

__all__ = ["memory_curve", "recl", "relative_gains", "effective_context",
           "measure_language_models", "context_table", "plot_memory_curves", "RECL_RATIOS",
           "GAIN_THRESHOLD"]

RECL_RATIOS = (0.1, 0.5, 1.0)   # the ratios r of Transformer-XL's Table 8
GAIN_THRESHOLD = 0.01           # Appendix C: stop when the relative gain falls below 1 %
MEM_STEP = 32                   # the default grid's step

Losses = Union[float, Sequence[float], np.ndarray]


# -- the curve ----------------------------------------------------------------------------------
def check_mem_lens(mem_lens: Sequence[int]) -> List[int]:
    """mem_lens → sorted distinct ints >= 0 (ConfigError naming the bad value)."""
    if isinstance(mem_lens, (str, bytes)) or not hasattr(mem_lens, "__iter__"):
        raise ConfigError(f"mem_lens must be a list of integers >= 0, got {mem_lens!r}")
    values = list(mem_lens)
    for m in values:
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
            raise ConfigError(f"mem_lens: {m!r} is not an integer >= 0")
    if not values:
        raise ConfigError("mem_lens: give at least one memory length")
    return sorted({int(m) for m in values})


def _protocol(lengths: Mapping[str, Any], mem_len: int) -> Dict[str, Any]:
    """The run's eval protocol with memory length `mem_len` (same_length needs a memory)."""
    return dict(lengths, mem_len=mem_len, same_length=bool(lengths["same_length"]) and mem_len > 0)


def _stream(directory: str, text_path: str, segment_positions: bool,
            max_tokens: Optional[int]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """The evaluation stream of `text_path` as the run's task reads a split (its vocabulary,
    `<eos>` per line, Segatron positions if the model uses them), cut to `max_tokens` →
    (ids [N], positions [3, N] or None)."""
    corpus = load_corpus({"eval": text_path}, os.path.join(directory, VOCAB_FILE), None,
                         positions="global" if segment_positions else None)
    data, positions = corpus.data["eval"], corpus.positions.get("eval")
    if max_tokens is not None:
        data = data[:max_tokens]
        positions = None if positions is None else positions[:, :max_tokens]
    return data, positions


def _read(pipe: Any, data: np.ndarray, positions: Optional[np.ndarray], rows: int,
          lengths: Dict[str, Any], progress: bool) -> np.ndarray:
    """One evaluation pass (the trainer's: LMEvalStream under `lengths`, the task's forward
    carrying memories) → per-token nll [rows, n_step − 1]."""
    split = LMEvalStream("eval", data, positions, rows, 0, 1, lengths, 0)
    carry: Dict[str, Any] = {}
    found = []
    batches = progress_bar(split.batches(), total=split.num_steps(), requested=progress,
                           desc=f"mem_len {lengths['mem_len']}", leave=False)
    with paddle.no_grad(), split.protocol(pipe.model):
        for _, batch in batches:
            tensors = {k: paddle.to_tensor(v) for k, v in batch.items()}
            out, carry = pipe.task.forward(pipe.model, tensors, carry)
            found.append(out.nll.astype("float32").numpy())
    return np.concatenate(found, axis=1)


def _check(pipe: Any, directory: str, mems: List[int], rows: int, device: str) -> None:
    """Every memory length is a valid protocol for the model, and the longest one's estimate
    fits (ConfigError, one line), before anything is read."""
    for m in mems:
        try:
            dataclasses.replace(pipe.model.config, **{k: v for k, v in
                                                     _protocol(pipe.lengths, m).items()
                                                     if k != "tgt_len"})
        except ValueError as e:
            raise ConfigError(f"mem_lens: {m}: {e}") from None
    pipe.task.check_eval_memory(rows, device, mem_len=mems[-1],
                                what=f"{directory}: memory_curve mem_len {mems[-1]}")


def default_mem_lens(lengths: Mapping[str, Any]) -> List[int]:
    """0, 32, 64, … up to 4× the eval protocol's memory (at least its tgt_len), and the
    protocol's own memory length."""
    own = int(lengths["mem_len"])
    top = 4 * max(own, int(lengths["tgt_len"]))
    return sorted(set(range(0, top + 1, MEM_STEP)) | {own})


def memory_curve(run_dir: str, text_path: str, mem_lens: Optional[Sequence[int]] = None,
                 max_tokens: Optional[int] = None, rows: Optional[int] = None,
                 device: str = "cpu", progress: bool = False) -> Dict[str, Any]:
    """The loss of a saved language model (`run_dir`: a run's OUTPUT_DIR, or its best/ or
    final/) on `text_path` (a WikiText-style tokens file) for each test-time memory length in
    `mem_lens` (None: default_mem_lens of the run's protocol). `max_tokens`: read only the
    stream's first N tokens (None: all); `rows`: the stream's rows (None: the run's
    eval_batch_size). Every memory length predicts the same tokens. → {"model", "text",
    "recurrence", "protocol", "rows", "tokens", "unk", "mem_lens", "points": [{"mem_len",
    "loss" (nats per token), "ppl", "seconds"}], "effective_context", "token_nll": {M: [N]
    float32}, "positions": [N] int64 (the stream index of each predicted token)}.
    ConfigError / DataError / PipelineError: one line."""
    if mem_lens is not None:
        check_mem_lens(mem_lens)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
            max_tokens, int) or max_tokens < 2):
        raise ConfigError(f"max_tokens must be an integer >= 2 or None, got {max_tokens!r}")
    directory = model_directory(run_dir)
    pipe = LMPipeline.from_pretrained(directory, batch_size=rows, device=device)
    c = pipe.model.config
    mems = check_mem_lens(default_mem_lens(pipe.lengths) if mem_lens is None else mem_lens)
    data, positions = _stream(directory, text_path, c.segment_positions, max_tokens)
    rows = pipe.rows
    if len(data) < 2 * rows:
        raise DataError(f"{text_path}: {len(data)} tokens, too few for {rows} rows (2 tokens "
                        f"per row)")
    _check(pipe, directory, mems, rows, device)
    points: List[Dict[str, Any]] = []   # per memory length: its loss, perplexity, seconds
    token_nll: Dict[int, np.ndarray] = {}
    for m in mems:
        start = time.perf_counter()
        nll = _read(pipe, data, positions, rows, _protocol(pipe.lengths, m), progress)
        token_nll[m] = nll.reshape(-1)
        loss = float(nll.astype(np.float64).mean())
        points.append({"mem_len": m, "loss": loss, "ppl": math.exp(min(loss, 50.0)),
                       "seconds": round(time.perf_counter() - start, 3)})
    n_step = len(data) // rows   # LMStreams: row b holds tokens b·n_step … (b+1)·n_step − 1
    predicted = (np.arange(rows)[:, None] * n_step + np.arange(1, n_step)[None, :]).reshape(-1)
    return {"model": directory, "text": text_path, "recurrence": c.recurrence,
            "protocol": {k: pipe.lengths[k] for k in ("tgt_len", "mem_len", "clamp_len",
                                                      "same_length", "ext_len")},
            "rows": rows, "tokens": int(predicted.size),
            "unk": int((data == pipe.vocab.unk_id).sum()), "mem_lens": mems, "points": points,
            "effective_context": effective_context({p["mem_len"]: p["loss"] for p in points}),
            "token_nll": token_nll, "positions": predicted}


# -- how far back: one model ----------------------------------------------------------------------
def effective_context(losses: Mapping[int, float],
                      threshold: float = GAIN_THRESHOLD) -> Dict[str, Any]:
    """One model's effective context on a grid of context lengths ({length: mean loss in nats
    per token}): the shortest length L beyond which no longer length lowers the perplexity by
    `threshold` (relative) or more, i.e. 1 − exp(loss(L') − loss(L)) < threshold for every
    L' > L. → {"length": L, "beyond_grid": whether L is the longest length measured (the
    true value may lie further out)}."""
    grid = sorted(losses)
    if not grid:
        raise DataError("effective_context: no context length")
    # the longest length always qualifies (nothing longer was measured)
    c = next(c for i, c in enumerate(grid)
             if all(1.0 - math.exp(losses[d] - losses[c]) < threshold for d in grid[i + 1:]))
    return {"length": c, "beyond_grid": c == grid[-1]}


# -- how far back: a group of models (Transformer-XL's RECL) ------------------------------------
def _aligned(curves: Mapping[str, Mapping[int, Losses]]) -> Tuple[List[int],
                                                                  Dict[str, Dict[int, np.ndarray]]]:
    """Every model's per-token losses as float64 arrays of one length, on one grid of context
    lengths (DataError naming the model otherwise)."""
    if not curves:
        raise DataError("recl: no model")
    grids = {name: sorted(curve) for name, curve in curves.items()}
    first = next(iter(curves))
    arrays: Dict[str, Dict[int, np.ndarray]] = {}
    size = None
    for name, curve in curves.items():
        if grids[name] != grids[first]:
            raise DataError(f"recl: {name} has context lengths {grids[name]}, {first} has "
                             f"{grids[first]}: every model needs the same ones")
        arrays[name] = {c: np.atleast_1d(np.asarray(v, dtype=np.float64)).reshape(-1)
                        for c, v in curve.items()}
        for c, a in arrays[name].items():
            size = a.size if size is None else size
            if a.size != size or size == 0:
                raise DataError(f"recl: {name} at context {c} has {a.size} token losses, "
                                 f"expected {size} (the same predicted tokens for all)")
    if not grids[first]:
        raise DataError("recl: no context length")
    return grids[first], arrays


def relative_gains(curves: Mapping[str, Mapping[int, Losses]], c: int, c_long: int,
                   r: float) -> Dict[str, float]:
    """Transformer-XL's Appendix C relative gain g_i(c, c') of each model i of the group:
    b(c, t) = min_i l_i(c, t) the group's best loss on token t with context c; T the
    ⌈r·n⌉ tokens of largest b(c, t) (the hard ones); f_i(c, c') = mean over T of
    min(b(c, t), l_i(c', t)); g_i = (exp f_i(c, c) − exp f_i(c, c')) / exp f_i(c, c)
    (f_i(c, c) is the mean of b over T). → {model: g_i}."""
    if not 0.0 < r <= 1.0:
        raise ConfigError(f"r must be in (0, 1], got {r}")
    _, arrays = _aligned(curves)
    base = np.min(np.stack([a[c] for a in arrays.values()]), axis=0)     # b(c, t) [n]
    hard = np.argsort(-base, kind="stable")[:max(1, math.ceil(r * base.size))]
    f_short = float(base[hard].mean())
    return {name: 1.0 - math.exp(float(np.minimum(base[hard], a[c_long][hard]).mean())
                                 - f_short)
            for name, a in arrays.items()}


def recl(curves: Mapping[str, Mapping[int, Losses]], r: float = 0.1,
         threshold: float = GAIN_THRESHOLD) -> Dict[str, Dict[str, Any]]:
    """Relative effective context length (Dai et al., 2019, Transformer-XL, §4.3 and Appendix
    C) of each model of a group. `curves`: {model: {context length: per-token losses [n]}},
    the same tokens for every model and length (memory_curve's "token_nll"); a float is one
    token. Each model walks the grid from its shortest length c: while g_i(c, c') ≥
    `threshold` (relative_gains, c' the next length) it moves to c'; its RECL is the c where
    it stops. → {model: {"recl": c, "beyond_grid": it never stopped (a lower bound),
    "gains": [{"from": c, "to": c', "gain": g_i}]}}. Unlike a model's own effective context,
    the baseline is the group's best at each length: a model only gains where it beats every
    model's shorter context."""
    grid, arrays = _aligned(curves)
    found = {}
    for name in arrays:
        gains, c, stopped = [], grid[0], False
        for c_long in grid[1:]:
            g = relative_gains(arrays, c, c_long, r)[name]
            gains.append({"from": c, "to": c_long, "gain": g})
            if g < threshold:
                stopped = True
                break
            c = c_long
        found[name] = {"recl": c, "beyond_grid": not stopped, "gains": gains}
    return found


# -- a group of runs: what `ernie-doc context` reports ------------------------------------------
ARRAYS = ("token_nll", "positions")   # a curve's per-token arrays (RECL's input, not JSON)


def measure_language_models(models: Mapping[str, str], text_path: str,
                            mem_lens: Optional[Sequence[int]] = None,
                            max_tokens: Optional[int] = None, rows: Optional[int] = None,
                            progress: bool = False,
                            ratios: Sequence[float] = RECL_RATIOS) -> Dict[str, Any]:
    """memory_curve of each run ({name: run folder}, one group) on the same tokens (the first
    run's memory lengths and rows for all), and the group's RECL for each r in `ratios` →
    JSON-able {"kind": "language_model", "text", "mem_lens", "runs": {name: curve without
    its arrays}, "recl": {r: {name: recl's entry}}, "table": context_table's Markdown}."""
    if not models:
        raise ConfigError("no language model to measure")
    curves: Dict[str, Dict[str, Any]] = {}
    for name, run_dir in models.items():
        curves[name] = memory_curve(run_dir, text_path, mem_lens, max_tokens, rows,
                                    progress=progress)
        mem_lens, rows = curves[name]["mem_lens"], curves[name]["rows"]
    token_nll = {name: curve["token_nll"] for name, curve in curves.items()}
    assert mem_lens is not None   # the first run's, read by them all
    found = {"kind": "language_model", "text": text_path, "mem_lens": list(mem_lens),
             "runs": {name: {k: v for k, v in curve.items() if k not in ARRAYS}
                      for name, curve in curves.items()},
             "recl": {str(r): recl(token_nll, r) for r in ratios}}
    found["table"] = context_table(found)
    return found


def context_table(found: Mapping[str, Any]) -> str:
    """The Markdown table of measure_language_models' result: per run, the perplexity without
    memory, at the run's eval memory and at its best length, its effective context, and its
    RECL for each r (≥: the longest length still helped)."""
    ratios = list(found["recl"])
    lines = ["| run | recurrence | tokens | ppl, no memory | ppl, run's memory (M) | best ppl (M) "
             "| effective context | " + " | ".join(f"RECL r={r}" for r in ratios) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(ratios)]
    for name, run in found["runs"].items():
        ppl = {p["mem_len"]: p["ppl"] for p in run["points"]}
        own = run["protocol"]["mem_len"]
        best = min(ppl, key=lambda m: (ppl[m], m))
        eff = run["effective_context"]
        cells = [name, run["recurrence"], f"{run['tokens']:,}",
                 f"{ppl[0]:.2f}" if 0 in ppl else "–",
                 f"{ppl[own]:.2f} ({own})" if own in ppl else f"– ({own})",
                 f"{ppl[best]:.2f} ({best})",
                 ("≥ " if eff["beyond_grid"] else "") + str(eff["length"])]
        for r in ratios:
            entry = found["recl"][r][name]
            cells.append(("≥ " if entry["beyond_grid"] else "") + str(entry["recl"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_memory_curves(found: Mapping[str, Any]) -> Any:
    """A matplotlib Figure of measure_language_models' result: each run's perplexity against
    the memory length (left) and its relative gain from one length to the next (right, the
    1 % line dotted)."""
    # matplotlib is optional (banned at the top in ruff.toml; ruff's exemption is off in a
    # module that imports paddle at its top)
    from matplotlib.figure import Figure  # noqa: PLC0415
    fig = Figure(figsize=(10, 4), dpi=100)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, run in found["runs"].items():
        mems = [p["mem_len"] for p in run["points"]]
        ppl = [p["ppl"] for p in run["points"]]
        left.plot(mems, ppl, marker="o", label=f"{name} ({run['recurrence']})")
        gains = [1.0 - b / a for a, b in zip(ppl, ppl[1:])]
        right.plot(mems[1:], gains, marker="o", label=name)
    right.axhline(GAIN_THRESHOLD, color="grey", linestyle=":", linewidth=1)
    left.set_xlabel("memory length at test time (tokens)")
    left.set_ylabel("perplexity")
    right.set_xlabel("memory length at test time (tokens)")
    right.set_ylabel("relative perplexity gain over the previous length")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
