"""Train one task config several times with different overrides and tabulate the results.

    python tools/ablation.py tasks/longdep/config.yaml --output-dir OUT \
        --variant none recurrence=none retro_feed=false \
        --variant enhanced+retro retro_feed=true [--jobs 2] [--set key=value ...]

Each variant is a `tools/finetune.py` run in OUT/<variant>/ (`--set` overrides apply to all;
`recurrence=...` is short for `model_overrides.recurrence=...`). Prints a table of the main
metric per variant and writes OUT/results.json ({variant: metric}). --jobs N runs N variants
at once, one CPU thread each; --nproc N launches each variant data-parallel instead.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHORTHANDS = {"recurrence": "model_overrides.recurrence"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--variant", nargs="+", action="append", required=True,
                   metavar=("NAME", "KEY=VALUE"), help="a name and its overrides")
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE")
    p.add_argument("--metric", help="metric to tabulate (default: the run's main metric)")
    p.add_argument("--jobs", type=int, default=1, help="variants run at once (CPU)")
    p.add_argument("--nproc", type=int, default=1, help="ranks per variant (fleetrun)")
    p.add_argument("--primary", help="variant whose eval_results.json is copied to "
                                     "OUTPUT_DIR (the run.sh contract)")
    args = p.parse_args(argv)
    names = [v[0] for v in args.variant]
    if len(set(names)) != len(names):
        p.error(f"variant names must be unique: {names}")
    if args.jobs < 1 or args.nproc < 1:
        p.error("--jobs and --nproc must be >= 1")
    if args.primary and args.primary not in names:
        p.error(f"--primary {args.primary}: not a variant ({names})")
    if not os.path.isfile(args.config):
        p.error(f"{args.config}: no such config file")
    for override in args.overrides + [o for v in args.variant for o in v[1:]]:
        if "=" not in override or not override.split("=", 1)[0].strip():
            p.error(f"override {override!r}: expected key=value")
    return args


def variant_error(log_path):
    """The `error:` line a failed variant's tools/finetune.py printed (its log), or None."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.startswith("error: ")]
    except OSError:
        return None
    return lines[-1][len("error: "):] if lines else None


def expand(override):
    key, _, value = override.partition("=")
    return f"{SHORTHANDS.get(key, key)}={value}"


def command(args, name, overrides):
    script = os.path.join(ROOT, "tools", "finetune.py")
    out = os.path.join(args.output_dir, name)
    sets = [f"output_dir={out}", "overwrite_output_dir=true", "progress=false"]
    sets += [expand(o) for o in args.overrides + list(overrides)]
    launcher = [sys.executable]
    if args.nproc > 1:
        launcher += ["-m", "paddle.distributed.launch", "--nproc_per_node", str(args.nproc),
                     "--log_dir", os.path.join(args.output_dir, f"{name}.launch")]
    return launcher + [script, args.config, "--set"] + sets


def main(argv=None):
    args = parse_args(argv)
    from ernie_doc.utils import write_error_types, write_failure
    try:
        return _run(args)
    except write_error_types() as e:   # OUT cannot be created or written (full, read-only)
        message = write_failure(e, args.output_dir, "--output-dir")
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _run(args):
    os.makedirs(args.output_dir, exist_ok=True)
    env = dict(os.environ)
    if args.jobs > 1:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pending = [(v[0], v[1:]) for v in args.variant]
    running, done = {}, {}
    while pending or running:
        while pending and len(running) < args.jobs:
            name, overrides = pending.pop(0)
            log = open(os.path.join(args.output_dir, f"{name}.log"), "w")
            print(f"[{name}] started: {' '.join(overrides) or '(config as is)'}", flush=True)
            proc = subprocess.Popen(command(args, name, overrides), cwd=ROOT, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            running[name] = (proc, log, time.time())
        time.sleep(0.5)
        for name, (proc, log, start) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            done[name] = (proc.returncode, time.time() - start)
            print(f"[{name}] finished in {done[name][1]:.0f} s (exit {proc.returncode})",
                  flush=True)
    results, rows = {}, []
    for name, _ in ((v[0], v[1:]) for v in args.variant):
        code, seconds = done[name]
        path = os.path.join(args.output_dir, name, "eval_results.json")
        if code != 0 or not os.path.isfile(path):
            log_path = os.path.join(args.output_dir, name + ".log")
            reason = variant_error(log_path)
            print(f"error: variant {name} failed (exit {code})"
                  + (f": {reason}" if reason else "") + f"; log: {log_path}", file=sys.stderr)
            sys.exit(2 if code == 2 else 1)
        with open(path, encoding="utf-8") as f:
            metrics = json.load(f)
        metric = args.metric or metrics["main_metric"]
        results[name] = metrics[metric]
        rows.append((name, metrics[metric], metrics["step"], seconds))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'variant':<{width}}  {metric:>9}  best step  seconds")
    for name, value, step, seconds in rows:
        print(f"{name:<{width}}  {value:9.4f}  {step:9d}  {seconds:7.0f}")
    from ernie_doc.utils import atomic_write_text
    atomic_write_text(os.path.join(args.output_dir, "results.json"),
                      json.dumps(results, indent=1) + "\n")
    if args.primary:
        with open(os.path.join(args.output_dir, args.primary, "eval_results.json")) as f:
            atomic_write_text(os.path.join(args.output_dir, "eval_results.json"), f.read())
    print(f"\nwrote {os.path.join(args.output_dir, 'results.json')}")
    return results


if __name__ == "__main__":
    main()
