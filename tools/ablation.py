"""Train one task config several times with different overrides and tabulate the results.

    python tools/ablation.py tasks/longdep/config.yaml --output-dir OUT \
        --variant none recurrence=none retro_feed=false \
        --variant enhanced+retro retro_feed=true [--jobs 2] [--set key=value ...]

Each variant is a `tools/finetune.py` run in OUT/<variant>/ (`--set` overrides apply to all;
`recurrence=...` is short for `model_overrides.recurrence=...`; `{variant}` in any override is
the variant's name), its output in OUT/<variant>.log. `--variants FILE:SECTION` takes the
variants from a YAML file's mapping SECTION ({name: [key=value, ...]}), e.g. the paper's
ablation rows (configs/ablation.yaml).
While they run, the screen gets one line per evaluation (`[xl] step 624/1872 dev accuracy
0.6140`) and, every --progress-seconds, one line per running variant with its step; this
process alone prints them, a whole line at a time, so variants run at once never mix. At the
end it prints a table of the main metric per variant and writes OUT/results.json ({variant:
metric}). --jobs N runs N variants at once, one CPU thread each; --nproc N launches each
variant data-parallel instead. A variant that finishes writes OUT/<variant>.done.json (its
command, the config file's digest and its time); with --skip-done, a variant whose done file
holds the same command and the same config digest is not run again, so a stopped ablation
continues where it stopped (and an edited config file runs it again). A variant that was
stopped (killed, interrupted) after a checkpoint resumes from it (`--resume`) when it was
started by the same command with the same config digest (OUT/<variant>.started.json), and its
time counts every attempt; one stopped before its first checkpoint, or after its last, or
whose resumed attempt failed (exit status other than a signal's, 130, 143 or 75), starts over.
A done file counts only while the variant's eval_results.json is not newer than it.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from typing import List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ernie_doc.peers import PEER_LOST  # noqa: E402  (no paddle: the constant only)

SHORTHANDS = {"recurrence": "model_overrides.recurrence"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--variant", nargs="+", action="append", default=[],
                   metavar=("NAME", "KEY=VALUE"), help="a name and its overrides")
    p.add_argument("--variants", metavar="FILE:SECTION",
                   help="variants from a YAML file: its mapping SECTION of name: [overrides]")
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE")
    p.add_argument("--metric", help="metric to tabulate (default: the run's main metric)")
    p.add_argument("--jobs", type=int, default=1, help="variants run at once (CPU)")
    p.add_argument("--nproc", type=int, default=1, help="ranks per variant (fleetrun)")
    p.add_argument("--primary", help="variant whose eval_results.json is copied to "
                                     "OUTPUT_DIR (the run.sh contract)")
    p.add_argument("--skip-done", action="store_true",
                   help="do not run again a variant that finished with the same command")
    p.add_argument("--progress-seconds", type=float, default=30.0, metavar="S",
                   help="a line with each running variant's step every S seconds (0: none; "
                        "evaluations are always shown)")
    args = p.parse_args(argv)
    if args.variants:
        try:
            args.variant = variants_from_file(args.variants) + args.variant
        except ValueError as e:
            p.error(f"--variants {args.variants}: {e}")
    if not args.variant:
        p.error("give --variant NAME [KEY=VALUE ...] or --variants FILE:SECTION")
    names = [v[0] for v in args.variant]
    for name in names:   # --variant's too: a name is a folder (and files) in --output-dir
        if not VARIANT_NAME.fullmatch(name):
            p.error(f"--variant {name!r}: a variant's name: letters, digits, _ . + - only")
    if len(set(names)) != len(names):
        p.error(f"variant names must be unique: {names}")
    written = {n + suffix for n in names for suffix in OWN_FILES} | set(RESULT_FILES)
    for name in names:
        if name in written:
            p.error(f"variant name {name!r}: the ablation writes a file of that name in "
                    f"--output-dir")
    if args.jobs < 1 or args.nproc < 1:
        p.error("--jobs and --nproc must be >= 1")
    if not args.progress_seconds >= 0:   # NaN too
        p.error("--progress-seconds must be >= 0")
    if args.primary and args.primary not in names:
        p.error(f"--primary {args.primary}: not a variant ({names})")
    if not os.path.isfile(args.config):
        p.error(f"{args.config}: no such config file")
    for override in args.overrides + [o for v in args.variant for o in v[1:]]:
        if "=" not in override or not override.split("=", 1)[0].strip():
            p.error(f"override {override!r}: expected key=value")
        if override.split("=", 1)[0].strip() == "output_dir":
            p.error(f"override {override!r}: each variant writes to --output-dir/<variant>")
    return args


VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")   # enhanced+retro: longdep's
# What OUT holds beside each variant's folder: <variant> + these, and the tables
OWN_FILES = (".log", ".done.json", ".started.json", ".launch")
RESULT_FILES = ("results.json", "eval_results.json")


def variants_from_file(spec: str) -> List[List[str]]:
    """FILE:SECTION → [[name, override, ...], ...], the file's mapping SECTION in its order;
    ValueError (one line) for a missing file or section or a malformed entry."""
    import yaml
    path, _, section = spec.rpartition(":")
    if not path or not section:
        raise ValueError("expected FILE:SECTION")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(" ".join(str(e).split())) from None
    rows = data.get(section) if isinstance(data, dict) else None
    if not isinstance(rows, dict) or not rows:
        sections = ", ".join(str(k) for k, v in data.items() if isinstance(v, dict)) \
            if isinstance(data, dict) else ""
        raise ValueError(f"no mapping {section!r} of variants (sections: {sections or 'none'})")
    out = []
    for name, overrides in rows.items():
        if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name):
            raise ValueError(f"{section}: variant name {name!r}: letters, digits, _ . + - "
                             f"only")
        if overrides is None:
            overrides = []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ValueError(f"{section}.{name}: expected a list of key=value strings")
        out.append([name] + overrides)
    return out


def variant_error(log_path):
    """The `error:` line a failed variant's tools/finetune.py printed (its log), or None."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.startswith("error: ")]
    except OSError:
        return None
    return lines[-1][len("error: "):] if lines else None


class Progress:
    """What a running variant has done so far, read from the files its run writes in
    OUT/<variant>/ (the trainer's train_log.jsonl: a record per optimizer step;
    eval_history.jsonl: a record per evaluation; train.log: the line that gives the number of
    steps). Only whole lines are read, and only files written since the variant started
    (a previous run's files stay until the new run replaces them)."""

    TOTAL = re.compile(r"training: (?:\d+ epochs, )?(\d+) optimizer steps")

    def __init__(self, name: str, run_dir: str, start: float):
        self.name, self.dir, self.start = name, run_dir, start
        self.offsets = {}   # file name → (inode, bytes read)
        self.step, self.total, self.shown_step = 0, None, 0

    def _new_lines(self, file: str) -> List[str]:
        path = os.path.join(self.dir, file)
        try:
            with open(path, "rb") as f:
                info = os.fstat(f.fileno())
                if info.st_mtime < self.start - 1:   # a previous run's file (1 s: clock grain)
                    return []
                inode, offset = self.offsets.get(file, (info.st_ino, 0))
                if inode != info.st_ino:   # replaced: read the new file from its start
                    offset = 0
                f.seek(offset)
                data = f.read()
        except OSError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self.offsets[file] = (info.st_ino, offset + len(whole))
        return whole.decode("utf-8", "replace").splitlines()

    def _records(self, file: str) -> List[dict]:
        records = []
        for line in self._new_lines(file):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
        return records

    def _at(self, step: int) -> str:
        return f"step {step}/{self.total}" if self.total else f"step {step}"

    def poll(self, metric: Optional[str]) -> List[str]:
        """→ the lines to print for what happened since the last poll: one per evaluation."""
        if self.total is None:
            for line in self._new_lines("train.log"):
                found = self.TOTAL.search(line)
                if found:
                    self.total = int(found.group(1))
        for record in self._records("train_log.jsonl"):
            self.step = max(self.step, record["step"])
        lines = []
        for record in self._records("eval_history.jsonl"):
            names = [metric] if metric in record else [
                k for k, v in record.items() if k not in ("split", "step", "loss")
                and isinstance(v, (int, float)) and not isinstance(v, bool)][:3]
            values = " ".join(f"{k} {record[k]:.4f}" for k in names)
            lines.append(f"[{self.name}] {self._at(record['step'])} {record.get('split', '')} "
                         f"{values}".rstrip())
            self.shown_step = self.step = max(self.step, record["step"])
        return lines

    def heartbeat(self, elapsed: float) -> Optional[str]:
        """→ a line with the step reached, or None when it has not moved since the last line."""
        if self.step == self.shown_step:
            return None
        self.shown_step = self.step
        share = f" ({100 * self.step / self.total:.0f}%)" if self.total else ""
        return f"[{self.name}] {self._at(self.step)}{share}, {elapsed:.0f} s"


def done_file(args, name: str) -> str:
    return os.path.join(args.output_dir, f"{name}.done.json")


def config_digest(path: str) -> str:
    """The config file's content, hashed: the command names the file, not what it holds."""
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def started_file(args, name: str) -> str:
    return os.path.join(args.output_dir, f"{name}.started.json")


def run_record(cmd: List[str], digest: str, seconds: float) -> dict:
    """What a done or started record holds of a run: its command (not the python that ran
    it), the config file's content digest, and its seconds; _same_run reads them back."""
    return {"command": cmd[1:], "config_sha1": digest, "seconds": round(seconds, 1)}


def _same_run(path: str, cmd: List[str], digest: str) -> Optional[dict]:
    """The record in `path` when it holds this very command (not the python that ran it) and
    the config file's content `digest`; else None (absent, unreadable or another run)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    same = (isinstance(record, dict) and record.get("command") == cmd[1:]
            and record.get("config_sha1") == digest)
    return record if same else None


def finished_before(args, name: str, cmd: List[str], digest: str) -> Optional[float]:
    """The seconds a previous run of this very command, with the config file's content
    `digest`, took, when it finished and its eval_results.json is still the one it finished
    with (not newer than its done file: a later run's, cut short, is not); else None."""
    record = _same_run(done_file(args, name), cmd, digest)
    try:
        finished = (os.path.getmtime(os.path.join(args.output_dir, name, "eval_results.json"))
                    <= os.path.getmtime(done_file(args, name)))
        seconds = float(record["seconds"]) if record is not None else None
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return seconds if finished else None


def stopped_before(args, name: str, cmd: List[str],
                   digest: str) -> Optional[Tuple[float, float]]:
    """When a run of this very command (and config content) was started and stopped part-way
    (killed, interrupted) after a checkpoint it can go on from: (when its first attempt
    started, the seconds its attempts took), from its started record; else None (start it
    over). Its checkpoint must be this run's (its run_config.yaml written after the
    run started: an attempt that died before writing one leaves an older run's files),
    complete, and short of the last step (a run stopped after its last checkpoint, in its
    final evaluation or export, runs again), and no resumed attempt of it failed."""
    record = _same_run(started_file(args, name), cmd, digest)
    run_dir = os.path.join(args.output_dir, name)
    try:
        started_at, seconds = float(record["started_at"]), float(record.get("seconds", 0.0))
        # 1 s: file times may be coarser than the clock
        ours = os.path.getmtime(os.path.join(run_dir, "run_config.yaml")) >= started_at - 1
        latest = os.path.realpath(os.path.join(run_dir, "checkpoints", "latest"))
        with open(os.path.join(latest, "trainer_state.json"), encoding="utf-8") as f:
            state = json.load(f)
        short = int(state["step"]) < int(state["total_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None   # no record (or another run's), no checkpoint, or not one we know
    failed = record.get("resume_failed")   # resuming failed once: it would again
    return (started_at, seconds) if ours and short and not failed else None


def write_started(args, name: str, cmd: List[str], digest: str, started_at: float,
                  seconds: float, resume_failed: bool = False) -> None:
    """OUT/<variant>.started.json: what runs in OUT/<variant>, when its first attempt started,
    and the seconds its attempts have taken (rewritten as it runs, so a killed ablation loses
    at most a minute of them); resume_failed: a resumed attempt failed (the next starts over)."""
    from ernie_doc.utils import atomic_write_text
    record = dict(run_record(cmd, digest, seconds), started_at=started_at)
    atomic_write_text(started_file(args, name), json.dumps(
        dict(record, resume_failed=True) if resume_failed else record) + "\n")


# Exit statuses after which a run can go on from its checkpoint: a signal (negative),
# Ctrl-C / SIGTERM (130 / 143) and a lost peer (peers.PEER_LOST). Any other failure of a
# resumed attempt (the data changed, a checkpoint it cannot read) would fail again the same way.
RESUMABLE_EXITS = (130, 143, PEER_LOST)


def expand(override):
    key, _, value = override.partition("=")
    return f"{SHORTHANDS.get(key, key)}={value}"


def command(args, name, overrides):
    script = os.path.join(ROOT, "tools", "finetune.py")
    out = os.path.join(args.output_dir, name)
    sets = [f"output_dir={out}", "overwrite_output_dir=true", "progress=false"]
    sets += [expand(o).replace("{variant}", name) for o in args.overrides + list(overrides)]
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
    running, done, watch, commands = {}, {}, {}, {}
    before = {}   # variant resumed → (when its first attempt started, seconds so far)
    digest = config_digest(args.config)   # what every variant started now reads
    for name, overrides in list(pending) if args.skip_done else []:
        cmd = command(args, name, overrides)
        seconds = finished_before(args, name, cmd, digest)
        if seconds is not None:
            pending.remove((name, overrides))
            done[name] = (0, seconds)
            print(f"[{name}] finished before in {seconds:.0f} s: not run again", flush=True)
            continue
        stopped = stopped_before(args, name, cmd, digest)
        if stopped is not None:
            before[name] = stopped
    from ernie_doc.utils import atomic_write_text
    last_beat = last_record = time.time()
    started_at = {}   # variant → when its first attempt started (its record keeps it)
    while pending or running:
        while pending and len(running) < args.jobs:
            name, overrides = pending.pop(0)
            commands[name] = command(args, name, overrides)
            again = name in before   # its log goes on; the run continues from its checkpoint
            started_at[name], earlier = before[name] if again else (time.time(), 0.0)
            write_started(args, name, commands[name], digest, started_at[name], earlier)
            log = open(os.path.join(args.output_dir, f"{name}.log"), "a" if again else "w")
            print(f"[{name}] " + ("resumed from its last checkpoint" if again else "started")
                  + f": {' '.join(overrides) or '(config as is)'}", flush=True)
            argv = commands[name] + (["--resume", os.path.join(args.output_dir, name)]
                                     if again else [])
            # the caller's directory: OUT and every relative path given resolve as they were meant
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            running[name] = (proc, log, time.time() - earlier)
            watch[name] = Progress(name, os.path.join(args.output_dir, name), time.time())
        time.sleep(0.5)
        for name, (proc, log, start) in list(running.items()):
            finished = proc.poll() is not None   # before reading: its last lines are written
            for line in watch[name].poll(args.metric):
                print(line, flush=True)
            if not finished:
                continue
            log.close()
            del running[name]
            done[name] = (proc.returncode, time.time() - start)
            if name in before and proc.returncode > 0 and proc.returncode not in RESUMABLE_EXITS:
                write_started(args, name, commands[name], digest, started_at[name],
                              done[name][1], resume_failed=True)
            if proc.returncode == 0:
                atomic_write_text(done_file(args, name), json.dumps(
                    run_record(commands[name], digest, done[name][1])) + "\n")
            print(f"[{name}] finished in {done[name][1]:.0f} s (exit {proc.returncode})",
                  flush=True)
        if time.time() - last_record >= 60:
            last_record = time.time()
            for name, (_, _, start) in running.items():
                write_started(args, name, commands[name], digest, started_at[name],
                              last_record - start)
        if args.progress_seconds and time.time() - last_beat >= args.progress_seconds:
            last_beat = time.time()
            for name, (_, _, start) in running.items():
                line = watch[name].heartbeat(last_beat - start)
                if line:
                    print(line, flush=True)
    results, rows = {}, []
    for name, _ in ((v[0], v[1:]) for v in args.variant):
        code, seconds = done[name]
        path = os.path.join(args.output_dir, name, "eval_results.json")
        log_path = os.path.join(args.output_dir, name + ".log")
        if code == 0 and not os.path.isfile(path):
            print(f"error: variant {name} finished (exit 0) but wrote no {path}; "
                  f"log: {log_path}", file=sys.stderr)
            sys.exit(1)
        if code != 0:
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
    atomic_write_text(os.path.join(args.output_dir, "results.json"),
                      json.dumps(results, indent=1) + "\n")
    if args.primary:
        with open(os.path.join(args.output_dir, args.primary, "eval_results.json")) as f:
            atomic_write_text(os.path.join(args.output_dir, "eval_results.json"), f.read())
    print(f"\nwrote {os.path.join(args.output_dir, 'results.json')}")
    return results


if __name__ == "__main__":
    main()
