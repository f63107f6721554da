"""Explaining a prediction: the time of a gradient attribution against the time of predicting
the same long document, and the resident memory of occlusion against the document's length.

    python tools/benchmark_explain.py [--preset ernie-doc-base-en] [--tokens 10000] \\
        [--occlusion-segments 100 400] [--threads N] [--output explain.json]

(From a source checkout.) Nothing is downloaded: each model is a randomly initialised
sequence classifier saved with save_pretrained, beside a WordPiece vocabulary of synthetic
words and a task.json that reads documents as the IMDB task's config does (max_seq_len 512,
stride = memory_len, the retrospective feed on; --seq-len changes the first). The document is
--tokens synthetic words drawn by seed, one token each.

* Gradient against predict, at --preset's shape: `Pipeline.stream` of the document with one
  row (the rows the gradient pass reads), then `Explainer(method="gradient")` of the same
  document; seconds of each, their ratio, whether the gradient pass chose recompute, and the
  peak resident memory of each. Each runs in a process of its own after a one-segment warm-up
  document, its peak (VmHWM) reset before the measured call where the kernel allows it.
* Occlusion's memory, at a small shape (--occlusion-layers, --occlusion-hidden, T = 64,
  M = 32): documents of --occlusion-segments segments each, each in a process of its own,
  read with --occlusion-rows variants side by side; seconds, the peak resident memory, and
  the resident memory sampled as the variants are read. Flat means the peak grows from the
  shortest document to the longest by no more than what the longer document itself holds
  (its token ids, its segments' rows and the per-segment scores: `document_bytes`) plus
  --flat-slack-mib.

Prints one JSON object (also written atomically to --output)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from benchmarks.common import (PACKAGE_PARENT, add_common_arguments, check_output, emit,
                               environment, set_threads)

WORDS = 1000   # the synthetic vocabulary: w0 ... w999, one WordPiece token each
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
OCCLUSION_SEQ_LEN, OCCLUSION_MEMORY = 64, 32
QUICK = dict(preset="ernie-doc-small", layers=1, hidden=32, heads=2, memory_len=16,
             seq_len=32, tokens=400, occlusion_segments=[6, 12], occlusion_layers=1,
             occlusion_hidden=16, occlusion_rows=4)
SAMPLE_SECONDS = 0.2


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="ernie-doc-base-en", help="the gradient model's shape")
    p.add_argument("--layers", type=int, help="override the preset's num_hidden_layers")
    p.add_argument("--hidden", type=int, help="override the preset's hidden_size")
    p.add_argument("--heads", type=int, help="override the preset's num_attention_heads")
    p.add_argument("--memory-len", type=int, help="override the preset's memory_len")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per segment (default: the IMDB task's max_seq_len, 512)")
    p.add_argument("--tokens", type=int, default=10000, help="the document's length")
    p.add_argument("--occlusion-segments", type=int, nargs="*", default=[100, 400],
                   help="occlusion: document lengths in segments (none: skip)")
    p.add_argument("--occlusion-layers", type=int, default=2)
    p.add_argument("--occlusion-hidden", type=int, default=128)
    p.add_argument("--occlusion-rows", type=int, default=32,
                   help="variants read side by side (the IMDB task's eval batch size)")
    p.add_argument("--flat-slack-mib", type=float, default=32.0,
                   help="occlusion: peak growth allowed beyond the document's own bytes")
    p.add_argument("--no-gradient", action="store_true", help="skip gradient against predict")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes and documents (seconds): a check that it runs")
    p.add_argument("--worker", nargs=4, metavar=("WHAT", "FOLDER", "TOKENS", "ROWS"),
                   help=argparse.SUPPRESS)
    add_common_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    sizes = [args.tokens, args.occlusion_layers, args.occlusion_hidden, args.occlusion_rows]
    sizes += args.occlusion_segments + [v for v in (args.layers, args.hidden, args.heads,
                                                    args.seq_len) if v is not None]
    if any(n < 1 for n in sizes) or (args.memory_len is not None and args.memory_len < 1):
        p.error("sizes, lengths and counts must be positive integers")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    check_output(p, args)
    return args


# -- the model folders -------------------------------------------------------------------------
def save_classifier(folder: str, preset: str, overrides: Dict[str, int],
                    seq_len: Optional[int], seed: int = 0) -> Dict[str, Any]:
    """A randomly initialised (seeded) sequence classifier of `preset`'s shape with
    `overrides`, saved in `folder` with the synthetic vocabulary and a task.json of the IMDB
    task's config (max_seq_len `seq_len`, default the task's) → the shape and reading."""
    import paddle

    from ernie_doc import ErnieDocConfig
    from ernie_doc.heads import ErnieDocForSequenceClassification
    from ernie_doc.kinds.folders import task_config
    from ernie_doc.run_config import load_yaml
    paddle.seed(seed)
    config = ErnieDocConfig.from_preset(preset, num_labels=2, **overrides)
    ErnieDocForSequenceClassification(config).save_pretrained(folder)
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIALS + [f"w{i}" for i in range(WORDS)]) + "\n")
    values = dict(load_yaml(task_config("imdb")), model=preset, model_overrides=overrides,
                  tokenizer="", data_dir="", output_dir="")
    if seq_len is not None:
        values["max_seq_len"] = seq_len
    with open(os.path.join(folder, "task.json"), "w", encoding="utf-8") as f:
        json.dump({"format": 1, "task": "imdb", "kind": "classification",
                   "labels": ["0", "1"], "config": values}, f, indent=1)
    return {"preset": preset, "layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "heads": config.num_attention_heads,
            "memory_len": config.memory_len, "max_seq_len": values["max_seq_len"],
            "stride": values.get("stride") or config.memory_len,
            "retro_feed": values["retro_feed"]}


def document(tokens: int, seed: int = 0) -> str:
    """`tokens` synthetic words drawn by seed: a document of exactly that many tokens."""
    import numpy as np
    ids = np.random.default_rng(seed).integers(0, WORDS, tokens)
    return " ".join(f"w{i}" for i in ids)


# -- one measurement, in its own process -------------------------------------------------------
def worker(what: str, folder: str, tokens: int, rows: int) -> Dict[str, Any]:
    """predict, gradient or occlusion of a document of `tokens` tokens with `rows` rows a step,
    after a warm-up document (paddle's kernels and caches) → seconds, peak and sampled
    resident memory, and what the call reported."""
    from benchmarks.long_document import reset_peak, resident_bytes, status_bytes
    from ernie_doc.explain.explainer import Explainer
    from ernie_doc.predict.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(folder, batch_size=rows, on_error="fail")
    if what == "predict":
        def call(text):
            return next(iter(pipe.stream([text])))
    else:
        explainer = Explainer(pipe, method=what, max_segments=1 << 30)

        def call(text):
            return explainer([text])[0]
    # warm-up: one segment. A gradient pass keeps its whole graph when that fits (no
    # recompute), and paddle's allocator keeps what it took: a longer warm-up document would
    # set the resident memory, and the peak, of the measured call
    call(document(min(tokens, pipe.cfg.max_seq_len - 2), seed=1))
    text = document(tokens)
    samples: List[float] = []
    done = threading.Event()

    def sample():
        while not done.wait(SAMPLE_SECONDS):
            samples.append(round(resident_bytes() / 2**20, 1))
    watch = threading.Thread(target=sample, daemon=True)
    peak_of_call = reset_peak()
    before = resident_bytes()
    watch.start()
    start, cpu = time.perf_counter(), time.process_time()
    record = call(text)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    done.set()
    watch.join()
    return {"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3),
            "segments": record["segments"]
            if isinstance(record["segments"], int) else len(record["segments"]),
            "rss_before_mib": round(before / 2**20, 1),
            "peak_rss_mib": round(status_bytes("VmHWM") / 2**20, 1),
            "peak_rss_of": "the call" if peak_of_call else "the process",
            "rss_at_end_mib": round(resident_bytes() / 2**20, 1),
            "rss_sampled_mib": samples[::max(1, -(-len(samples) // 25))],
            "recompute": record.get("recompute"),
            # predict's label; an explanation's record holds predict's under "prediction"
            "prediction": record.get("prediction", record).get("pred")}


def in_subprocess(args: argparse.Namespace, what: str, folder: str, tokens: int,
                  rows: int) -> Dict[str, Any]:
    """`worker` in a process of its own (its peak memory its own) → its result."""
    command = [sys.executable, os.path.join(PACKAGE_PARENT, "tools", "benchmark_explain.py"),
               "--worker", what, folder, str(tokens), str(rows)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    path = os.pathsep.join([PACKAGE_PARENT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run(command, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"benchmark-explain: {what} of {tokens} tokens failed: {tail}")
    return json.loads(lines[-1])


def measure(args: argparse.Namespace, what: str, folder: str, tokens: int,
            rows: int) -> Dict[str, Any]:
    """One measurement (`in_subprocess`), reported on stderr as it ends → its result."""
    result = in_subprocess(args, what, folder, tokens, rows)
    print(f"[benchmark-explain] {what}, {tokens} tokens: {result['seconds']} s, peak RSS "
          f"{result['peak_rss_mib']} MiB", file=sys.stderr)
    return result


# -- the two measurements ----------------------------------------------------------------------
def gradient_against_predict(args: argparse.Namespace, work: str) -> Dict[str, Any]:
    """Predict, then gradient, of one document of --tokens tokens at --preset's shape."""
    overrides = {k: v for k, v in (("num_hidden_layers", args.layers),
                                   ("hidden_size", args.hidden),
                                   ("num_attention_heads", args.heads),
                                   ("memory_len", args.memory_len)) if v is not None}
    folder = os.path.join(work, "gradient")
    shape = save_classifier(folder, args.preset, overrides, args.seq_len)
    predict = measure(args, "predict", folder, args.tokens, 1)
    gradient = measure(args, "gradient", folder, args.tokens, 1)
    return {"model": shape, "document_tokens": args.tokens, "rows": 1,
            "predict": predict, "gradient": gradient,
            "same_prediction": predict["prediction"] == gradient["prediction"],
            "ratio_gradient_over_predict": round(gradient["seconds"] / predict["seconds"], 3),
            # the process's CPU time: less moved by other work on a shared machine
            "cpu_ratio_gradient_over_predict": round(gradient["cpu_seconds"]
                                                     / predict["cpu_seconds"], 3)}


def occlusion_memory(args: argparse.Namespace, work: str) -> Dict[str, Any]:
    """Occlusion of documents of each --occlusion-segments length at the small shape, each in
    its own process → their peaks and whether the peak stays flat."""
    folder = os.path.join(work, "occlusion")
    shape = save_classifier(folder, "ernie-doc-small", {
        "num_hidden_layers": args.occlusion_layers, "hidden_size": args.occlusion_hidden,
        "num_attention_heads": max(1, args.occlusion_hidden // 64),
        "memory_len": OCCLUSION_MEMORY,
        "max_position_embeddings": OCCLUSION_SEQ_LEN}, OCCLUSION_SEQ_LEN)
    runs = {}
    for segments in args.occlusion_segments:
        # the first window holds T − 2 tokens, each further one `stride` new tokens
        tokens = shape["max_seq_len"] - 2 + (segments - 1) * shape["stride"]
        r = measure(args, "occlusion", folder, tokens, args.occlusion_rows)
        # what the document itself holds: its token ids (int64), each reading's rows
        # (input ids, mask, types: 8 + 4 + 8 bytes a position) and a score per segment
        r["document_bytes"] = tokens * 8 + r["segments"] * 2 * shape["max_seq_len"] * 20 + \
            r["segments"] * 8
        r["document_tokens"] = tokens
        runs[str(segments)] = r
    out: Dict[str, Any] = {"model": shape, "rows": args.occlusion_rows, "documents": runs}
    if len(runs) > 1:
        first, last = runs[str(min(args.occlusion_segments))], \
            runs[str(max(args.occlusion_segments))]
        growth = last["peak_rss_mib"] - first["peak_rss_mib"]
        allowed = (last["document_bytes"] - first["document_bytes"]) / 2**20 + \
            args.flat_slack_mib
        out.update(peak_growth_mib=round(growth, 1), allowed_growth_mib=round(allowed, 1),
                   flat=growth <= allowed)
    return out


def run(args: argparse.Namespace) -> int:
    result: Dict[str, Any] = {"tool": "benchmark-explain",
                              "environment": dict(environment(args, paddlenlp=False),
                                                  cpu_flags=cpu_flags())}
    work = tempfile.mkdtemp(prefix="ernie-doc-bench-explain-")
    try:
        if not args.no_gradient:
            result["gradient"] = gradient_against_predict(args, work)
            print(f"[benchmark-explain] gradient / predict = "
                  f"{result['gradient']['ratio_gradient_over_predict']}", file=sys.stderr)
        if args.occlusion_segments:
            result["occlusion"] = occlusion_memory(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(result, args)
    return 0


def cpu_flags() -> List[str]:
    """The CPU features that decide paddle's kernels (AVX2, AVX-512, AMX ...) of /proc/cpuinfo."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in wanted if flag in flags]


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    if args.worker:
        what, folder, tokens, rows = args.worker
        from benchmarks.common import apply_paddle_threads
        apply_paddle_threads(args.threads)
        print(json.dumps(worker(what, folder, int(tokens), int(rows))), flush=True)
        return 0
    return run(args)


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
