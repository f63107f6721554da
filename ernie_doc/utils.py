"""Small shared helpers: atomic file writes, JSON reading with file:line errors, CPU threads."""
import contextlib
import json
import os
import tempfile


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to `path`; move it into place only if the block succeeds."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + ".", dir=directory)
    os.close(fd)
    # mkstemp creates 0600; give the file the mode a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path, text):
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def read_utf8(path, error=ValueError):
    """A whole UTF-8 file; invalid bytes or an unreadable file raise `error` naming the file
    (and the line of the bad byte)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{path}:{line}: invalid UTF-8 (byte {e.start})") from None


def read_json(path, error=ValueError):
    """Parse a JSON file; a bad file raises `error` naming the file (and line)."""
    text = read_utf8(path, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{os.fspath(path)}:{e.lineno}: invalid JSON ({e.msg})") from None


def set_paddle_threads(threads):
    """CPU math threads for paddle (set OMP_NUM_THREADS before importing paddle as well for
    the OpenMP parts)."""
    import paddle
    setter = getattr(paddle, "set_num_threads", None)
    if setter is None:  # 2.6.2 and 3.3.1 have it only in the core module
        core = getattr(getattr(paddle, "base", None), "core", None)
        setter = getattr(core, "set_num_threads", None)
    if setter is not None:
        setter(int(threads))
