"""Fetching one file over HTTP(S) into the cache: mirror, offline mode, lock, progress bar,
checksum, and nothing half-written.

A file is streamed into `<final>.part` while its sha256 is computed, checked against the
length the server announced and the expected hash, and only then renamed to its final name:
a cut connection, a wrong hash or a full disk leaves no file under the final name (and the
`.part` is removed). Environment:

    ERNIE_DOC_OFFLINE=1           never open a socket; a file not in the cache is an error
                                  naming its URL and the path to put it at by hand
    ERNIE_DOC_MIRROR=http://h:p   replace the scheme and host of every URL (the path is kept),
                                  for an internal mirror or a test server
    ERNIE_DOC_TIMEOUT=SECONDS     socket timeout (default 60)
"""
import contextlib
import hashlib
import http.client
import logging
import os
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


class HubError(CheckpointError):
    """A released model or a remote file that cannot be fetched, verified or unpacked; the
    message is one line naming the URL or cache path (and, for a failed download, where to
    put the file by hand)."""


def offline() -> bool:
    """ERNIE_DOC_OFFLINE is set to 1/true/yes/on."""
    return os.environ.get("ERNIE_DOC_OFFLINE", "").strip().lower() in _TRUE


def mirrored(url: str) -> str:
    """`url` with its scheme and host replaced by ERNIE_DOC_MIRROR's (path and query kept)."""
    mirror = os.environ.get("ERNIE_DOC_MIRROR", "").strip()
    if not mirror:
        return url
    m = urllib.parse.urlsplit(mirror)
    if m.scheme not in ("http", "https") or not m.netloc:
        raise HubError(f"ERNIE_DOC_MIRROR={mirror!r}: expected http://host[:port] or "
                       f"https://host[:port]")
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
def file_lock(path: str, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed) for the block: N processes (e.g.
    the ranks of a fleetrun job) that want the same cache entry fetch it once, the others
    wait and then find it there. The lock dies with its process, so a killed download never
    leaves the entry locked."""
    try:
        import fcntl
    except ImportError:   # Windows: no flock; concurrent downloads then race (still atomic)
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that is fetching %s", what)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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


def download(url: str, dest: str, sha256: Optional[str] = None,
             room_factor: float = 1.0) -> Tuple[str, int]:
    """Fetch `url` (through ERNIE_DOC_MIRROR) into the file `dest` → (sha256 hex, bytes).

    `sha256`: the expected hash; a mismatch is a HubError and nothing is kept. `room_factor`:
    how many times the announced size must be free (an archive also needs room to unpack).
    The caller holds the entry's lock. HubError, one line naming the URL and `dest` (where the
    file can be put by hand), on ERNIE_DOC_OFFLINE, any network error, a short body or a wrong
    hash; `dest` then does not exist and no `.part` is left.
    """
    fetched = mirrored(url)
    by_hand = f"download {fetched} yourself and put it at {dest}"
    if offline():
        raise HubError(f"{dest}: not in the cache and ERNIE_DOC_OFFLINE is set: {by_hand}")
    directory = os.path.dirname(dest)
    os.makedirs(directory, exist_ok=True)
    part = dest + ".part"
    timeout = float(os.environ.get("ERNIE_DOC_TIMEOUT", "60") or 60)
    request = urllib.request.Request(fetched, headers={"User-Agent": "ernie-doc-paddle"})
    digest, size = hashlib.sha256(), 0
    started = time.time()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            if total is not None:
                check_space(directory, int(total * room_factor), fetched)
            with open(part, "wb") as out, _progress(total, os.path.basename(dest)) as bar:
                while True:
                    block = response.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    size += len(block)
                    bar.update(len(block))
        if total is not None and size != total:
            raise HubError(f"{fetched}: the connection closed after {size:,} of {total:,} "
                           f"bytes; try again, or {by_hand}")
        got = digest.hexdigest()
        if sha256 is not None and got != sha256.lower():
            raise HubError(f"{fetched}: sha256 {got} differs from the expected {sha256} "
                           f"(a corrupted or different file; nothing was kept)")
        os.replace(part, dest)
    except HubError:
        _remove(part)
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        # HTTP errors, timeouts, resets, a body cut short (IncompleteRead)
        _remove(part)
        if not isinstance(e, urllib.error.URLError) and isinstance(e, OSError) \
                and e.filename is not None:
            raise   # a local write failure (full disk, permissions): the caller reports it
        reason = getattr(e, "reason", None) or e
        code = getattr(e, "code", None)
        what = f"HTTP {code}" if code else f"{type(reason).__name__}: {reason}"
        raise HubError(f"{fetched}: cannot download ({what}); {by_hand}") from None
    except BaseException:   # KeyboardInterrupt: no partial file either
        _remove(part)
        raise
    logger.info("downloaded %s (%s bytes, %.1f s, sha256 %s)", fetched, f"{size:,}",
                time.time() - started, got)
    return got, size


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
