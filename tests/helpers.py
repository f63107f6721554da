"""What tests share, imported by name (`from helpers import ROOT, tiny_config`): the repository
on sys.path, the ../shared folder when present, tiny configs, file writers, one-line error
checks (and exit statuses, listings of what was written), two-rank launches, a block bounded in
address space and time. The fixtures pytest injects live in conftest.py."""
import contextlib
import json
import os
import resource
import signal
import sys
import zlib  # noqa: F401  before paddle: on 2.6.2 a later scipy/paddlenlp import fails otherwise
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def shared_dir():
    """The shared reference folder (env ERNIE_DOC_SHARED, else ../shared beside the repo)."""
    return Path(os.environ.get("ERNIE_DOC_SHARED", ROOT.parent / "shared"))


def shared_path(*parts):
    """A path under ../shared, or skip the test with the reason."""
    path = shared_dir().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present (set ERNIE_DOC_SHARED to the shared folder)")
    return path


def tiny_config(**overrides):
    from ernie_doc import ErnieDocConfig
    values = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, vocab_size=60,
                  max_position_embeddings=16, memory_len=4)
    values.update(overrides)
    return ErnieDocConfig(**values)


def write(root, files):
    """Write {relative path: str, bytes or JSON-able object} under root; return root."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    return root


def error(call, *parts):
    """Run call(); it must raise a one-line DataError containing every part."""
    from ernie_doc.errors import DataError
    with pytest.raises(DataError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def tiny_longdep(*extra, train_docs=8, segments=2):
    """Config overrides of a seconds-long fine-tuning run on the synthetic longdep task: every
    train document has exactly `segments` segments (so all rows of a batch read in step, and
    every step's rows train or skim together), a 1-layer H=16 model without dropout (the
    comparisons of two runs must not depend on dropout masks), 4 rows, one epoch, no
    warmup, no logging; `extra` overrides come last."""
    return ["task=longdep", "kind=classification", "model=ernie-doc-small",
            "model_overrides={num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2, "
            "memory_len: 8, max_position_embeddings: 8, hidden_dropout_prob: 0.0, "
            "attention_probs_dropout_prob: 0.0, relu_dropout: 0.0, classifier_dropout: 0.0}",
            f"reader={{num_docs: {{train: {train_docs}, dev: 4, test: 4}}, segment_tokens: 6, "
            f"min_segments: {segments}, max_segments: {segments}, key_count: 2}}",
            "max_seq_len=8", "stride=6", "batch_size=4", "epochs=1", "learning_rate=0.01",
            "warmup_proportion=0", "logging_steps=0", "progress=false", *extra]


def launch_two_ranks(tmp_path, args, timeout=300):
    """`fleetrun --nproc_per_node 2 ARGS` (paddle.distributed.launch without fleetrun) from
    the repository root, worker logs in tmp_path/log → (completed process, the tail of every
    worker's log, for assertion messages)."""
    import subprocess
    py = sys.executable
    fleetrun = os.path.join(os.path.dirname(py), "fleetrun")
    launcher = [fleetrun] if os.path.exists(fleetrun) else [py, "-m", "paddle.distributed.launch"]
    log_dir = tmp_path / "log"
    proc = subprocess.run([*launcher, "--nproc_per_node", "2", "--log_dir", str(log_dir),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    logs = "".join((log_dir / name).read_text()[-2000:]
                   for name in sorted(os.listdir(log_dir)) if name.startswith("workerlog")) \
        if log_dir.exists() else ""
    return proc, logs


def free_port():
    """A TCP port free on 127.0.0.1 now (the OS picks it: tests under -n 2 do not collide)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_pids(launcher_pid):
    """{pid: start time} of the processes a launcher started (its workers), from /proc; the
    start time tells a process from a later one given the same pid."""
    pids = {}
    for task in os.listdir(f"/proc/{launcher_pid}/task") \
            if os.path.isdir(f"/proc/{launcher_pid}/task") else []:
        with contextlib.suppress(OSError), open(f"/proc/{launcher_pid}/task/{task}/children") as f:
            pids.update((int(pid), started_at(int(pid))) for pid in f.read().split())
    return pids


def started_at(pid):
    """A process's start time (clock ticks after boot), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def launch_two_nodes(tmp_path, args, kill=None, env=None, timeout=240):
    """Two simulated nodes on this host, as a user launches them: `python -m
    paddle.distributed.launch --nnodes 2 --master 127.0.0.1:PORT --rank R --nproc_per_node 1
    ARGS` for R = 0, 1 from the repository root, node R's logs in tmp_path/node-R; ARGS: a
    list, or R → node R's list. kill: (node, ready): SIGKILL that node's worker once ready()
    holds → [{"status", "output" (launcher), "log" (worker), "exited" (seconds from the kill,
    without one from the first launcher's exit, to its launcher's exit)}] per node."""
    import subprocess
    import time
    port, py = free_port(), sys.executable
    outs = [open(tmp_path / f"node-{r}.out", "w") for r in (0, 1)]
    procs = [subprocess.Popen(
        [py, "-m", "paddle.distributed.launch", "--nnodes", "2", "--master",
         f"127.0.0.1:{port}", "--rank", str(r), "--nproc_per_node", "1", "--log_dir",
         str(tmp_path / f"node-{r}"), *(args(r) if callable(args) else args)], cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=outs[r], stderr=subprocess.STDOUT) for r in (0, 1)]
    started, killed, exited, workers = time.time(), None, [None, None], {}
    try:
        while None in exited and time.time() - started < timeout:
            for r, proc in enumerate(procs):
                workers.update(worker_pids(proc.pid))
                if exited[r] is None and proc.poll() is not None:
                    exited[r] = time.time()
            if kill and killed is None and kill[1]():
                pids = list(worker_pids(procs[kill[0]].pid))
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed = time.time()
            time.sleep(0.05)
    finally:   # nothing outlives the test: the launchers, then their workers (still the same
        # processes: a pid with another start time is someone else's now)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for pid, start in workers.items():
            if start is not None and started_at(pid) == start:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    nodes, since = [], killed if kill else min((t for t in exited if t is not None), default=None)
    for r, proc in enumerate(procs):
        log = tmp_path / f"node-{r}" / "workerlog.0"
        outs[r].close()
        nodes.append({"status": proc.wait(), "output": (tmp_path / f"node-{r}.out").read_text(),
                      "log": log.read_text() if log.exists() else "",
                      "exited": None if since is None or exited[r] is None
                      else exited[r] - since})
    assert None not in exited, f"still running after {timeout} s: {nodes}"
    return nodes


def train_and_dump(out, overrides):
    """Train the run that the config overrides describe (output_dir=out) and write this rank's
    parameters (params-rankR.npz) and final memories (memories-rankR.npy) into out → the
    Trainer. tests/dp_worker.py runs it under two ranks; in one process (world size 1) it is
    the single-process side of `assert_two_ranks_equal_one_process`."""
    from ernie_doc import distributed as dist
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    from ernie_doc.training.trainer import Trainer
    trainer = Trainer(prepare(load_config(None, list(overrides) + [f"output_dir={out}"])))
    trainer.train()
    params = {k: v.numpy() for k, v in trainer.model.state_dict().items()}
    np.savez(os.path.join(out, f"params-rank{dist.rank()}.npz"), **params)
    np.save(os.path.join(out, f"memories-rank{dist.rank()}.npy"), trainer.last_memories)
    return trainer


def assert_two_ranks_equal_one_process(dp, single):
    """dp_worker.py outputs of two ranks (dp) and of one process on the union of their rows
    (single): the ranks hold identical parameters, equal to the single process's, and their
    memories are its rows 0..B−1 and B..2B−1 → the two train logs (lists of records)."""
    p0, p1 = np.load(dp / "params-rank0.npz"), np.load(dp / "params-rank1.npz")
    ps = np.load(single / "params-rank0.npz")
    assert sorted(p0.files) == sorted(p1.files) == sorted(ps.files) and len(p0.files) > 5
    for k in p0.files:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
        np.testing.assert_allclose(p0[k], ps[k], rtol=1e-4, atol=2e-6, err_msg=k)
    m0, m1 = np.load(dp / "memories-rank0.npy"), np.load(dp / "memories-rank1.npy")
    ms = np.load(single / "memories-rank0.npy")
    np.testing.assert_allclose(np.concatenate([m0, m1], axis=1), ms, rtol=1e-4, atol=1e-5)
    logs = []
    for run in (dp, single):
        with open(run / "train_log.jsonl") as f:
            logs.append([json.loads(line) for line in f])
    return logs


def write_wikitext(path, lines, seed, words=40, unseen=0, periods=0.0):
    """WikiText-like token lines at `path`: headings and blank lines, and paragraphs of 5..30
    words with a learnable pattern (w_i often followed by w_{i+1}); `unseen` words only this
    file has (→ <unk>); `periods`: the chance of a "." after a word."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(lines):
        if i % 7 == 0:
            out += [f" = Heading {i} = ", ""]
            continue
        n, w = int(rng.integers(5, 30)), int(rng.integers(words))
        toks = []
        for _ in range(n):
            w = (w + 1) % words if rng.random() < 0.7 else int(rng.integers(words))
            toks.append(f"w{w}")
            if periods and rng.random() < periods:
                toks.append(".")
        if unseen and rng.random() < 0.3:
            toks.append(f"new{int(rng.integers(unseen))}")
        out.append(" " + " ".join(toks) + " . ")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def saved_lm(root, name, recurrence, vocab, tgt=8, scale=0.3, **config):
    """A saved language model (seeded numpy weights, the same for every recurrence) whose
    task.json gives the eval protocol tgt_len `tgt` (8), memory 2·tgt, same_length, 2 rows;
    `config`: TransformerXLConfig keys over the tiny defaults (2 layers of width 16, one
    softmax cluster); every weight drawn from N(0, scale²)."""
    from ernie_doc.lm.model import TransformerXLConfig, TransformerXLLM
    folder = root / name
    values = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                  vocab_size=len(vocab), cutoffs=[], tgt_len=tgt, mem_len=tgt,
                  recurrence=recurrence)
    model = TransformerXLLM(TransformerXLConfig(**dict(values, **config)))
    rng = np.random.RandomState(0)
    for p in model.parameters():
        p.set_value((rng.standard_normal(p.shape) * scale).astype("float32"))
    model.save_pretrained(str(folder))
    vocab.save(folder / "vocab.txt")
    (folder / "task.json").write_text(json.dumps({
        "format": 1, "task": "wikitext103", "kind": "language_model", "labels": [],
        "config": {"task": "wikitext103", "kind": "language_model", "max_steps": 1,
                   "batch_size": 2, "test_splits": ["test"],
                   "task_options": {"eval_tgt_len": tgt, "eval_mem_len": 2 * tgt,
                                    "eval_same_length": True}}}))
    return folder


def tiny_classifier(root, *extra):
    """A saved IMDB classifier trained for one step in-process (about 2 s): a tiny model
    (1 layer, H=16, max_seq_len 16) over a 20-token WordPiece vocabulary, → the run's
    OUTPUT_DIR (its best/ holds task.json, config, weights and vocab.txt). For tests of
    predict and the pipeline that need a real saved model, not a good one; share it through
    a module-scoped fixture. `extra`: config overrides (key=value)."""
    from test_tasks import COMMON, WORDS, imdb_tsv, vocab_dir

    from ernie_doc.cli import finetune
    root.mkdir(parents=True, exist_ok=True)
    out = root / "run"
    finetune.main(["imdb", "--set", f"data_dir={imdb_tsv(root)}", f"output_dir={out}",
                   f"tokenizer={vocab_dir(root / 'vocab', WORDS)}", *COMMON, "max_steps=1",
                   "eval_splits=[test]", *extra])
    assert (out / "best" / "task.json").is_file()
    return out


def tiny_export(best, prefix):
    """`ernie-doc export` of a saved classifier's best/ (sequence classification head,
    dynamic batch) at `prefix`, in-process → the export's folder (its sidecar
    <prefix>.meta.json, task.json and the tokenizer beside it)."""
    from ernie_doc.cli import export
    assert export.main(["--config", str(best), "--head", "sequence_classification",
                        "--output", str(prefix)]) == 0
    return prefix.parent


def in_process(command, argv, expect=0):
    """A tool's command(argv), what its script runs, in this process with stdout and stderr
    captured (paddle's import, about 2 s of CPU, is paid once per test process instead of once
    per launch) → (returncode, stdout, stderr) as a finished subprocess has them; the status
    must be `expect`. For tests of what a tool does; a test of a script's or run.sh's own
    wiring launches it."""
    import contextlib
    import io
    from types import SimpleNamespace
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = command(list(argv))
        except SystemExit as e:
            code = e.code
    proc = SimpleNamespace(returncode=code or 0, stdout=stdout.getvalue(),
                           stderr=stderr.getvalue())
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def one_error_line(capsys, *parts):
    """stderr is exactly one `error:` line (after argparse's usage block, if any) holding
    every part → that line."""
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    if err and err[0].startswith("usage:"):
        err = [line for line in err if ": error: " in line]
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("error: ") or ": error: " in line, line
    assert "Traceback" not in line
    for part in parts:
        assert part in line, (part, line)
    return line


def exits(code, call):
    with pytest.raises(SystemExit) as info:
        call()
    assert info.value.code == code
    return info.value


def listing(path):
    """Every path under `path` (to show nothing was written)."""
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(path) for n in dirs + files)


# -- the shared message shapes (ernie_doc.utils) ------------------------------------------------


HEADROOM = 3 << 30   # bytes of address space a command may add to what the process holds
SECONDS = 30         # far above a decision (milliseconds; ~2 s with a subprocess's imports)


def address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


@contextlib.contextmanager
def deadline(seconds: int, message: str = ""):
    """The block must end within `seconds`: a TimeoutError (`message`, else one naming the
    time) turns a hang into a failure (no pytest-timeout here)."""
    def fail(*_):
        raise TimeoutError(message or f"still running after {seconds} s: an endless loop?")
    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def bounded(seconds: int = SECONDS):
    """The block runs with HEADROOM more address space than the process holds and must end
    within `seconds` (TimeoutError otherwise); the limits are restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = address_space() + HEADROOM
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        with deadline(seconds, f"no decision in {seconds} s"):
            yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
