#!/usr/bin/env python
"""Pretraining throughput: the real `ernie-doc pretrain` runs, one per process count.

    python tools/benchmark_train.py --config configs/pretrain/tiny.yaml --nproc 1 2 \
        --steps 60 [--warmup 10] [--set k=v ...] [--threads N] [--output results.json]

(From a source checkout. The model's own throughput is tools/benchmark_model.py.)

For each N of --nproc the real tools/pretrain.py runs (N=1: plain python; N>1: fleetrun
--nproc_per_node N, data-parallel over gloo, its worker logs in a --log_dir of its own) in a
fresh temporary OUTPUT_DIR with `max_steps=<steps> progress=false logging_steps=0
save_steps=0`, then the --set items (passed through as tools/pretrain.py --set items; they may
not set max_steps or output_dir). CPU threads per process: --threads, else a `--set threads=K`,
else floor(cpu_count / N); OMP_NUM_THREADS / MKL_NUM_THREADS are set to it as well. From the
run's train_log.jsonl, after dropping the first --warmup steps: median and mean tokens/s per
rank and the median aggregate tokens/s (rank 0's tokens x N / rank 0's step time), with the
wall seconds of the whole run (start-up and tokenizer training included), the steps measured,
and rows per rank / max_seq_len from the run's run_config.yaml; and, when N=1 was measured
too, scaling_efficiency = aggregate(N) / (N x per-rank(1)). Tokens are the non-padding tokens
of every segment read: with retro_feed the skim pass counts too. The temporary directories
are removed; a failed run prints one `error:` line naming N and where its logs were kept, then
the tail of its worker log, and exits with 1. Prints one JSON object (also written atomically
to --output).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from benchmarks.common import (PACKAGE_PARENT, add_common_arguments, check_output, emit,
                               environment, set_threads)

PRETRAIN_STEPS, PRETRAIN_WARMUP = 60, 10
TOKENS_COUNTED = "every segment read, skim pass included"


# dest → this tool's option name (what the messages say)
OPTION_NAMES = {"pretrain_config": "--config", "pretrain_nproc": "--nproc",
                "pretrain_steps": "--steps", "pretrain_warmup": "--warmup"}


def add_train_arguments(p: Any) -> None:
    """This tool's own options (on a parser or an argument group)."""
    p.add_argument("--config", dest="pretrain_config", required=True, metavar="CONFIG",
                   help="measure tools/pretrain.py with this config")
    p.add_argument("--nproc", dest="pretrain_nproc", type=int, nargs="+",
                   default=None, metavar="N",
                   help="processes per run, one run each (default: 1)")
    p.add_argument("--steps", dest="pretrain_steps", type=int, default=None,
                   metavar="STEPS", help=f"optimizer steps per run (default {PRETRAIN_STEPS})")
    p.add_argument("--warmup", dest="pretrain_warmup", type=int, default=None,
                   metavar="STEPS", help=f"first steps not measured (default {PRETRAIN_WARMUP})")
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="tools/pretrain.py --set items")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_train_arguments(p)
    add_common_arguments(p)
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults filled in, then the range checks; p.error (exit 2) on a bad value."""
    opt = OPTION_NAMES
    args.pretrain_nproc = args.pretrain_nproc or [1]
    if args.pretrain_steps is None:
        args.pretrain_steps = PRETRAIN_STEPS
    if args.pretrain_warmup is None:
        args.pretrain_warmup = PRETRAIN_WARMUP
    if not os.path.isfile(args.pretrain_config):
        p.error(f"{opt['pretrain_config']} {args.pretrain_config}: no such file")
    if any(n < 1 for n in args.pretrain_nproc):
        p.error(f"{opt['pretrain_nproc']} must be >= 1")
    if args.pretrain_warmup < 0 or args.pretrain_steps <= args.pretrain_warmup:
        p.error(f"{opt['pretrain_warmup']} must be >= 0 and {opt['pretrain_steps']} greater "
                "than it")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    for item in args.overrides:
        key = item.split("=", 1)[0].split(".")[0].strip()
        if "=" not in item:
            p.error(f"--set {item!r}: expected key=value")
        if key in ("max_steps", "output_dir"):
            p.error(f"--set {key}: the benchmark sets it (use {opt['pretrain_steps']})")
    args.pretrain_nproc = list(dict.fromkeys(args.pretrain_nproc))  # each N once, in order
    check_output(p, args, [args.pretrain_config])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    check_args(p, args)
    return args


class PretrainRunError(RuntimeError):
    """A pretraining run failed; the message names N and ends with its worker log's tail."""


def pretrain_threads(args: argparse.Namespace, nproc: int) -> Tuple[Optional[int], bool]:
    """CPU threads per process: --threads, else the user's `--set threads=K`, else
    floor(cpu_count / N). → (threads, whether the user chose them)."""
    if args.threads is not None:
        return args.threads, True
    for item in reversed(args.overrides):
        key, _, value = item.partition("=")
        if key.strip() == "threads":
            try:
                return int(value), True
            except ValueError:
                return None, True   # tools/pretrain.py says what is wrong with it
    return max(1, (os.cpu_count() or 1) // nproc), False


def pretrain_command(args: argparse.Namespace, nproc: int, work: str
                     ) -> Tuple[List[str], Dict[str, str], str, Optional[int]]:
    """→ (argv, env, worker log directory, threads per process) of one run in the scratch
    directory `work`."""
    from ernie_doc.cli import launch_script
    script = launch_script()
    log_dir = os.path.join(work, "log")
    if nproc == 1:
        cmd = [sys.executable, script]
    else:
        fleetrun = os.path.join(os.path.dirname(sys.executable), "fleetrun")
        launcher = [fleetrun] if os.path.exists(fleetrun) else [
            sys.executable, "-m", "paddle.distributed.launch"]
        cmd = [*launcher, "--nproc_per_node", str(nproc), "--log_dir", log_dir, script]
    cmd.append("pretrain")
    threads, chosen = pretrain_threads(args, nproc)
    sets = ["progress=false", "logging_steps=0", "save_steps=0"]
    if not chosen:
        sets.append(f"threads={threads}")
    sets += list(args.overrides)
    if args.threads is not None:   # --threads wins over a --set threads=K
        sets.append(f"threads={threads}")
    sets += [f"max_steps={args.pretrain_steps}", f"output_dir={os.path.join(work, 'out')}"]
    cmd += ["--config", args.pretrain_config, "--set", *sets]
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    if threads:   # paddle reads OMP_NUM_THREADS at import
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    return cmd, env, log_dir, threads


def worker_log_tail(log_dir: str, launcher_log: str, lines: int = 25) -> Tuple[str, str]:
    """(name, last lines) of the log that says what went wrong: the first worker log with an
    error or traceback, else workerlog.0, else the launcher's own output."""
    logs = []
    if os.path.isdir(log_dir):
        logs = sorted((n for n in os.listdir(log_dir) if n.startswith("workerlog.")),
                      key=lambda n: int(n.rsplit(".", 1)[1]) if n.rsplit(".", 1)[1].isdigit()
                      else 1 << 30)
    texts = {}
    for name in logs:
        with open(os.path.join(log_dir, name), encoding="utf-8", errors="replace") as f:
            texts[name] = f.read()
    bad = [n for n, t in texts.items() if "error:" in t or "Traceback" in t]
    name = (bad or logs or [None])[0]
    if name is None or not texts[name].strip():
        name = os.path.basename(launcher_log)
        with open(launcher_log, encoding="utf-8", errors="replace") as f:
            texts[name] = f.read()
    return name, "\n".join(texts[name].rstrip().splitlines()[-lines:])


def run_pretraining(args: argparse.Namespace, nproc: int) -> Dict[str, Any]:
    """One tools/pretrain.py run with `nproc` processes → its throughput dict."""
    from ernie_doc.run_config import parse_yaml
    from ernie_doc.training.runlog import read_jsonl
    work = tempfile.mkdtemp(prefix=f"ernie-doc-bench-pretrain-n{nproc}-")
    cmd, env, log_dir, threads = pretrain_command(args, nproc, work)
    if nproc == 1:
        os.makedirs(log_dir)
    # plain python: its output is its worker log; fleetrun: the launcher's own output
    launcher_log = os.path.join(log_dir if nproc == 1 else work,
                                "workerlog.0" if nproc == 1 else "launcher.log")
    print(f"[benchmark] pretraining with {nproc} process(es), {threads} thread(s) each",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(launcher_log, "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.perf_counter() - t0
    out = os.path.join(work, "out")
    records = read_jsonl(os.path.join(out, "train_log.jsonl")) if code == 0 else []
    measured = [r for r in records if r["step"] > args.pretrain_warmup]
    if code != 0 or not measured:
        why = (f"exit {code}" if code != 0 else
               f"{len(records)} steps logged, none after the {args.pretrain_warmup} warm-up "
               "steps")
        name, tail = worker_log_tail(log_dir, launcher_log)
        raise PretrainRunError(f"pretraining with N={nproc} process(es) failed ({why}; logs "
                               f"kept in {work}); the tail of {name}:\n{tail}")
    with open(os.path.join(out, "run_config.yaml"), encoding="utf-8") as f:
        run_config = parse_yaml(f)
    with open(os.path.join(out, "timing.json"), encoding="utf-8") as f:
        timing = json.load(f)   # rank 0's share of step time spent waiting for batches
    shutil.rmtree(work, ignore_errors=True)
    per_rank = [float(r["tokens_per_sec_per_rank"]) for r in measured]
    aggregate = [float(r["tokens_per_sec"]) for r in measured]
    return {
        "nproc": nproc,
        "threads_per_process": threads,
        "rows_per_rank": run_config["batch_size"],
        "grad_accum_steps": run_config["grad_accum_steps"],
        "max_seq_len": run_config["max_seq_len"],
        "retro_feed": run_config["retro_feed"],
        "steps_logged": len(records),
        "steps_measured": len(measured),
        "tokens_per_sec_per_rank_median": round(statistics.median(per_rank), 1),
        "tokens_per_sec_per_rank_mean": round(statistics.fmean(per_rank), 1),
        "tokens_per_sec_median": round(statistics.median(aggregate), 1),
        "input_share": timing["input_share"],
        "wall_s": round(wall, 2),
    }


def run(args: argparse.Namespace) -> int:
    """The runs of parsed `args` → the exit status."""
    set_threads(args.threads)
    t_total = time.perf_counter()
    result = {
        "setup": {"mode": "pretraining", "config": args.pretrain_config,
                  "nproc": args.pretrain_nproc, "steps": args.pretrain_steps,
                  "warmup_steps_dropped": args.pretrain_warmup, "overrides": args.overrides,
                  "launcher": "python (N=1), fleetrun --nproc_per_node N (N>1; gloo on CPU)",
                  "tokens": "non-padding tokens (attention_mask) of the rows fed",
                  "aggregate": "rank 0's tokens x N / rank 0's step time",
                  "scaling_efficiency": "aggregate(N) / (N x per-rank(1)), medians"},
        "environment": environment(args, paddlenlp=False),
    }
    runs = []
    for nproc in args.pretrain_nproc:
        try:
            runs.append(run_pretraining(args, nproc))
        except PretrainRunError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    base = next((r for r in runs if r["nproc"] == 1), None)
    for r in runs:
        if base is not None:
            r["scaling_efficiency"] = round(
                r["tokens_per_sec_median"] / (r["nproc"] * base["tokens_per_sec_per_rank_median"]),
                3)
    retro = any(r["retro_feed"] for r in runs)
    result["setup"]["tokens_counted"] = TOKENS_COUNTED if retro else "every segment read"
    result["pretraining"] = runs
    result["total_wall_s"] = round(time.perf_counter() - t_total, 2)
    emit(result, args)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run(parse_args(argv))


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
