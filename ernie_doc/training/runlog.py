"""What a run reports: console/file log, JSON-lines history, VisualDL scalars, curves.png.
Only rank 0 writes."""
import json
import logging
import math
import os
import sys

from ernie_doc.errors import DataError
from ernie_doc.training import outdir
from ernie_doc.utils import CurrentStdout

logger = logging.getLogger("ernie_doc.train")


def setup_logging(output_dir=None, is_main=True):
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    console = CurrentStdout()   # log lines under a progress bar
    console.setFormatter(fmt)
    logger.addHandler(console)
    if output_dir and is_main:
        handler = _RunFileHandler(os.path.join(output_dir, "train.log"), encoding="utf-8")
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    if not is_main:
        logger.setLevel(logging.WARNING)
    return logger


class _RunFileHandler(logging.FileHandler):
    """train.log; a failed write stops the run as an OSError naming the file (not logging's
    "--- Logging error ---" while the run carries on)."""

    def handleError(self, record):
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            if error.filename is None:
                raise OSError(error.errno, error.strerror, self.baseFilename) from error
            raise error
        super().handleError(record)

    def _open(self):
        return outdir.open_append(self.baseFilename)   # never through a link


class RunLog:
    """train_log.jsonl (one line per optimizer step), eval_history.jsonl, VisualDL scalars
    under vdl/, curves.png redrawn from those files."""

    def __init__(self, output_dir, is_main=True, resume_step=0):
        self.dir, self.is_main = output_dir, is_main
        self.writer = None
        if not is_main:
            return
        self.train_path = os.path.join(output_dir, "train_log.jsonl")
        self.eval_path = os.path.join(output_dir, "eval_history.jsonl")
        for path in (self.train_path, self.eval_path):
            _truncate_after(path, resume_step)   # a resumed run rewrites what followed
        try:
            from visualdl import LogWriter
            self.writer = LogWriter(logdir=os.path.join(output_dir, "vdl"))
        except ImportError:  # pragma: no cover - visualdl is in the pinned requirements
            logger.warning("visualdl is not installed: no VisualDL scalars")

    def train_step(self, record):
        if not self.is_main:
            return
        _append(self.train_path, record)
        if self.writer:
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"train/{key}", value, record["step"])

    def evaluation(self, split, step, metrics):
        if not self.is_main:
            return
        _append(self.eval_path, dict(split=split, step=step, **metrics))
        if self.writer:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{split}/{key}", value, step)

    def close(self):
        if self.writer:
            self.writer.close()
            self.writer = None


def _append(path, record):
    try:
        with outdir.open_append(path) as f:   # never through a link
            f.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError as e:   # a full disk fails the write or the close, without a file name
        if e.filename is None:
            raise OSError(e.errno, e.strerror, path) from e
        raise


def check_run_logs(output_dir):
    """DataError (file and line) when train_log.jsonl or eval_history.jsonl is damaged beyond
    a cut-short last line; reads only."""
    for name in ("train_log.jsonl", "eval_history.jsonl"):
        _records(os.path.join(output_dir, name), warn=False)


def _records(path, warn=True):
    """[(line number, record, raw bytes)] of a JSON-lines log; a cut-short last line is dropped
    with a warning, any other bad line (or no integer step) is a DataError."""
    if not os.path.lexists(path):
        return []
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    lines = [(number, raw) for number, raw in enumerate(data.split(b"\n"), 1) if raw.strip()]
    records = []
    for k, (number, raw) in enumerate(lines):
        try:
            record = json.loads(raw.decode("utf-8"))
            problem = None if isinstance(record, dict) else \
                f"a JSON {type(record).__name__}, not an object"
        except UnicodeDecodeError as e:
            record, problem = None, f"invalid UTF-8 (byte {e.start} of the line)"
        except ValueError as e:
            record, problem = None, f"invalid JSON ({getattr(e, 'msg', e)})"
        if problem is not None and k == len(lines) - 1 and record is None:
            if warn:
                shown = raw[:60].decode("utf-8", "replace")
                logger.warning(f"{path}:{number}: dropped the last line, cut short by an "
                               f"interrupted write: {shown!r}")
            break
        if problem is not None:
            raise DataError(f"{path}:{number}: {problem}")
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise DataError(f"{path}:{number}: no integer 'step' in the record")
        records.append((number, record, raw))
    return records


def _truncate_after(path, step):
    """Keep the records up to `step` (a resumed run rewrites what followed), and drop a last
    line cut short; the file is replaced atomically, never left half-written."""
    if not os.path.lexists(path):
        return
    keep = [raw.decode("utf-8") + "\n" for _, record, raw in _records(path)
            if record["step"] <= step]
    outdir.write_text(os.path.dirname(path), os.path.basename(path), "".join(keep))


def read_jsonl(path):
    """The records of a JSON-lines log (see _records: a cut-short last line is dropped)."""
    return [record for _, record, _ in _records(path)]


def _smooth(values):
    width = max(1, len(values) // 25)
    return [sum(values[max(0, i - width + 1):i + 1]) / len(values[max(0, i - width + 1):i + 1])
            for i in range(len(values))], width


_WARNED_NO_MATPLOTLIB = False


def plot_curves(output_dir, metric):
    """curves.png: training losses, accuracies and the eval metric by step; skipped with one
    warning without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        global _WARNED_NO_MATPLOTLIB
        if not _WARNED_NO_MATPLOTLIB:
            logger.warning("matplotlib is not installed: curves.png not drawn (pip install "
                           "matplotlib)")
            _WARNED_NO_MATPLOTLIB = True
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = read_jsonl(os.path.join(output_dir, "train_log.jsonl"))
    evals = [r for r in read_jsonl(os.path.join(output_dir, "eval_history.jsonl"))
             if metric in r]
    keys = sorted({k for r in train for k in r})
    losses = [k for k in keys if k == "loss" or k.endswith("_loss")]
    accuracies = [k for k in keys if k.endswith("_accuracy")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for key in losses:
        rows = [r for r in train if key in r]
        steps = [r["step"] for r in rows]
        if len(losses) == 1:
            ax1.plot(steps, [r[key] for r in rows], lw=0.8, alpha=0.5, label=key)
        smooth, width = _smooth([r[key] for r in rows])
        ax1.plot(steps, smooth, lw=1.5, label=f"{key} (mean of {width})")
    if losses:
        ax1.set_xlabel("step"), ax1.set_ylabel("training loss"), ax1.legend(fontsize=8)
    for key in accuracies:
        rows = [r for r in train if key in r]
        smooth, width = _smooth([r[key] for r in rows])
        ax2.plot([r["step"] for r in rows], smooth, lw=1.2, label=f"train {key} (mean of "
                                                                 f"{width})")
    for split in sorted({r["split"] for r in evals}):
        rows = [r for r in evals if r["split"] == split and not math.isnan(r[metric])]
        ax2.plot([r["step"] for r in rows], [r[metric] for r in rows], marker="o",
                 label=f"{split} {metric}")
    ax2.set_xlabel("step"), ax2.set_ylabel("accuracy" if accuracies else metric)
    if evals or accuracies:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    with outdir.atomic_entry(output_dir, "curves.png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
