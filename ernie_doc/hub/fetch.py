"""Fetching one file over HTTP(S) into the cache: mirror, offline mode, lock, progress bar,
checksum, bounds, and nothing half-written.

A file is streamed into a new file of a private temporary folder (created with O_EXCL and
O_NOFOLLOW, so a link planted there is never written through) while its sha256 is computed,
and checked against the length the server announced and the expected hash before the caller
uses it. Every download is bounded: in time (a total deadline, not only a per-read timeout, so
a server that drips one byte at a time stops) and in size (the announced Content-Length, or,
when none is announced, the entry's cap). Only identity-encoded bodies are accepted, an HTML
page is never taken for a file, and a redirect to another host is refused unless a mirror is
configured. Environment (a malformed value is a one-line HubError):

    ERNIE_DOC_OFFLINE=1           never open a socket; a file not in the cache is an error
                                  naming its URL and the path to put it at by hand
    ERNIE_DOC_MIRROR=http://h:p   replace the scheme and host of every URL (the path is kept),
                                  for an internal mirror or a test server
    ERNIE_DOC_TIMEOUT=SECONDS     socket timeout of each read (default 60)
    ERNIE_DOC_DOWNLOAD_DEADLINE=SECONDS   the longest one download may take (default 3 h)
    ERNIE_DOC_DOWNLOAD_MAX_BYTES=N        the largest body accepted without a Content-Length
                                  when the registry sets no cap for the file (default 8 GiB;
                                  K, M, G suffixes are binary)
"""
import contextlib
import hashlib
import http.client
import logging
import math
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterator, Optional, Tuple

from ernie_doc.checkpoint.io import CheckpointError

logger = logging.getLogger("ernie_doc.hub")

CHUNK = 1 << 20
_TRUE = ("1", "true", "yes", "on")
DEFAULT_TIMEOUT = 60.0
DEFAULT_DEADLINE = 3 * 3600.0
DEFAULT_MAX_BYTES = 8 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Opened for writing: created here, never an existing file and never through a link.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


class HubError(CheckpointError):
    """A released model or a remote file that cannot be fetched, verified or unpacked; the
    message is one line naming the URL or cache path (and, for a failed download, where to
    put the file by hand)."""


def offline() -> bool:
    """ERNIE_DOC_OFFLINE is set to 1/true/yes/on."""
    return os.environ.get("ERNIE_DOC_OFFLINE", "").strip().lower() in _TRUE


def seconds_env(name: str, default: float) -> float:
    """The environment variable `name` as a positive, finite number of seconds (`default`
    when unset or empty); HubError, one line naming the variable, otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise HubError(f"{name}={raw!r}: expected a number of seconds above 0")
    return value


def bytes_env(name: str, default: int) -> int:
    """The environment variable `name` as a positive byte count (`default` when unset):
    `N`, or `N` followed by K, M, G or T (binary units; `KiB`, `MB` ... also read as binary)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    match = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:I?B)?", raw.upper())
    if not match or int(match.group(1)) <= 0:
        raise HubError(f"{name}={raw!r}: expected a number of bytes above 0 (e.g. 4294967296 "
                       f"or 4G)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def check_url(url: str, what: str = "URL") -> urllib.parse.SplitResult:
    """`url` split, after checking it is an http(s) URL with a host and a valid port, and
    holds no control character (raw or %-encoded: a NUL byte cannot name a file); HubError,
    one line naming it, otherwise."""
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


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def file_lock(path: str, what: str) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (created if needed) for the block: N processes (e.g.
    the ranks of a fleetrun job) that want the same cache entry fetch it once, the others
    wait and then find it there. The lock dies with its process, so a killed download never
    leaves the entry locked. Yields True when the lock is held (False on a system without
    flock: then nothing left by another process may be taken as stale)."""
    try:
        import fcntl
    except ImportError:   # Windows: no flock; concurrent downloads then race (still atomic)
        yield False
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # never through a link, and never blocking on a FIFO planted under the lock's name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that is fetching %s", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
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
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                file=sys.stderr, leave=False, mininterval=0.5,
                disable=os.environ.get("ERNIE_DOC_PROGRESS", "1") in ("0", "false"))


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to the same host (http → https allowed, never back), or
    anywhere http(s) when a mirror is configured (the user chose that server)."""

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
        if old.scheme == "https" and new.scheme.lower() == "http":
            problem = "from https to http"
        elif not self.anywhere and (new.hostname or "") != (old.hostname or ""):
            problem = (f"to another host (set ERNIE_DOC_MIRROR={new.scheme}://{new.netloc} "
                       f"to fetch from it)")
        if problem:
            fp.close()
            raise HubError(f"{req.full_url}: refused a redirect {problem}: {newurl}; "
                           f"{self.by_hand}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def looks_like_html(head: bytes) -> bool:
    """The first bytes of a file are an HTML page's (a login or captive portal answering in
    place of the file)."""
    return head[:512].lstrip()[:64].lower().startswith((b"<!doctype html", b"<html",
                                                         b"<head", b"<body"))


def download(url: str, dest: str, manual: str, sha256: Optional[str] = None,
             room_factor: float = 1.0, max_bytes: Optional[int] = None) -> Tuple[str, int]:
    """Fetch `url` (through ERNIE_DOC_MIRROR) into the new file `dest` → (sha256 hex, bytes).

    `dest` must not exist and should lie in a folder private to the caller: it is created
    with O_EXCL | O_NOFOLLOW, so nothing already there (a planted link) is written through.
    `manual`: where the user can put the file by hand (named in every error). `sha256`: the
    expected hash; a mismatch is a HubError. `room_factor`: how many times the announced size
    must be free (an archive also needs room to unpack). `max_bytes`: the cap of a body sent
    without a Content-Length (default ERNIE_DOC_DOWNLOAD_MAX_BYTES, else 8 GiB). HubError,
    one line naming the URL and `manual`, on ERNIE_DOC_OFFLINE, any network error, a body
    that is short, too long, encoded, an HTML page, late (ERNIE_DOC_DOWNLOAD_DEADLINE) or
    has a wrong hash, and a redirect to another host; `dest` then does not exist.
    """
    fetched = mirrored(url)
    check_url(fetched)
    by_hand = f"download {fetched} yourself and put it at {manual}"
    if offline():
        raise HubError(f"{manual}: not in the cache and ERNIE_DOC_OFFLINE is set: {by_hand}")
    timeout = seconds_env("ERNIE_DOC_TIMEOUT", DEFAULT_TIMEOUT)
    deadline = seconds_env("ERNIE_DOC_DOWNLOAD_DEADLINE", DEFAULT_DEADLINE)
    cap = max_bytes or bytes_env("ERNIE_DOC_DOWNLOAD_MAX_BYTES", DEFAULT_MAX_BYTES)
    directory = os.path.dirname(dest)
    request = urllib.request.Request(fetched, headers={"User-Agent": "ernie-doc-paddle",
                                                       "Accept-Encoding": "identity"})
    opener = urllib.request.build_opener(_Redirects(by_hand))
    digest, size, fd = hashlib.sha256(), 0, None
    started = time.monotonic()
    try:
        # the socket never waits past the deadline either
        with opener.open(request, timeout=min(timeout, deadline)) as response:
            encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
            if encoding != "identity":
                raise HubError(f"{fetched}: the server sent the file {encoding}-encoded "
                               f"although identity was asked for; refused (nothing was "
                               f"kept); {by_hand}")
            kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            html_ok = dest.lower().endswith((".html", ".htm"))
            if kind == "text/html" and not html_ok:
                raise HubError(f"{fetched}: the server sent an HTML page, not the file (a "
                               f"login or captive portal?); nothing was kept; {by_hand}")
            length = (response.headers.get("Content-Length") or "").strip()
            total = int(length) if length.isdigit() else None
            limit = total if total is not None else cap
            if total is not None:
                check_space(directory, int(total * room_factor), fetched)
            fd = os.open(dest, _NEW_FILE, 0o600)
            with _progress(total, os.path.basename(manual)) as bar:
                while True:
                    if time.monotonic() - started > deadline:
                        raise HubError(f"{fetched}: not finished after {deadline:g} s "
                                       f"({size:,} bytes received; ERNIE_DOC_DOWNLOAD_DEADLINE "
                                       f"sets the limit); nothing was kept; {by_hand}")
                    # read1: whatever has arrived, so a slow drip cannot hold a read forever
                    block = response.read1(min(CHUNK, limit + 1 - size))
                    if not block:
                        break
                    if size == 0 and not html_ok and looks_like_html(block):
                        raise HubError(f"{fetched}: the server sent an HTML page, not the "
                                       f"file (a login or captive portal?); nothing was kept; "
                                       f"{by_hand}")
                    size += len(block)
                    if size > limit:
                        said = "the announced Content-Length" if total is not None else \
                            "the registry's cap for this file" if max_bytes else \
                            "the cap of a body without a Content-Length " \
                            "(ERNIE_DOC_DOWNLOAD_MAX_BYTES)"
                        raise HubError(f"{fetched}: the body is longer than {limit:,} bytes, "
                                       f"{said}; nothing was kept; {by_hand}")
                    _write_all(fd, block, dest)
                    digest.update(block)
                    bar.update(len(block))
        if total is not None and size != total:
            raise HubError(f"{fetched}: the connection closed after {size:,} of {total:,} "
                           f"bytes; try again, or {by_hand}")
        got = digest.hexdigest()
        if sha256 is not None and got != sha256.lower():
            raise HubError(f"{fetched}: sha256 {got} differs from the expected {sha256} "
                           f"(a corrupted or different file; nothing was kept)")
    except HubError:
        _discard(fd, dest)
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        # HTTP errors, timeouts, resets, a body cut short (IncompleteRead)
        _discard(fd, dest)
        if not isinstance(e, urllib.error.URLError) and isinstance(e, OSError) \
                and e.filename is not None:
            raise   # a local write failure (full disk, permissions): the caller reports it
        reason = getattr(e, "reason", None) or e
        code = getattr(e, "code", None)
        what = f"HTTP {code}" if code else f"{type(reason).__name__}: {reason}"
        if time.monotonic() - started > deadline:
            what += f", after the {deadline:g} s of ERNIE_DOC_DOWNLOAD_DEADLINE"
        raise HubError(f"{fetched}: cannot download ({what}); {by_hand}") from None
    except BaseException:   # KeyboardInterrupt: no partial file either
        _discard(fd, dest)
        raise
    os.close(fd)
    logger.info("downloaded %s (%s bytes, %.1f s, sha256 %s)", fetched, f"{size:,}",
                time.monotonic() - started, got)
    return got, size


def _write_all(fd: int, data: bytes, path: str) -> None:
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
