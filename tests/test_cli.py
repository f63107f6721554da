"""The installed `ernie-doc` command: subcommands, --version, --nproc relaunch, task names,
the package as it installs (task folders included), the matplotlib guard, packaging files."""
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

import ernie_doc
from ernie_doc import cli


def run_cli(*argv, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "ernie_doc.cli", *argv], capture_output=True,
                          text=True, cwd=cwd or ROOT, env=env, timeout=120)


USER_COMMANDS = ("finetune", "pretrain", "predict", "export", "convert", "download",
                 "train-tokenizer", "run-document")


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
                                   "run-document, predict, download")


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
    assert config_path("no_such_task") == "no_such_task"
    assert cli.main(["finetune", "--list-tasks"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed][:3] == ["c3", "cail2019_scm", "cmrc2018"]
    assert len(listed) == 14


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
                 "ernie_doc_tasks/hotpotqa/config_answer.yaml", "ernie_doc_tasks/README.md"):
        assert (target / path).is_file(), path
    assert not (target / "tasks").exists()   # no generic top-level package
    code = ("import importlib, ernie_doc_tasks.imdb.reader as r\n"
            "from ernie_doc.kinds import base as t, folders\n"
            "print(folders.task_package())\n"
            "print(t.load_reader('imdb').__file__)\n"
            "print(importlib.import_module(folders.task_package() + '.hotpotqa.task').__file__)\n"
            "print(folders.task_config('c3'))\n")
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
