"""The one answer to "name, URL, archive or directory → a local directory".

    resolve("ernie-doc-base-en")                     released weights + config + tokenizer files
    resolve("ernie-doc-base-en", source="paddlenlp") PaddleNLP's .pdparams copy instead
    resolve("ernie-doc-base-zh", kind="tokenizer")   the tokenizer files only (no weights)
    resolve("https://host/path/model.tar.gz")        a URL or archive: fetched, unpacked, cached

The cache lives at $ERNIE_DOC_HOME (default ~/.cache/ernie_doc). Details (layout, trust on
first use): docs/design-notes.md, "Hub: the cache"."""
import contextlib
import datetime
import hashlib
import ipaddress
import json
import logging
import os
import re
import stat
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import BinaryIO, Dict, List, Optional, Tuple

from ernie_doc import releases as registry
from ernie_doc.checkpoint import io
from ernie_doc.config import run_model_folder
from ernie_doc.errors import CheckpointError, DuplicateKey, HubError
from ernie_doc.hub import archive
from ernie_doc.hub.fetch import (CHUNK, check_url, download, file_lock, looks_like_html, offline,
                                 open_own, sha256_file, sha256_of, shown)
from ernie_doc.utils import (atomic_write_text, clip, decode_utf8, open_regular, parse_json,
                             short_list, unique_keys)

logger = logging.getLogger("ernie_doc.hub")

MANIFEST = ".manifest.json"
CHECKSUMS = "checksums.json"
KINDS = ("model", "tokenizer")
# mkdtemp's random part: what `_building` names its folders, and all `_clean_stale` removes
_TMP_RANDOM = re.compile(r"[a-z0-9_]{8}")
# Single files a URL may name: what the entry is for (anything else is refused before it is
# fetched: a login page saved as login.txt is no model).
CHECKPOINT_FILES = (".pdparams", ".safetensors")
TOKENIZER_FILES = ("vocab.txt", "encoder.json", "vocab.bpe", "spm.model", "sentencepiece.model",
                   "tokenizer_config.json")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_UNRESERVED = re.compile(r"%([0-9A-Fa-f]{2})")


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
    """Where the file of `url` is fetched to and put by hand: downloads/ + the URL's path (no
    host, so a mirror fills it too). HubError for a malformed URL or a control character."""
    path = urllib.parse.unquote(check_url(url).path).lstrip("/")
    parts = [p for p in path.split("/") if p not in ("", ".", "..")]
    if not parts:
        raise HubError(f"{url}: the URL names no file")
    return os.path.join(home(), "downloads", *parts)


def _normal_path(path: str) -> str:
    """A URL path in one spelling (RFC 3986 6.2.2): unreserved %-escapes decoded, others
    upper-cased, empty and `.` segments dropped, `..` applied."""
    def escape(match):
        char = chr(int(match.group(1), 16))
        return char if re.fullmatch(r"[A-Za-z0-9._~-]", char) else "%" + match.group(1).upper()

    out: List[str] = []
    for segment in _UNRESERVED.sub(escape, path).split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    return "/" + "/".join(out) + ("/" if path.endswith("/") and out else "")


def _checksum_key(url: str) -> str:
    """The normalised full URL a trusted checksum is keyed by: scheme and host lower-cased,
    canonical IP, default port dropped, `_normal_path`, query kept, no fragment."""
    parts = check_url(url)
    scheme, host = parts.scheme.lower(), parts.hostname.lower().rstrip(".")
    with contextlib.suppress(ValueError):
        host = ipaddress.ip_address(host).compressed
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != {"http": 80, "https": 443}[scheme]:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((scheme, host, _normal_path(parts.path), parts.query, ""))


# -- the cache's own folders ----------------------------------------------------------------
def _cache_dir(path: str) -> str:
    """`path` under the cache root, made if needed, every component checked to be a real
    folder (a planted link is never followed); HubError naming the component otherwise."""
    root = home()
    os.makedirs(root, exist_ok=True)
    current = root
    for part in os.path.relpath(path, root).split(os.sep):
        if part in ("", "."):
            continue
        if part == "..":
            raise HubError(f"{shown(path)}: not inside the cache {root}")
        current = os.path.join(current, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(current)
        mode = os.lstat(current).st_mode
        if not stat.S_ISDIR(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
            raise HubError(f"{shown(current)}: is {what}, where the cache keeps a folder; "
                           f"refused (a link there could send files elsewhere): remove it")
    return path


@contextlib.contextmanager
def _cache_dir_fd(path: str):
    """A descriptor of folder `path` under the cache root, opened component by component with
    O_NOFOLLOW, or None when it is not a real folder."""
    root = home()
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield None
        return
    try:
        for part in os.path.relpath(path, root).split(os.sep):
            if part in ("", "."):
                continue
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:   # missing, a link (ELOOP) or a file
                os.close(fd)
                fd = None
                break
            os.close(fd)
            fd = sub
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove the folder `name` of `parent_fd` and everything in it, through descriptors
    opened with O_NOFOLLOW: a link inside is removed as a link, never followed."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                _remove_tree_at(fd, entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


@contextlib.contextmanager
def _stale_names(parent: str, prefix: str, kind: int):
    """(descriptor of `parent`, names) a killed process left there: `prefix` + 8 random
    characters, of type `kind`, owned by this user; (None, []) if `parent` is no real folder."""
    with _cache_dir_fd(parent) as fd:
        if fd is None:
            yield None, []
            return
        names = []
        for name in os.listdir(fd):
            if not (name.startswith(prefix) and _TMP_RANDOM.fullmatch(name[len(prefix):])):
                continue
            try:
                st = os.lstat(name, dir_fd=fd)
            except OSError:
                continue
            if stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid():
                names.append(name)
        yield fd, names



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
    """Record every file of the entry being built (all regular files: archive.py unpacks no
    link, and open_own refuses one)."""
    files = {}
    for rel in _tree_files(root):
        with open_own(os.path.join(root, rel)) as f:
            files[rel] = {"size": os.fstat(f.fileno()).st_size, "sha256": sha256_of(f)}
    manifest = dict(origin, files=files,
                    created=datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"))
    atomic_write_text(os.path.join(root, MANIFEST), json.dumps(manifest, indent=1) + "\n")


def _read_manifest(root: str) -> Dict:
    path = os.path.join(root, MANIFEST)
    try:
        with open_own(path) as f:
            manifest = parse_json(f.read().decode("utf-8"), path, HubError)
        files = manifest["files"]
        if not isinstance(files, dict):
            raise ValueError("'files' is not an object")
        for rel, want in files.items():
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"the file name {rel!r} leaves the entry")
            if not isinstance(want, dict) or not (
                    isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)):
                raise ValueError(f"the record of {rel!r} holds no size and sha256")
    except HubError as e:
        raise HubError(f"{e}; remove {shown(root)} to fetch it again") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HubError(f"{shown(path)}: unreadable cache manifest ({shown(e)}); remove "
                       f"{shown(root)} to fetch it again") from None
    return manifest


def _file_problem(file: str, want: Dict) -> Optional[str]:
    """How the entry's file `file` differs from its manifest record `want`, or None. Only a
    regular file is read: a link (to anywhere), FIFO or device there is a problem."""
    try:
        mode = os.lstat(file).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "is missing"
    if stat.S_ISLNK(mode):
        return "is a symbolic link (never followed)"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    with open_own(file) as f:
        size = os.fstat(f.fileno()).st_size
        if size != want["size"]:
            return f"has {size:,} bytes, {want['size']:,} were recorded"
        if sha256_of(f) != want["sha256"]:
            return "has changed (its sha256 differs from the one recorded when it was fetched)"
    return None


def verify_entry(root: str) -> Dict:
    """Check a cache entry against its manifest → the manifest: every file with its size and
    sha256, nothing else (an added file could load instead). HubError naming the file."""
    manifest = _read_manifest(root)
    files = manifest["files"]
    for rel, want in files.items():
        file = os.path.join(root, *rel.split("/"))
        problem = _file_problem(file, want)
        if problem:
            raise HubError(f"{shown(file)}: cache entry {root} is damaged: the file {problem}; "
                           f"remove {root} to fetch it again")
    for rel in _tree_files(root):
        if rel not in files:
            file = os.path.join(root, *rel.split("/"))
            raise HubError(f"{shown(file)}: cache entry {root} holds a file its manifest does "
                           f"not list (added after the entry was fetched; it is never loaded): "
                           f"remove it, or remove {root} to fetch the entry again")
    return manifest


# -- trust on first use -----------------------------------------------------------------------
@dataclass(frozen=True)
class Fetched:
    """A remote file for an entry being built: `path`, its sha256 and size, and whether its
    checksum is still to be recorded (trust on first use)."""
    url: str
    path: str
    sha256: str
    size: int
    by_hand: bool
    unpinned: bool


def _expected_sha256(remote: registry.Remote) -> Tuple[Optional[str], str]:
    """(sha256 the file must have or None, where that value comes from). checksums.json is
    read, every record checked, even when the registry pins the file: a malformed record is
    an error before anything is fetched."""
    records = _read_checksums()
    if remote.sha256:
        return remote.sha256.lower(), "pinned in ernie_doc.releases"
    record = _trusted(remote.url, records)
    if record:
        return record["sha256"].lower(), f"recorded in {os.path.join(home(), CHECKSUMS)} on " \
                                         f"{record.get('first_seen', '?')}"
    return None, ""


def _read_checksums() -> Dict:
    """checksums.json as it is written ({URL: record}), once every record has been checked
    (`_record_problem`) and no two keys spelling one URL disagree; {} when there is none.
    HubError, one line naming the file (and the record), otherwise."""
    path = os.path.join(home(), CHECKSUMS)
    if not os.path.lexists(path):
        return {}
    why = "it records the sha256 of weights first fetched"
    try:
        with open_regular(path, "file", HubError) as f:
            text = f.read().decode("utf-8")
        try:
            data = json.loads(text, object_pairs_hook=unique_keys)
        except RecursionError:   # "[[[[..." thousands deep
            raise ValueError("JSON nested too deeply") from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except HubError as e:   # a FIFO or device under that name: never opened
        raise HubError(f"{e}; remove it ({why})") from None
    except DuplicateKey as e:   # json.loads would keep the last record (or field) silently
        raise HubError(f"{path}: {e}; fix or remove that record (nothing is downloaded or "
                       f"trusted until then)") from None
    except (OSError, ValueError) as e:
        raise HubError(f"{path}: unreadable ({shown(e)}); fix or remove it ({why})") from None
    seen: Dict[str, str] = {}
    for key, record in data.items():
        problem = _record_problem(key, record)
        if problem is None:
            first = seen.setdefault(_checksum_key(key), key)
            if data[first]["sha256"].lower() != record["sha256"].lower():
                problem = f"names the URL of the record {_json_clip(first)} with another sha256"
        if problem:
            raise HubError(f"{path}: the record {_json_clip(key)} {problem}; fix or remove "
                           f"that record (nothing is downloaded or trusted until then)")
    return data


_JSON_TYPES = {str: "a string", int: "a number", float: "a number", bool: "true or false",
               list: "an array"}


def _json_clip(value, limit: int = 120) -> str:
    """A JSON value quoted for an error line: escaped (one printable line) and clipped."""
    return clip(json.dumps(value), limit)


def _record_problem(key: str, record) -> Optional[str]:
    """What makes one checksums.json record unusable, or None: the key is an http(s) URL;
    the record an object with a 64-hex-digit 'sha256', and, when present, a 'size' in bytes,
    and a 'url' (that same URL) and 'first_seen' as text."""
    try:
        canonical = _checksum_key(key)
    except HubError:
        return "is keyed by no http(s) URL"
    if not isinstance(record, dict):
        return f"is {_JSON_TYPES.get(type(record), 'null')}, not an object"
    if "sha256" not in record:
        return "holds no 'sha256'"
    sha, size = record["sha256"], record.get("size", 0)
    if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha)):
        return f"has 'sha256' {_json_clip(sha, 80)}, not 64 hexadecimal digits"
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"has 'size' {_json_clip(size, 40)}, not a number of bytes"
    for field in ("url", "first_seen"):
        if not isinstance(record.get(field, ""), str):
            return f"has '{field}' {_json_clip(record[field], 40)}, not text"
    if "url" in record:
        try:
            same = _checksum_key(record["url"]) == canonical
        except HubError:
            same = False
        if not same:
            return f"has 'url' {_json_clip(record['url'])}, another URL than its key"
    return None


def _trusted(url: str, records: Dict) -> Optional[Dict]:
    """The record of `records` (checked by `_read_checksums`) trusted for `url`: keyed by the
    same URL in any spelling (`_checksum_key`), or None."""
    key = _checksum_key(url)
    for spelled, record in records.items():
        if _checksum_key(spelled) == key:
            return record
    return None


def _record_checksum(fetched: Fetched) -> None:
    """Trust `fetched` from now on: called only once the entry it built has been checked."""
    locks = _cache_dir(os.path.join(home(), "locks"))
    with file_lock(os.path.join(locks, "checksums.lock"), CHECKSUMS):
        data = _read_checksums()
        key = _checksum_key(fetched.url)
        record = _trusted(fetched.url, data)
        if record:   # recorded meanwhile (the same URL as a name and as a URL)
            if record["sha256"].lower() != fetched.sha256:
                raise HubError(f"{fetched.url}: sha256 {fetched.sha256} differs from "
                               f"{record['sha256']}, recorded meanwhile in "
                               f"{os.path.join(home(), CHECKSUMS)}; nothing was kept")
            return
        data[key] = {"sha256": fetched.sha256, "size": fetched.size, "url": fetched.url,
                     "first_seen": datetime.date.today().isoformat()}
        # the temporary files of a write that a kill interrupted (named by atomic_path; none
        # is in use: this process holds the lock)
        with _stale_names(home(), f".tmp-{CHECKSUMS}.", stat.S_IFREG) as (fd, names):
            for name in names:
                os.unlink(name, dir_fd=fd)
        atomic_write_text(os.path.join(home(), CHECKSUMS),
                          json.dumps(data, indent=1, sort_keys=True) + "\n")
        logger.info("%s: no published checksum; recorded sha256 %s (trust on first use: "
                    "every later fetch must match it)", fetched.url, fetched.sha256)


def fetch(remote: registry.Remote, into: str, room_factor: float = 1.0) -> Fetched:
    """The file of `remote`, verified against its pinned or trusted sha256 → Fetched (put by
    hand in downloads/, else downloaded into `into`). The caller holds the entry's lock."""
    manual = download_path(remote.url)
    want, origin = _expected_sha256(remote)
    if os.path.isfile(manual):   # put there by hand (a FIFO or device is not a file)
        with open_regular(manual, "file", HubError) as f:
            if looks_like_html(f.read(4096)) and not manual.lower().endswith((".html", ".htm")):
                raise HubError(f"{manual}: an HTML page, not the file of {remote.url} (it was "
                               f"put there by hand): replace it with that file")
            f.seek(0)
            got, size = sha256_of(f), os.fstat(f.fileno()).st_size
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
    """A fresh private temporary directory beside `final`, removed unless the block renamed it;
    downloads go to `<tmp>/.fetch`, never into the entry."""
    parent = _cache_dir(os.path.dirname(final))
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    try:
        os.mkdir(os.path.join(tmp, ".fetch"), 0o700)
        yield tmp
    finally:
        with _cache_dir_fd(parent) as fd, contextlib.suppress(OSError):
            if fd is not None:
                _remove_tree_at(fd, os.path.basename(tmp))


def _clean_stale(final: str) -> None:
    """Remove the temporary folders of `final` a killed process left (caller holds the lock):
    only this user's real folders named as `_building` names them, never following a link."""
    prefix = f".tmp-{os.path.basename(final)}-"
    with _stale_names(os.path.dirname(final), prefix, stat.S_IFDIR) as (fd, names):
        for name in names:
            _remove_tree_at(fd, name)
            logger.info("removed %s, left by an interrupted download",
                        os.path.join(os.path.dirname(final), name))


def _lock(entry: str) -> str:
    rel = os.path.relpath(entry, home()).replace(os.sep, "--")
    return os.path.join(_cache_dir(os.path.join(home(), "locks")), rel + ".lock")


def _ready(entry: str) -> bool:
    return os.path.isfile(os.path.join(entry, MANIFEST))


def _entry(final: str, build, what: str) -> str:
    """`final` verified, built under its lock by `build(tmp, fetched) -> root` if absent;
    checksums are trusted only after `build` returned."""
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


def _copy_new(source: BinaryIO, dst: str) -> None:
    """Copy the open binary file `source` into the new file `dst` (O_EXCL | O_NOFOLLOW: never
    onto or through something already there)."""
    fd = os.open(dst, _NEW_FILE, 0o644)
    try:
        for block in iter(lambda: source.read(CHUNK), b""):
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _place(item: Fetched, dst: str) -> None:
    """Put a fetched file into an entry being built: moved from the temporary folder, or
    (put in downloads/ by hand) copied, so the user's file stays."""
    if item.by_hand:
        with open_regular(item.path, "file", HubError) as source:
            _copy_new(source, dst)
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
            archive.extract(item.path, unpacked, what=item.path if item.by_hand else item.url)
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


def _relative(message: str, root: str) -> str:
    """`message` of a reader, the entry's temporary folder dropped from the paths it names
    (it is gone by the time the message is read): they read relative to the fetched file."""
    return shown(message.replace(root + os.sep, "").replace(root, "."))


def _check_checkpoint(root: str, origin: str, required: bool) -> bool:
    """Read the checkpoint in `root` once before trusting its checksum → whether there is one.
    HubError naming `origin`: not weights, a missing encoder tensor, none when `required`."""
    try:
        io.detect_format(root)
    except CheckpointError as e:
        if required:
            raise HubError(f"{origin}: holds no ERNIE-Doc checkpoint "
                           f"({_relative(str(e), root)})") from None
        return False
    try:
        gaps = io.encoder_gaps(io.read_checkpoint(root, upcast=False))
    except (CheckpointError, ValueError, TypeError) as e:
        raise HubError(f"{origin}: the fetched checkpoint does not load "
                       f"({_relative(str(e), root)}); nothing was kept") from None
    if gaps:
        raise HubError(f"{origin}: the fetched checkpoint lacks {len(gaps)} encoder tensors "
                       f"({short_list(gaps, 3)}): incomplete, not trusted; nothing was kept")
    return True


def _check_tokenizer_files(root: str, origin: str) -> None:
    """A URL entry without a checkpoint must hold tokenizer files, each what its name says:
    UTF-8 text (a JSON object for .json), never an HTML page. HubError naming `origin`."""
    found = [n for n in TOKENIZER_FILES if os.path.lexists(os.path.join(root, n))]
    if not found:
        raise HubError(f"{origin}: holds neither an ERNIE-Doc checkpoint nor tokenizer files "
                       f"({', '.join(TOKENIZER_FILES)}); refused, nothing was kept")
    for name in found:
        with open_own(os.path.join(root, name)) as f:
            data = f.read()
        where = f"{origin}: {name}"
        if looks_like_html(data):
            raise HubError(f"{where}: an HTML page, not a tokenizer file (a login or captive "
                           f"portal?); nothing was kept")
        if name.endswith(".model"):
            continue
        text = decode_utf8(data, where, HubError)
        if name.endswith(".json") and not isinstance(parse_json(text, where, HubError), dict):
            raise HubError(f"{where}: not a JSON object; nothing was kept")


def _complete_model_dir(root: str, release: registry.Release, origin: str) -> None:
    """Add a missing config (the release's preset) and tokenizer files (pinned); only regular
    files are read or written (O_EXCL | O_NOFOLLOW)."""
    try:
        fmt, _, config_path = io.detect_format(root)
    except CheckpointError as e:
        raise HubError(f"{origin}: holds no ERNIE-Doc checkpoint ({_relative(str(e), root)})") \
            from None
    if config_path is None:
        name = io.write_config(root, fmt, release.preset)
        logger.info("%s: no config in the release; wrote %s from preset %s", origin, name,
                    release.preset)
    _check_checkpoint(root, origin, required=True)
    tokenizer_dir = _tokenizer_entry(release)
    for filename, remote in release.tokenizer.items():
        dst = os.path.join(root, filename)
        if not os.path.lexists(dst):
            with open_own(os.path.join(tokenizer_dir, filename)) as source:
                _copy_new(source, dst)
        elif sha256_file(dst) != remote.sha256:   # a link or FIFO there: HubError
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


def _url_file_problem(url: str) -> Optional[str]:
    """Why the file a URL names is none an entry can be built from, or None: an archive, a
    checkpoint file or a tokenizer file (by its name; the content is checked once fetched)."""
    name = os.path.basename(download_path(url)).lower()
    if archive.is_archive(name) or name.endswith(CHECKPOINT_FILES) or name in TOKENIZER_FILES \
            or name.endswith(".model"):
        return None
    return (f"names {shown(repr(os.path.basename(download_path(url))))}, which is not an "
            f"archive ({', '.join(archive.ARCHIVE_SUFFIXES)}), a checkpoint file "
            f"({', '.join(CHECKPOINT_FILES)}) or a tokenizer file "
            f"({', '.join(TOKENIZER_FILES)}); refused")


def _url_entry(url: str) -> str:
    """The entry of a URL (keyed by its normalised form): an archive with a checkpoint or
    tokenizer files, a checkpoint file, or a tokenizer file, read before it is trusted."""
    key = hashlib.sha256(_checksum_key(url).encode("utf-8")).hexdigest()[:16]
    problem = _url_file_problem(url)
    if problem:
        raise HubError(f"{url}: {problem}")
    final = os.path.join(home(), "urls", key)
    remote = registry.Remote(url)

    def build(tmp, fetched):
        item = _fetch_into(tmp, remote, fetched,
                           room_factor=2.2 if archive.is_archive(url) else 1.1)
        root = _unpacked_or_placed(tmp, item, "file")
        if not _check_checkpoint(root, url, required=False):
            _check_tokenizer_files(root, url)
        _write_manifest(root, {"kind": "url", "url": url})
        return root

    _offline_check(url, final, [remote])
    return _entry(final, build, url)


def _archive_entry(path: str) -> str:
    """The entry of a local archive, keyed by its content (sha256): an archive edited in
    place, whatever its size and time stamp, is another entry, never the stale one."""
    real = os.path.realpath(path)
    with open_regular(real, "archive", HubError) as f:
        digest = sha256_of(f)
    final = os.path.join(home(), "archives", digest[:16])

    def build(tmp, fetched):
        unpacked = os.path.join(tmp, "unpacked")
        os.mkdir(unpacked)
        archive.extract(real, unpacked)
        with open_regular(real, "archive", HubError) as f:
            if sha256_of(f) != digest:
                raise HubError(f"{real}: changed while it was being unpacked; try again")
        root = _checkpoint_root(unpacked)
        _write_manifest(root, {"kind": "archive", "path": real, "sha256": digest})
        return root

    return _entry(final, build, real)


def resolve(spec, kind: str = "model", source: Optional[str] = None) -> str:
    """A local path for `spec`, fetched into the cache if needed. kind: "model" or "tokenizer";
    source: "official" or "paddlenlp" (default $ERNIE_DOC_SOURCE). HubError, one line."""
    if kind not in KINDS:
        raise HubError(f"kind {kind!r}: choose one of {KINDS}")
    spec = os.fspath(spec)
    if source is not None and source not in registry.SOURCES:
        raise HubError(f"source {source!r}: choose one of {', '.join(registry.SOURCES)}")
    if is_url(spec):
        return _url_entry(spec)   # checked first: a NUL byte cannot reach the file system
    if os.path.exists(spec):
        if os.path.isfile(spec) and archive.is_archive(spec):
            return _archive_entry(spec)
        return run_model_folder(spec)   # a run's OUTPUT_DIR: its best/, else final/
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
