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
"""
import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from benchmarks.common import (add_common_arguments, apply_paddle_threads, check_output, emit,
                               environment, set_threads)

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
    add_common_arguments(p)
    args = p.parse_args(argv)
    for name in ("limit", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    check_output(p, args, [args.input, args.model])
    return args


class TimedModel:
    """The pipeline's model with each call timed and the tokens it read counted (the real
    tokens of the batch: attention_mask's sum)."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.seconds, self.tokens, self.calls = 0.0, 0, 0

    def eval(self):
        return self

    def __call__(self, input_ids, *args, **kwargs):
        start = time.perf_counter()
        out = self.model(input_ids, *args, **kwargs)
        for value in vars(out).values() if not hasattr(out, "_fields") else out:
            if hasattr(value, "numpy"):   # wait for the result (nothing runs lazily on CPU,
                value.numpy()             # but a GPU would return before finishing)
                break
        self.seconds += time.perf_counter() - start
        mask = args[2] if len(args) > 2 else kwargs.get("attention_mask")
        self.tokens += int(mask.sum()) if mask is not None else int(input_ids.size)
        self.calls += 1
        return out


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


def run(args: argparse.Namespace) -> int:
    from ernie_doc.cli.predict import check_input
    from ernie_doc.errors import PipelineError
    from ernie_doc.predict.pipeline import Pipeline, model_directory
    check_input(args.input, PipelineError)
    apply_paddle_threads(args.threads)
    directory = model_directory(args.model)
    result = {"tool": "benchmark-predict", "model": directory, "input": args.input,
              "environment": environment(args, paddlenlp=False), "engines": {}}
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
