"""Ctrl-C (SIGINT) and SIGTERM sent to a real fine-tuning run: it stops at the end of the step
under way with a resumable checkpoint of that step, prints one line naming the step and the
command that resumes it, exits 130 / 143, and --resume then ends exactly where the
uninterrupted run ends. A second Ctrl-C during the checkpoint write does not tear it; a run
that stopped before any checkpoint says how to start over."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import ROOT, tiny_longdep

PY = sys.executable
# a seconds-long run of some 30 optimizer steps: a signal sent once step 2 is logged lands
# long before the end, even on a fast machine
ARGS = tiny_longdep(train_docs=32)
CLI = [PY, "-m", "ernie_doc.cli", "finetune"]

# the CLI with a second Ctrl-C delivered in the middle of the interrupt's checkpoint write
# (after its model file, before the rest): it must wait for the write to finish
SECOND_CTRL_C = r"""
import os, signal, sys, warnings
sys.path.insert(0, {root!r})
warnings.filterwarnings("ignore", message="No ccache found")   # as the CLI does
from ernie_doc.training import state
real = state._save_tensors
def save(path, arrays, *args, **kwargs):
    real(path, arrays, *args, **kwargs)
    if path.endswith("model.safetensors"):
        os.kill(os.getpid(), signal.SIGINT)
state._save_tensors = save
from ernie_doc.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _latest(out):
    return os.path.realpath(os.path.join(out, "checkpoints", "latest"))


def _start(cmd, out, log):
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.PIPE,
                            text=True)


def _logged_steps(out):
    try:
        with open(os.path.join(out, "train_log.jsonl")) as f:
            return sum(1 for line in f if line.endswith("\n"))
    except FileNotFoundError:
        return 0


def _signal_after_steps(procs, steps=2, timeout=240):
    """Send each (process, output_dir, signal) its signal once the run has logged `steps`
    optimizer steps (train_log.jsonl, polled; one line per step)."""
    waiting, deadline = list(procs), time.monotonic() + timeout
    while waiting:
        for item in list(waiting):
            proc, out, signum = item
            if _logged_steps(out) >= steps:
                proc.send_signal(signum)
                waiting.remove(item)
            elif proc.poll() is not None:
                raise AssertionError(f"{out}: ended ({proc.returncode}) before step {steps}: "
                                     + proc.stderr.read()[-2000:])
        assert time.monotonic() < deadline, "no step logged in time"
        time.sleep(0.01)


def _wait(proc):
    _, err = proc.communicate(timeout=240)
    return proc.returncode, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run, a run stopped by SIGINT (a second one during its checkpoint
    write) and one stopped by SIGTERM, then both resumed; all started side by side →
    {name: {out, code, err, resumed_code, resumed_err}}, plus "nockpt": a copy of the SIGINT
    run as it stood, without its checkpoints (a run stopped before its first)."""
    root = tmp_path_factory.mktemp("interrupt")
    script = root / "second_ctrl_c.py"
    script.write_text(SECOND_CTRL_C.format(root=str(ROOT)))
    runs = {name: {"out": str(root / name)} for name in ("full", "sigint", "sigterm")}
    cmds = {"full": CLI, "sigint": [PY, str(script), "finetune"], "sigterm": CLI}
    procs = {name: _start(cmds[name] + ["--set", *ARGS, f"output_dir={r['out']}"], r["out"],
                          root / f"{name}.log")
             for name, r in runs.items()}
    _signal_after_steps([(procs["sigint"], runs["sigint"]["out"], signal.SIGINT),
                         (procs["sigterm"], runs["sigterm"]["out"], signal.SIGTERM)])
    for name, proc in procs.items():
        runs[name]["code"], runs[name]["err"] = _wait(proc)
    assert runs["full"]["code"] == 0, runs["full"]["err"][-2000:]
    for name in ("sigint", "sigterm"):   # the checkpoint as the signal left it
        run = runs[name]
        run["latest"], run["state"], run["tmp"] = _latest(run["out"]), None, None
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(run["latest"], "trainer_state.json")) as f:
                run["state"] = json.load(f)
            run["tmp"] = [n for n in os.listdir(os.path.dirname(run["latest"])) if "tmp" in n]
    nockpt = root / "nockpt"
    shutil.copytree(runs["sigint"]["out"], nockpt, symlinks=True)
    shutil.rmtree(nockpt / "checkpoints", ignore_errors=True)
    runs["nockpt"] = {"out": str(nockpt)}
    resumed = {name: _start(CLI + ["--resume", runs[name]["out"]], runs[name]["out"],
                            root / f"{name}-resumed.log") for name in ("sigint", "sigterm")}
    for name, proc in resumed.items():
        runs[name]["resumed_code"], runs[name]["resumed_err"] = _wait(proc)
    return runs


def _weights(out):
    from safetensors.numpy import load_file
    return load_file(os.path.join(_latest(out), "model.safetensors"))


@pytest.mark.parametrize("name, status", [("sigint", 130), ("sigterm", 143)])
def test_a_signal_saves_the_step_and_prints_one_line(runs, name, status):
    run = runs[name]
    assert run["code"] == status, run["err"][-3000:]
    lines = [line for line in run["err"].splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in run["err"], run["err"][-3000:]
    match = re.fullmatch(r"interrupted at step (\d+): resume with ernie-doc finetune "
                         r"--resume (\S+)", lines[0])
    assert match and match.group(2) == run["out"], lines[0]
    step = int(match.group(1))
    # the step the signal found under way, saved whole (a second Ctrl-C came mid-write)
    assert step >= 2
    assert run["latest"] == os.path.join(run["out"], "checkpoints", f"step-{step}")
    assert run["state"] and run["state"]["step"] == step < run["state"]["total_steps"]
    assert run["tmp"] == []


@pytest.mark.parametrize("name", ["sigint", "sigterm"])
def test_resume_after_a_signal_equals_the_uninterrupted_run(runs, name):
    run, full = runs[name], runs["full"]
    assert run["resumed_code"] == 0, run["resumed_err"][-3000:]
    a, b = _weights(full["out"]), _weights(run["out"])
    assert sorted(a) == sorted(b) and len(a) > 5
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    logs = []
    for out in (full["out"], run["out"]):
        with open(os.path.join(out, "train_log.jsonl")) as f:
            logs.append([(r["step"], r.get("loss"), r["lr"]) for r in map(json.loads, f)])
    assert logs[0] == logs[1]
    results = [open(os.path.join(out, "eval_results.json")).read()
               for out in (full["out"], run["out"])]
    assert results[0] == results[1]


def _one_line(capsys, *parts):
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    for part in parts:
        assert part in err[0], (part, err[0])
    return err[0]


def test_a_run_without_a_checkpoint_says_how_to_start_over(runs, capsys):
    """Re-running the same command, or --resume, on a run that stopped before its first
    checkpoint: one line saying there is nothing to resume and how to start over; doing
    so works."""
    from ernie_doc.cli import main
    out = runs["nockpt"]["out"]
    with pytest.raises(SystemExit) as info:
        main(["finetune", "--set", *ARGS, f"output_dir={out}"])
    assert info.value.code == 2
    line = _one_line(capsys, out, "saved no checkpoint", "--set overwrite_output_dir=true")
    assert "--resume" not in line
    with pytest.raises(SystemExit) as info:
        main(["finetune", "--resume", out])
    assert info.value.code == 2
    _one_line(capsys, out, "nothing to resume", "--set overwrite_output_dir=true")
    assert main(["finetune", "--set", *ARGS, f"output_dir={out}",   # a step is enough
                 "overwrite_output_dir=true", "stop_at_step=1"]) == 0
    assert _latest(out) == os.path.join(out, "checkpoints", "step-1")


@pytest.mark.parametrize("debug", [False, True])
def test_the_line_and_the_traceback_under_debug(tmp_path, capsys, monkeypatch, debug):
    """The one line and 128 + the signal; --debug adds the traceback."""
    from ernie_doc.cli import main
    from ernie_doc.training import trainer

    def interrupted(cfg, resume=False):
        raise trainer.Interrupted(signal.SIGTERM, cfg.output_dir, None)

    monkeypatch.setattr(trainer, "run", interrupted)
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit) as info:
        main(["finetune", "--set", *ARGS, f"output_dir={out}"] + ["--debug"] * debug)
    assert info.value.code == 143
    err = capsys.readouterr().err
    assert ("Traceback" in err) == debug, err
    assert err.splitlines()[-1] == ("interrupted before the first step: nothing was "
                                    "written; run the same command again"), err


def test_stop_signals_defer_the_first_and_hold_writes():
    """While training, the first signal is recorded; the same one again aborts, the other
    one (a launcher forwarding what the terminal sent) does not; during a write, nothing
    aborts until it ends."""
    from ernie_doc.training.trainer import Interrupted, StopSignals
    signals = StopSignals()
    before = signal.getsignal(signal.SIGINT)
    with signals.installed():
        with pytest.raises(Interrupted):   # not training: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        signals.defer = True
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert signals.signum == signal.SIGINT
        written = []
        with pytest.raises(Interrupted) as info:
            with signals.writing():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                written.append(True)   # the write went on to its end
        assert written and info.value.status == 130
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_to_a_two_rank_run_saves_every_rank(tmp_path):
    """`ernie-doc finetune --nproc 2` sent SIGTERM: the launcher stops both ranks, which
    agree on the step; rank 0 writes one whole checkpoint (both ranks' memories) and its
    line is repeated on the command's stderr; exit 143; nothing left running."""
    out = str(tmp_path / "run")
    env = dict(os.environ, LAUNCH_LOG_DIR=str(tmp_path / "log"))
    proc = subprocess.Popen(CLI + ["--nproc", "2", "--set", *ARGS, f"output_dir={out}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        _signal_after_steps([(proc, out, signal.SIGTERM)])
        code, err = _wait(proc)
    finally:   # the ranks too, whatever happened
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 143, err[-3000:]
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(r"interrupted at step (\d+): resume with ernie-doc finetune "
                         r"--resume (\S+) --nproc 2", last)
    assert match and match.group(2) == out, err[-3000:]
    latest = _latest(out)
    assert latest == os.path.join(out, "checkpoints", f"step-{match.group(1)}")
    assert {"trainer_state.json", "model.safetensors", "rank-0.npz", "rank-1.npz"} <= \
        set(os.listdir(latest))


# -- the line a signal prints, from what is on disk (no training) ------------------------


def test_ctrl_c_while_importing_is_one_line(monkeypatch, capsys):
    """Ctrl-C in the seconds a command spends importing paddle: one line saying nothing was
    written, exit 130, for the `ernie-doc` command and the tools/ scripts alike."""
    import importlib

    from ernie_doc import cli

    def slow_import(name, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", slow_import)
    try:
        code = cli.main(["export", "--help"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C while importing: a traceback")
    assert code == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted before anything was written: run the same command again"]

    def command(argv):   # a tool whose own imports are interrupted (finetune, predict)
        with cli.nothing_written_yet():
            raise KeyboardInterrupt

    assert cli.run_command(command, []) == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted before anything was written: run the same command again"]


def test_a_signal_after_run_config_is_written_says_so(tmp_path, capsys, monkeypatch):
    """Interrupted while preparing, once run_config.yaml is written: the same command would
    be refused, so the line says how to start over, not "nothing was written"."""
    from ernie_doc.cli import main
    from ernie_doc.training import prepare, trainer

    def interrupted(cfg, *args):
        with open(os.path.join(cfg.output_dir, prepare.RUN_CONFIG), "w") as f:
            f.write("task: longdep\n")
        raise trainer.Interrupted(signal.SIGINT)

    monkeypatch.setattr(prepare, "_prepare_locked", interrupted)
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit) as info:
        main(["finetune", "--set", *ARGS, f"output_dir={out}"])
    assert info.value.code == 130
    _one_line(capsys, "before any checkpoint: nothing to resume",
              "--set overwrite_output_dir=true")


def _best_only(out, step=8):
    """OUTPUT_DIR as a second Ctrl-C during the final evaluation leaves it: run_config.yaml
    and the best model of the last step, no resumable checkpoint."""
    os.makedirs(os.path.join(out, "checkpoints", f"best-step-{step}"))
    os.symlink(f"checkpoints/best-step-{step}", os.path.join(out, "best"))
    with open(os.path.join(out, "run_config.yaml"), "w") as f:
        f.write("task: longdep\n")


@pytest.mark.parametrize("finished", [True, False])
def test_the_line_never_advises_deleting_a_trained_model(tmp_path, finished):
    """A best model on disk and nothing to resume: the line names it and how to evaluate it;
    overwrite_output_dir (which would delete it) is never advised."""
    from ernie_doc.training.trainer import Interrupted
    out = str(tmp_path / "run")
    _best_only(out)
    e = Interrupted(signal.SIGINT, out, 8)
    e.finished = finished
    line = e.message("ernie-doc finetune")
    assert "overwrite_output_dir" not in line, line
    assert os.path.join(out, "best") in line and "eval_only=true" in line, line
    assert f"init_checkpoint={os.path.join(out, 'best')}" in line, line


def test_the_resume_line_works_from_any_directory(tmp_path, monkeypatch):
    """A relative OUTPUT_DIR ("-run", which would read as an option) is shown absolute."""
    from ernie_doc.training.trainer import Interrupted
    monkeypatch.chdir(tmp_path)
    os.makedirs("-run/checkpoints/step-3")
    os.symlink("step-3", "-run/checkpoints/latest")
    with open("-run/checkpoints/step-3/trainer_state.json", "w") as f:
        f.write("{}")
    line = Interrupted(signal.SIGINT, "-run", 3).message("ernie-doc finetune")
    assert line.endswith(f"resume with ernie-doc finetune --resume {tmp_path / '-run'}"), line
    # two ranks on one node: --nproc relaunches them; on two nodes each node launches its
    # own part, so the line says what the lost-peer line says (ernie_doc.peers)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "2")
    line = Interrupted(signal.SIGINT, "-run", 3).message("ernie-doc finetune")
    assert line.endswith(f"--resume {tmp_path / '-run'} --nproc 2"), line
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "1")
    line = Interrupted(signal.SIGINT, "-run", 3).message("ernie-doc finetune")
    assert line.endswith(f"resume with --resume {tmp_path / '-run'} on every node"), line


# a stand-in for paddle's launcher: announces itself, then on SIGINT says what rank 0 would
# (or, "finished", nothing: the run ended anyway) and exits; waits 20 s for a signal
FAKE_LAUNCHER = r"""
import os, signal, sys, time
log_dir, mode = sys.argv[1], sys.argv[2]
def stop(signum, frame):
    if mode == "interrupted":
        with open(os.path.join(log_dir, "workerlog.0"), "a") as f:
            f.write("interrupted at step 3: resume with ernie-doc finetune --resume X\n")
    with open(os.path.join(log_dir, "warnings"), "w") as f:   # what the ranks inherit
        f.write(os.environ.get("PYTHONWARNINGS", ""))
    sys.exit(2 if mode == "interrupted" else 0)
signal.signal(signal.SIGINT, stop)
open(os.path.join(log_dir, "ready"), "w").close()
time.sleep(20)
"""

RUN_LAUNCHER = r"""
import sys
from ernie_doc.cli import run_launcher
log_dir, mode = sys.argv[1], sys.argv[2]
sys.exit(run_launcher([sys.executable, "-c", {code!r}, log_dir, mode], {{}}, log_dir))
"""


@pytest.mark.parametrize("mode,status", [("interrupted", 130), ("finished", 0)])
def test_sigint_to_the_parent_reaches_the_launcher(tmp_path, mode, status):
    """`kill -INT` to `ernie-doc finetune --nproc N` itself (not its process group): the
    launcher gets it, once; the exit status is the run's (130 with rank 0's line when it was
    interrupted, 0 with no line when it finished anyway)."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    proc = subprocess.Popen([PY, "-c", RUN_LAUNCHER.format(code=FAKE_LAUNCHER), str(log_dir),
                             mode], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (log_dir / "ready").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    said = [line for line in err.splitlines() if line.strip()]
    assert said == (["interrupted at step 3: resume with ernie-doc finetune --resume X"]
                    if mode == "interrupted" else []), err
    # paddle's ccache warning is filtered in the ranks too (the parent filters its own)
    assert (log_dir / "warnings").read_text().endswith("ignore:No ccache found")
