"""The one answer to "name, URL, archive or directory → a local directory".

    resolve("ernie-doc-base-en")                     released weights + config + tokenizer files
    resolve("ernie-doc-base-en", source="paddlenlp") PaddleNLP's .pdparams copy instead
    resolve("ernie-doc-base-zh", kind="tokenizer")   the tokenizer files only (no weights)
    resolve("https://host/path/model.tar.gz")        any URL: fetched, unpacked, cached
    resolve("model.tar.gz")                          a local archive: unpacked once, cached
    resolve("some/dir"), resolve("w.pdparams")       returned as given

The cache lives at $ERNIE_DOC_HOME (default ~/.cache/ernie_doc):

    downloads/<URL path>     files put there by hand (offline use); never written to
    models/<name>/<source>/  a released model, ready for from_pretrained and load_tokenizer
    tokenizers/<name>/       a released tokenizer
    urls/<key>/              a URL given directly        archives/<key>/  a local archive
    checksums.json           sha256 of weights first fetched, by full URL (trust on first use)
    locks/                   one lock per entry: N processes fetch an entry once

Every entry is built in a fresh private temporary folder beside its final place
(`.tmp-<entry>-XXXXXXXX`, mode 0700): the download is streamed into a new file there (O_EXCL,
O_NOFOLLOW), unpacked and checked there, and the entry renamed into place with a
`.manifest.json` (each file's size and sha256). A folder left by a process that was killed
is removed by the next process that takes the entry's lock. Every later load checks the
entry against its manifest: a file that changed, is missing, or is there without being
listed is an error, never silently used.

The weights have no published checksum: once the first fetch of a URL has been unpacked and
read as a checkpoint, its sha256 is recorded in checksums.json under the full URL (scheme,
host, port, path, query), and every later fetch of that URL (another cache, a re-download, a
file put there by hand, the same path through ERNIE_DOC_MIRROR) must match it, unless the
registry pins a value, which wins. A fetch that fails (a short body, an HTML page, a file that
does not unpack or load) records nothing and leaves nothing. Tokenizer files are pinned. A
file put in downloads/ by hand is read (copied or unpacked) and left where it is.
"""
import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ernie_doc.hub import archive, registry
from ernie_doc.hub.fetch import (HubError, check_url, download, file_lock, looks_like_html, offline,
                                 sha256_file)
from ernie_doc.utils import atomic_write_text, open_regular

logger = logging.getLogger("ernie_doc.hub")

MANIFEST = ".manifest.json"
CHECKSUMS = "checksums.json"
KINDS = ("model", "tokenizer")
# mkdtemp's random part: what `_building` names its folders, and all `_clean_stale` removes
_TMP_RANDOM = re.compile(r"[a-z0-9_]{8}")


def home() -> str:
    """The cache root: $ERNIE_DOC_HOME, default ~/.cache/ernie_doc."""
    return os.path.abspath(os.path.expanduser(
        os.environ.get("ERNIE_DOC_HOME") or os.path.join("~", ".cache", "ernie_doc")))


def is_url(spec) -> bool:
    return isinstance(spec, str) and spec.lower().startswith(("http://", "https://"))


def default_source() -> str:
    """$ERNIE_DOC_SOURCE, default "official"."""
    return os.environ.get("ERNIE_DOC_SOURCE", "").strip() or registry.DEFAULT_SOURCE


def download_path(url: str) -> str:
    """Where the file of `url` is fetched to, and where to put it by hand: downloads/ + the
    URL's path (the host is dropped, so a mirror fills the same place). HubError for a URL
    that is malformed or holds a control character (%00)."""
    path = urllib.parse.unquote(check_url(url).path).lstrip("/")
    parts = [p for p in path.split("/") if p not in ("", ".", "..")]
    if not parts:
        raise HubError(f"{url}: the URL names no file")
    return os.path.join(home(), "downloads", *parts)


def _checksum_key(url: str) -> str:
    """What a trusted checksum is recorded under: the full URL (scheme and host lower-cased,
    a default port dropped, no fragment), so the same path on two hosts is two records."""
    parts = check_url(url)
    scheme, host = parts.scheme.lower(), parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != {"http": 80, "https": 443}[scheme]:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((scheme, host, parts.path or "/", parts.query, ""))


# -- manifests ----------------------------------------------------------------------------------
def _tree_files(root: str) -> List[str]:
    """Every file and link under `root` (relative, posix), the manifest excluded; a link to a
    folder is listed, never followed."""
    out = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        links = [d for d in dirs if os.path.islink(os.path.join(directory, d))]
        dirs[:] = [d for d in dirs if d not in links]
        for name in sorted(files + links):
            rel = os.path.relpath(os.path.join(directory, name), root)
            if rel != MANIFEST:
                out.append(rel.replace(os.sep, "/"))
    return out


def _write_manifest(root: str, origin: Dict) -> None:
    files = {}
    for rel in _tree_files(root):
        path = os.path.join(root, rel)
        if os.path.islink(path):   # a link inside the archive (archive.py checked its target)
            files[rel] = {"link": os.readlink(path)}
        else:
            files[rel] = {"size": os.path.getsize(path), "sha256": sha256_file(path)}
    manifest = dict(origin, files=files,
                    created=datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"))
    atomic_write_text(os.path.join(root, MANIFEST), json.dumps(manifest, indent=1) + "\n")


def _read_manifest(root: str) -> Dict:
    path = os.path.join(root, MANIFEST)
    try:
        with open_regular(path, "cache manifest", HubError) as f:
            manifest = json.loads(f.read().decode("utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise ValueError("'files' is not an object")
        for rel, want in files.items():
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"the file name {rel!r} leaves the entry")
            if not isinstance(want, dict) or not (
                    isinstance(want.get("link"), str) or (
                        isinstance(want.get("size"), int)
                        and isinstance(want.get("sha256"), str))):
                raise ValueError(f"the record of {rel!r} holds no size and sha256")
    except HubError as e:
        raise HubError(f"{e}; remove {root} to fetch it again") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HubError(f"{path}: unreadable cache manifest ({e}); remove {root} to fetch it "
                       f"again") from None
    return manifest


def _file_problem(root: str, file: str, want: Dict) -> Optional[str]:
    """How the entry's file `file` differs from its manifest record `want`, or None."""
    if "link" in want:
        if not os.path.islink(file):
            return "was a link and is not one any more"
        if os.readlink(file) != want["link"]:
            return "is a link that now points elsewhere"
        return None
    if os.path.islink(file):
        real, top = os.path.realpath(file), os.path.realpath(root)
        if os.path.commonpath([real, top]) != top:
            return "is a link to a file outside the entry"
    if not os.path.isfile(file):   # a FIFO or device is no file (and is never opened)
        return "is missing" if not os.path.lexists(file) else "is not a regular file"
    size = os.path.getsize(file)
    if size != want["size"]:
        return f"has {size:,} bytes, {want['size']:,} were recorded"
    if sha256_file(file) != want["sha256"]:
        return "has changed (its sha256 differs from the one recorded when it was fetched)"
    return None


def verify_entry(root: str) -> Dict:
    """Check a cache entry against its manifest → the manifest: every listed file present
    with its recorded size and sha256, and nothing else there (a file added to an entry, e.g.
    a `model.safetensors` beside the fetched weights, would be loaded in their place). HubError
    naming the entry and the first file that is missing, differs or is not listed."""
    manifest = _read_manifest(root)
    files = manifest["files"]
    for rel, want in files.items():
        file = os.path.join(root, *rel.split("/"))
        problem = _file_problem(root, file, want)
        if problem:
            raise HubError(f"{file}: cache entry {root} is damaged: the file {problem}; remove "
                           f"{root} to fetch it again")
    for rel in _tree_files(root):
        if rel not in files:
            file = os.path.join(root, *rel.split("/"))
            raise HubError(f"{file}: cache entry {root} holds a file its manifest does not "
                           f"list (added after the entry was fetched; it is never loaded): "
                           f"remove it, or remove {root} to fetch the entry again")
    return manifest


# -- trust on first use -----------------------------------------------------------------------
@dataclass(frozen=True)
class Fetched:
    """A remote file ready to be used by an entry being built: `path` (in the entry's
    temporary folder, or in downloads/ when `by_hand`), its sha256 and size, and whether its
    checksum is still to be recorded (trust on first use) once the entry is checked."""
    url: str
    path: str
    sha256: str
    size: int
    by_hand: bool
    unpinned: bool


def _expected_sha256(remote: registry.Remote) -> Tuple[Optional[str], str]:
    """(sha256 the file must have or None, where that value comes from)."""
    if remote.sha256:
        return remote.sha256.lower(), "pinned in ernie_doc.hub.registry"
    record = _trusted(remote.url)
    if record:
        return record["sha256"].lower(), f"recorded in {os.path.join(home(), CHECKSUMS)} on " \
                                         f"{record.get('first_seen', '?')}"
    return None, ""


def _read_checksums() -> Dict:
    path = os.path.join(home(), CHECKSUMS)
    if not os.path.lexists(path):
        return {}
    try:
        with open_regular(path, "file", HubError) as f:
            data = json.loads(f.read().decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except HubError as e:   # a FIFO or device under that name: never opened
        raise HubError(f"{e}; remove it (it records the sha256 of weights first fetched)") \
            from None
    except (OSError, ValueError) as e:
        raise HubError(f"{path}: unreadable ({e}); fix or remove it (it records the sha256 of "
                       f"weights first fetched)") from None


def _trusted(url: str) -> Optional[Dict]:
    """The checksums.json record trusted for `url`, or None. A record of the older layout,
    keyed by the URL's path alone, is trusted only for the URL it names in its "url" field
    (never for the same path on another host); without one it is ignored. HubError, one line
    naming the key, for a record that is not an object holding a sha256."""
    data = _read_checksums()
    key = _checksum_key(url)
    record = data.get(key)
    if key not in data:
        path = urllib.parse.urlsplit(url).path
        legacy = data.get(path)
        if not isinstance(legacy, dict) or not isinstance(legacy.get("url"), str):
            return None
        try:
            if _checksum_key(legacy["url"]) != key:
                return None
        except HubError:
            return None
        key, record = path, legacy
    sha = record.get("sha256") if isinstance(record, dict) else None
    if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha)):
        what = "holds no 64-hex-digit 'sha256'" if isinstance(record, dict) else \
            f"is a {type(record).__name__}, not an object"
        raise HubError(f"{os.path.join(home(), CHECKSUMS)}: the record {key!r} {what}; fix "
                       f"or remove it (it is the trusted checksum of {url})")
    return record


def _record_checksum(fetched: Fetched) -> None:
    """Trust `fetched` from now on: called only once the entry it built has been checked."""
    with file_lock(os.path.join(home(), "locks", "checksums.lock"), CHECKSUMS):
        data = _read_checksums()
        key = _checksum_key(fetched.url)
        if key in data:   # recorded meanwhile (the same URL as a name and as a URL)
            record = _trusted(fetched.url)
            if record["sha256"].lower() != fetched.sha256:
                raise HubError(f"{fetched.url}: sha256 {fetched.sha256} differs from "
                               f"{record['sha256']}, recorded meanwhile in "
                               f"{os.path.join(home(), CHECKSUMS)}; nothing was kept")
            return
        data[key] = {"sha256": fetched.sha256, "size": fetched.size, "url": fetched.url,
                     "first_seen": datetime.date.today().isoformat()}
        atomic_write_text(os.path.join(home(), CHECKSUMS),
                          json.dumps(data, indent=1, sort_keys=True) + "\n")
        logger.info("%s: no published checksum; recorded sha256 %s (trust on first use: "
                    "every later fetch must match it)", fetched.url, fetched.sha256)


def _clean_stale_part(manual: str) -> None:
    """Remove `<manual>.part`, which versions before this one streamed downloads into and a
    kill left behind: only a regular file of this user (a link is never followed nor
    removed). The caller holds the entry's lock, so no process is writing it."""
    part = manual + ".part"
    try:
        st = os.lstat(part)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
        os.remove(part)
        logger.info("removed %s, left by an interrupted download", part)


def fetch(remote: registry.Remote, into: str, room_factor: float = 1.0) -> Fetched:
    """The file of `remote`, verified against its pinned or trusted sha256 → Fetched. A file
    put by hand in downloads/ is checked like a download and used where it is; otherwise the
    file is downloaded into the private folder `into`. Nothing is recorded here: the caller
    records an unpinned checksum once the entry is built and checked. The caller holds the
    lock of the entry the file is for."""
    manual = download_path(remote.url)
    want, origin = _expected_sha256(remote)
    _clean_stale_part(manual)
    if os.path.isfile(manual):   # put there by hand (a FIFO or device is not a file)
        with open_regular(manual, "file", HubError) as f:
            if looks_like_html(f.read(512)) and not manual.lower().endswith((".html", ".htm")):
                raise HubError(f"{manual}: an HTML page, not the file of {remote.url} (it was "
                               f"put there by hand): replace it with that file")
        got, size = sha256_file(manual), os.path.getsize(manual)
        if want is not None and got != want:
            raise HubError(f"{manual}: sha256 {got} differs from {want} ({origin}): not the "
                           f"file of {remote.url}; replace it with that file")
        return Fetched(remote.url, manual, got, size, True, want is None)
    dest = os.path.join(into, os.path.basename(manual))
    got, size = download(remote.url, dest, manual, want, room_factor, remote.max_bytes)
    return Fetched(remote.url, dest, got, size, False, want is None)


# -- building entries -------------------------------------------------------------------------
@contextlib.contextmanager
def _building(final: str):
    """A fresh private (0700) temporary directory beside `final`, `.tmp-<name>-XXXXXXXX`;
    removed unless the block renamed it. The block builds the entry in a subfolder (named by
    the block) and downloads into `<tmp>/.fetch`, so nothing fetched lands in the entry."""
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    try:
        os.mkdir(os.path.join(tmp, ".fetch"), 0o700)
        yield tmp
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _clean_stale(final: str) -> None:
    """Remove the temporary folders of `final` that a killed process left (the caller holds
    the entry's lock, so none is in use): only real folders of this user named exactly as
    `_building` names them; a link is never followed nor removed."""
    parent = os.path.dirname(final)
    prefix = f".tmp-{os.path.basename(final)}-"
    try:
        names = os.listdir(parent)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        if not (name.startswith(prefix) and _TMP_RANDOM.fullmatch(name[len(prefix):])):
            continue
        path = os.path.join(parent, name)
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)   # rmtree never follows links inside
            logger.info("removed %s, left by an interrupted download", path)


def _lock(entry: str) -> str:
    rel = os.path.relpath(entry, home()).replace(os.sep, "--")
    return os.path.join(home(), "locks", rel + ".lock")


def _ready(entry: str) -> bool:
    return os.path.isfile(os.path.join(entry, MANIFEST))


def _entry(final: str, build, what: str) -> str:
    """`final` verified, built under its lock by `build(tmp, fetched) -> root` first if
    absent. `build` appends every remote file it used to `fetched`; the checksums still to be
    trusted are recorded only after `build` returned (the entry unpacked and checked)."""
    if _ready(final):
        verify_entry(final)
        return final
    with file_lock(_lock(final), what) as locked:
        if _ready(final):   # another process built it while this one waited
            verify_entry(final)
            return final
        if locked:
            _clean_stale(final)
        if os.path.lexists(final):
            raise HubError(f"{final}: exists but is not a complete cache entry (no "
                           f"{MANIFEST}); remove it to fetch {what} again")
        with _building(final) as tmp:
            fetched: List[Fetched] = []
            root = build(tmp, fetched)
            for item in fetched:
                if item.unpinned:
                    _record_checksum(item)
            os.rename(root, final)
    logger.info("cached %s in %s", what, final)
    return final


def _offline_check(name: str, entry: str, remotes: List[registry.Remote]) -> None:
    """Offline and `entry` not cached: HubError naming every file still to be put by hand
    (URL and path), unless all of them are already in downloads/."""
    if not offline() or _ready(entry):
        return
    missing = [r for r in remotes if not os.path.isfile(download_path(r.url))]
    if missing:
        placed = "; ".join(f"{r.url} at {download_path(r.url)}" for r in missing)
        raise HubError(f"{name}: not in the cache ({home()}) and ERNIE_DOC_OFFLINE is set: "
                       f"download {placed} (or run `ernie-doc download {name}` on a machine "
                       f"with network and copy {home()} here)")


def _place(item: Fetched, dst: str) -> None:
    """Put a fetched file into an entry being built: moved from the temporary folder, or
    (put in downloads/ by hand) copied, so the user's file stays."""
    if item.by_hand:
        shutil.copyfile(item.path, dst)
    else:
        os.replace(item.path, dst)


def _fetch_into(tmp: str, remote: registry.Remote, fetched: List[Fetched],
                room_factor: float = 1.0) -> Fetched:
    item = fetch(remote, os.path.join(tmp, ".fetch"), room_factor)
    fetched.append(item)
    return item


def _unpacked_or_placed(tmp: str, item: Fetched, folder: str) -> str:
    """The root of an entry built from one fetched file: an archive unpacked (HubError for one
    that does not unpack), any other file placed in `tmp/<folder>`."""
    if archive.is_archive(item.path):
        unpacked = os.path.join(tmp, "unpacked")
        os.mkdir(unpacked)
        try:
            archive.extract(item.path, unpacked)
        except HubError as e:
            if item.by_hand:
                raise HubError(f"{e}; it was put there by hand: replace it with the file of "
                               f"{item.url}") from None
            raise
        return _checkpoint_root(unpacked)
    root = os.path.join(tmp, folder)
    os.mkdir(root)
    _place(item, os.path.join(root, os.path.basename(item.path)))
    return root


def _tokenizer_entry(release: registry.Release) -> str:
    final = os.path.join(home(), "tokenizers", release.name)

    def build(tmp, fetched):
        root = os.path.join(tmp, "tokenizer")
        os.mkdir(root)
        for filename, remote in release.tokenizer.items():
            _place(_fetch_into(tmp, remote, fetched), os.path.join(root, filename))
        _write_manifest(root, {"name": release.name, "kind": "tokenizer",
                               "urls": [r.url for r in release.tokenizer.values()]})
        return root

    _offline_check(release.name, final, list(release.tokenizer.values()))
    return _entry(final, build, f"the {release.name} tokenizer")


def _checkpoint_root(tmp: str) -> str:
    """The folder an archive unpacked into `tmp` holds its checkpoint in: `tmp`, or its only
    subfolder when the archive wraps everything in one (but never a bare params/)."""
    root = tmp
    while True:
        entries = [e for e in os.listdir(root) if not e.startswith(".")]
        if len(entries) == 1 and entries[0] != "params" and \
                os.path.isdir(os.path.join(root, entries[0])) and \
                not os.path.islink(os.path.join(root, entries[0])):
            root = os.path.join(root, entries[0])
        else:
            return root


def _check_checkpoint(root: str, origin: str, required: bool) -> None:
    """Read the checkpoint in `root` once (through the restricted readers) before its
    checksum is trusted: a file that is not the weights (an HTML page saved as .pdparams, a
    truncated tensor) is a HubError naming `origin`. `required`: a folder with no checkpoint
    at all is an error too (a released model; a URL may hold only tokenizer files)."""
    from ernie_doc.checkpoint import io
    try:
        io.detect_format(root)
    except io.CheckpointError as e:
        if required:
            raise HubError(f"{origin}: holds no ERNIE-Doc checkpoint ({e})") from None
        return
    try:
        io.read_checkpoint(root, upcast=False)
    except io.CheckpointError as e:
        raise HubError(f"{origin}: the fetched checkpoint does not load ({e}); nothing was "
                       f"kept") from None


def _complete_model_dir(root: str, release: registry.Release, origin: str) -> None:
    """Add what a released archive or file may lack: a config (from the release's preset)
    and the tokenizer files (the release's, pinned)."""
    from ernie_doc.checkpoint import io
    from ernie_doc.config import ErnieDocConfig
    try:
        fmt, _, config_path = io.detect_format(root)
    except io.CheckpointError as e:
        raise HubError(f"{origin}: holds no ERNIE-Doc checkpoint ({e})") from None
    if config_path is None:
        config = ErnieDocConfig.from_any(release.preset)
        if fmt == "official":
            text = json.dumps(io.official_config_dict(config), indent=2) + "\n"
            name = io.OFFICIAL_CONFIG_FILE
        else:
            text = json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n"
            name = io.CONFIG_FILE
        atomic_write_text(os.path.join(root, name), text)
        logger.info("%s: no config in the release; wrote %s from preset %s", origin, name,
                    release.preset)
    _check_checkpoint(root, origin, required=True)
    tokenizer_dir = _tokenizer_entry(release)
    for filename, remote in release.tokenizer.items():
        dst = os.path.join(root, filename)
        if not os.path.exists(dst):
            shutil.copyfile(os.path.join(tokenizer_dir, filename), dst)
        elif sha256_file(dst) != remote.sha256:
            logger.warning("%s: its own %s differs from the released tokenizer file; keeping "
                           "the archive's", origin, filename)


def _model_entry(release: registry.Release, source: str) -> str:
    remote = release.weights_for(source)
    final = os.path.join(home(), "models", release.name, source)

    def build(tmp, fetched):
        item = _fetch_into(tmp, remote, fetched,
                           room_factor=2.2 if archive.is_archive(remote.url) else 1.1)
        root = _unpacked_or_placed(tmp, item, "model")
        _complete_model_dir(root, release, remote.url)
        _write_manifest(root, {"name": release.name, "kind": "model", "source": source,
                               "url": remote.url})
        return root

    needed = [remote]
    if not _ready(os.path.join(home(), "tokenizers", release.name)):
        needed += release.tokenizer.values()
    _offline_check(release.name, final, needed)
    return _entry(final, build, f"{release.name} ({source} weights)")


def _url_entry(url: str) -> str:
    check_url(url)
    key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    final = os.path.join(home(), "urls", key)
    remote = registry.Remote(url)

    def build(tmp, fetched):
        item = _fetch_into(tmp, remote, fetched,
                           room_factor=2.2 if archive.is_archive(url) else 1.1)
        root = _unpacked_or_placed(tmp, item, "file")
        _check_checkpoint(root, url, required=False)
        _write_manifest(root, {"kind": "url", "url": url})
        return root

    _offline_check(url, final, [remote])
    return _entry(final, build, url)


def _archive_entry(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    final = os.path.join(home(), "archives", key)

    def build(tmp, fetched):
        unpacked = os.path.join(tmp, "unpacked")
        os.mkdir(unpacked)
        archive.extract(real, unpacked)
        root = _checkpoint_root(unpacked)
        _write_manifest(root, {"kind": "archive", "path": real, "size": st.st_size,
                               "mtime_ns": st.st_mtime_ns})
        return root

    return _entry(final, build, real)


def resolve(spec, kind: str = "model", source: Optional[str] = None) -> str:
    """A local path for `spec` (see the module docstring); fetches into the cache if needed.

    kind: "model" (weights, config and tokenizer files) or "tokenizer" (the tokenizer files
    only; matters for released names). source: "official" or "paddlenlp" weights of a released
    name (default $ERNIE_DOC_SOURCE, else "official"). HubError, one line: an unknown name or
    missing path, offline without the files, a network error (with the URL and the path to put
    the file at by hand), a checksum mismatch, an unsafe archive, a damaged cache entry.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: choose one of {KINDS}")
    spec = os.fspath(spec)
    if source is not None and source not in registry.SOURCES:
        raise HubError(f"source {source!r}: choose one of {', '.join(registry.SOURCES)}")
    if is_url(spec):
        return _url_entry(spec)   # checked first: a NUL byte cannot reach the file system
    if os.path.exists(spec):
        if os.path.isfile(spec) and archive.is_archive(spec):
            return _archive_entry(spec)
        return spec
    release = registry.release(spec)
    if release is None:
        raise HubError(f"{spec}: no such file or directory, and not a released model name "
                       f"({', '.join(registry.names())}) or an http(s) URL")
    if kind == "tokenizer":
        return _tokenizer_entry(release)
    try:
        return _model_entry(release, source or default_source())
    except ValueError as e:
        if isinstance(e, HubError):
            raise
        raise HubError(str(e)) from None


def is_released(spec) -> bool:
    """`spec` is a released model name that is not also a local path."""
    return isinstance(spec, str) and registry.release(spec) is not None \
        and not os.path.exists(spec)
