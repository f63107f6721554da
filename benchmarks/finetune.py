#!/usr/bin/env python
"""Fine-tuning side by side with PaddleNLP's ERNIE-Doc script, on the same IMDB documents.

    python tools/benchmark_finetune.py --paddlenlp-dir PaddleNLP/model_zoo/ernie-doc \\
        --data imdb_test_sample5k.tsv --tokenizer ernie-doc/base-en \\
        [--batch-size 2 --seq-len 512 --memory-len 128 --learning-rate 7e-5] \\
        [--steps 10 --warmup 2 --repeats 1] [--threads N] [--output results.json]

(From a source checkout.) Two contenders train the
same model shape from random weights (`ernie-doc-base-en`'s configuration, --model-overrides
over it for both) on the same documents, each as one process of the same python with the same
CPU threads (--threads, default: every CPU; OMP_NUM_THREADS / MKL_NUM_THREADS too):

* paddlenlp: PaddleNLP's `model_zoo/ernie-doc/run_classifier.py` from --paddlenlp-dir (with its
  data.py and metrics.py beside it), run unmodified through `python -m
  benchmarks.paddlenlp_driver`, which replaces only what it would download (the dataset, the
  tokenizer's files, the weights), nltk's sentence splitter (punkt's data) and what stops it
  under paddle 3 on a CPU: see that module. Its arguments: --device, --batch_size,
  --max_seq_length, --memory_length, --learning_rate, --epochs 1, --max_steps, --save_steps
  (more than --steps: it saves nothing), --logging_steps 1, --output_dir (a temporary folder).
* ours: `ernie-doc finetune imdb` with the same T, memory length (model_overrides.memory_len),
  batch size, learning rate, max_steps and threads; stride = min(T - 2, M) so that its windows
  of T - 2 tokens advance as PaddleNLP's do; retro_feed=false (PaddleNLP reads each document
  once); PaddleNLP's optimiser (no clipping, epsilon 1e-8, where ours would follow the
  official code's rule and clip a run too short for a warmup step); the same documents'
  evaluation at the end.

The documents: the first --train-docs rows of --data (a TSV in the official IMDB layout: a
header row naming `label` and `text_a`) are the training split, the next --test-docs rows
the evaluation both tools run at the end; they are written to a temporary folder as
train.txt / test.txt, which both read.

Each contender's output is read line by line as it arrives and the lines reporting training
step k are timed (PaddleNLP: "train: global step k, ..."; ours: "step k/N ..."): time to the
first step = step 1's line - launch; seconds per step = (t(step N) - t(step W)) / (N - W)
after W = --warmup steps; tokens/s = batch size x T per step (both pad every row to T); wall
time launch -> exit (each tool's end-of-run work included: both evaluate the test documents,
ours also writes its best model and a resumable checkpoint; after_last_step_s says how long
that took); peak RSS from the child's rusage (os.wait4). With --repeats R the two run
alternately R times each, and the medians are reported, with every run's numbers. The ratio
ours / PaddleNLP is given for each. Prints one JSON object (also written atomically to
--output). Bad arguments: one `error:` line, exit 2; a contender that fails: one `error:` line
naming it, with the tail of its output, and exit 1 (its temporary folder is kept).
"""
import argparse
import collections
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from benchmarks.common import (PACKAGE_PARENT, add_common_arguments, check_output, emit,
                               environment, set_threads)

CONTENDERS = ("paddlenlp", "ours")
FLUSH_MODES = ("ours", "both", "none")
MODEL = "ernie-doc-base-en"
TOKENIZER_FILES = ("vocab.txt", "encoder.json", "vocab.bpe")
REFERENCE_FILES = ("run_classifier.py", "data.py", "metrics.py")
# the log line of training step k: PaddleNLP's logger (colour codes around it), ours
STEP_LINES = {"paddlenlp": re.compile(r"train: global step (\d+),"),
              "ours": re.compile(r"(?:^|\s)step (\d+)/\d+ epoch ")}
LABELS = {"paddlenlp": "PaddleNLP's run_classifier.py", "ours": "ernie-doc finetune"}
TAIL_LINES = 30
MEASURES = ("time_to_first_step_s", "seconds_per_step", "tokens_per_sec", "wall_s",
            "after_last_step_s", "peak_rss_mib")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paddlenlp-dir", required=True, metavar="DIR",
                   help="PaddleNLP's model_zoo/ernie-doc (run_classifier.py, data.py, "
                        "metrics.py)")
    p.add_argument("--data", required=True, metavar="TSV",
                   help="IMDB in the official TSV layout (qid, label, score, text_a)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="the released BPE files: vocab.txt, encoder.json, vocab.bpe")
    p.add_argument("--train-docs", type=int, default=None,
                   help="training documents: the first rows of --data (default: 2 x "
                        "batch size x (steps + 1), enough for the steps)")
    p.add_argument("--test-docs", type=int, default=2,
                   help="documents both evaluate at the end: the rows after those (default 2)")
    p.add_argument("--batch-size", type=int, default=2, help="rows per step (default 2)")
    p.add_argument("--seq-len", type=int, default=512, help="T, tokens per row (default 512)")
    p.add_argument("--memory-len", type=int, default=128, help="memory length (default 128)")
    p.add_argument("--learning-rate", type=float, default=7e-5, help="default 7e-5")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run (default 10)")
    p.add_argument("--warmup", type=int, default=2,
                   help="first steps not in the steady state (default 2; at least 1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each contender, alternating; medians reported (default 1)")
    p.add_argument("--model-overrides", default=None, metavar="JSON",
                   help=f"a JSON/YAML mapping over {MODEL}'s configuration, for both (e.g. a "
                        "tiny shape: {num_hidden_layers: 1, hidden_size: 32, "
                        "num_attention_heads: 2})")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="default cpu")
    p.add_argument("--flush-denormals", choices=FLUSH_MODES, default="ours",
                   help="which contender flushes denormal floats to zero: ours (each as it "
                        "runs by default: ours flushes, PaddleNLP's script does not; the "
                        "default), both (the driver flushes for PaddleNLP too: the same "
                        "numerics), none (ours with flush_denormals=false)")
    add_common_arguments(p)
    for action in p._actions:   # both contenders get the same count, so never paddle's own
        if action.dest == "threads":
            action.help = "CPU threads of each contender (default: every CPU)"
    return p


def parse_model_overrides(p: argparse.ArgumentParser, text: Optional[str]) -> Dict[str, Any]:
    """--model-overrides → a dict of keys that both models' configurations know (PaddleNLP's
    configuration of the released model names them all); p.error otherwise."""
    if text is None:
        return {}
    import yaml

    from ernie_doc.run_config import parse_yaml
    from ernie_doc.utils import clip
    try:
        value = parse_yaml(text)
    except yaml.YAMLError as e:
        p.error(f"--model-overrides: not JSON or YAML ({clip(str(e).splitlines()[0])})")
    if value is None:
        return {}
    if not isinstance(value, dict):
        p.error(f"--model-overrides: expected a mapping, got {clip(repr(text))}")
    if "memory_len" in value:
        p.error("--model-overrides: memory_len is --memory-len")
    from paddlenlp.transformers import ErnieDocModel
    known = ErnieDocModel.pretrained_init_configuration[MODEL]
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        # a key only one side reads would make the two models differ
        p.error(f"--model-overrides: {', '.join(unknown)}: not keys of {MODEL}'s "
                f"configuration (known: {', '.join(sorted(known))})")
    return value


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults filled in, then the checks; p.error (one `error:` line, exit 2) on bad input."""
    script = os.path.join(args.paddlenlp_dir, REFERENCE_FILES[0])
    if not os.path.isfile(script):
        p.error(f"--paddlenlp-dir {args.paddlenlp_dir}: no {REFERENCE_FILES[0]} there (give "
                "PaddleNLP's model_zoo/ernie-doc folder)")
    if not os.path.isfile(args.data):
        p.error(f"--data {args.data}: no such file")
    missing = [n for n in TOKENIZER_FILES if not os.path.isfile(os.path.join(args.tokenizer, n))]
    if missing:
        p.error(f"--tokenizer {args.tokenizer}: no {', '.join(missing)} there")
    for name in ("batch_size", "seq_len", "memory_len", "steps", "test_docs", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seq_len < 3:
        p.error(f"--seq-len must be >= 3 (a window of T - 2 tokens), got {args.seq_len}")
    if not args.learning_rate > 0:
        p.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    if not 1 <= args.warmup < args.steps:
        p.error(f"--warmup must be >= 1 and --steps greater than it, got --warmup "
                f"{args.warmup} --steps {args.steps}")
    if args.train_docs is None:
        args.train_docs = 2 * args.batch_size * (args.steps + 1)
    if args.train_docs < args.batch_size:
        p.error(f"--train-docs must be >= --batch-size ({args.batch_size}): PaddleNLP's batches "
                f"read one document per row, got {args.train_docs}")
    if args.threads is None:
        args.threads = os.cpu_count() or 1
    if args.threads < 1:
        p.error("--threads must be >= 1")
    args.model_overrides = parse_model_overrides(p, args.model_overrides)
    try:   # checked now, not after minutes of the first contender
        args.documents = read_documents(args)
    except UnicodeDecodeError as e:
        p.error(f"--data {args.data}: not UTF-8 text ({e.reason} at byte {e.start})")
    except ValueError as e:
        p.error(str(e))
    check_output(p, args, [args.data, args.tokenizer, args.paddlenlp_dir])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    check_args(p, args)
    return args


class ContenderError(RuntimeError):
    """A contender failed or logged too few steps; the message names it and ends with the tail
    of its output."""


def read_documents(args: argparse.Namespace) -> Tuple[str, List[str]]:
    """--data's header row and its first --train-docs + --test-docs rows (blank lines
    skipped), as they are in the file → (header, rows). ValueError when the header does not
    name label and text_a, or there are too few rows."""
    need = args.train_docs + args.test_docs
    rows = []
    with open(args.data, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\r\n")
        columns = header.split("\t")
        for column in ("label", "text_a"):
            if column not in columns:
                raise ValueError(f"--data {args.data}: its header row has no {column!r} column "
                                 f"(got {columns})")
        for line in f:
            if line.strip():
                rows.append(line.rstrip("\r\n"))
                if len(rows) == need:
                    break
    if len(rows) < need:
        raise ValueError(f"--data {args.data}: {len(rows)} documents, --train-docs + "
                         f"--test-docs need {need}")
    return header, rows


def write_documents(args: argparse.Namespace, data_dir: str) -> None:
    """train.txt (the first --train-docs rows of --data) and test.txt (the next --test-docs),
    each under --data's header row, into data_dir: the files both contenders read."""
    header, rows = args.documents
    os.makedirs(data_dir, exist_ok=True)
    for name, part in (("train", rows[:args.train_docs]), ("test", rows[args.train_docs:])):
        with open(os.path.join(data_dir, f"{name}.txt"), "w", encoding="utf-8") as out:
            out.write("\n".join([header, *part]) + "\n")


def stride(args: argparse.Namespace) -> int:
    """Our window advance: PaddleNLP's windows of T - 2 tokens advance by min(T - 2, M)."""
    return min(args.seq_len - 2, args.memory_len)


def paddlenlp_command(args: argparse.Namespace, data_dir: str, out: str) -> List[str]:
    """The argv that runs PaddleNLP's script through the driver."""
    config = dict(args.model_overrides, memory_len=args.memory_len)
    flush = ["--flush-denormals"] if args.flush_denormals == "both" else []
    return [sys.executable, "-m", "benchmarks.paddlenlp_driver",
            "--script", os.path.abspath(os.path.join(args.paddlenlp_dir, REFERENCE_FILES[0])),
            "--data-dir", data_dir, "--tokenizer", os.path.abspath(args.tokenizer),
            "--model-config", json.dumps(config), "--threads", str(args.threads), *flush, "--",
            "--device", args.device, "--model_name_or_path", MODEL, "--dataset", "imdb",
            "--batch_size", str(args.batch_size), "--max_seq_length", str(args.seq_len),
            "--memory_length", str(args.memory_len), "--learning_rate", repr(args.learning_rate),
            "--epochs", "1", "--max_steps", str(args.steps),
            "--save_steps", str(args.steps + 1), "--logging_steps", "1", "--output_dir", out]


def ours_command(args: argparse.Namespace, data_dir: str, out: str) -> List[str]:
    """The argv that runs `ernie-doc finetune imdb` on the same documents and shape."""
    from ernie_doc.cli import launch_script
    sets = [f"data_dir={data_dir}", f"output_dir={out}", f"model={MODEL}",
            f"tokenizer={os.path.abspath(args.tokenizer)}", f"max_seq_len={args.seq_len}",
            f"stride={stride(args)}", "retro_feed=false", f"batch_size={args.batch_size}",
            f"learning_rate={args.learning_rate!r}", "epochs=1", f"max_steps={args.steps}",
            "max_grad_norm=0", "adam_epsilon=1e-8",   # PaddleNLP's AdamW, whatever the warmup
            f"threads={args.threads}", "logging_steps=1", "progress=false",
            f"device={args.device}", f"model_overrides.memory_len={args.memory_len}",
            f"flush_denormals={str(args.flush_denormals != 'none').lower()}"]
    sets += [f"model_overrides.{k}={json.dumps(v)}" for k, v in args.model_overrides.items()]
    return [sys.executable, launch_script(), "finetune", "imdb", "--set", *sets]


def child_env(threads: int) -> Dict[str, str]:
    """The environment both run in: this package importable, the threads (paddle reads
    OMP_NUM_THREADS at import), and unbuffered output so that each line is timed as it is
    written, not when a buffer fills."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def run_process(cmd: List[str], env: Dict[str, str], cwd: str,
                step_line: "re.Pattern[str]", name: str = "") -> Dict[str, Any]:
    """Run one contender, reading its output (stdout and stderr together) as it comes →
    {returncode, step_s: {k: seconds from launch to the line of step k}, wall_s,
    peak_rss_kib (ru_maxrss of the child, from os.wait4), tail: its last lines}. Each step
    is reported on stderr as it is seen (a base-en step takes tens of seconds on a CPU)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd, text=True, errors="replace", bufsize=1)
    step_s: Dict[int, float] = {}
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    try:
        for line in proc.stdout:
            now = time.perf_counter() - start
            match = step_line.search(line)
            if match and int(match.group(1)) not in step_s:
                step_s[int(match.group(1))] = now
                print(f"[benchmark-finetune] {name}: step {match.group(1)} at {now:.1f} s",
                      file=sys.stderr, flush=True)
            tail.append(line.rstrip("\n"))
    except BaseException:   # Ctrl-C: no contender left training behind the benchmark
        proc.kill()
        proc.wait()
        raise
    proc.stdout.close()
    # wait4 rather than Popen.wait: the child's own resource usage, peak RSS included
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"returncode": proc.returncode, "step_s": step_s, "wall_s": wall,
            "peak_rss_kib": usage.ru_maxrss, "tail": list(tail)}


def measures(run: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    """One run's numbers (see the module's doc) from run_process's result."""
    t, n, w = run["step_s"], args.steps, args.warmup
    per_step = (t[n] - t[w]) / (n - w)
    return {"time_to_first_step_s": round(t[1], 3),
            "seconds_per_step": round(per_step, 5),
            "tokens_per_sec": round(args.batch_size * args.seq_len / max(per_step, 1e-9), 1),
            "wall_s": round(run["wall_s"], 3),
            "after_last_step_s": round(run["wall_s"] - t[n], 3),
            "peak_rss_mib": round(run["peak_rss_kib"] / 1024, 1),
            "steps_logged": len(t)}


def run_contender(name: str, args: argparse.Namespace, data_dir: str,
                  work: str) -> Tuple[Dict[str, Any], List[str]]:
    """One run of contender `name` in its own folder under work → (its measures, its argv).
    ContenderError when it fails or does not log every step up to --steps."""
    folder = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
    out = os.path.join(folder, "output")
    cmd = (paddlenlp_command if name == "paddlenlp" else ours_command)(args, data_dir, out)
    print(f"[benchmark-finetune] {name}: {LABELS[name]}, {args.steps} steps", file=sys.stderr,
          flush=True)
    run = run_process(cmd, child_env(args.threads), folder, STEP_LINES[name], name)
    missing = [k for k in (1, args.warmup, args.steps) if k not in run["step_s"]]
    if run["returncode"] != 0 or missing:
        why = (f"exit {run['returncode']}" if run["returncode"] != 0 else
               f"it logged {len(run['step_s'])} of {args.steps} training steps: too few "
               f"documents for them? (--train-docs {args.train_docs})")
        tail = "\n".join(run["tail"])
        raise ContenderError(f"{name} ({LABELS[name]}) failed ({why}; its files are kept in "
                             f"{folder}); the last lines of its output:\n{tail}")
    numbers = measures(run, args)
    print(f"[benchmark-finetune] {name}: first step after {numbers['time_to_first_step_s']} s, "
          f"{numbers['seconds_per_step']} s/step, {numbers['tokens_per_sec']} tok/s, "
          f"peak RSS {numbers['peak_rss_mib']} MiB", file=sys.stderr, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return numbers, cmd


def median_of(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The median of each measure over runs, with every run's numbers under "runs"."""
    summary = {key: round(statistics.median(r[key] for r in runs), 5) for key in MEASURES}
    summary["runs"] = runs
    return summary


def ratios(ours: Dict[str, Any], reference: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """ours / PaddleNLP for each measure (None where PaddleNLP's is 0)."""
    return {key: (round(ours[key] / reference[key], 3) if reference[key] else None)
            for key in MEASURES}


def setup(args: argparse.Namespace) -> Dict[str, Any]:
    """What both ran and how each number is measured, for the JSON."""
    return {
        "data": args.data, "train_docs": args.train_docs, "test_docs": args.test_docs,
        "model": MODEL, "weights": "random", "model_overrides": args.model_overrides,
        "tokenizer": args.tokenizer, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "memory_len": args.memory_len, "stride_ours": stride(args),
        "learning_rate": args.learning_rate, "steps": args.steps,
        "warmup_steps": args.warmup, "repeats": args.repeats, "device": args.device,
        "flush_denormals": {"ours": args.flush_denormals != "none",
                            "paddlenlp": args.flush_denormals == "both"},
        "threads": args.threads, "paddlenlp_script": os.path.abspath(
            os.path.join(args.paddlenlp_dir, REFERENCE_FILES[0])),
        "tokens_per_step": args.batch_size * args.seq_len,
        "measures": {
            "time_to_first_step_s": "launch -> the log line of step 1",
            "seconds_per_step": "(t(step N) - t(step warmup)) / (N - warmup), log lines' "
                                "arrival times",
            "tokens_per_sec": "batch_size x seq_len / seconds_per_step (both pad rows to T)",
            "wall_s": "launch -> exit, each tool's end-of-run work included",
            "after_last_step_s": "wall_s - t(step N): the final evaluation (both), and ours "
                                 "writing its best model and a checkpoint",
            "peak_rss_mib": "the child's ru_maxrss (os.wait4)",
        },
        "paddlenlp_patches": "see benchmarks/paddlenlp_driver.py: load_dataset, the "
                             "tokenizer's and the model's from_pretrained, nltk's "
                             "sent_tokenize; bs4 when missing, AdamW's lr_ratio on a CPU, "
                             "Accuracy's mask as int64",
    }


def run(args: argparse.Namespace) -> int:
    """Both contenders, --repeats times each, alternating → the exit status."""
    set_threads(args.threads)
    t_total = time.perf_counter()
    result = {"tool": "benchmark-finetune", "setup": setup(args),
              "environment": environment(args)}
    work = tempfile.mkdtemp(prefix="ernie-doc-bench-finetune-")
    data_dir = os.path.join(work, "data")
    write_documents(args, data_dir)
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in CONTENDERS}
    commands: Dict[str, str] = {}
    for _ in range(args.repeats):
        for name in CONTENDERS:
            try:
                numbers, cmd = run_contender(name, args, data_dir, work)
            except ContenderError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            runs[name].append(numbers)
            commands[name] = shlex.join(cmd)
    shutil.rmtree(work, ignore_errors=True)
    result["contenders"] = {name: dict(median_of(runs[name]), command=commands[name])
                            for name in CONTENDERS}
    result["ratio_ours_over_paddlenlp"] = ratios(result["contenders"]["ours"],
                                                 result["contenders"]["paddlenlp"])
    result["total_wall_s"] = round(time.perf_counter() - t_total, 2)
    emit(result, args)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run(parse_args(argv))


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
