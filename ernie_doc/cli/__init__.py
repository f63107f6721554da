"""`ernie-doc`: the installed command, one subcommand per tool (finetune, pretrain, predict,
explain, context, plan, export, convert, train-tokenizer, run-document, download ...).

Each subcommand is a module of this package with `main(argv)` (for callers in Python) and
`command(argv)` (the command line's exit status); `tools/<name>.py` in a source checkout are
the same modules. `--nproc N` (finetune, pretrain) relaunches the command through paddle's
launcher (`python -m paddle.distributed.launch`, what `fleetrun` is) with N processes.
"""
import contextlib
import importlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from ernie_doc._version import __version__
from ernie_doc.errors import ConfigError, ErnieDocError
from ernie_doc.utils import (clip, notes_to_stdout, quiet_failed_closes, write_error_types,
                             write_failure)

# what a command that needs paddle says when it is not installed (one line, exit 2)
PADDLE_MISSING = ("paddle is not installed: pip install paddlepaddle==3.3.1 (CPU) or "
                  "paddlepaddle-gpu==2.6.2 (GPU)")

# subcommand → (module, one line of help)
COMMANDS: Dict[str, Tuple[str, str]] = {
    "finetune": ("ernie_doc.cli.finetune", "fine-tune or evaluate on a task (one trainer for "
                                           "every task)"),
    "pretrain": ("ernie_doc.cli.pretrain", "pretrain: masked LM + segment reordering on a "
                                           "streamed corpus"),
    "export": ("ernie_doc.cli.export", "export for Paddle Inference (bare model or a head)"),
    "convert": ("ernie_doc.cli.convert", "convert a checkpoint between the official, "
                                         "PaddleNLP and safetensors layouts"),
    "train-tokenizer": ("ernie_doc.cli.train_tokenizer", "train a SentencePiece tokenizer"),
    "run-document": ("ernie_doc.cli.run_document", "read one long document segment by "
                                                   "segment"),
    "predict": ("ernie_doc.cli.predict", "predict documents with a fine-tuned model (JSON "
                                         "lines, streamed, resumable)"),
    "explain": ("ernie_doc.cli.explain", "explain predictions: which segments and words drove "
                                         "them (JSON lines, a PNG and an HTML page each)"),
    "context": ("ernie_doc.cli.context", "measure how far back models look (effective "
                                         "context: occlusion and gradients by distance)"),
    "download": ("ernie_doc.hub.cli", "fetch released models into the cache ahead of time"),
    "plan": ("ernie_doc.cli.plan", "estimate a run from its config: memory per device, "
                                   "GPU-hours"),
}
DISTRIBUTED = ("finetune", "pretrain")

# Ctrl-C (SIGINT) ends a command with this status and one line, never a traceback
INTERRUPTED_STATUS = 130


class InterruptedEarly(KeyboardInterrupt):
    """Ctrl-C while a command was still importing or reading its arguments: nothing was
    written yet."""


@contextlib.contextmanager
def nothing_written_yet():
    """A block that writes nothing (imports, argument checks): Ctrl-C in it becomes
    InterruptedEarly, which `main` reports as such."""
    try:
        yield
    except InterruptedEarly:
        raise
    except KeyboardInterrupt:
        raise InterruptedEarly() from None


def report_error(error: BaseException, message: Optional[str] = None) -> None:
    """Print the one `error:` line for `error` (its message, or `message`) on stderr,
    bounded: a message that quotes a value from a file whole must not be megabytes."""
    print(f"error: {clip(str(error) if message is None else message, 1000)}", file=sys.stderr)


def user_error_types() -> tuple:
    """What a command's `except` clause hands to `exit_on_user_error`: ErnieDocError and the
    errors of a failed write (OSError, safetensors' serialisation error)."""
    return (ErnieDocError,) + write_error_types()


def exit_on_user_error(error: BaseException, debug: bool,
                       target: Optional[str] = None, what: str = "output_dir",
                       target_is_dir: bool = True) -> None:
    """For `except user_error_types()`: print one `error:` line and exit for an ErnieDocError
    (its `exit_status`) or a failed write to `target` (status 2); else return, to re-raise."""
    if debug:
        return
    if isinstance(error, ErnieDocError):
        report_error(error)
        sys.exit(error.exit_status)
    message = write_failure(error, target, what, target_is_dir) if target else None
    if message is None:
        return
    quiet_failed_closes()
    report_error(error, message)
    sys.exit(2)


def report_run(run: Callable[[], Any], args: Any, interrupted: Callable[[], str],
               target_is_dir: bool = False) -> int:
    """A command's `main` around its run: 0 when it returns; Ctrl-C: the `interrupted()`
    line and 130 (--debug: the traceback first); an ErnieDocError or a failed write to
    args.output: one `error:` line and its status (exit_on_user_error); anything else
    raised as it is."""
    try:
        run()
        return 0
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        print(interrupted(), file=sys.stderr)
        return INTERRUPTED_STATUS
    except user_error_types() as e:
        exit_on_user_error(e, args.debug, args.output, what="--output",
                           target_is_dir=target_is_dir)
        raise


def is_paddle_missing(error: BaseException) -> bool:
    """Whether an ImportError is paddle's own absence (not a module of paddle that another
    version lacks, nor another package)."""
    return isinstance(error, ImportError) and getattr(error, "name", None) == "paddle"


def paddle_installed() -> bool:
    """Whether paddle can be imported, without importing it (that takes seconds)."""
    try:
        return importlib.util.find_spec("paddle") is not None
    except (ImportError, ValueError):   # ValueError: sys.modules["paddle"] is None
        return False


def head_choices(**options) -> Optional[List[str]]:
    """The head names an option accepts, or None (any) without paddle, so `--help` still answers."""
    try:
        with nothing_written_yet():   # paddle's import, seconds long
            from ernie_doc import auto
    except ImportError as e:
        if not is_paddle_missing(e):
            raise
        return None
    return auto.head_names(**options)


def with_notes_on_stdout(main, argv: Optional[List[str]]) -> int:
    """Run a tool's main(argv) with readers' and loaders' notes on stdout (stderr holds only an
    error line) → the exit status (0 when main returns a result)."""
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
                raise ConfigError(f"--nproc: must be a positive integer, got {value!r}")
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


def run_launcher(cmd: List[str], env: Dict[str, str], log_dir: str) -> int:
    """Run paddle's launcher in its own session → its exit status (128 + the signal after an
    interruption); SIGINT / SIGTERM relayed once, SIGHUP as SIGTERM."""
    log = os.path.join(log_dir, "workerlog.0")
    start = os.path.getsize(log) if os.path.isfile(log) else 0   # an earlier job's lines
    env = dict(env)
    # the ranks import paddle too: the same filter as this process's (one error line only)
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"),
                                                   "ignore:No ccache found"]))
    got: List[int] = []
    relayed = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
               signal.SIGHUP: signal.SIGTERM}
    launcher: List[subprocess.Popen] = []
    sent: List[int] = []

    def relay():
        if got and launcher and not sent:
            sent.append(got[0])
            launcher[0].send_signal(relayed[got[0]])

    def note(signum, frame):
        got.append(signum)
        relay()

    saved = {s: signal.signal(s, note) for s in relayed}
    try:
        launcher.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        relay()   # a signal while it started
        code = launcher[0].wait()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if not got:
        return code
    try:
        with open(log, "rb") as f:
            f.seek(start if os.path.getsize(log) >= start else 0)   # rewritten: from 0
            said = [line.decode("utf-8", "replace").strip() for line in f
                    if line.startswith(b"interrupted ")]
    except OSError:
        said = []
    if said:   # interrupted: the ranks said where
        print(said[-1], file=sys.stderr)
        return 128 + got[0]
    # finished before the signal mattered (0); else stopped before rank 0 could say where
    return code if code == 0 else 128 + got[0]


def main(argv: Optional[List[str]] = None) -> int:
    """`ernie-doc ARGV` → the exit status; an unreported Ctrl-C is one line and 130 (--debug
    adds the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(_dispatch, argv)


def run_command(command, argv: Optional[List[str]] = None) -> int:
    """command(argv) → its exit status; an unreported Ctrl-C or ErnieDocError, or paddle's
    absence, becomes one line and its status (traceback under --debug); a reader that left
    (`| head`) ends it quietly. Run by `ernie-doc` and the tools/ scripts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return command(argv)
    except ErnieDocError as e:
        if "--debug" in argv:
            raise
        report_error(e)
        return e.exit_status
    except BrokenPipeError:   # `ernie-doc ... | head`: the reader left, nothing is wrong
        sys.stdout = open(os.devnull, "w")
        return 0
    except ImportError as e:   # a command needs paddle (also run.sh's PYTHON): one line
        if not is_paddle_missing(e) or "--debug" in argv:
            raise
        print(f"error: {PADDLE_MISSING}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if "--debug" in argv:
            traceback.print_exc()
        if isinstance(e, InterruptedEarly):
            line = "interrupted before anything was written: run the same command again"
        else:
            line = "interrupted before the command finished"
        print(line, file=sys.stderr)
        return INTERRUPTED_STATUS


def _dispatch(argv: List[str]) -> int:
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
            if not paddle_installed():   # before the launcher (itself paddle's) fails
                print(f"error: {PADDLE_MISSING}", file=sys.stderr)
                return 2
            env = dict(os.environ)
            parent = os.path.dirname(os.path.dirname(os.path.dirname(launch_script())))
            env["PYTHONPATH"] = parent + os.pathsep + env.get("PYTHONPATH", "")
            log_dir = os.environ.get("LAUNCH_LOG_DIR")
            return run_launcher(launch_command(name, nproc, rest, log_dir), env,
                                log_dir or "log")
    program, sys.argv[0] = sys.argv[0], f"ernie-doc {name}"   # argparse's usage line
    try:
        with nothing_written_yet():
            module = importlib.import_module(COMMANDS[name][0])
            entry = getattr(module, "command", None) or module.main
        return entry(rest)
    finally:
        sys.argv[0] = program
