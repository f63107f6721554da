"""Fetching one file over HTTP(S) into the cache: mirror, offline mode, lock, progress bar,
checksum, bounds, and nothing half-written.

Environment: ERNIE_DOC_OFFLINE, ERNIE_DOC_MIRROR, ERNIE_DOC_TIMEOUT, ERNIE_DOC_DOWNLOAD_DEADLINE,
ERNIE_DOC_DOWNLOAD_MIN_SPEED, ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME, ERNIE_DOC_DOWNLOAD_MAX_BYTES.
Details: docs/design-notes.md, "Hub: fetching a file"."""
import collections
import contextlib
import hashlib
import http.client
import io
import logging
import math
import os
import re
import shutil
import socket
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import BinaryIO, Iterator, NamedTuple, Optional, Tuple

from ernie_doc.errors import HubError
from ernie_doc.utils import mode_kind, progress_bar

logger = logging.getLogger("ernie_doc.hub")

CHUNK = 1 << 20
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
DEFAULT_TIMEOUT = 60.0
DEFAULT_DEADLINE = 3 * 3600.0
DEFAULT_MAX_BYTES = 8 << 30
DEFAULT_MIN_SPEED = 1 << 10      # bytes/s, averaged over DEFAULT_MIN_SPEED_TIME (curl's
DEFAULT_MIN_SPEED_TIME = 60.0    # --speed-limit / --speed-time)
MAX_SECONDS = 30 * 24 * 3600.0   # the largest timeout or deadline a variable may set
MAX_BYTES = 1 << 50              # ... and the largest byte cap (1 PiB)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Opened for writing: created here, never an existing file and never through a link.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def shown(text: str) -> str:
    """`text` for a one-line message: as is when printable, else its repr (no forged lines)."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def _env(name: str) -> str:
    """The environment variable `name`, stripped, for parsing (bounded: a value of megabytes
    is shown clipped in the error)."""
    return os.environ.get(name, "").strip()


def _quoted(raw: str) -> str:
    return repr(raw if len(raw) <= 40 else raw[:30] + "..." + raw[-6:])


def offline() -> bool:
    """ERNIE_DOC_OFFLINE is 1/true/yes/on (False for 0/false/no/off/unset); HubError, one line,
    for any other value (a typo must not silently go online)."""
    raw = _env("ERNIE_DOC_OFFLINE").lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise HubError(f"ERNIE_DOC_OFFLINE={_quoted(raw)}: expected 1, true, yes or on (offline), "
                   f"or 0, false, no, off or nothing (online)")


def seconds_env(name: str, default: float) -> float:
    """The environment variable `name` as a number of seconds above 0 and at most 30 days
    (`default` when unset or empty); HubError, one line naming the variable, otherwise."""
    raw = _env(name)
    if not raw:
        return default
    try:
        value = float(raw) if len(raw) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise HubError(f"{name}={_quoted(raw)}: expected a number of seconds above 0 and at "
                       f"most {MAX_SECONDS:.0f} (30 days)")
    return value


def bytes_env(name: str, default: int, per_second: bool = False) -> int:
    """Environment variable `name` as a byte count in (0, 1 PiB] (`default` when unset): `N`
    or `N` K/M/G/T (binary units). `per_second`: a speed, where 0 (off) is allowed too.
    HubError naming the variable otherwise."""
    raw = _env(name)
    if not raw:
        return default
    match = re.fullmatch(r"(\d{1,20})\s*([KMGT]?)(?:I?B)?" + ("(?:/S)?" if per_second else ""),
                         raw.upper()) if len(raw) <= 40 else None
    value = int(match.group(1)) * _UNITS[match.group(2)] if match else -1
    if not (0 if per_second else 1) <= value <= MAX_BYTES:
        raise HubError(
            f"{name}={_quoted(raw)}: expected a number of bytes per second, 0 (no limit) to "
            f"1 PiB (e.g. 1024 or 1K)" if per_second else
            f"{name}={_quoted(raw)}: expected a number of bytes above 0 and at most 1 PiB "
            f"(e.g. 4294967296 or 4G)")
    return value


def check_url(url: str, what: str = "URL") -> urllib.parse.SplitResult:
    """`url` split, once checked to be http(s) with a host, a valid port and no control
    character (raw or %-encoded); HubError naming it otherwise."""
    def bad(reason):
        return HubError(f"{what} {url!r}: {reason}")

    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in url):
        raise bad("holds a control character")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port   # noqa: B018  raises ValueError for a port that is not a number in range
    except ValueError as e:
        raise bad(f"not a valid URL ({e})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise bad("expected http(s)://host[:port]/...")
    decoded = urllib.parse.unquote(parts.path)
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in decoded):
        raise bad("its path holds an encoded control character (such as %00)")
    return parts


def mirror() -> Optional[str]:
    """ERNIE_DOC_MIRROR, checked, or None when unset."""
    value = os.environ.get("ERNIE_DOC_MIRROR", "").strip()
    if not value:
        return None
    try:
        parts = check_url(value, "ERNIE_DOC_MIRROR")
    except HubError:
        raise HubError(f"ERNIE_DOC_MIRROR={value!r}: expected http://host[:port] or "
                       f"https://host[:port] (with an optional /path prefix)") from None
    if parts.query or parts.fragment:
        raise HubError(f"ERNIE_DOC_MIRROR={value!r}: a mirror has no ?query or #fragment")
    return value


def mirrored(url: str) -> str:
    """`url` with its scheme and host replaced by ERNIE_DOC_MIRROR's (path and query kept)."""
    value = mirror()
    if value is None:
        return url
    m = urllib.parse.urlsplit(value)
    u = urllib.parse.urlsplit(url)
    prefix = m.path.rstrip("/")   # a mirror may serve the tree under a path prefix
    return urllib.parse.urlunsplit((m.scheme, m.netloc, prefix + u.path, u.query, ""))


# Opened for reading: a regular file reached without following a final link, never blocking on
# a FIFO planted under its name.
_READ_NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def open_own(path: str) -> BinaryIO:
    """A binary file object of the regular file `path` in the cache; a link, FIFO, device or
    folder there is a HubError, never followed or opened."""
    try:
        fd = os.open(path, _READ_NOFOLLOW)
    except OSError as e:
        try:
            kind = _kind(os.lstat(path).st_mode)
        except OSError:
            kind = None
        if kind:
            raise HubError(f"{shown(path)}: is {kind}, not a regular file; refused") from None
        raise HubError(f"{shown(path)}: cannot read ({e.strerror})") from None
    kind = _kind(os.fstat(fd).st_mode)
    if kind:
        os.close(fd)
        raise HubError(f"{shown(path)}: is {kind}, not a regular file; refused")
    return os.fdopen(fd, "rb")


def _kind(mode: int) -> Optional[str]:
    """None for a regular file, else what is there instead (a link is never taken for its
    target)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return mode_kind(mode)


def sha256_of(f: BinaryIO) -> str:
    """The sha256 (hex) of an open binary file, read from where it stands to its end."""
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(CHUNK), b""):
        digest.update(block)
    return digest.hexdigest()


def sha256_file(path: str) -> str:
    """The sha256 of the regular file `path` (a link, FIFO or device: HubError, never read)."""
    with open_own(path) as f:
        return sha256_of(f)


@contextlib.contextmanager
def file_lock(path: str, what: str, wait: Optional[float] = None) -> Iterator[bool]:
    """Hold an exclusive flock on `path` for the block (dies with its process); `wait` seconds
    at most, then a HubError. Yields True when held (False without flock)."""
    try:
        import fcntl
    except ImportError:   # Windows: no flock; concurrent downloads then race (still atomic)
        yield False
        return
    if wait is None:
        wait = seconds_env("ERNIE_DOC_DOWNLOAD_DEADLINE", DEFAULT_DEADLINE)
    # never through a link, and never blocking on a FIFO planted under the lock's name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as e:
        raise HubError(f"{shown(path)}: cannot open the lock ({e.strerror}); remove it") \
            from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HubError(f"{shown(path)}: the lock is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that is fetching %s", shown(what))
            end, pause = time.monotonic() + wait, 0.02
            while True:
                time.sleep(min(pause, max(0.0, end - time.monotonic())))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= end:
                        raise HubError(
                            f"{shown(path)}: another process has been fetching {shown(what)} "
                            f"for longer than {wait:g} s (ERNIE_DOC_DOWNLOAD_DEADLINE) and "
                            f"still holds this lock; try again later, or stop that "
                            f"process") from None
                pause = min(pause * 2, 0.25)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _free_bytes(directory: str) -> Optional[int]:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def check_space(directory: str, needed: int, what: str) -> None:
    """HubError before writing `needed` bytes into `directory` when they cannot fit."""
    free = _free_bytes(directory)
    if free is not None and needed > free:
        raise HubError(f"{what}: needs {needed / 2**20:,.0f} MiB in {directory} but only "
                       f"{free / 2**20:,.0f} MiB are free (ERNIE_DOC_HOME picks another place)")


def _progress(total: Optional[int], desc: str):
    return progress_bar(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                        leave=False, mininterval=0.5)


def _origin(parts: urllib.parse.SplitResult) -> Tuple[str, str, int]:
    """(scheme, host, port) of a URL, the port made explicit."""
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), \
        parts.port or {"http": 80, "https": 443}.get(scheme, 0)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to the same scheme, host and port (or http → https on the same
    host), or anywhere http(s) under a configured mirror."""

    def __init__(self, by_hand: str):
        self.by_hand = by_hand
        self.anywhere = mirror() is not None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old = urllib.parse.urlsplit(req.full_url)
        try:
            new = check_url(newurl, "redirect to")
        except HubError as e:
            fp.close()
            raise HubError(f"{req.full_url}: {e}; {self.by_hand}") from None
        problem = None
        (old_scheme, old_host, old_port), (scheme, host, port) = _origin(old), _origin(new)
        upgrade = (old_scheme, old_port, scheme, port) == ("http", 80, "https", 443)
        if old_scheme == "https" and scheme == "http":
            problem = "from https to http"
        elif not self.anywhere and (host != old_host or (
                (scheme, port) != (old_scheme, old_port) and not upgrade)):
            problem = (f"to another host or port (set ERNIE_DOC_MIRROR={new.scheme}://"
                       f"{new.netloc} to fetch from it)")
        if problem:
            fp.close()
            raise HubError(f"{req.full_url}: refused a redirect {problem}: {shown(newurl)}; "
                           f"{self.by_hand}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def looks_like_html(head: bytes) -> bool:
    """The first bytes of a file are an HTML page's (a login or captive portal answering in
    place of the file), also after a byte-order mark, white space or `<!-- comments -->`."""
    text = head[:4096].lstrip()
    for bom in (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"):
        if text.startswith(bom):
            text = text[len(bom):].replace(b"\0", b"").lstrip()
    while text.startswith(b"<!--"):
        end = text.find(b"-->")
        if end < 0:
            return True   # a page opening with a comment longer than what was read
        text = text[end + 3:].lstrip()
    return text[:64].lower().startswith((b"<!doctype html", b"<html", b"<head", b"<body",
                                         b"<?xml", b"<meta", b"<script", b"<title"))


class _Limits(NamedTuple):
    """The bounds of one download, from the environment (`_download_limits`)."""
    timeout: float       # seconds one connect or read may wait (ERNIE_DOC_TIMEOUT)
    deadline: float      # seconds the whole download may take
    min_speed: int       # bytes/s every `speed_time` seconds must average (0: no such rule)
    speed_time: float
    cap: int             # the most bytes the body may have
    said: str            # how the cap is named in errors


class _Stopped(Exception):
    """A bound of the download ended it: `what` happened, `setting` names the variables
    that set the bound (not an OSError nor ValueError: http.client turns those into other
    errors on the way)."""

    def __init__(self, what: str, setting: str):
        super().__init__(what)
        self.what, self.setting = what, setting


class _Pace:
    """curl's --speed-limit/--speed-time: from `window` seconds after the first connection
    (`begin`), the bytes received in the last `window` seconds must average `limit` bytes/s
    or more (headers, chunk-size lines and body alike)."""

    def __init__(self, limit: int, window: float):
        self.limit, self.window, self.size = limit, window, 0
        self.start: Optional[float] = None
        # (time, bytes received by then), at least window/16 apart except the newest, which
        # the next block moves forward (a block counts as arriving up to window/16 late)
        self.marks: collections.deque = collections.deque()

    def begin(self, now: float) -> None:
        if self.start is None:
            self.start = now
            self.marks.append((now, 0))

    def received(self, n: int, now: float) -> None:
        self.size += n
        if len(self.marks) > 1 and now - self.marks[-2][0] < self.window / 16:
            self.marks[-1] = (now, self.size)
        else:
            self.marks.append((now, self.size))
        while len(self.marks) > 2 and self.marks[1][0] <= now - self.window:
            self.marks.popleft()   # what no window ending now or later reaches

    def left(self, now: float) -> float:
        """Seconds until the rule fails if nothing more arrives (0: it fails now)."""
        if not self.limit or self.start is None:
            return math.inf
        for at, count in self.marks:   # the first mark a failing window can start at
            if self.size - count < self.limit * self.window:
                return max(0.0, self.start + self.window - now, at + self.window - now)
        return math.inf   # not reached: the newest mark holds every byte

    def stopped(self, now: float) -> _Stopped:
        """The rule failed (or fails within `left(now)` s): _Stopped with the bytes of the
        window that fails and their speed."""
        end = now + self.left(now)
        before = [count for at, count in self.marks if at <= end - self.window]
        got = self.size - (before[-1] if before else 0)
        return _Stopped(f"too slow: {got:,} bytes in the last {self.window:g} s "
                        f"({got / self.window:,.1f} bytes/s), below {self.limit:,} bytes/s",
                        "ERNIE_DOC_DOWNLOAD_MIN_SPEED and ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME "
                        "set this rule")


class _Clock:
    """The bounds of one download in time: every socket operation waits at most the
    per-read timeout, never past the deadline, and never past the moment the low-speed rule
    fails if nothing more arrives."""

    def __init__(self, limits: _Limits):
        self.timeout, self.deadline = limits.timeout, limits.deadline
        self.end = time.monotonic() + limits.deadline
        self.pace = _Pace(limits.min_speed, limits.speed_time)

    def connected(self) -> None:
        self.pace.begin(time.monotonic())

    def received(self, n: int) -> None:
        self.pace.received(n, time.monotonic())

    def remaining(self, grace: float = 0.0) -> float:
        """Seconds left for the next socket operation; _Stopped once the deadline passed or
        the low-speed rule failed (within `grace` seconds of it: a timeout that ended there)."""
        now = time.monotonic()
        left = self.end - now
        if left <= grace:
            raise _Stopped(f"not finished after {self.deadline:g} s",
                           "ERNIE_DOC_DOWNLOAD_DEADLINE sets the limit")
        slow = self.pace.left(now)
        if slow <= grace:
            raise self.pace.stopped(now)
        return min(self.timeout, left, slow)


class _TimedReader(io.RawIOBase):
    """The socket's raw reader with its timeout set from the clock before every read, so a
    trickling server stops at the deadline or, sooner, at the low-speed rule."""

    def __init__(self, sock, clock: _Clock):
        super().__init__()
        self.sock, self.clock = sock, clock
        self.raw = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.sock.settimeout(self.clock.remaining())
        try:
            n = self.raw.readinto(buffer)
        except socket.timeout:
            self.clock.remaining(grace=0.01)   # _Stopped when a bound is what stopped it
            raise
        if n:
            self.clock.received(n)
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


class _TimedSocket:
    """What an HTTPResponse is given as its socket: makefile() reads through _TimedReader."""

    def __init__(self, sock, clock: _Clock):
        self.sock, self.clock = sock, clock

    def makefile(self, mode, *args, **kwargs):
        return io.BufferedReader(_TimedReader(self.sock, self.clock))


def _timed_handlers(clock: _Clock) -> list:
    """urllib handlers whose connections connect within the clock's time and read through
    _TimedReader (redirects go through them as well)."""
    def timed(base):
        class Response(http.client.HTTPResponse):
            def __init__(self, sock, *args, **kwargs):
                super().__init__(_TimedSocket(sock, clock), *args, **kwargs)

        class Connection(base):
            response_class = Response

            def connect(self):
                self.timeout = clock.remaining()
                super().connect()
                clock.connected()
        return Connection

    http_connection = timed(http.client.HTTPConnection)
    https_connection = timed(http.client.HTTPSConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(http_connection, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(https_connection, req, context=self._context)

    return [Http(), Https()]


def download(url: str, dest: str, manual: str, sha256: Optional[str] = None,
             room_factor: float = 1.0, max_bytes: Optional[int] = None) -> Tuple[str, int]:
    """Fetch `url` into the new file `dest` (O_EXCL | O_NOFOLLOW) → (sha256 hex, bytes). HubError
    naming the URL and `manual` on any failure; `dest` then does not exist."""
    fetched = mirrored(url)
    check_url(fetched)
    by_hand = f"download {fetched} yourself and put it at {manual}"
    if offline():
        raise HubError(f"{manual}: not in the cache and ERNIE_DOC_OFFLINE is set: {by_hand}")
    limits = _download_limits(max_bytes)
    cap, said = limits.cap, limits.said
    directory = os.path.dirname(dest)
    request = urllib.request.Request(fetched, headers={"User-Agent": "ernie-doc-paddle",
                                                       "Accept-Encoding": "identity"})
    clock = _Clock(limits)
    opener = urllib.request.build_opener(_Redirects(by_hand), *_timed_handlers(clock))
    body, fd = _Body(fetched, by_hand), None
    started = time.monotonic()
    try:
        with opener.open(request, timeout=clock.remaining()) as response:
            html_ok = dest.lower().endswith((".html", ".htm"))
            total = _announced_size(response, body, html_ok, cap, said, sha256)
            check_space(directory, int((total or 0) * room_factor), fetched)
            fd = os.open(dest, _NEW_FILE, 0o600)
            with _progress(total, os.path.basename(manual)) as bar:
                body.stream(response, fd, dest, clock, bar, html_ok,
                            total if total is not None else cap,
                            "the announced Content-Length" if total is not None else said)
        got = body.checked_hash(total, sha256)
    except HubError:
        _discard(fd, dest)
        raise
    except _Stopped as e:
        _discard(fd, dest)
        raise body.stopped(e) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        # HTTP errors, timeouts, resets, a body cut short (IncompleteRead)
        _discard(fd, dest)
        if not isinstance(e, urllib.error.URLError) and isinstance(e, OSError) \
                and e.filename is not None:
            raise   # a local write failure (full disk, permissions): the caller reports it
        raise _network_error(e, body, limits.deadline, started) from None
    except BaseException:   # KeyboardInterrupt: no partial file either
        _discard(fd, dest)
        raise
    os.close(fd)
    logger.info("downloaded %s (%s bytes, %.1f s, sha256 %s)", fetched, f"{body.size:,}",
                time.monotonic() - started, got)
    return got, body.size


def _download_limits(max_bytes: Optional[int]) -> _Limits:
    """The bounds of a download from the environment (each variable checked: HubError, one
    line, before anything is fetched); `max_bytes`, the registry's cap, wins over the
    variable."""
    cap = max_bytes or bytes_env("ERNIE_DOC_DOWNLOAD_MAX_BYTES", DEFAULT_MAX_BYTES)
    said = "the registry's cap for this file" if max_bytes else \
        "the cap of ERNIE_DOC_DOWNLOAD_MAX_BYTES"
    return _Limits(
        timeout=seconds_env("ERNIE_DOC_TIMEOUT", DEFAULT_TIMEOUT),
        deadline=seconds_env("ERNIE_DOC_DOWNLOAD_DEADLINE", DEFAULT_DEADLINE),
        min_speed=bytes_env("ERNIE_DOC_DOWNLOAD_MIN_SPEED", DEFAULT_MIN_SPEED,
                            per_second=True),
        speed_time=seconds_env("ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME", DEFAULT_MIN_SPEED_TIME),
        cap=cap, said=said)


class _Body:
    """The body of one download as it arrives: its size and sha256 so far (read by the
    error messages of `download` too), and the URL and by-hand advice its errors name."""

    def __init__(self, fetched: str, by_hand: str):
        self.fetched, self.by_hand = fetched, by_hand
        self.digest, self.size = hashlib.sha256(), 0

    def stream(self, response, fd: int, dest: str, clock: _Clock, bar, html_ok: bool,
               limit: int, why: str) -> None:
        """Copy the response into `fd` block by block, hashing it; HubError on an HTML page
        (unless `html_ok`) or on more than `limit` bytes (`why`: the source of the limit)."""
        fetched, by_hand = self.fetched, self.by_hand
        while True:
            clock.remaining()
            # read1: whatever has arrived, so a slow drip cannot hold a read forever
            block = response.read1(min(CHUNK, limit + 1 - self.size))
            if not block:
                break
            if self.size == 0 and not html_ok and looks_like_html(block):
                raise HubError(f"{fetched}: the server sent an HTML page, not the "
                               f"file (a login or captive portal?); nothing was kept; "
                               f"{by_hand}")
            self.size += len(block)
            if self.size > limit:
                raise HubError(f"{fetched}: the body is longer than {limit:,} bytes, "
                               f"{why}; nothing was kept; {by_hand}")
            write_all(fd, block, dest)
            self.digest.update(block)
            bar.update(len(block))

    def stopped(self, e: _Stopped) -> HubError:
        """The one line of a download a bound ended (the deadline, the low-speed rule)."""
        return HubError(f"{self.fetched}: {e.what}; {self.size:,} bytes of the file received "
                        f"({e.setting}); nothing was kept; {self.by_hand}")

    def checked_hash(self, total: Optional[int], sha256: Optional[str]) -> str:
        """The body's sha256 hex, once it is known to be whole (`total` bytes when announced)
        and, when `sha256` is given, the expected one; HubError otherwise."""
        if total is not None and self.size != total:
            raise HubError(f"{self.fetched}: the connection closed after {self.size:,} of "
                           f"{total:,} bytes; try again, or {self.by_hand}")
        got = self.digest.hexdigest()
        if sha256 is not None and got != sha256.lower():
            raise HubError(f"{self.fetched}: sha256 {got} differs from the expected {sha256} "
                           f"(a corrupted or different file; nothing was kept)")
        return got


def _announced_size(response, body: _Body, html_ok: bool, cap: int, said: str,
                    sha256: Optional[str]) -> Optional[int]:
    """The body's announced size (None: not announced), refusing an encoding, HTML, a size
    over `cap`, or no framing when no sha256 could detect a cut body."""
    fetched, by_hand = body.fetched, body.by_hand
    encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise HubError(f"{fetched}: the server sent the file {shown(encoding)}-encoded "
                       f"although identity was asked for; refused (nothing was "
                       f"kept); {by_hand}")
    kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind == "text/html" and not html_ok:
        raise HubError(f"{fetched}: the server sent an HTML page, not the file (a "
                       f"login or captive portal?); nothing was kept; {by_hand}")
    length = (response.headers.get("Content-Length") or "").strip()
    total = int(length) if length.isdigit() and len(length) <= 20 else None
    if total is not None and total > cap:
        raise HubError(f"{fetched}: the server announces {total:,} bytes, more than "
                       f"{cap:,}, {said}; refused (nothing was kept); {by_hand}")
    if total is None and not getattr(response, "chunked", False) and sha256 is None:
        raise HubError(f"{fetched}: the server announced no length (no Content-Length, "
                       f"not chunked), so a body cut short could not be told from the "
                       f"whole file, and no sha256 is known for it; refused (nothing "
                       f"was kept); {by_hand}")
    return total


def _network_error(e: BaseException, body: _Body, deadline: float,
                   started: float) -> HubError:
    """The one-line HubError of a failed connection or read (HTTP status, timeout, reset),
    saying when the download deadline is what ended it."""
    fetched, by_hand = body.fetched, body.by_hand
    reason = getattr(e, "reason", None) or e
    if isinstance(reason, _Stopped):   # wrapped by urllib on the way
        return body.stopped(reason)
    code = getattr(e, "code", None)
    what = f"HTTP {code}" if code else f"{type(reason).__name__}: {shown(reason)}"
    if time.monotonic() - started > deadline:
        what += f", after the {deadline:g} s of ERNIE_DOC_DOWNLOAD_DEADLINE"
    return HubError(f"{fetched}: cannot download ({what}); {by_hand}")


def write_all(fd: int, data: bytes, path: str) -> None:
    """Write all of `data` to `fd`; a failure (a full disk) is an OSError naming `path`."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:   # a full disk: a local write failure naming the file
        raise OSError(e.errno, e.strerror, path) from None


def _discard(fd: Optional[int], path: str) -> None:
    """Close and remove the file this download created (only when it created one)."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
