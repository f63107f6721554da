"""Progress on screen: one switch decides whether bars are drawn (ERNIE_DOC_PROGRESS=0 for every
bar, `progress: false` / predict's `--no-progress` for one run), and a log line written while a
bar is drawn clears the bar first instead of leaving a stale copy of it above the line. On a
terminal the bar redraws in place; elsewhere (a log file) progress is a few plain lines."""
import io
import logging
import os
import re
import sys
import threading

import pytest
from helpers import tiny_longdep


@pytest.mark.parametrize("env, requested, shown", [
    (None, True, True), (None, False, False), ("1", True, True), ("0", True, False),
    ("false", True, False), ("OFF", True, False), ("0", False, False),
])
def test_one_switch_decides(monkeypatch, env, requested, shown):
    from ernie_doc.utils import show_progress
    if env is None:
        monkeypatch.delenv("ERNIE_DOC_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("ERNIE_DOC_PROGRESS", env)
    assert show_progress(requested) is shown


@pytest.mark.parametrize("env, bar", [(None, True), ("0", False)])
def test_the_trainer_honours_the_environment_switch(tmp_path, monkeypatch, capsys, env, bar):
    """progress: true draws the training bar, unless ERNIE_DOC_PROGRESS=0 turns every bar
    off (downloads already honoured it; the trainer did not)."""
    from ernie_doc.run_config import load_config
    from ernie_doc.training.trainer import run
    if env is None:
        monkeypatch.delenv("ERNIE_DOC_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("ERNIE_DOC_PROGRESS", env)
    run(load_config(None, tiny_longdep(f"output_dir={tmp_path / 'out'}", "progress=true")))
    shown = capsys.readouterr()
    assert ("train longdep" in shown.err) is bar
    # the run's summary (console and train.log) gives each split's label counts
    log = (tmp_path / "out" / "train.log").read_text()
    assert "split train: 8 documents; labels 0: " in log and "split dev: 4 documents" in log


def test_a_log_line_under_a_bar_leaves_no_stale_bar(monkeypatch):
    """In a terminal, stdout (the log) and stderr (the bar) are one screen: a log line must
    clear the bar's line before it is written, and the bar is drawn again below it."""
    from tqdm import tqdm

    from ernie_doc.training.runlog import setup_logging
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    log = setup_logging()
    try:
        with tqdm(total=10, desc="train demo", file=sys.stderr, mininterval=0) as bar:
            bar.update(3)
            log.info("a log line")
            bar.update(1)
    finally:
        for handler in list(log.handlers):
            log.removeHandler(handler)
        log.propagate, log.level = True, logging.NOTSET
    text = screen.getvalue()
    found = re.search(r"\d\d:\d\d:\d\d a log line\n", text)   # the run log's format
    assert found, repr(text)
    before, after = text[:found.start()], text[found.end():]
    # what precedes the log line on its screen line: the bar was cleared (\r, blanks), not left
    assert before.rsplit("\r", 1)[-1].strip() == "" and before.endswith("\r"), repr(text)
    assert "train demo" in after   # redrawn below


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("env, requested, tty, style", [
    (None, True, True, "bar"), (None, True, False, "lines"), (None, False, True, None),
    ("1", True, False, "lines"), ("bar", True, False, "bar"), ("LINES", True, True, "lines"),
    ("0", True, True, None), ("bar", False, False, None),
])
def test_a_terminal_gets_a_bar_a_file_gets_lines(monkeypatch, env, requested, tty, style):
    from ernie_doc.utils import progress_style
    if env is None:
        monkeypatch.delenv("ERNIE_DOC_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("ERNIE_DOC_PROGRESS", env)
    assert progress_style(requested, _Stream(tty)) == style


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _lines(total, steps, seconds_per_step, leave=True):
    """The lines a ProgressLines writes for `steps` updates, `seconds_per_step` apart."""
    from ernie_doc.utils import ProgressLines
    out, clock = io.StringIO(), _Clock()
    bar = ProgressLines(total=total, desc="train x", leave=leave, file=out, clock=clock)
    for step in range(steps):
        clock.now += seconds_per_step
        bar.set_postfix(loss=f"{1 / (step + 1):.2f}")
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    return text.splitlines()


def test_lines_every_five_percent_or_minute():
    # 1,000 steps over 300 s: a line per 5 % (15 s apart), the last one at 100 %
    lines = _lines(1000, 1000, 0.3)
    assert len(lines) == 20
    assert lines[0] == "train x:   5% 50/1000 [00:15<04:45,  3.33it/s, loss=0.02]"
    assert lines[-1].startswith("train x: 100% 1000/1000 [05:00<00:00,")
    # a quick run (1 s): its last line only, or none for a transient bar (eval, download)
    assert _lines(1000, 1000, 0.001) == ["train x: 100% 1000/1000 [00:01<00:00, "
                                         "1000.00it/s, loss=0.00]"]
    assert _lines(1000, 1000, 0.001, leave=False) == []
    # a slow one: a line at least every minute, even under 5 % (20 s per step of 1,000)
    assert len(_lines(1000, 12, 20.0)) == 4   # 60, 120, 180 s, then the last
    # no total (predict from standard input): a line a minute, then the last
    lines = _lines(None, 200, 1.0, leave=False)
    assert [line.split(" [")[0] for line in lines] == ["train x: 60it", "train x: 120it",
                                                       "train x: 180it", "train x: 200it"]


def _finetune(tmp_path, monkeypatch, stderr):
    """`ernie-doc finetune` (tools/finetune.py's command) of a 16-step run with progress, in
    this process (paddle is imported once per test process), its stderr `stderr`."""
    from tools.finetune import command
    monkeypatch.delenv("ERNIE_DOC_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", stderr)
    code = command(["--set", *tiny_longdep(f"output_dir={tmp_path / 'out'}", "progress=true",
                                           train_docs=16)])
    assert code == 0


def test_progress_to_a_file_is_a_few_plain_lines(tmp_path, monkeypatch, capsys):
    """stderr sent to a file (not a terminal): the training bar's progress is plain lines, no
    carriage-return redraws, a bounded count (one IMDB log was 712 KB of redraws)."""
    with open(tmp_path / "stderr", "w") as err:
        _finetune(tmp_path, monkeypatch, err)
    text = (tmp_path / "stderr").read_text()
    assert "\r" not in text and "\x1b" not in text, repr(text[:500])
    lines = [line for line in text.splitlines() if line.startswith(("train ", "eval "))]
    assert 1 <= len(lines) <= 21 + 2, lines   # every 5 %, the last, transient eval bars' own
    assert re.fullmatch(r"train longdep: 100% 16/16 \[.*loss=.*\]", lines[-1]), lines
    assert len(text) < 3000


def test_on_a_terminal_the_bar_redraws(tmp_path, monkeypatch, capsys):
    """stderr on a terminal (a pseudo-terminal here): tqdm's bar, redrawn in place."""
    import fcntl
    import struct
    import termios
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # 100 columns
    screen, chunks = os.fdopen(slave, "w"), []

    def read():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:   # EIO: the terminal's other end closed
                return
            if not chunk:
                return
            chunks.append(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _finetune(tmp_path, monkeypatch, screen)
    finally:
        screen.close()
        reader.join(10)
        os.close(master)
    text = b"".join(chunks).decode()
    assert text.count("\rtrain longdep:") >= 2, repr(text)   # drawn, then redrawn over
    assert "16/16" in text
