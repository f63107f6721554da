"""What a run may put in OUTPUT_DIR, and the only things it ever deletes there.

A run lists every entry it creates in OUTPUT_DIR in a manifest, `.ernie-doc-run.json`,
before creating it, so a kill at any moment leaves nothing the manifest does not list (at
worst a listed name that was never created). Deleting is decided by the manifest alone, never
by a name: a re-run into the same directory (`overwrite_output_dir`) removes the manifest's
entries, and only after checking that the directory holds nothing else; the rotation of
checkpoints removes only checkpoint folders the manifest lists. A user's notes, a dataset or
another tool's files are never touched, even when they are named like a run's. A directory
without a manifest is never cleaned: a new run goes only into an empty or new one.

The manifest's entries are relative paths: "name" is a file, link or folder the run owns
whole; "name/" is a folder the run created whose contents are listed one by one
("name/child", e.g. checkpoints/step-3), so that another tool's checkpoints/epoch-9/ in it
stays someone else's. The run's temporary files (atomic writes) live in its own listed folder,
`.ernie-doc-tmp/`, and the manifest is itself replaced atomically through
`.ernie-doc-run.json.tmp`.

A directory that is, contains or lies inside one of the run's inputs (data, checkpoint,
tokenizer), or that is or contains the current directory, the repository or $HOME, is
refused before anything is written. Every deletion in OUTPUT_DIR goes through `remove_entry`
(or `clear_previous_run`, which removes every listed entry).
"""
import contextlib
import json
import os
import shutil
import stat
from typing import Iterable, Iterator, List, Optional, Tuple

from ernie_doc.config import ConfigError
from ernie_doc.utils import atomic_path, path_within

MANIFEST = ".ernie-doc-run.json"
_MANIFEST_TMP = MANIFEST + ".tmp"
TEMP = ".ernie-doc-tmp"        # the run's temporary files: a folder it owns whole
_FORMAT = 1
_MAX_MANIFEST_BYTES = 16 << 20   # a run lists a few dozen names; anything this large is not ours

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the manifest ----------------------------------------------------------------------------
def _parts(entry: str) -> Optional[List[str]]:
    """The path components of a manifest entry, or None when it is not one: a relative path
    of one or two plain names ("name", "name/", "name/child"), never '..', '.' or absolute."""
    if not isinstance(entry, str) or not entry or "\\" in entry or "\0" in entry:
        return None
    tracked = entry.endswith("/")
    parts = (entry[:-1] if tracked else entry).split("/")
    if len(parts) > (1 if tracked else 2) or any(p in ("", ".", "..") for p in parts):
        return None
    return parts


def read_manifest(output_dir: str) -> Optional[List[str]]:
    """The entries the manifest in `output_dir` lists, or None when there is none.
    ConfigError (one line naming the file) for a manifest that is not one a run wrote: not a
    regular file, unreadable, or an entry that is not a plain relative path inside the
    directory (a damaged or planted manifest never makes a run delete outside its folder)."""
    path = os.path.join(output_dir, MANIFEST)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None

    def damaged(why: str) -> ConfigError:
        return ConfigError(f"{path}: {why}, not the list of files a run wrote: remove "
                           f"{output_dir} yourself or choose another output_dir")
    if not stat.S_ISREG(info.st_mode):
        raise damaged("not a regular file")
    if info.st_size > _MAX_MANIFEST_BYTES:
        raise damaged(f"{info.st_size} bytes")
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read(_MAX_MANIFEST_BYTES + 1).decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise damaged("invalid JSON") from None
    entries = value.get("entries") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("format") != _FORMAT or \
            not isinstance(entries, list):
        raise damaged(f"no format {_FORMAT} object with an 'entries' list")
    folders = {e for e in entries if isinstance(e, str) and e.endswith("/")}
    for entry in entries:
        parts = _parts(entry)
        if parts is None or (len(parts) == 2 and parts[0] + "/" not in folders):
            raise damaged(f"entry {str(entry)[:80]!r} is not a name inside the directory")
    return list(dict.fromkeys(entries))


def _write_manifest(output_dir: str, entries: Iterable[str]) -> None:
    """Replace the manifest atomically (its temporary file is its own, never followed)."""
    text = json.dumps({"format": _FORMAT, "written_by": "ernie-doc",
                       "entries": sorted(set(entries))}, indent=1) + "\n"
    tmp, path = os.path.join(output_dir, _MANIFEST_TMP), os.path.join(output_dir, MANIFEST)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from e
    os.replace(tmp, path)


def open_run(output_dir: str) -> None:
    """Create `output_dir` if needed and start its manifest when it has none (a new run, or
    the resume of a run written by an earlier version: the manifest then lists only what
    this run creates). Temporary files a killed run left in TEMP go."""
    os.makedirs(output_dir, exist_ok=True)
    if read_manifest(output_dir) is None:
        _write_manifest(output_dir, [])
    remove_entry(output_dir, TEMP)


def claim(output_dir: str, *entries: str) -> None:
    """List `entries` in the manifest before they are created ("name/child" lists its folder
    "name/" too). Nothing happens in a directory without a manifest (a function of the run
    called on its own, outside a run): such a directory is never cleaned either."""
    listed = read_manifest(output_dir)
    if listed is None:
        return
    new = []
    for entry in entries:
        parts = _parts(entry)
        if parts is None:
            raise ValueError(f"not a manifest entry: {entry!r}")
        for item in ([parts[0] + "/"] if len(parts) == 2 else []) + [entry]:
            if item not in listed and item not in new:
                new.append(item)
    if new:
        _write_manifest(output_dir, listed + new)


def listed_in(output_dir: str, folder: str) -> List[str]:
    """The names the manifest lists inside `folder` (a folder listed as "folder/")."""
    prefix = folder.rstrip("/") + "/"
    return [e[len(prefix):] for e in read_manifest(output_dir) or []
            if e.startswith(prefix) and e != prefix]


def _path(output_dir: str, entry: str) -> Optional[str]:
    """The path of `entry`, or None when its folder is not a real folder (a link put in
    its place is never followed)."""
    parts = _parts(entry)
    if len(parts) == 2:
        parent = os.path.join(output_dir, parts[0])
        if os.path.islink(parent) or not os.path.isdir(parent):
            return None
    return os.path.join(output_dir, *parts)


def _remove_listed(output_dir: str, listed: List[str], entries: Iterable[str]) \
        -> Tuple[List[str], List[str]]:
    """Remove `entries` (each listed; children before their folders) → (removed, still
    there). A file or link is unlinked (never its target), an owned folder removed whole, a
    listed folder ("name/") only once its listed contents are gone and nothing else is in
    it."""
    removed, kept = [], []
    for entry in sorted(entries, key=lambda e: (-len(_parts(e)), e.endswith("/"), e)):
        path = _path(output_dir, entry)
        if path is None or not os.path.lexists(path):
            removed.append(entry)   # nothing there: no longer listed
            continue
        if entry.endswith("/"):
            inside = [e for e in listed if e.startswith(entry) and e != entry]
            if os.path.islink(path) or not os.path.isdir(path) or os.listdir(path) or \
                    any(e not in removed for e in inside):
                kept.append(entry)
                continue
            os.rmdir(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        removed.append(entry)
    return removed, kept


def remove_entry(output_dir: str, entry: str) -> bool:
    """Delete `entry` if, and only if, the manifest lists it (then unlist it) → whether it
    is gone. The one way a run deletes anything in OUTPUT_DIR besides clear_previous_run."""
    listed = read_manifest(output_dir)
    if listed is None or entry not in listed:
        return not os.path.lexists(os.path.join(output_dir, entry))
    removed, _ = _remove_listed(output_dir, listed, [entry])
    if removed:
        _write_manifest(output_dir, [e for e in listed if e not in removed])
    return bool(removed)


def make_room(output_dir: str, entry: str) -> None:
    """Before `entry` is created afresh: remove what is there if the manifest lists it;
    ConfigError (one line) when something the run did not write is in the way."""
    if not remove_entry(output_dir, entry):
        raise ConfigError(f"{os.path.join(output_dir, entry)}: exists and was not written by "
                          f"this run (not listed in {MANIFEST}): move it away")


def rename_entry(output_dir: str, src: str, dst: str) -> None:
    """Rename `src` to `dst` (both entries; `dst` listed before it appears)."""
    claim(output_dir, dst)
    os.rename(os.path.join(output_dir, src), os.path.join(output_dir, dst))
    listed = read_manifest(output_dir)
    if listed is not None and src in listed:
        _write_manifest(output_dir, [e for e in listed if e != src])


@contextlib.contextmanager
def atomic_entry(output_dir: str, entry: str) -> Iterator[str]:
    """ernie_doc.utils.atomic_path for OUTPUT_DIR/entry: a temporary path moved into place
    when the block succeeds. In a run's folder, `entry` is listed first and the temporary
    file lives in the run's own folder TEMP, so a kill leaves nothing unlisted."""
    path = os.path.join(output_dir, *entry.split("/"))
    if read_manifest(output_dir) is None:
        with atomic_path(path) as tmp:
            yield tmp
        return
    claim(output_dir, TEMP, entry)
    temp = os.path.join(output_dir, TEMP)
    os.makedirs(temp, exist_ok=True)
    with atomic_path(path, tmp_dir=temp) as tmp:
        yield tmp


def write_text(output_dir: str, entry: str, text: str) -> None:
    """OUTPUT_DIR/entry = text, atomically, listed first (atomic_entry)."""
    with atomic_entry(output_dir, entry) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


# -- what is in a directory ------------------------------------------------------------------
def foreign_entries(directory: str) -> List[str]:
    """What in `directory` its manifest does not list (sorted; folders end in '/'): every
    name when there is no manifest; inside a listed folder ("checkpoints/"), what is not
    listed there either (checkpoints/epoch-9/)."""
    listed = read_manifest(directory)
    listed = set() if listed is None else set(listed) | {MANIFEST, _MANIFEST_TMP}
    top = {e.split("/")[0] for e in listed}
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.name not in top:
            out.append(entry.name + ("/" if is_dir else ""))
        elif is_dir and entry.name + "/" in listed:
            for child in sorted(os.scandir(entry.path), key=lambda e: e.name):
                if f"{entry.name}/{child.name}" not in listed:
                    out.append(f"{entry.name}/{child.name}"
                               + ("/" if child.is_dir(follow_symlinks=False) else ""))
    return out


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def _shown(names: List[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_output_dir(output_dir: str, inputs: Iterable[str] = (), resume: bool = False,
                     overwrite: bool = False, marker: str = "run_config.yaml",
                     source: str = "config") -> None:
    """Refuse an output directory this run must not write into (ConfigError, one line).

    inputs: paths the run reads (data directory, checkpoint, tokenizer ...); output_dir may
    not be, contain or lie inside any of them. A new run goes into a new or empty directory,
    or (overwrite) into one holding only what its manifest lists; --resume into a run's
    directory (`marker` there). Nothing is created or changed here."""
    out = _real(output_dir)
    where = f"output_dir {output_dir}"
    for path in inputs:
        if not path or not os.path.exists(os.path.expanduser(os.fspath(path))):
            continue
        real = _real(path)
        if path_within(out, real) or path_within(real, out):
            relation = ("is" if out == real else "lies inside" if path_within(out, real)
                        else "contains")
            raise ConfigError(f"{source}: {where} {relation} {path}, an input of this run: "
                              "choose a directory of its own")
    protected = [("the current directory", os.getcwd()), ("the repository", REPOSITORY),
                 ("$HOME", os.path.expanduser("~")), ("the root directory", os.sep)]
    for what, path in protected:
        real = _real(path)
        if path_within(real, out):
            relation = "is" if out == real else "contains"
            raise ConfigError(f"{source}: {where} {relation} {what} ({real}): choose a "
                              "directory of its own")
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out):
        raise ConfigError(f"{source}: {where} exists and is not a directory")
    listed = read_manifest(out)
    has_run = os.path.isfile(os.path.join(out, marker))
    if resume:
        if not has_run:
            raise ConfigError(f"--resume {output_dir}: no run there ({marker} missing)")
        return
    foreign = foreign_entries(out)
    if listed is None and has_run:   # an earlier version's run: nothing says what it wrote
        if not overwrite:
            raise ConfigError(f"{where} already holds a run (written by an earlier version): "
                              f"resume it with --resume {output_dir}, or remove it yourself "
                              "or choose another directory")
        raise ConfigError(f"{source}: {where} holds a run written by an earlier version, "
                          f"which did not list the files it wrote ({MANIFEST}): "
                          "overwrite_output_dir removes only listed files, so remove it "
                          "yourself or choose another directory")
    owned = [e for e in listed or [] if os.path.lexists(os.path.join(out, e.rstrip("/")))]
    if (has_run or owned) and not overwrite:
        raise ConfigError(f"{where} already holds a run: resume it with --resume "
                          f"{output_dir}, or set overwrite_output_dir=true")
    if foreign:
        raise ConfigError(f"{source}: {where} holds files that are not a previous run's "
                          f"({_shown(foreign)}): choose an empty or new directory, or move "
                          "them")


def clear_previous_run(output_dir: str) -> Optional[List[str]]:
    """Remove what the manifest of `output_dir` lists (anything else stays; a directory
    without a manifest is left as it is) → the names removed that were there, or None when
    the directory does not exist. The manifest keeps listing whatever could not go."""
    if not os.path.isdir(output_dir):
        return None
    listed = read_manifest(output_dir)
    if not listed:
        return []
    there = [e for e in listed if os.path.lexists(os.path.join(output_dir, e.rstrip("/")))]
    removed, kept = _remove_listed(output_dir, listed, listed)
    _write_manifest(output_dir, kept)
    return sorted(e.rstrip("/") for e in removed if e in there and "/" not in e.rstrip("/"))
