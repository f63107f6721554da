"""Progress on screen: one switch decides whether bars are drawn (ERNIE_DOC_PROGRESS=0 for every
bar, `progress: false` / predict's `--no-progress` for one run), and a log line written while a
bar is drawn clears the bar first instead of leaving a stale copy of it above the line."""
import io
import logging
import re
import sys

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
