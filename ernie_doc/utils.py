"""Small shared helpers: atomic file writes, JSON reading with file:line errors, CPU threads,
and the one-line report of a failed write (full disk, read-only filesystem) for the tools."""
import contextlib
import ctypes
import difflib
import errno
import json
import logging
import os
import platform
import re
import stat
import sys
import tempfile
import time
import unicodedata
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ernie_doc.errors import DuplicateKey

# errno values that mean "this write cannot succeed here" (the user's environment, never a bug)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
# errno values that, for a path inside the output location, make it unusable (not ENOENT: a
# file of ours that vanished is a bug and keeps its traceback)
_PLACE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR,
                           errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.EMLINK,
                           errno.ENOTEMPTY})


def _named(error: OSError, path: str) -> OSError:
    """`error` with `path` as its file name (same errno, so the same OSError subclass)."""
    renamed = OSError(error.errno, error.strerror, path)
    renamed.__cause__ = error
    return renamed


@contextlib.contextmanager
def atomic_path(path, tmp_dir=None):
    """Yield a temporary path next to `path` (or in `tmp_dir`), moved into place if the block
    succeeds. An OSError without a file name, or naming the temporary, is raised naming `path`."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    try:
        # the name's head only: a name near the length limit must not make this one too long
        fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path)[:64] + ".",
                                   dir=tmp_dir or directory)
    except OSError as e:
        raise _named(e, path) from None
    os.close(fd)
    # mkstemp creates 0600; give the file the mode a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None or os.fspath(e.filename) == tmp:
            raise _named(e, path) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path, text):
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


# -- reading regular files only ------------------------------------------------------------
# A FIFO blocks and a device never ends: every reader of user files opens regular files only.
def file_kind(path) -> Optional[str]:
    """None for a regular file (links followed), else what is there: "missing", "a directory",
    "a FIFO", "a socket", "a ... device", "unreadable (<reason>)", "not a regular file"."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte
        return "missing"
    except OSError as e:  # e.g. a parent directory without search permission
        return f"unreadable ({e.strerror})"
    return mode_kind(mode)


def mode_kind(mode: int) -> Optional[str]:
    """`file_kind` of an st_mode (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def regular_file_problem(path, what: str = "file") -> Optional[str]:
    """None when `path` is a regular file, else the one-line reason: "<path>: <what> does not
    exist", "... is a directory, not a file", "... is a FIFO, not a regular file" ..."""
    kind = file_kind(path)
    if kind is None:
        return None
    path = os.fspath(path)
    if kind == "missing":
        return f"{path}: {what} does not exist"
    if kind == "a directory":
        return f"{path}: {what} is a directory, not a file"
    if kind.startswith("unreadable"):
        return f"{path}: {what} is {kind}"
    return f"{path}: {what} is {kind}, not a regular file"


def open_regular(path, what: str = "file", error=ValueError):
    """A binary file object of a regular file; anything else raises `error` naming the path
    without blocking (checked before, opened non-blocking, checked again on the descriptor)."""
    problem = regular_file_problem(path, what)
    if problem:
        raise error(problem)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{os.fspath(path)}: cannot read ({e.strerror})") from None
    kind = mode_kind(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise error(f"{os.fspath(path)}: {what} is {kind}, not a regular file")
    return os.fdopen(fd, "rb")


def decode_utf8(data: bytes, where: str, error=ValueError) -> str:
    """`data` decoded; invalid UTF-8 raises `error` naming `where` and the line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{where}:{line}: invalid UTF-8 (byte {e.start})") from None


def read_utf8(path, error=ValueError, what: str = "file"):
    """A whole UTF-8 regular file; anything else, an unreadable file or invalid bytes raise
    `error` naming the file (and the line of the bad byte)."""
    with open_regular(path, what, error) as f:
        try:
            data = f.read()
        except OSError as e:
            raise error(f"{os.fspath(path)}: cannot read ({e.strerror})") from None
    return decode_utf8(data, os.fspath(path), error)


def read_json(path, error=ValueError):
    """Parse a JSON file; a bad file raises `error` naming the file (and line)."""
    return parse_json(read_utf8(path, error), os.fspath(path), error)


# The most digits an integer read from a file may have: far beyond any count (2**64 has 20),
# far below int()'s 4300-digit limit, and cheap to convert.
MAX_INT_DIGITS = 30


class _LongInteger(ValueError):
    """An integer literal of more than MAX_INT_DIGITS digits (its text is the argument)."""


def _bounded_int(text: str) -> int:
    """json's parse_int: int(text), refusing more than MAX_INT_DIGITS digits."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInteger(text)
    return int(text)


def long_integer_problem(digits: int) -> str:
    """The message for an integer literal of `digits` digits (more than MAX_INT_DIGITS)."""
    return f"an integer of {digits} digits (at most {MAX_INT_DIGITS})"


def unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """json's object_pairs_hook: the object as a dict; errors.DuplicateKey naming a key it
    holds twice (json.loads alone keeps the last value)."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(f"the key {clip(json.dumps(key), 120)} appears twice in "
                                   f"one object", key)
            seen.add(key)
    return value


def parse_json(text: str, where: str, error=ValueError):
    """`text` (of file `where`) parsed as JSON; invalid, too deep, an object holding a key
    twice, or an integer over MAX_INT_DIGITS digits raises `error` naming `where` (and the
    line, or the key)."""
    try:
        return json.loads(text, parse_int=_bounded_int, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise error(f"{where}:{e.lineno}: invalid JSON ({e.msg})") from None
    except DuplicateKey as e:
        raise error(f"{where}: {e}") from None
    except RecursionError:   # "[[[[..." thousands deep: no config or sidecar is like that
        raise error(f"{where}: JSON nested too deeply") from None
    except _LongInteger as e:
        digits = str(e.args[0])
        line = text.count("\n", 0, max(text.find(digits), 0)) + 1
        raise error(f"{where}:{line}: {long_integer_problem(len(digits.lstrip('-')))}") \
            from None


def dtype_name(dtype) -> str:
    """A paddle (or numpy) dtype → its bare name, 'float32' (paddle 2.6 and 3.x print
    dtypes as 'paddle.float32')."""
    return str(dtype).split(".")[-1]


def short_list(items, limit: int = 5, sep: str = ", ") -> str:
    """The first `limit` items joined on one line, and how many there are when more (for
    one-line error messages that name what is wrong)."""
    items = [str(item) for item in items]
    shown = sep.join(items[:limit])
    return shown + (f"{sep}... ({len(items)} in all)" if len(items) > limit else "")


def clip(text: str, limit: int = 200) -> str:
    """`text` for an error line: at most about `limit` characters, its start and end kept
    around what was cut (a value quoted from a file or the command line can be megabytes)."""
    text = str(text)
    if len(text) <= limit:
        return text
    tail = limit // 4
    return f"{text[:limit - tail]}...({len(text) - limit} characters)...{text[-tail:]}"


def did_you_mean(value: object, known: Iterable[str]) -> str:
    """The hint an error line about an unknown name ends with: " (did you mean 'imdb'?)" for
    the nearest of `known` (difflib's near miss, case ignored: 'IMDB' and 'Imbd' are near
    'imdb'; the hint spells it as `known` does), else ""; a value that is no string gets none."""
    if not isinstance(value, str):
        return ""
    spelled: Dict[str, str] = {}
    for name in known:
        spelled.setdefault(name.casefold(), name)
    close = difflib.get_close_matches(value.casefold(), list(spelled), n=1)
    return f" (did you mean {spelled[close[0]]!r}?)" if close else ""


def control_character(text: str) -> Optional[str]:
    """The first control character (category Cc) in `text` as "U+000A", or None: no name or
    path the package reads may hold one."""
    for char in text:
        if unicodedata.category(char) == "Cc":
            return f"U+{ord(char):04X}"
    return None


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not on Linux
        return os.cpu_count() or 1


def threads_problem(threads) -> Optional[str]:
    """Why `threads` cannot be the CPU math thread count, or None (0: default); more than the
    usable CPUs is refused (paddle's OpenMP aborts)."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        return f"must be a non-negative integer, got {clip(repr(threads))}"
    cpus = available_cpus()
    if threads > cpus:
        return f"{threads} exceeds the {cpus} CPUs this process may use"
    return None


def set_paddle_threads(threads: int, what: str = "threads", error: type = ValueError) -> None:
    """CPU math threads for paddle; `error` (naming `what`) for a count threads_problem refuses,
    before paddle's OpenMP sees it (too many threads abort the process)."""
    problem = threads_problem(threads)
    if problem:
        raise error(f"{what}: {problem}")
    import paddle
    setter = getattr(paddle, "set_num_threads", None)
    if setter is None:  # 2.6.2 and 3.3.1 have it only in the core module
        core = getattr(getattr(paddle, "base", None), "core", None)
        setter = getattr(core, "set_num_threads", None)
    if setter is not None:
        setter(int(threads))


# -- the device ----------------------------------------------------------------------------
def set_device(place: str) -> None:
    """paddle.set_device(place); on CPU also paddle's FLAGS_use_stride_kernel off, so that
    transpose and slicing write dense results instead of strided views, which paddle's CPU
    kernels read through a slow element-by-element copy (docs/design-notes.md); the values
    are the same. On a GPU the flag is left as it is."""
    import paddle
    paddle.set_device(place)
    if place.split(":")[0] == "cpu":
        paddle.set_flags({"FLAGS_use_stride_kernel": False})


# -- denormal floats -----------------------------------------------------------------------
# x86-64 MXCSR bits flush-to-zero and denormals-are-zero: a CPU computes denormals in
# microcode, and once a loss nears 0 whole backward steps slow down severalfold.
_MXCSR_FTZ_DAZ = 0x8040
_FENV_SIZE, _MXCSR_OFFSET = 32, 28   # glibc's x86-64 fenv_t: the x87 state, then mxcsr


def _fenv():
    """(libm, a fenv_t buffer read by fegetenv) on x86-64 Linux with glibc, else None."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        libm = ctypes.CDLL("libm.so.6")
    except OSError:   # not glibc
        return None
    env = (ctypes.c_ubyte * _FENV_SIZE)()
    if libm.fegetenv(ctypes.byref(env)) != 0:
        return None
    return libm, env


def _mxcsr(env) -> int:
    """The mxcsr word of a fenv_t buffer."""
    return int.from_bytes(bytes(env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4]), "little")


def denormals_flushed() -> Optional[bool]:
    """Whether this thread flushes denormal floats to zero (None where it cannot be read)."""
    got = _fenv()
    if got is None:
        return None
    return _mxcsr(got[1]) & _MXCSR_FTZ_DAZ == _MXCSR_FTZ_DAZ


def flush_denormals(enable: bool = True) -> bool:
    """Flush denormal floats to zero (FTZ, DAZ) in this thread and those it starts;
    `enable=False` restores them → whether applied (only on x86-64 Linux/glibc)."""
    got = _fenv()
    if got is None:
        return False
    if enable:   # numpy's finfo then finds float32's smallest subnormal to be 0 and says so
        warnings.filterwarnings("ignore", message="The value of the smallest subnormal",
                                category=UserWarning)
    libm, env = got
    mxcsr = _mxcsr(env)
    mxcsr = mxcsr | _MXCSR_FTZ_DAZ if enable else mxcsr & ~_MXCSR_FTZ_DAZ
    env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4] = (ctypes.c_ubyte * 4)(*mxcsr.to_bytes(4, "little"))
    return libm.fesetenv(ctypes.byref(env)) == 0


# -- failed writes, for the command-line tools -----------------------------------------------------
def path_within(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies under it (after resolving links and '..')."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _safetensors_write_reason(error: BaseException) -> Optional[str]:
    """The OS reason of a safetensors serialisation failure ("No space left on device"), or
    None when `error` is not one (reading a damaged file is the loader's error to report)."""
    module = sys.modules.get("safetensors")   # never imported: it cannot have raised
    cls = getattr(module, "SafetensorError", None)
    if cls is None or not isinstance(error, cls):
        return None
    text = str(error)
    if "while serializing" not in text:
        return None
    # "Error while serializing: I/O error: No space left on device (os error 28)", or in older
    # releases "... IoError(Os { code: 28, kind: StorageFull, message: \"No space left ...\" })"
    found = re.search(r'message: "([^"]+)"', text) or \
        re.search(r"I/O error: (.*?)(?: \(os error \d+\))?$", text)
    return found.group(1) if found else text


def write_failure(error: BaseException, target: str, what: str = "output_dir",
                  target_is_dir: bool = True) -> Optional[str]:
    """The one-line report of `error` raised while writing `target`, or None when it is no
    failed write there (the caller then re-raises)."""
    target = os.fspath(target)
    if isinstance(error, OSError):
        reason = error.strerror or str(error)
        name = error.filename
        name = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else None
        if name is not None and path_within(target, name):          # target or a parent of it
            is_target = os.path.normpath(name) == os.path.normpath(target)
            where = f"{what} {target}" if is_target else f"{what} {target}: {name}"
            if os.path.lexists(name) and not os.path.isdir(name) and \
                    (target_is_dir or not is_target):
                return f"{where}: is a file, not a directory"
            if os.path.lexists(name) or error.errno in WRITE_ERRNOS - {errno.EROFS}:
                return f"{where}: cannot write ({reason})"     # there, or no room for it
            return f"{where}: cannot create it ({reason})"
        if error.errno in WRITE_ERRNOS:
            return f"{name or target}: cannot write ({reason})"
        if name is not None and path_within(name, target) and error.errno in _PLACE_ERRNOS:
            return f"{name}: {reason}"
        return None
    reason = _safetensors_write_reason(error)
    if reason is not None:
        return f"{target}: cannot write ({reason})"
    return None


# ERNIE_DOC_PROGRESS: these values turn progress off; "bar" and "lines" force that display;
# anything else (or nothing) draws a bar on a terminal and plain lines elsewhere (a log file)
_PROGRESS_OFF = ("0", "false", "no", "off")
_PROGRESS_FORCED = ("bar", "lines")
# ProgressLines: a line for each LINE_PERCENT of the total done (LINE_GAP seconds apart at
# least), else one every LINE_SECONDS; a log then holds a few dozen lines, not thousands
LINE_PERCENT, LINE_GAP, LINE_SECONDS = 5.0, 5.0, 60.0


def _progress_setting() -> str:
    return os.environ.get("ERNIE_DOC_PROGRESS", "").strip().lower()


def show_progress(requested: bool = True) -> bool:
    """Whether to show progress (every bar asks here): off with ERNIE_DOC_PROGRESS=0, or for
    one run with `requested` False (`progress: false`, --no-progress)."""
    return bool(requested) and _progress_setting() not in _PROGRESS_OFF


def progress_style(requested: bool = True, stream: Any = None) -> Optional[str]:
    """How progress is shown: "bar" (redrawn in place) when `stream` (default stderr) is a
    terminal, "lines" (plain lines, for a log file) when it is not, either one forced by
    ERNIE_DOC_PROGRESS=bar|lines; None when progress is off (show_progress)."""
    if not show_progress(requested):
        return None
    setting = _progress_setting()
    if setting in _PROGRESS_FORCED:
        return setting
    stream = sys.stderr if stream is None else stream
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return "lines"


def progress_bar(iterable: Any = None, *, total: Optional[float] = None, desc: str = "",
                 requested: bool = True, unit: str = "it", leave: bool = True,
                 **bar_options: Any) -> Any:
    """The progress display of every command, on stderr: a tqdm bar on a terminal, plain
    ProgressLines elsewhere, a disabled tqdm when progress is off (progress_style). Used as
    tqdm; `bar_options` go to tqdm (unit_scale, unit_divisor and initial to the lines too)."""
    style = progress_style(requested)
    if style == "lines":
        kept = {k: bar_options[k] for k in ("unit_scale", "unit_divisor", "initial")
                if k in bar_options}
        return ProgressLines(iterable, total=total, desc=desc, unit=unit, leave=leave, **kept)
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr,
                disable=style is None, **bar_options)


class ProgressLines:
    """Progress as plain lines on stderr, for a log file (no "\\r" redraws): a line each time
    another LINE_PERCENT of the total is done (and LINE_GAP seconds have passed), or after
    LINE_SECONDS without one; at close, a last line (with `leave`, or when lines were written).
    A line is tqdm's statistics without the bar. Used as a tqdm bar."""

    def __init__(self, iterable: Any = None, total: Optional[float] = None, desc: str = "",
                 unit: str = "it", leave: bool = True, initial: float = 0,
                 unit_scale: bool = False, unit_divisor: int = 1000, file: Any = None,
                 clock: Any = None):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.leave, self.unit_scale, self.unit_divisor = leave, unit_scale, unit_divisor
        self.n = self.initial = initial
        self.file, self.clock = file, clock or time.monotonic
        self.start = self.last_time = self.clock()
        self.last_n, self.lines, self.postfix, self.closed = initial, 0, "", False

    def __iter__(self) -> Any:
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        """What follows the statistics, as tqdm's `key=value, ...`."""
        values = dict(ordered_dict or {}, **kwargs)
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: float = 1) -> None:
        """Count `n` more done; write a line when one is due."""
        self.n += n
        now = self.clock()
        if self._due(now):
            self._write(now)

    def _due(self, now: float) -> bool:
        if self.n == self.last_n:
            return False
        since = now - self.last_time
        if self.total:
            step = (self.n - self.last_n) * 100.0 / self.total
            if step >= LINE_PERCENT and since >= LINE_GAP:
                return True
        return since >= LINE_SECONDS

    def _write(self, now: float) -> None:
        from tqdm import tqdm
        line = tqdm.format_meter(self.n, self.total, now - self.start, ncols=0,
                                 prefix=self.desc, unit=self.unit, unit_scale=self.unit_scale,
                                 unit_divisor=self.unit_divisor, initial=self.initial,
                                 postfix=self.postfix or None)
        stream = sys.stderr if self.file is None else self.file
        stream.write(line + "\n")
        stream.flush()
        self.last_n, self.last_time, self.lines = self.n, now, self.lines + 1

    def close(self) -> None:
        """The last line (with `leave`, or when lines were written and more was done since)."""
        if self.closed:
            return
        self.closed = True
        written = self.lines and self.n == self.last_n   # the last line says it already
        if not written and (self.leave or self.lines):
            self._write(self.clock())


def _bars_drawn() -> bool:
    """True while a tqdm bar is on screen (a bar made with disable=True is never listed)."""
    tqdm = sys.modules.get("tqdm")   # no bar can exist before tqdm is imported
    return bool(tqdm and getattr(tqdm.tqdm, "_instances", None))


class BarSafeHandler(logging.StreamHandler):
    """A console log handler writing through tqdm.write while a progress bar is drawn (so the
    bar is redrawn below the line); otherwise a StreamHandler."""

    def emit(self, record: logging.LogRecord) -> None:
        if not _bars_drawn():
            super().emit(record)
            return
        try:
            from tqdm import tqdm
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:   # as logging.StreamHandler.emit
            raise
        except Exception:
            self.handleError(record)


class CurrentStdout(BarSafeHandler):
    """A BarSafeHandler writing to sys.stdout as it is when a record comes (it may have been
    replaced since the handler was made: captured, or a command run in-process ended)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def notes_to_stdout(name: str = "ernie_doc") -> None:
    """Send the `name` logger's records to stdout with a tool's report (stderr: only errors).
    For a tool's `__main__`: changes process-wide logging."""
    handler = CurrentStdout()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    log = logging.getLogger(name)
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)


def write_error_types() -> tuple:
    """The exception types write_failure() may report (for an `except` clause)."""
    module = sys.modules.get("safetensors")
    cls = getattr(module, "SafetensorError", None)
    return (OSError,) if cls is None else (OSError, cls)


def quiet_failed_closes() -> None:
    """After a write failed for lack of space, drop the "Exception ignored in ..." tracebacks of
    files the garbage collector closes (OSError with a WRITE_ERRNOS errno); print any other."""
    previous = sys.unraisablehook

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
            return
        previous(unraisable)
    sys.unraisablehook = hook
