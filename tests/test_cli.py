"""The installed `ernie-doc` command: subcommands, --version, --nproc relaunch, task names,
the package as it installs (task folders included), the matplotlib guard, packaging files."""
import errno
import json
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import ROOT, exits, listing, one_error_line, tiny_config

import ernie_doc
from ernie_doc import cli
from ernie_doc.errors import DataError
from ernie_doc.utils import atomic_write_text, write_failure


def run_cli(*argv, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "ernie_doc.cli", *argv], capture_output=True,
                          text=True, cwd=cwd or ROOT, env=env, timeout=120)


USER_COMMANDS = ("finetune", "pretrain", "predict", "explain", "context", "export", "convert",
                 "download", "train-tokenizer", "run-document", "plan")


def test_help_version_and_unknown_command():
    proc = run_cli("--help")
    assert proc.returncode == 0
    # the user commands, exactly: the benchmarks run from a checkout (tools/benchmark_*.py)
    listed = re.findall(r"^  ([a-z][a-z-]*) +\S", proc.stdout, re.M)
    assert sorted(listed) == sorted(USER_COMMANDS) == sorted(cli.COMMANDS)
    assert run_cli("--version").stdout.strip() == f"ernie-doc {ernie_doc.__version__}"
    proc = run_cli("fine-tune")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: unknown command 'fine-tune'; choose one of "
                                   "finetune, pretrain, export, convert, train-tokenizer, "
                                   "run-document, predict, explain, context, download, plan")


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_has_its_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([name, "--help"])
    assert e.value.code == 0
    assert f"usage: ernie-doc {name}" in capsys.readouterr().out


def test_nproc_relaunches_through_paddles_launcher():
    assert cli.split_nproc(["cfg.yaml", "--nproc", "4", "--set", "a=1"]) == \
        (4, ["cfg.yaml", "--set", "a=1"])
    assert cli.split_nproc(["--nproc=2", "x"]) == (2, ["x"])
    assert cli.split_nproc(["x"]) == (1, ["x"])
    for bad in (["--nproc", "0"], ["--nproc"], ["--nproc", "two"]):
        with pytest.raises(ValueError, match="--nproc: must be a positive integer"):
            cli.split_nproc(bad)
    cmd = cli.launch_command("pretrain", 2, ["--config", "c.yaml"], log_dir="log/x")
    assert cmd == [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                   "--log_dir", "log/x", cli.launch_script(), "pretrain", "--config", "c.yaml"]
    assert cli.launch_script().endswith(os.path.join("ernie_doc", "cli", "__main__.py"))
    # the launched script runs the command from a file path, like fleetrun does
    proc = subprocess.run([sys.executable, cli.launch_script(), "--version"], cwd="/",
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.strip() == f"ernie-doc {ernie_doc.__version__}", proc.stderr
    proc = run_cli("finetune", "--nproc", "x")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --nproc")


def test_a_task_name_is_its_config(capsys):
    from ernie_doc.cli.finetune import config_path
    assert config_path("imdb") == str(ROOT / "tasks" / "imdb" / "config.yaml")
    assert config_path("no/such.yaml") == "no/such.yaml"   # a path: the config file's error
    assert cli.main(["finetune", "--list-tasks"]) == 0
    listed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    assert list(listed)[:3] == ["c3", "cail2019_scm", "cmrc2018"]
    assert len([name for name in listed if ":" not in name]) == 14


def test_a_tasks_other_configs_are_named_task_colon_variant(capsys):
    """A wheel has no run.sh (SIZE=large, STAGE=answer): `ernie-doc finetune imdb:large` is
    the packaged config_large.yaml; --list-tasks lists each variant under its task."""
    from ernie_doc.cli.finetune import config_path
    from ernie_doc.kinds.folders import named_config, task_config
    tasks = ROOT / "tasks"
    assert config_path("imdb:large") == str(tasks / "imdb" / "config_large.yaml")
    assert config_path("hotpotqa:answer_large") == str(tasks / "hotpotqa" /
                                                       "config_answer_large.yaml")
    for name in ("imdb:", "imdb:huge", "imdb:large.yaml", "nosuch:large", ":large", "c3:large"):
        assert named_config(name) is None, name
    assert task_config("imdb:large") is None   # predict's task names stay the folders
    assert cli.main(["finetune", "--list-tasks"]) == 0
    listed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    large = {f"{t}:large" for t in ("imdb", "hyp", "triviaqa", "hotpotqa", "wikitext103")}
    assert {n for n in listed if n.endswith(":large")} == large
    assert list(listed)[list(listed).index("hotpotqa"):][:4] == [
        "hotpotqa", "hotpotqa:answer", "hotpotqa:answer_large", "hotpotqa:large"]
    assert all(listed[name] == config_path(name) for name in listed)


def test_a_task_name_never_reaches_outside_the_task_folders(tmp_path, monkeypatch):
    """A config_x.yaml (or config.yaml) that is a symlink out of the task folders, or a
    folder, is no config: `imdb:evil` must not read /etc/passwd; --list-tasks omits them."""
    from ernie_doc.kinds import folders
    root = tmp_path / "tasks"
    (root / "imdb" / "config_dir.yaml").mkdir(parents=True)
    (root / "imdb" / "config.yaml").write_text("task: imdb\n")
    (root / "imdb" / "config_large.yaml").write_text("task: imdb\n")
    (tmp_path / "outside.yaml").write_text("task: imdb\n")
    (root / "imdb" / "config_evil.yaml").symlink_to(tmp_path / "outside.yaml")
    (root / "imdb" / "config_same.yaml").symlink_to(root / "imdb" / "config_large.yaml")
    (root / "away").mkdir()
    (root / "away" / "config.yaml").symlink_to(tmp_path / "outside.yaml")
    monkeypatch.setattr(folders, "_tasks_folder", lambda: str(root))
    assert folders.named_config("imdb:large") == str(root / "imdb" / "config_large.yaml")
    assert folders.named_config("imdb:same") == str(root / "imdb" / "config_same.yaml")
    for name in ("imdb:evil", "imdb:dir", "away"):
        assert folders.named_config(name) is None, name
    assert folders.task_names() == ["imdb"]
    assert folders.task_variants("imdb") == ["imdb:large", "imdb:same"]


@pytest.mark.parametrize("name, hint", [("imbd", " (did you mean 'imdb'?)"),
                                        ("hotpot_qa", " (did you mean 'hotpotqa'?)"),
                                        ("IMDB", " (did you mean 'imdb'?)"),   # had no hint
                                        ("Imbd", " (did you mean 'imdb'?)"),   # had no hint
                                        ("zzzz", ""),
                                        ("imdb:larg", " (did you mean 'imdb:large'?)")])
def test_a_misspelt_task_is_one_line_naming_the_nearest(tmp_path, name, hint):
    """`ernie-doc finetune imbd`: neither a file nor a task; one line, the nearest task (when
    one is near) and where the tasks are listed, before paddle's import (a stand-in that
    fails if imported); nothing written."""
    (tmp_path / "fake" / "paddle").mkdir(parents=True)
    (tmp_path / "fake" / "paddle" / "__init__.py").write_text("raise ImportError('imported')\n")
    (tmp_path / "run").mkdir()
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'fake'}{os.pathsep}{ROOT}")
    proc = run_cli("finetune", name, "--set", "output_dir=out", cwd=tmp_path / "run", env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr == (f"error: {name}: no such config file, nor a task{hint}; "
                           f"ernie-doc finetune --list-tasks lists the tasks\n")
    assert os.listdir(tmp_path / "run") == []


def test_a_tools_script_without_paddle_is_one_line(tmp_path):
    """run.sh's PYTHON without paddle: tools/finetune.py says which package to install, in one
    line, exit 2, and writes nothing (it was a ModuleNotFoundError traceback)."""
    (tmp_path / "fake" / "paddle").mkdir(parents=True)
    (tmp_path / "fake" / "paddle" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'paddle'\", name='paddle')\n")
    (tmp_path / "run").mkdir()
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "finetune.py"),
                           str(ROOT / "tasks" / "imdb" / "config.yaml"), "--set",
                           f"data_dir={tmp_path}", "output_dir=out"], cwd=tmp_path / "run",
                          env=env, capture_output=True, text=True, timeout=60)
    from ernie_doc.cli import PADDLE_MISSING
    assert (proc.returncode, proc.stderr) == (2, f"error: {PADDLE_MISSING}\n"), proc.stderr
    assert os.listdir(tmp_path / "run") == []


@pytest.mark.parametrize("script", [["-m", "ernie_doc.cli", "finetune"],
                                    [str(ROOT / "tools" / "finetune.py")]])
def test_a_reader_that_leaves_ends_the_listing_quietly(script):
    """`... --list-tasks | head -1`: the reader closes the pipe after one line; the command
    ends with 0 and no traceback (tools/*.py printed a BrokenPipeError's)."""
    proc = subprocess.Popen([sys.executable, *script, "--list-tasks"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    first = proc.stdout.readline()
    proc.stdout.close()   # head -1 leaves
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and first.startswith(b"c3") and err == "", err


def test_a_data_folder_named_like_the_task_does_not_shadow_it(tmp_path, monkeypatch):
    # a user keeping the data in ./imdb runs `ernie-doc finetune imdb --set data_dir=imdb`
    from ernie_doc.cli.finetune import config_path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imdb").mkdir()
    (tmp_path / "mine.yaml").write_text("task: imdb\n")
    assert config_path("imdb") == str(ROOT / "tasks" / "imdb" / "config.yaml")
    assert config_path("mine.yaml") == "mine.yaml"      # a file is always the config


def test_the_installed_package_brings_the_task_folders(tmp_path):
    """setup.py's layout, built into a folder (what pip installs), imported from elsewhere:
    the task readers, configs and registered kinds come from there, not the checkout."""
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                           str(target)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for path in ("ernie_doc/cli/__main__.py", "ernie_doc/hub/cache.py",
                 "ernie_doc_tasks/__init__.py", "ernie_doc_tasks/imdb/config.yaml",
                 "ernie_doc_tasks/hotpotqa/config_answer.yaml", "ernie_doc_tasks/README.md",
                 "ernie_doc_tasks/imdb/config_large.yaml"):
        assert (target / path).is_file(), path
    assert not (target / "tasks").exists()   # no generic top-level package
    code = ("import importlib, ernie_doc_tasks.imdb.reader as r\n"
            "from ernie_doc.kinds import base as t, folders\n"
            "print(folders.task_package())\n"
            "print(t.load_reader('imdb').__file__)\n"
            "print(importlib.import_module(folders.task_package() + '.hotpotqa.task').__file__)\n"
            "print(folders.task_config('c3'))\n"
            "print(folders.named_config('imdb:large'))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(target)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split()
    assert lines[0] == "ernie_doc_tasks"
    for line in lines[1:]:
        assert line.startswith(str(target)), line
    proc = subprocess.run([sys.executable, "-m", "ernie_doc.cli", "--version"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(target)))
    assert proc.stdout.strip() == f"ernie-doc {ernie_doc.__version__}"


def test_curves_without_matplotlib(tmp_path, monkeypatch, caplog):
    from ernie_doc.training import runlog as run_logging
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib fails
    monkeypatch.setattr(run_logging, "_WARNED_NO_MATPLOTLIB", False)
    (tmp_path / "train_log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with caplog.at_level("WARNING", logger="ernie_doc.train"):
        run_logging.plot_curves(str(tmp_path), "accuracy")
        run_logging.plot_curves(str(tmp_path), "accuracy")
    warnings = [r.message for r in caplog.records if "matplotlib" in r.message]
    assert warnings == ["matplotlib is not installed: curves.png not drawn (pip install "
                        "matplotlib)"]
    assert not (tmp_path / "curves.png").exists()


def test_packaging_files_agree_on_the_version():
    source = (ROOT / "ernie_doc" / "_version.py").read_text()
    version = re.search(r'__version__ = "([^"]+)"', source).group(1)
    assert version == ernie_doc.__version__
    cff = (ROOT / "CITATION.cff").read_text()
    assert f'\nversion: "{version}"\n' in cff
    assert 'doi: "10.18653/v1/2021.acl-long.227"' in cff
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    setup = (ROOT / "setup.py").read_text()
    assert '"ernie-doc=ernie_doc.cli:main"' in setup and 'license="Apache-2.0"' in setup


# Issue 13 §6 at the command line: every bad argument or input, and every output that cannot
# be written (full disk, read-only filesystem, a file where a directory should be), is one
# `error:` line, exit status 2 and nothing written; --debug shows the traceback; a genuine bug
# keeps its traceback; a train_log.jsonl cut short by a full disk does not stop --resume.
#
# Tools are called in-process (main(argv), stderr through capsys); one subprocess fills a real
# tmpfs, where root may mount one.


TINY = [
    "task=longdep", "model=ernie-doc-small",
    "model_overrides={num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2, "
    "memory_len: 8, max_position_embeddings: 16}",
    "reader={num_docs: {train: 8, dev: 4}, segment_tokens: 14, max_segments: 2}",
    "max_seq_len=16", "stride=14", "batch_size=4", "epochs=1", "logging_steps=0",
    "progress=false",
]
ENOSPC = "No space left on device"


def test_write_failure_message_shapes(tmp_path):
    out = str(tmp_path / "out")
    assert write_failure(OSError(errno.ENOSPC, ENOSPC), out) == f"{out}: cannot write ({ENOSPC})"
    assert write_failure(OSError(errno.EROFS, "Read-only file system", out), out) == \
        f"output_dir {out}: cannot create it (Read-only file system)"
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert write_failure(OSError(errno.ENOTDIR, "Not a directory", str(afile)),
                         str(afile / "out")) == \
        f"output_dir {afile / 'out'}: {afile}: is a file, not a directory"
    inside = os.path.join(out, "train_log.jsonl")
    assert write_failure(OSError(errno.EISDIR, "Is a directory", inside), out) == \
        f"{inside}: Is a directory"
    # a file of ours that vanished, or any other exception, is not a write failure: the
    # caller re-raises it and the traceback stays
    assert write_failure(FileNotFoundError(errno.ENOENT, "No such file", inside), out) is None
    assert write_failure(KeyError("step"), out) is None


def test_atomic_write_names_the_target_and_leaves_nothing(tmp_path):
    from ernie_doc.utils import atomic_path
    target = tmp_path / "results.json"
    with pytest.raises(OSError) as info:
        with atomic_path(target) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise OSError(errno.ENOSPC, ENOSPC)   # what a full disk raises, without a name
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert os.listdir(tmp_path) == []


# -- tools/finetune.py: output that cannot be written -----------------------------------------


def finetune(*argv):
    from tools.finetune import main
    return main(list(argv))


def test_output_dir_under_a_file_is_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    out = afile / "out"
    exits(2, lambda: finetune("--set", *TINY, f"output_dir={out}"))
    one_error_line(capsys, str(out), "Not a directory")
    assert afile.read_text() == "mine" and listing(tmp_path) == [str(afile)]


@pytest.mark.parametrize("raised, message", [
    (OSError(errno.ENOSPC, ENOSPC), "{out}: cannot write (" + ENOSPC + ")"),
    (OSError(errno.EROFS, "Read-only file system", "{out}/checkpoints/step-2.tmp/x"),
     "{out}/checkpoints/step-2.tmp/x: cannot write (Read-only file system)"),
    ("safetensors", "{out}: cannot write (" + ENOSPC + ")"),
])
def test_failed_checkpoint_write_is_one_line(tmp_path, capsys, monkeypatch, raised, message):
    """A full disk or read-only filesystem under a checkpoint save (paddle, numpy and
    safetensors raise without naming the file): one line naming OUTPUT_DIR, exit 2."""
    from ernie_doc.training import state as checkpoint
    out = tmp_path / "run"
    if raised == "safetensors":
        import safetensors
        raised = safetensors.SafetensorError(
            f"Error while serializing: I/O error: {ENOSPC} (os error 28)")
    elif raised.filename:
        raised = OSError(raised.errno, raised.strerror, raised.filename.format(out=out))

    def full(*args, **kwargs):
        raise raised
    monkeypatch.setattr(checkpoint, "save_training_state", full)
    exits(2, lambda: finetune("--set", *TINY, f"output_dir={out}", "save_steps=1"))
    one_error_line(capsys, message.format(out=out))


def test_debug_shows_the_traceback_and_a_bug_keeps_it(tmp_path, monkeypatch):
    from ernie_doc.training import state as checkpoint

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, ENOSPC)
    monkeypatch.setattr(checkpoint, "save_training_state", full)
    with pytest.raises(OSError, match=ENOSPC):
        finetune("--set", *TINY, f"output_dir={tmp_path / 'a'}", "save_steps=1", "--debug")

    def vanished(*args, **kwargs):   # a file of the run missing: a bug, not the disk
        raise FileNotFoundError(errno.ENOENT, "No such file or directory",
                                str(tmp_path / "b" / "checkpoints" / "latest"))
    monkeypatch.setattr(checkpoint, "save_training_state", vanished)
    with pytest.raises(FileNotFoundError):
        finetune("--set", *TINY, f"output_dir={tmp_path / 'b'}", "save_steps=1")

    def bug(*args, **kwargs):
        raise KeyError("step")
    monkeypatch.setattr(checkpoint, "save_training_state", bug)
    with pytest.raises(KeyError):
        finetune("--set", *TINY, f"output_dir={tmp_path / 'c'}", "save_steps=1")


def _can_mount_tmpfs(path):
    if os.geteuid() != 0:
        return False
    path.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(path)],
                        capture_output=True).returncode == 0
    return ok


def test_a_real_full_disk_is_one_line(tmp_path):
    """OUTPUT_DIR on a 12 KiB tmpfs: the run fills it; no traceback, no logging error block,
    no 'Exception ignored' echo from files closed later."""
    mnt = tmp_path / "mnt"
    if not _can_mount_tmpfs(mnt):
        pytest.skip("needs root and a mountable tmpfs")
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "finetune.py"), "--set",
                               *TINY, f"output_dir={mnt / 'out'}", "save_steps=1"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(err) == 1 and err[0].startswith("error: ") and str(mnt / "out") in err[0] \
        and f"cannot write ({ENOSPC})" in err[0], proc.stderr[-3000:]


# -- train_log.jsonl cut short by a full disk ----------------------------------------------------
@pytest.fixture
def stopped_run(tmp_path):
    """A run stopped at step 2 (checkpoint saved), resumable."""
    out = tmp_path / "run"
    finetune("--set", *TINY, f"output_dir={out}", "save_steps=1", "stop_at_step=2")
    return out


def test_resume_drops_a_cut_short_last_line(stopped_run, capsys):
    log = stopped_run / "train_log.jsonl"
    whole = log.read_text()
    assert [json.loads(line)["step"] for line in whole.splitlines()] == [1, 2]
    log.write_text(whole + '{"epoch": 1, "lo')          # the write a full disk cut short
    capsys.readouterr()
    finetune("--resume", str(stopped_run))
    out = capsys.readouterr()
    warned = [line.split(" ", 1)[1] for line in out.out.splitlines() if "dropped" in line]
    assert warned == [f"{log}:3: dropped the last line, cut short by an interrupted write: "
                      "'{\"epoch\": 1, \"lo'"]
    assert warned[0] in (stopped_run / "train.log").read_text()          # logged, too
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > 2   # resumed and finished


@pytest.mark.parametrize("content, where, problem", [
    ('{"step": 1}\n{not json\n{"step": 2}\n', ":2:", "invalid JSON"),
    (b'{"step": 1}\n\xff\xfe\n{"step": 2}\n', ":2:", "invalid UTF-8"),
    ('{"loss": 1.0}\n{"step": 2}\n', ":1:", "no integer 'step'"),
])
def test_damage_before_the_last_line_is_an_error(stopped_run, capsys, content, where, problem):
    log = stopped_run / "train_log.jsonl"
    if isinstance(content, bytes):
        log.write_bytes(content)
    else:
        log.write_text(content)
    before = log.read_bytes()
    exits(2, lambda: finetune("--resume", str(stopped_run)))
    one_error_line(capsys, f"{log}{where} {problem}")
    assert log.read_bytes() == before


def test_read_jsonl_rules(tmp_path):
    from ernie_doc.training.runlog import read_jsonl
    path = tmp_path / "eval_history.jsonl"
    path.write_text('{"split": "dev", "step": 1}\n\n{"split": "dev", "st')
    assert read_jsonl(path) == [{"split": "dev", "step": 1}]
    path.write_text('{"split": "dev", "step": 1}\n[1, 2]\n')   # complete, but not a record
    with pytest.raises(DataError, match=r"eval_history.jsonl:2: a JSON list, not an object"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "none.jsonl") == []
    # --resume can check both logs before it writes anything
    from ernie_doc.training.runlog import check_run_logs
    (tmp_path / "train_log.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')
    path.write_text('{"split": "dev", "step": 1}\n')
    check_run_logs(tmp_path)                                   # a cut-short last line is fine
    (tmp_path / "train_log.jsonl").write_text('{"step": 1}\n{"step"\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"train_log.jsonl:2: invalid JSON"):
        check_run_logs(tmp_path)


# -- tools/run_document.py -----------------------------------------------------------------------
def run_document(*argv):
    from tools.run_document import main
    return main(list(argv))


@pytest.fixture
def files(tmp_path):
    """tiny config, a vocab dir, text files of every kind (good, empty, not UTF-8)."""
    cfg = tmp_path / "tiny.json"
    tiny_config(max_position_embeddings=8).to_json(cfg)
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\ngood\nbad\n")
    (tmp_path / "doc.txt").write_text("good bad good\n")
    (tmp_path / "empty.txt").write_text(" \n\n")
    (tmp_path / "latin1.txt").write_bytes(b"good\nb\xe4d\n")
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "adir").mkdir()
    return tmp_path


@pytest.mark.parametrize("argv, parts", [
    (["--tokens", "0"], ["--tokens must be in [1, 10,000,000], got 0"]),
    (["--tokens", "-1"], ["--tokens must be in [1, 10,000,000], got -1"]),
    (["--seq-len", "0"], ["--seq-len must be a positive integer, got 0"]),
    (["--seed", "-1"], ["--seed must be in [0, 2^32), got -1"]),
    (["--tokens", "x"], ["argument --tokens: invalid int value: 'x'"]),
    (["--output", "{d}/adir"], ["--output {d}/adir: is a directory; give a file name"]),
])
def test_run_document_argument_shape(files, capsys, argv, parts):
    argv = [a.format(d=files) for a in argv]
    exits(2, lambda: run_document(*argv))
    one_error_line(capsys, *[p.format(d=files) for p in parts])


@pytest.mark.parametrize("argv, parts", [
    (["--text", "{d}/missing.txt", "--tokenizer", "{d}/vocab"],
     ["--text {d}/missing.txt: No such file or directory"]),
    (["--text", "{d}/adir", "--tokenizer", "{d}/vocab"],
     ["--text {d}/adir: is a directory, not a text file"]),
    (["--text", "{d}/doc.txt"], ["--text needs --tokenizer DIR"]),
    (["--text", "{d}/doc.txt", "--tokenizer", "{d}/nowhere"],
     ["--tokenizer {d}/nowhere: no such file or directory"]),
    (["--output", "{d}/afile/summary.json"],
     ["--output {d}/afile/summary.json: {d}/afile is a file, not a directory"]),
    (["--model", "{d}/tiny.json", "--text", "{d}/empty.txt", "--tokenizer", "{d}/vocab"],
     ["--text {d}/empty.txt: the file holds no text"]),
    (["--model", "{d}/tiny.json", "--text", "{d}/latin1.txt", "--tokenizer", "{d}/vocab"],
     ["{d}/latin1.txt:2: invalid UTF-8"]),
    (["--model", "{d}/tiny.json", "--text", "{d}/doc.txt", "--tokenizer", "{d}/adir"],
     ["--tokenizer {d}/adir: no tokenizer files in {d}/adir"]),
    (["--model", "{d}/tiny.json", "--seq-len", "64", "--tokens", "20"],
     ["--seq-len 64 exceeds the model's max_position_embeddings 8"]),
    (["--model", "{d}/nowhere.json"], ["'{d}/nowhere.json'"]),
    (["--model", "{d}/afile"], ["{d}/afile:1: invalid JSON"]),
    (["--model", "{d}/adir"], ["{d}/adir: no ERNIE-Doc checkpoint found"]),
])
def test_run_document_bad_files(files, capsys, argv, parts):
    argv = [a.format(d=files) for a in argv]
    if "--output" not in argv:
        argv += ["--output", str(files / "summary.json")]
    before = listing(files)
    exits(2, lambda: run_document(*argv))
    one_error_line(capsys, *[p.format(d=files) for p in parts])
    assert listing(files) == before


@pytest.mark.parametrize("output, parts", [
    ("doc.txt", ["--output {d}/doc.txt: is the input {d}/doc.txt (the same file)"]),
    ("vocab/vocab.txt", ["--output {d}/vocab/vocab.txt: inside the input folder {d}/vocab"]),
    ("fifo", ["--output {d}/fifo: is a FIFO, not a regular file"]),
])
def test_run_document_output_follows_the_output_rule(files, capsys, output, parts):
    """--output is refused, untouched, when it is an input, inside one or a FIFO (it was
    replaced: the --text read, a FIFO made a file, /dev/null as root made a file)."""
    os.mkfifo(files / "fifo")
    before = listing(files)
    exits(2, lambda: run_document("--model", str(files / "tiny.json"), "--text",
                                  str(files / "doc.txt"), "--tokenizer", str(files / "vocab"),
                                  "--output", str(files / output)))
    one_error_line(capsys, *[p.format(d=files) for p in parts])
    assert listing(files) == before


def test_run_document_writes_its_summary(files):
    summary = run_document("--model", str(files / "tiny.json"), "--text",
                           str(files / "doc.txt"), "--tokenizer", str(files / "vocab"),
                           "--output", str(files / "out" / "summary.json"))
    assert summary["tokens"] == 3 and summary["segments"] == 1 and summary["seq_len"] == 8
    assert json.loads((files / "out" / "summary.json").read_text()) == summary


def test_run_document_debug_shows_the_traceback(files):
    from ernie_doc.errors import ConfigError
    with pytest.raises(ConfigError):
        run_document("--model", str(files / "afile"), "--debug")


# -- tools/export_model.py -----------------------------------------------------------------------
def export_model(*argv):
    import importlib.util
    spec = importlib.util.spec_from_file_location("export_model",
                                                  ROOT / "tools" / "export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.main(list(argv))


@pytest.mark.parametrize("argv, parts", [
    (["--head", "sequence_classification", "--num-labels", "0"],
     ["--num-labels must be in [1, 1,000,000], got 0"]),
    (["--head", "sequence_classification", "--num-labels", "100000000000"],
     ["--num-labels must be in [1, 1,000,000]"]),
    (["--batch-size", "0"], ["--batch-size must be a positive integer or 'dynamic', got 0"]),
    (["--seq-len", "-1"], ["--seq-len must be a positive integer, got -1"]),
    (["--head", "multiple_choice", "--num-choices", "3", "--batch-size", "4"],
     ["--batch-size 4 must be a multiple of --num-choices 3"]),
    (["--seq-len", "64"], ["--seq-len 64 exceeds the model's max_position_embeddings 8"]),
    (["--output", "{d}/adir"], ["--output {d}/adir: give a file prefix"]),
    (["--output", "{d}/afile/m"], ["--output {d}/afile: is a file, not a directory"]),
    (["--config", "{d}/afile"], ["{d}/afile:1: invalid JSON"]),
    (["--config", "{d}/adir"], ["{d}/adir: no ERNIE-Doc checkpoint found"]),
])
def test_export_model_bad_input(files, capsys, argv, parts):
    argv = [a.format(d=files) for a in argv]
    if "--config" not in argv:
        argv += ["--config", str(files / "tiny.json")]
    if "--output" not in argv:
        argv += ["--output", str(files / "out" / "m")]
    before = listing(files)
    exits(2, lambda: export_model(*argv))
    one_error_line(capsys, *[p.format(d=files) for p in parts])
    assert listing(files) == before


def test_export_model_full_disk_leaves_nothing(files, capsys, monkeypatch):
    """paddle.jit.save on a full disk raises without a file name: the line names the export
    prefix, and no file of the export (nor its temporary directory) is left."""
    import paddle

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, ENOSPC)
    monkeypatch.setattr(paddle.jit, "save", full)
    (files / "out").mkdir()
    exits(2, lambda: export_model("--config", str(files / "tiny.json"), "--output",
                                  str(files / "out" / "m"), "--seq-len", "8"))
    one_error_line(capsys, f"{files / 'out' / 'm'}: cannot write ({ENOSPC})")
    assert os.listdir(files / "out") == []


# -- Predictor on a bad export directory ---------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from ernie_doc import ErnieDocModel
    from ernie_doc.predict.export import export
    model = ErnieDocModel(tiny_config(max_position_embeddings=8))
    d = tmp_path_factory.mktemp("export")
    info = export(model, str(d / "m"), seq_len=8)
    return d, info


def damaged_copy(exported, tmp_path, **edits):
    """A copy of the export with files replaced: {file name: bytes / dict / None (removed)}."""
    import shutil
    src, info = exported
    dst = tmp_path / "export"
    shutil.copytree(src, dst)
    for name, content in edits.items():
        name = name.replace("MODEL", os.path.basename(info["model_path"]))
        if content is None:
            os.remove(dst / name)
        elif isinstance(content, bytes):
            (dst / name).write_bytes(content)
        else:
            (dst / name).write_text(json.dumps(content))
    return dst


@pytest.mark.parametrize("edits, parts", [
    ({"m.meta.json": b"{"}, ["m.meta.json:1: invalid JSON"]),
    ({"m.meta.json": [1]}, ["m.meta.json: expected a JSON object, got list"]),
    ({"m.meta.json": b"\xff\xfe"}, ["m.meta.json:1: invalid UTF-8"]),
    ({"m.meta.json": {"format_version": 1}},
     ["m.meta.json: model_file: expected a file name inside the export's directory, got "
      "'<missing>'"]),
    ({"m.meta.json": {"format_version": 99}}, ["m.meta.json: unsupported export format 99"]),
    ({"MODEL": None}, ["MODEL: the program file is missing (named by"]),
    ({"m.pdiparams": b""}, ["m.pdiparams: the parameters file is empty"]),
    ({"m.pdiparams": b"garbage"}, ["m.pdiparams: not a LoDTensor file"]),
])
def test_predictor_bad_export_is_one_line(exported, tmp_path, edits, parts):
    from ernie_doc.errors import ExportError
    from ernie_doc.predict.engine import Predictor
    dst = damaged_copy(exported, tmp_path, **edits)
    model_file = os.path.basename(exported[1]["model_path"])
    with pytest.raises(ExportError) as info:
        Predictor(str(dst / "m"))
    message = str(info.value)
    assert "\n" not in message and str(dst) in message
    for part in parts:
        assert part.replace("MODEL", model_file) in message, message


def test_predictor_refuses_a_file_outside_the_export(exported, tmp_path):
    from ernie_doc.errors import ExportError
    from ernie_doc.predict.engine import Predictor
    meta = json.loads((exported[0] / "m.meta.json").read_text())
    dst = damaged_copy(exported, tmp_path,
                       **{"m.meta.json": dict(meta, model_file="../../../etc/passwd")})
    with pytest.raises(ExportError, match=r"m.meta.json: model_file: expected a file name "
                                          r"inside the export's directory, got "
                                          r"'\.\./\.\./\.\./etc/passwd'"):
        Predictor(str(dst / "m"))
    with pytest.raises(ExportError, match=r"no exported model at .*nowhere"):
        Predictor(str(tmp_path / "nowhere"))


# -- tools/benchmark_model.py and tools/ablation.py ---------------------------------------------
def test_benchmark_quick_keeps_what_the_command_line_gave(capsys):
    from tools.benchmark_model import main, parse_args
    args = parse_args(["--quick", "--seq-len", "64"])
    assert args.seq_len == 64 and args.preset == "ernie-doc-small" and args.batch_size == 2
    assert main(["--quick", "--preset", "bogus", "--no-paddlenlp"]) == 2
    one_error_line(capsys, "--preset bogus: unknown preset 'bogus'")


def test_ablation_skips_only_a_variant_that_finished_with_the_same_command(tmp_path):
    from tools.ablation import command, config_digest, finished_before, parse_args
    config = tmp_path / "config.yaml"
    config.write_text(open(os.path.join(ROOT, "tasks", "longdep", "config.yaml")).read())
    args = parse_args([str(config), "--output-dir", str(tmp_path), "--skip-done",
                       "--variant", "a", "seed=1"])
    cmd, digest = command(args, "a", ["seed=1"]), config_digest(str(config))
    assert finished_before(args, "a", cmd, digest) is None   # never ran
    atomic_write_text(tmp_path / "a.done.json", json.dumps(
        {"command": cmd[1:], "config_sha1": digest, "seconds": 7}))
    assert finished_before(args, "a", cmd, digest) is None   # its results are gone
    atomic_write_text(tmp_path / "a" / "eval_results.json", "{}")
    # results newer than the done file: a later run of the variant, cut short, wrote them
    assert finished_before(args, "a", cmd, digest) is None
    time.sleep(0.05)
    atomic_write_text(tmp_path / "a.done.json", json.dumps(
        {"command": cmd[1:], "config_sha1": digest, "seconds": 7}))
    assert finished_before(args, "a", cmd, digest) == 7.0
    assert finished_before(args, "a", command(args, "a", ["seed=2"]), digest) is None
    # the same command, but the config file it names was edited since: run again
    config.write_text(config.read_text() + "epochs: 9\n")
    assert finished_before(args, "a", cmd, config_digest(str(config))) is None
    # a done file without the config's digest decides nothing
    atomic_write_text(tmp_path / "a.done.json", json.dumps({"command": cmd[1:], "seconds": 7}))
    assert finished_before(args, "a", cmd, config_digest(str(config))) is None
    atomic_write_text(tmp_path / "a.done.json", "{trunc")
    assert finished_before(args, "a", cmd, digest) is None


TINY_LONGDEP = ["epochs=1", "reader.num_docs={train: 64, dev: 16}", "save_steps=1",
                "model_overrides.hidden_size=16", "logging_steps=1"]


def test_ablation_resumes_a_variant_killed_after_a_checkpoint(tmp_path, capsys):
    """The ablation killed while its variant writes checkpoint step-3 (step-2 complete): run
    again with --skip-done, the variant continues from step 2, with its log kept and its
    earlier attempt's time counted, and ends as a run that was never stopped."""
    import signal

    from ernie_doc.training.state import TEST_PAUSE
    from tools.ablation import (command, config_digest, main, parse_args, stopped_before,
                                write_started)
    config = os.path.join(ROOT, "tasks", "longdep", "config.yaml")
    argv = [config, "--skip-done", "--progress-seconds", "0", "--variant", "a", "seed=3",
            "--set"] + TINY_LONGDEP
    whole = main(["--output-dir", str(tmp_path / "whole")] + argv)
    out = tmp_path / "cut"
    args = parse_args(["--output-dir", str(out)] + argv)
    cmd, digest = command(args, "a", ["seed=3"]), config_digest(config)
    assert stopped_before(args, "a", cmd, digest) is None   # never started
    proc = subprocess.Popen([sys.executable, "tools/ablation.py", "--output-dir", str(out)]
                            + argv, cwd=ROOT, env=dict(os.environ, **{TEST_PAUSE: "3"}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (out / "a" / "checkpoints" / "step-3.tmp").exists():
            assert proc.poll() is None and time.time() < deadline, "never reached step 3"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the ablation and its variant, as a reboot would
        proc.wait()
    assert not (out / "a.done.json").exists()
    assert stopped_before(args, "a", cmd, digest) is not None
    assert stopped_before(args, "a", command(args, "a", ["seed=4"]), digest) is None
    assert stopped_before(args, "a", cmd, "0" * 40) is None   # the config file was edited
    # the record as the ablation rewrites it every minute: after the run's run_config.yaml,
    # with the same first start
    record = json.loads((out / "a.started.json").read_text())
    time.sleep(0.05)
    write_started(args, "a", cmd, digest, record["started_at"], 100.0)
    assert stopped_before(args, "a", cmd, digest) == (record["started_at"], 100.0)
    first = (out / "a.log").read_text()
    capsys.readouterr()
    assert main(["--output-dir", str(out)] + argv) == whole
    assert "[a] resumed from its last checkpoint: seed=3" in capsys.readouterr().out
    log = (out / "a.log").read_text()
    assert log.startswith(first) and "resumed from" in log[len(first):]
    assert "step-2: step 2" in log[len(first):]
    done = json.loads((out / "a.done.json").read_text())
    assert done["command"] == cmd[1:] and done["seconds"] >= 100.0

    def steps(run):
        return [r["step"] for r in map(json.loads, open(tmp_path / run / "a" / "train_log.jsonl"))
                if "loss" in r]
    assert steps("cut") == steps("whole")


def test_ablation_starts_over_after_a_resume_that_failed(tmp_path, capsys):
    """A resumed attempt that fails (here: its checkpoint's step count no longer matches the
    run's) marks the record; the next run starts the variant over instead of failing again."""
    from tools.ablation import command, config_digest, main, parse_args
    config = os.path.join(ROOT, "tasks", "longdep", "config.yaml")
    out = tmp_path / "o"
    argv = ["--output-dir", str(out), config, "--skip-done", "--progress-seconds", "0",
            "--variant", "a", "--set"] + TINY_LONGDEP
    args = parse_args(argv)
    cmd, digest = command(args, "a", []), config_digest(config)
    out.mkdir()
    atomic_write_text(out / "a.started.json", json.dumps(
        {"command": cmd[1:], "config_sha1": digest, "started_at": time.time() - 1,
         "seconds": 1.0}))
    subprocess.run(cmd + ["stop_at_step=2"], cwd=ROOT, check=True, capture_output=True)
    state = out / "a" / "checkpoints" / "step-2" / "trainer_state.json"
    atomic_write_text(state, json.dumps(dict(json.loads(state.read_text()), total_steps=99)))
    exits(2, lambda: main(argv))
    assert "[a] resumed" in capsys.readouterr().out
    assert json.loads((out / "a.started.json").read_text())["resume_failed"] is True
    assert set(main(argv)) == {"a"}
    assert "[a] started" in capsys.readouterr().out


def test_ablation_starts_over_what_it_cannot_resume(tmp_path):
    """A checkpoint at the last step (the run stopped in its final evaluation), a `latest`
    link to nothing, and a checkpoint older than the started record (an attempt that died
    before writing its run_config.yaml: the files are an older run's) are not resumed."""
    from tools.ablation import command, config_digest, parse_args, stopped_before
    config = os.path.join(ROOT, "tasks", "longdep", "config.yaml")
    args = parse_args([config, "--output-dir", str(tmp_path), "--variant", "a"])
    cmd, digest = command(args, "a", []), config_digest(config)
    run, ckpt = tmp_path / "a", tmp_path / "a" / "checkpoints"
    (ckpt / "step-4").mkdir(parents=True)
    (ckpt / "latest").symlink_to("step-4")
    atomic_write_text(run / "run_config.yaml", "task: longdep\n")
    atomic_write_text(tmp_path / "a.started.json", json.dumps(
        {"command": cmd[1:], "config_sha1": digest, "started_at": time.time() - 60,
         "seconds": 5.0}))

    def state(step, total):
        atomic_write_text(ckpt / "step-4" / "trainer_state.json",
                          json.dumps({"step": step, "total_steps": total}))
    state(4, 9)
    assert stopped_before(args, "a", cmd, digest)[1] == 5.0
    state(9, 9)
    assert stopped_before(args, "a", cmd, digest) is None   # past its last step
    state(4, 9)
    os.utime(run / "run_config.yaml", (1e9, 1e9))
    assert stopped_before(args, "a", cmd, digest) is None   # written before the run started
    os.utime(run / "run_config.yaml")
    # a resumed attempt failed (not killed, not interrupted): it would fail again
    record = json.loads((tmp_path / "a.started.json").read_text())
    for bad in ({"resume_failed": True}, {"seconds": "x"}):
        atomic_write_text(tmp_path / "a.started.json", json.dumps(dict(record, **bad)))
        assert stopped_before(args, "a", cmd, digest) is None, bad
    atomic_write_text(tmp_path / "a.started.json", json.dumps(record))
    assert stopped_before(args, "a", cmd, digest) == (record["started_at"], 5.0)
    (ckpt / "latest").unlink()
    (ckpt / "latest").symlink_to("step-9")
    assert stopped_before(args, "a", cmd, digest) is None   # a link to nothing


def test_ablation_reports_the_variant_error(tmp_path, capsys):
    from tools.ablation import main
    exits(2, lambda: main(["tasks/longdep/config.yaml", "--output-dir", str(tmp_path / "o"),
                           "--variant", "a", "batch_size=abc"]))
    one_error_line(capsys, "variant a failed (exit 2): ", "batch_size: must be a positive "
                   "integer, got 'abc'", f"log: {tmp_path / 'o' / 'a.log'}")
    atomic_write_text(tmp_path / "afile", "mine")
    exits(2, lambda: main(["tasks/longdep/config.yaml", "--output-dir",
                           str(tmp_path / "afile" / "o"), "--variant", "a"]))
    one_error_line(capsys, f"--output-dir {tmp_path / 'afile' / 'o'}")
    # exit 0 (here: stopped at a step, as if interrupted) without its results: what is missing,
    # never "failed (exit 0)"
    out = tmp_path / "s"
    exits(1, lambda: main(["tasks/longdep/config.yaml", "--output-dir", str(out),
                           "--progress-seconds", "0", "--variant", "a", "stop_at_step=1",
                           "--set"] + TINY_LONGDEP))
    line = one_error_line(capsys, f"variant a finished (exit 0) but wrote no "
                          f"{out / 'a' / 'eval_results.json'}; log: {out / 'a.log'}")
    assert "failed" not in line


def test_ablation_takes_its_variants_from_a_file_section(tmp_path, capsys):
    """--variants FILE:SECTION: the section's variants in the file's order, after which
    --variant adds more; `{variant}` in an override is the variant's name; a missing section or
    a malformed entry is one line naming the file."""
    from tools.ablation import command, parse_args
    rows = tmp_path / "rows.yaml"
    rows.write_text("a: {x: [seed=2], y: null}\nb: [1]\nc: {x: seed=2}\nd: {../x: []}\n")
    config = "tasks/longdep/config.yaml"
    args = parse_args([config, "--output-dir", "o", "--variants", f"{rows}:a", "--variant", "z",
                       "--set", "init_checkpoint=p/{variant}/final"])
    assert args.variant == [["x", "seed=2"], ["y"], ["z"]]
    assert command(args, "x", ["seed=2"])[-2:] == ["init_checkpoint=p/x/final", "seed=2"]
    for spec, part in ((f"{rows}:b", "no mapping 'b' of variants (sections: a, c, d)"),
                       (f"{rows}:c", "c.x: expected a list of key=value strings"),
                       (f"{rows}:d", "d: variant name '../x': letters, digits, _ . + - "
                                     "only"),
                       (f"{tmp_path / 'none.yaml'}:a", "No such file"), (str(rows), "FILE:")):
        exits(2, lambda: parse_args([config, "--output-dir", "o", "--variants", spec]))
        one_error_line(capsys, f"--variants {spec}: ", part)


@pytest.mark.parametrize("argv, part", [
    (["--variant", "../x"], "--variant '../x': a variant's name: letters, digits, _ . + -"),
    (["--variant", "/tmp/x"], "--variant '/tmp/x': a variant's name"),
    (["--variant", "."], "--variant '.': a variant's name"),
    (["--variant", ""], "--variant '': a variant's name"),
    (["--variant", "a", "--variant", "a.log"], "variant name 'a.log': the ablation writes"),
    (["--variant", "results.json"], "variant name 'results.json': the ablation writes"),
    (["--variant", "a", "--set", "output_dir=x"], "override 'output_dir=x': each variant"),
], ids=["parent", "absolute", "dot", "empty", "log", "results", "output_dir"])
def test_ablation_variant_names_stay_folders_of_the_output_dir(argv, part, capsys):
    """--variant's names were not checked as a file's are: `--variant ../x` ran in OUT/../x
    (`.` in OUT itself, overwriting), `a.log` was variant a's log; `--set output_dir=` sent
    every variant to one folder. One line each."""
    from tools.ablation import parse_args
    exits(2, lambda: parse_args(["tasks/longdep/config.yaml", "--output-dir", "o", *argv]))
    one_error_line(capsys, "", part)
    # longdep's run.sh names one enhanced+retro
    assert parse_args(["tasks/longdep/config.yaml", "--output-dir", "o", "--variant",
                       "enhanced+retro"]).variant == [["enhanced+retro"]]
