"""What a run may put in OUTPUT_DIR, and the only things it ever deletes there.

A run writes a fixed set of names (RUN_ENTRIES). Re-running into the same directory
(`overwrite_output_dir`) removes those names and nothing else, and only after checking that
the directory holds nothing else: a user's notes, a dataset or a checkout that ended up in
OUTPUT_DIR is never touched. A directory that is, contains or lies inside one of the run's
inputs (data, checkpoint, tokenizer), or that is or contains the current directory, the
repository or $HOME, is refused before anything is written.
"""
import fnmatch
import os
import shutil
from typing import Iterable, List, Optional

from ernie_doc.config import ConfigError
from ernie_doc.utils import path_within

# Every name a run writes directly inside OUTPUT_DIR (glob patterns). The end-to-end tests of
# fine-tuning, pretraining and language modelling check that a run writes nothing else.
RUN_ENTRIES = (
    "run_config.yaml", "train.log", "train_log.jsonl", "eval_history.jsonl",
    "eval_results.json", "results.json", "*_results.json", "predictions_*.jsonl", "timing.json",
    "curves.png", "vdl", "checkpoints", "best", "final", "final.tmp", "tokenizer",
    "vocab.txt",
    ".tmp-*",            # atomic writes (ernie_doc.utils.atomic_path) cut short by a kill
)

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def is_run_entry(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_ENTRIES)


def foreign_entries(directory: str) -> List[str]:
    """Names in `directory` that no run writes (sorted; directories end in '/')."""
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not is_run_entry(entry.name):
            out.append(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
    return out


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def check_output_dir(output_dir: str, inputs: Iterable[str] = (), resume: bool = False,
                     overwrite: bool = False, marker: str = "run_config.yaml",
                     source: str = "config") -> None:
    """Refuse an output directory this run must not write into (ConfigError, one line).

    inputs: paths the run reads (data directory, checkpoint, tokenizer ...); output_dir may
    not be, contain or lie inside any of them. Nothing is created or changed here."""
    out = _real(output_dir)
    where = f"output_dir {output_dir}"
    for path in inputs:
        if not path or not os.path.exists(os.path.expanduser(os.fspath(path))):
            continue
        real = _real(path)
        if path_within(out, real) or path_within(real, out):
            relation = ("is" if out == real else "lies inside" if path_within(out, real)
                        else "contains")
            raise ConfigError(f"{source}: {where} {relation} {path}, an input of this run: "
                              "choose a directory of its own")
    protected = [("the current directory", os.getcwd()), ("the repository", REPOSITORY),
                 ("$HOME", os.path.expanduser("~")), ("the root directory", os.sep)]
    for what, path in protected:
        real = _real(path)
        if path_within(real, out):
            relation = "is" if out == real else "contains"
            raise ConfigError(f"{source}: {where} {relation} {what} ({real}): choose a "
                              "directory of its own")
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out):
        raise ConfigError(f"{source}: {where} exists and is not a directory")
    has_run = os.path.isfile(os.path.join(out, marker))
    if resume:
        if not has_run:
            raise ConfigError(f"--resume {output_dir}: no run there ({marker} missing)")
        return
    if has_run and not overwrite:
        raise ConfigError(f"{where} already holds a run: resume it with --resume "
                          f"{output_dir}, or set overwrite_output_dir=true")
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        raise ConfigError(f"{source}: {where} holds files that are not a previous run's "
                          f"({shown}): choose an empty or new directory, or move them")


def clear_previous_run(output_dir: str) -> Optional[List[str]]:
    """Remove what a previous run wrote in `output_dir` (RUN_ENTRIES only; anything else
    stays) → the names removed, or None when the directory does not exist."""
    if not os.path.isdir(output_dir):
        return None
    removed = []
    for entry in sorted(os.scandir(output_dir), key=lambda e: e.name):
        if not is_run_entry(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.remove(entry.path)   # a file, or a link (best -> ...): never its target
        removed.append(entry.name)
    return removed
