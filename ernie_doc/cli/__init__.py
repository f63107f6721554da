"""`ernie-doc`: the installed command, one subcommand per tool.

    ernie-doc finetune CONFIG|TASK [--set key=value ...] [--nproc N]
    ernie-doc pretrain --config CONFIG [--set ...] [--nproc N]
    ernie-doc predict MODEL --input FILE|DIR --output preds.jsonl
    ernie-doc export | convert | benchmark-model | benchmark-train | benchmark-finetune |
              train-tokenizer | run-document | download ...
    ernie-doc benchmark ...   (the earlier command line of both benchmarks, routed by its
                               options)

Each subcommand is a module of this package with `main(argv)` (for callers in Python) and
`command(argv)` (the command line's exit status); `tools/<name>.py` in a source checkout are
the same modules. `--nproc N` (finetune, pretrain) relaunches the command through paddle's
launcher (`python -m paddle.distributed.launch`, what `fleetrun` is) with N processes.
"""
import importlib
import os
import sys
from typing import Dict, List, Optional, Tuple

from ernie_doc._version import __version__

# subcommand → (module, one line of help)
COMMANDS: Dict[str, Tuple[str, str]] = {
    "finetune": ("ernie_doc.cli.finetune", "fine-tune or evaluate on a task (one trainer for "
                                           "every task)"),
    "pretrain": ("ernie_doc.cli.pretrain", "pretrain: masked LM + segment reordering on a "
                                           "streamed corpus"),
    "export": ("ernie_doc.cli.export", "export for Paddle Inference (bare model or a head)"),
    "convert": ("ernie_doc.cli.convert", "convert a checkpoint between the official, "
                                         "PaddleNLP and safetensors layouts"),
    "benchmark": ("ernie_doc.cli.benchmark", "benchmark-model, or benchmark-train given "
                                             "--pretrain-* options (the older form)"),
    "benchmark-model": ("ernie_doc.cli.benchmark_model", "the model's throughput against "
                                                         "PaddleNLP, parity and streaming"),
    "benchmark-train": ("ernie_doc.cli.benchmark_train", "pretraining throughput: real runs "
                                                         "with 1..N processes"),
    "benchmark-predict": ("ernie_doc.cli.benchmark_predict", "predict throughput per engine "
                                                             "on real documents"),
    "benchmark-finetune": ("ernie_doc.cli.benchmark_finetune", "fine-tuning side by side with "
                                                               "PaddleNLP's ERNIE-Doc script"),
    "train-tokenizer": ("ernie_doc.cli.train_tokenizer", "train a SentencePiece tokenizer"),
    "run-document": ("ernie_doc.cli.run_document", "read one long document segment by "
                                                   "segment"),
    "predict": ("ernie_doc.cli.predict", "predict documents with a fine-tuned model (JSON "
                                         "lines, streamed, resumable)"),
    "download": ("ernie_doc.hub.cli", "fetch released models into the cache ahead of time"),
}
DISTRIBUTED = ("finetune", "pretrain")


def with_notes_on_stdout(main, argv: Optional[List[str]]) -> int:
    """Run a tool's main(argv) for the command line: readers' and loaders' notes go to stdout
    with the run's log (stderr holds only an error line) → the exit status (0 when main
    returns a result instead)."""
    import logging

    from ernie_doc.utils import notes_to_stdout
    log = logging.getLogger("ernie_doc")
    saved = log.handlers[:], log.propagate, log.level
    notes_to_stdout()
    try:
        result = main(argv)
    finally:   # called in-process (tests, a notebook): leave logging as it was
        log.handlers[:], log.propagate, log.level = saved
    return result if isinstance(result, int) else 0


def launch_script() -> str:
    """A file paddle's launcher (fleetrun) can run as a script: ernie_doc/cli/__main__.py,
    whose first argument is the subcommand."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: ernie-doc COMMAND [ARGS ...]   (ernie-doc COMMAND --help for its "
             "arguments)", "", "ERNIE-Doc for PaddlePaddle " + __version__, "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "  --version  print the version"]
    return "\n".join(lines)


def split_nproc(argv: List[str]) -> Tuple[int, List[str]]:
    """`--nproc N` / `--nproc=N` taken out of argv → (N, the rest). ValueError for a value
    that is not a positive integer."""
    rest, nproc, i = [], 1, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--nproc" or arg.startswith("--nproc="):
            value = arg.split("=", 1)[1] if "=" in arg else \
                (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--nproc: must be a positive integer, got {value!r}")
            nproc = int(value)
            continue
        rest.append(arg)
        i += 1
    return nproc, rest


def launch_command(command: str, nproc: int, argv: List[str],
                   log_dir: Optional[str] = None) -> List[str]:
    """The argv that runs `ernie-doc COMMAND ARGV` in `nproc` processes through paddle's
    launcher (gloo on CPU, NCCL on GPU)."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc)]
    if log_dir:
        cmd += ["--log_dir", log_dir]
    return cmd + [launch_script(), command, *argv]


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"ernie-doc {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    if name in DISTRIBUTED:
        try:
            nproc, rest = split_nproc(rest)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if nproc > 1:
            import subprocess
            env = dict(os.environ)
            parent = os.path.dirname(os.path.dirname(os.path.dirname(launch_script())))
            env["PYTHONPATH"] = parent + os.pathsep + env.get("PYTHONPATH", "")
            return subprocess.call(launch_command(name, nproc, rest,
                                                  os.environ.get("LAUNCH_LOG_DIR")), env=env)
    module = importlib.import_module(COMMANDS[name][0])
    entry = getattr(module, "command", None) or module.main
    program, sys.argv[0] = sys.argv[0], f"ernie-doc {name}"   # argparse's usage line
    try:
        return entry(rest)
    except BrokenPipeError:   # `ernie-doc ... | head`: the reader left, nothing is wrong
        sys.stdout = open(os.devnull, "w")
        return 0
    finally:
        sys.argv[0] = program
