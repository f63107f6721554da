"""Predict throughput on real documents, per engine: end to end (reading, tokenizing,
segmenting, scheduling, the model, the predictions) against the engine's own forward time.

    python tools/benchmark_predict.py output/imdb --input imdb_dev.jsonl --limit 500 \\
        --engines dygraph inference inference-bf16 --threads 2 --output bench.json

MODEL is a fine-tuned run (its best/). The inference engines run an export of it that the tool
writes into a temporary directory (`ernie-doc export --config best/ --head <its head>`). For
each engine: documents/s and tokens/s end to end, tokens/s inside the model calls alone (the
engine's forward throughput, timed around each call of the same run), their ratio, and, against
each engine measured before it, its speed-up and how often its predictions agree (the largest
probability difference too, for kinds that report probabilities). Engines a machine cannot run
(bf16 without AVX512-BF16 or AMX) are reported as skipped with the reason.

`--long-document 20000 250000` reads instead one document of each length (the input's texts
joined), each in a process of its own (benchmarks/long_document.py): tokens/s, the model calls'
share, peak and final resident memory. `--compare-with DIR` measures another checkout's
ernie_doc (DIR holds its ernie_doc/) the same way, each length alternately, and reports the
speed-up and whether both predicted the same; `--long-timeout` stops a run that takes longer
and reports how far it got.
"""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from benchmarks.common import (PACKAGE_PARENT, add_common_arguments, apply_paddle_threads,
                               check_output, emit, environment, set_threads)
from benchmarks.long_document import TimedModel

ENGINES = {"dygraph": ("dygraph", "fp32"), "inference": ("inference", "fp32"),
           "inference-bf16": ("inference", "bf16")}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a fine-tuning run's OUTPUT_DIR or its best/")
    p.add_argument("--input", required=True, help="documents, as ernie-doc predict reads them")
    p.add_argument("--format", default="auto", help="input format (as ernie-doc predict)")
    p.add_argument("--limit", type=int, default=200, help="documents measured (default 200)")
    p.add_argument("--warmup", type=int, default=8, help="documents read first, not measured")
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    p.add_argument("--batch-size", type=int, help="rows (default: the run's eval batch size)")
    p.add_argument("--long-document", type=int, nargs="+", metavar="TOKENS",
                   help="instead: one document of each length, each in its own process")
    p.add_argument("--compare-with", metavar="DIR",
                   help="with --long-document: also measure the ernie_doc of this checkout")
    p.add_argument("--long-timeout", type=float, default=None, metavar="SECONDS",
                   help="with --long-document: stop a run after this long (default: none)")
    add_common_arguments(p)
    args = p.parse_args(argv)
    if (args.compare_with or args.long_timeout) and not args.long_document:
        p.error("--compare-with and --long-timeout go with --long-document")
    if any(n < 1 for n in args.long_document or []):
        p.error(f"--long-document: lengths must be positive, got {args.long_document}")
    for name in ("limit", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    check_output(p, args, [args.input, args.model])
    return args


def export_for(directory: str, pipe, work: str) -> str:
    """An export of the fine-tuned model in `directory` under `work` → its directory."""
    from ernie_doc import auto
    from ernie_doc.cli import export as export_cli
    head = next(name for name, cls in auto.head_classes().items()
                if cls is pipe.task.head_class)
    target = os.path.join(work, "export")
    export_cli.main(["--config", directory, "--head", head, "--output",
                     os.path.join(target, "model")])
    return target


def measure(pipe, args: argparse.Namespace) -> Dict[str, Any]:
    """One engine over the documents → its numbers and its records (by doc_id)."""
    from ernie_doc.predict.pipeline import read_inputs
    if args.warmup:   # first calls build kernels and caches: not what a long run sees
        list(pipe.stream(itertools.islice(read_inputs(args.input, args.format), args.warmup)))
    timed = TimedModel(pipe.model)
    pipe.model = pipe.run.model = timed
    start = time.perf_counter()
    records = list(pipe.stream(itertools.islice(read_inputs(args.input, args.format),
                                                args.limit)))
    total = time.perf_counter() - start
    done = [r for r in records if "error" not in r]
    return {"documents": len(done), "errors": len(records) - len(done),
            "model_calls": timed.calls, "tokens": timed.tokens, "seconds": round(total, 3),
            "model_seconds": round(timed.seconds, 3),
            "documents_per_sec": round(len(done) / total, 2),
            "tokens_per_sec": round(timed.tokens / total, 1),
            "forward_tokens_per_sec": round(timed.tokens / max(timed.seconds, 1e-9), 1),
            "end_to_end_over_forward": round(timed.seconds / total, 3)}, \
        {r["doc_id"]: r for r in done}


def cpu_model() -> Optional[str]:
    """lscpu's "Model name" (/proc/cpuinfo's "model name"), None where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.lower().startswith("model name")), None)
    except OSError:
        return None


def speedup(reference: Dict[str, Any], other: Dict[str, Any]) -> Dict[str, float]:
    """`other`'s throughput over `reference`'s, end to end and inside the model calls."""
    return {key: round(other[key] / max(reference[key], 1e-9), 3)
            for key in ("tokens_per_sec", "forward_tokens_per_sec")}


def agreement(reference: Dict[str, dict], other: Dict[str, dict]) -> Dict[str, Any]:
    """How often two engines predict the same, and the largest probability difference."""
    common = [k for k in reference if k in other]
    same = sum(reference[k].get("pred") == other[k].get("pred") for k in common)
    diffs = [abs(a - b) for k in common if "probs" in reference[k]
             for a, b in zip(reference[k]["probs"], other[k]["probs"])]
    return {"documents": len(common), "same_prediction": round(same / max(1, len(common)), 4),
            "max_prob_diff": max(diffs) if diffs else None}


def long_run(root: str, args: argparse.Namespace, directory: str,
             tokens: int) -> Dict[str, Any]:
    """benchmarks/long_document.py with `root`'s ernie_doc on one document of `tokens` →
    its result, or {"error", "progress": the last report} when it failed or timed out."""
    script = os.path.join(PACKAGE_PARENT, "benchmarks", "long_document.py")
    command = [sys.executable, script, directory, args.input, args.format, str(tokens),
               str(args.threads or 0), str(args.batch_size or 0)]
    path = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=path))
    error = None
    try:
        out, err = proc.communicate(timeout=args.long_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        error = f"stopped after {args.long_timeout:g} s (--long-timeout)"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    progress = [line["progress"] for line in lines if "progress" in line]
    result = next((line["result"] for line in lines if "result" in line), None)
    # resident memory as the document is read: [seconds, tokens the model read (both passes,
    # [SEP] and [CLS] counted), MiB], at most 25 of the samples
    series = [[p["seconds"], p["model_tokens"], p["rss_mib"]]
              for p in progress[::max(1, -(-len(progress) // 25))]]
    if result is None:
        return {"error": error or (err.strip().splitlines() or ["no result"])[-1],
                "progress": progress[-1] if progress else None, "rss_while_read": series,
                "max_rss_mib_sampled": max((p["rss_mib"] for p in progress), default=None)}
    result["rss_while_read"] = series
    result["max_rss_mib_sampled"] = max([p["rss_mib"] for p in progress]
                                        + [result["rss_at_end_mib"]])
    return result


def long_documents(args: argparse.Namespace, directory: str) -> Dict[str, Any]:
    """Each --long-document length with this checkout's ernie_doc (and --compare-with's,
    the two alternating which goes first) → {tokens: {"this", "compare", speed-up, ...}}."""
    from ernie_doc.errors import PipelineError
    roots = {"this": PACKAGE_PARENT}
    if args.compare_with:
        if not os.path.isfile(os.path.join(args.compare_with, "ernie_doc", "__init__.py")):
            raise PipelineError(f"--compare-with {args.compare_with}: no ernie_doc/ there")
        roots["compare"] = os.path.abspath(args.compare_with)
    out = {}
    for i, tokens in enumerate(args.long_document):
        order = list(roots) if i % 2 else list(roots)[::-1]
        runs = {name: long_run(roots[name], args, directory, tokens) for name in order}
        for name in roots:
            r = runs[name]
            print(f"[benchmark-predict] {tokens} tokens, {name}: " + (
                f"{r['tokens_per_sec']} tok/s, peak RSS {r['peak_rss_mib']} MiB"
                if "error" not in r else r["error"]), file=sys.stderr)
        entry = {name: runs[name] for name in roots}
        if len(runs) == 2 and not any("error" in r for r in runs.values()):
            entry["speedup"] = round(runs["this"]["tokens_per_sec"]
                                     / runs["compare"]["tokens_per_sec"], 3)
            entry["same_prediction"] = runs["this"]["prediction"] == \
                runs["compare"]["prediction"]
        out[str(tokens)] = entry
    return out


def run(args: argparse.Namespace) -> int:
    from ernie_doc.cli.predict import check_input
    from ernie_doc.errors import PipelineError
    from ernie_doc.predict.pipeline import Pipeline, model_directory
    check_input(args.input, PipelineError)
    apply_paddle_threads(args.threads)
    directory = model_directory(args.model)
    result = {"tool": "benchmark-predict", "model": directory, "input": args.input,
              "environment": environment(args, paddlenlp=False), "engines": {}}
    if args.long_document:
        result["environment"]["cpu"] = cpu_model()
        result["long_document"] = long_documents(args, directory)
        emit(result, args)
        return 0
    work = tempfile.mkdtemp(prefix="ernie-doc-bench-")
    measured, exported = {}, None   # engine name → (numbers, records by doc_id)
    try:
        for name in args.engines:
            engine, precision = ENGINES[name]
            try:
                if engine == "inference" and exported is None:
                    exported = export_for(directory, Pipeline.from_pretrained(directory), work)
                pipe = Pipeline.from_pretrained(exported if engine == "inference" else directory,
                                                args.batch_size, engine=engine,
                                                precision=precision, threads=args.threads or 1)
            except PipelineError as e:   # e.g. bf16 on a CPU without it
                result["engines"][name] = {"skipped": str(e)}
                print(f"[benchmark-predict] {name}: skipped: {e}", file=sys.stderr)
                continue
            numbers, records = measure(pipe, args)
            # against every engine measured before it: bf16's agreement and speed-up are
            # wanted against inference fp32, not only against dygraph
            for earlier, (earlier_numbers, earlier_records) in measured.items():
                numbers["agreement_with_" + earlier] = agreement(earlier_records, records)
                numbers["speedup_over_" + earlier] = speedup(earlier_numbers, numbers)
            measured[name] = (numbers, records)
            result["engines"][name] = numbers
            print(f"[benchmark-predict] {name}: {numbers['documents_per_sec']} docs/s, "
                  f"{numbers['tokens_per_sec']} tok/s end to end, "
                  f"{numbers['forward_tokens_per_sec']} tok/s in the model", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(result, args)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Exit 2 with one `error:` line for a bad model folder (a refused pickle ...), input or
    --output, as `ernie-doc predict` reports them."""
    args = parse_args(argv)
    set_threads(args.threads)
    from ernie_doc.cli import exit_on_user_error, user_error_types
    try:
        return run(args)
    except user_error_types() as e:
        exit_on_user_error(e, False, args.output, what="--output", target_is_dir=False)
        raise


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
