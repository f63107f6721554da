"""The one answer to "name, URL, archive or directory → a local directory".

    resolve("ernie-doc-base-en")                     released weights + config + tokenizer files
    resolve("ernie-doc-base-en", source="paddlenlp") PaddleNLP's .pdparams copy instead
    resolve("ernie-doc-base-zh", kind="tokenizer")   the tokenizer files only (no weights)
    resolve("https://host/path/model.tar.gz")        any URL: fetched, unpacked, cached
    resolve("model.tar.gz")                          a local archive: unpacked once, cached
    resolve("some/dir"), resolve("w.pdparams")       returned as given

The cache lives at $ERNIE_DOC_HOME (default ~/.cache/ernie_doc):

    downloads/<URL path>     files being fetched, and files put there by hand (offline use)
    models/<name>/<source>/  a released model, ready for from_pretrained and load_tokenizer
    tokenizers/<name>/       a released tokenizer
    urls/<key>/              a URL given directly        archives/<key>/  a local archive
    checksums.json           sha256 of weights first fetched (trust on first use)
    locks/                   one lock per entry: N processes fetch an entry once

Every entry is built in a temporary directory beside its final place and renamed into place
with a `.manifest.json` (each file's size and sha256); every later load checks the files
against it, so a cache entry that changed on disk is an error, never silently used. The
weights have no published checksum: the first fetch records the file's sha256 in
checksums.json and every later fetch of the same URL path (another cache, a re-download)
must match it, unless the registry pins a value, which wins. Tokenizer files are pinned.
A file this process fetched into downloads/ is moved into its entry; a file put there by
hand is copied and left where it is.
"""
import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import tempfile
import urllib.parse
from typing import Dict, List, Optional, Tuple

from ernie_doc.hub import archive, registry
from ernie_doc.hub.fetch import HubError, download, file_lock, offline, sha256_file
from ernie_doc.utils import atomic_write_text

logger = logging.getLogger("ernie_doc.hub")

MANIFEST = ".manifest.json"
CHECKSUMS = "checksums.json"
KINDS = ("model", "tokenizer")


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
    URL's path (the host is dropped, so a mirror fills the same place)."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
    parts = [p for p in path.split("/") if p not in ("", ".", "..")]
    if not parts:
        raise HubError(f"{url}: the URL names no file")
    return os.path.join(home(), "downloads", *parts)


def _checksum_key(url: str) -> str:
    return urllib.parse.urlsplit(url).path


# -- manifests ----------------------------------------------------------------------------------
def _tree_files(root: str) -> List[str]:
    out = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(directory, name), root)
            if rel != MANIFEST:
                out.append(rel.replace(os.sep, "/"))
    return out


def _write_manifest(root: str, origin: Dict) -> None:
    files = {rel: {"size": os.path.getsize(os.path.join(root, rel)),
                   "sha256": sha256_file(os.path.join(root, rel))} for rel in _tree_files(root)}
    manifest = dict(origin, files=files,
                    created=datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"))
    atomic_write_text(os.path.join(root, MANIFEST), json.dumps(manifest, indent=1) + "\n")


def verify_entry(root: str) -> Dict:
    """Check every file of a cache entry against its manifest → the manifest. HubError naming
    the entry and the first file that is missing or differs."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        if not isinstance(files, dict):
            raise ValueError("'files' is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HubError(f"{path}: unreadable cache manifest ({e}); remove {root} to fetch it "
                       f"again") from None
    for rel, want in files.items():
        file = os.path.join(root, *rel.split("/"))
        problem = None
        if not os.path.isfile(file):
            problem = "is missing"
        elif os.path.getsize(file) != want.get("size"):
            problem = f"has {os.path.getsize(file):,} bytes, {want.get('size'):,} were recorded"
        elif sha256_file(file) != want.get("sha256"):
            problem = "has changed (its sha256 differs from the one recorded when it was fetched)"
        if problem:
            raise HubError(f"{file}: cache entry {root} is damaged: the file {problem}; remove "
                           f"{root} to fetch it again")
    return manifest


# -- trust on first use -----------------------------------------------------------------------
def _expected_sha256(remote: registry.Remote) -> Tuple[Optional[str], str]:
    """(sha256 the file must have or None, where that value comes from)."""
    if remote.sha256:
        return remote.sha256.lower(), "pinned in ernie_doc.hub.registry"
    record = _read_checksums().get(_checksum_key(remote.url))
    if record:
        return record["sha256"], f"recorded in {os.path.join(home(), CHECKSUMS)} on " \
                                 f"{record.get('first_seen', '?')}"
    return None, ""


def _read_checksums() -> Dict:
    path = os.path.join(home(), CHECKSUMS)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except (OSError, ValueError) as e:
        raise HubError(f"{path}: unreadable ({e}); fix or remove it (it records the sha256 of "
                       f"weights first fetched)") from None


def _record_checksum(url: str, sha256: str, size: int) -> None:
    with file_lock(os.path.join(home(), "locks", "checksums.lock"), CHECKSUMS):
        data = _read_checksums()
        key = _checksum_key(url)
        if key in data:
            return
        data[key] = {"sha256": sha256, "size": size, "url": url,
                     "first_seen": datetime.date.today().isoformat()}
        atomic_write_text(os.path.join(home(), CHECKSUMS),
                          json.dumps(data, indent=1, sort_keys=True) + "\n")
        logger.info("%s: no published checksum; recorded sha256 %s (trust on first use: "
                    "every later fetch must match it)", url, sha256)


def fetch(remote: registry.Remote, room_factor: float = 1.0) -> Tuple[str, bool]:
    """The file of `remote` in downloads/, verified → (path, fetched_now). A file already
    there (put by hand, or left by an earlier process) is checked like a download. The
    caller holds the lock of the entry the file is for."""
    dest = download_path(remote.url)
    want, origin = _expected_sha256(remote)
    if os.path.isfile(dest):
        got, fetched_now = sha256_file(dest), False
        size = os.path.getsize(dest)
        if want is not None and got != want:
            raise HubError(f"{dest}: sha256 {got} differs from {want} ({origin}): not the "
                           f"file of {remote.url}; replace it with that file")
    else:
        got, size = download(remote.url, dest, want, room_factor)
        fetched_now = True
    if want is None:
        _record_checksum(remote.url, got, size)
    return dest, fetched_now


def _place(src: str, dst: str, fetched_now: bool) -> None:
    """Put a fetched file into an entry being built: moved if this process fetched it, else
    (put there by hand) copied, so the user's file stays."""
    if fetched_now:
        os.replace(src, dst)
    else:
        shutil.copyfile(src, dst)


# -- building entries -------------------------------------------------------------------------
@contextlib.contextmanager
def _building(final: str):
    """A fresh temporary directory beside `final`; removed unless the block renamed it."""
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    try:
        yield tmp
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _lock(entry: str) -> str:
    rel = os.path.relpath(entry, home()).replace(os.sep, "--")
    return os.path.join(home(), "locks", rel + ".lock")


def _ready(entry: str) -> bool:
    return os.path.isfile(os.path.join(entry, MANIFEST))


def _entry(final: str, build, what: str) -> str:
    """`final` verified, built under its lock by `build(tmp) -> root` first if absent."""
    if _ready(final):
        verify_entry(final)
        return final
    with file_lock(_lock(final), what):
        if _ready(final):   # another process built it while this one waited
            verify_entry(final)
            return final
        if os.path.exists(final):
            raise HubError(f"{final}: exists but is not a complete cache entry (no "
                           f"{MANIFEST}); remove it to fetch {what} again")
        with _building(final) as tmp:
            root = build(tmp)
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


def _tokenizer_entry(release: registry.Release) -> str:
    final = os.path.join(home(), "tokenizers", release.name)

    def build(tmp):
        for filename, remote in release.tokenizer.items():
            path, fetched_now = fetch(remote)
            _place(path, os.path.join(tmp, filename), fetched_now)
        _write_manifest(tmp, {"name": release.name, "kind": "tokenizer",
                              "urls": [r.url for r in release.tokenizer.values()]})
        return tmp

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

    def build(tmp):
        path, fetched_now = fetch(remote, room_factor=2.2 if archive.is_archive(remote.url)
                                  else 1.1)
        if archive.is_archive(path):
            unpacked = os.path.join(tmp, "unpacked")
            os.mkdir(unpacked)
            archive.extract(path, unpacked)
            root = _checkpoint_root(unpacked)
        else:
            root = os.path.join(tmp, "model")
            os.mkdir(root)
            _place(path, os.path.join(root, os.path.basename(path)), fetched_now)
        _complete_model_dir(root, release, remote.url)
        _write_manifest(root, {"name": release.name, "kind": "model", "source": source,
                               "url": remote.url})
        if fetched_now and archive.is_archive(path):
            os.remove(path)   # ours, and unpacked: the manifest now guards the files
        return root

    needed = [remote]
    if not _ready(os.path.join(home(), "tokenizers", release.name)):
        needed += release.tokenizer.values()
    _offline_check(release.name, final, needed)
    return _entry(final, build, f"{release.name} ({source} weights)")


def _url_entry(url: str) -> str:
    key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    final = os.path.join(home(), "urls", key)
    remote = registry.Remote(url)

    def build(tmp):
        path, fetched_now = fetch(remote, room_factor=2.2 if archive.is_archive(url) else 1.1)
        if archive.is_archive(path):
            unpacked = os.path.join(tmp, "unpacked")
            os.mkdir(unpacked)
            archive.extract(path, unpacked)
            root = _checkpoint_root(unpacked)
            if fetched_now:
                os.remove(path)
        else:
            root = os.path.join(tmp, "file")
            os.mkdir(root)
            _place(path, os.path.join(root, os.path.basename(path)), fetched_now)
        _write_manifest(root, {"kind": "url", "url": url})
        return root

    _offline_check(url, final, [remote])
    return _entry(final, build, url)


def _archive_entry(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    final = os.path.join(home(), "archives", key)

    def build(tmp):
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
        return _url_entry(spec)
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
