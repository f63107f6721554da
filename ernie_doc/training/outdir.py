"""What a run may put in OUTPUT_DIR, and the only things it ever deletes there.

A run lists every entry in a manifest (`.ernie-doc-run.json`) before creating it and deletes
only what it lists, so no user file is ever touched; `lock_output_dir` keeps to one run at a
time. Details: docs/design-notes.md, "Training: the output directory"."""
import contextlib
import errno
import fnmatch
import json
import logging
import os
import shutil
import stat
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from ernie_doc.errors import ConfigError
from ernie_doc.outputs import check_output_folder, create_new, temp_name
from ernie_doc.utils import atomic_path, path_within

logger = logging.getLogger("ernie_doc.train")   # the run's log (training.runlog)

MANIFEST = ".ernie-doc-run.json"
TEMP = ".ernie-doc-tmp"        # the run's temporary files: a folder it owns whole
CHECKPOINTS = "checkpoints"    # the one folder listed item by item
_FORMAT = 1
MAX_ENTRIES = 100_000            # a run lists a few dozen names; anything this large is not ours
_MAX_MANIFEST_BYTES = 16 << 20

# The closed set of top-level names a run writes (glob patterns), each owned whole; and what
# it writes inside checkpoints/. A manifest listing another name is not a run's.
RUN_NAMES = (
    "run_config.yaml", "train.log", "train_log.jsonl", "eval_history.jsonl",
    "eval_results.json", "results.json", "*_results.json", "predictions_*.jsonl",
    "timing.json", "curves.png", "vdl", "best", "final", "final.tmp", "tokenizer",
    "vocab.txt", TEMP,
)
CHECKPOINT_NAMES = ("step-[0-9]*", "best-step-[0-9]*", "latest")   # and each with .tmp
LINKS = ("best", f"{CHECKPOINTS}/latest")   # the run's own symlinks, into checkpoints/


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def is_run_entry(entry: str) -> bool:
    """Whether `entry` is a name a run writes: one of RUN_NAMES, "checkpoints/", or a
    checkpoint ("checkpoints/step-3", "checkpoints/latest", ... and their .tmp)."""
    if entry == CHECKPOINTS + "/":
        return True
    if entry.startswith(CHECKPOINTS + "/"):
        name = entry[len(CHECKPOINTS) + 1:]
        name = name[:-4] if name.endswith(".tmp") else name
        return "/" not in name and _matches(name, CHECKPOINT_NAMES)
    return "/" not in entry and _matches(entry, RUN_NAMES)


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


# this process's view of each manifest it read or wrote: {abspath: (the file's lstat
# signature, entries in order, the same as a set)}; re-read when the file changed
_CACHE: Dict[str, Tuple[tuple, List[str], Set[str]]] = {}


def _signature(info: os.stat_result) -> tuple:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _load(output_dir: str) -> Optional[Tuple[List[str], Set[str]]]:
    """(entries, as a set) of `output_dir`'s manifest, or None; cached while unchanged.
    ConfigError for a manifest no run wrote (so a planted one never makes a run delete)."""
    path = os.path.join(output_dir, MANIFEST)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        _CACHE.pop(os.path.abspath(output_dir), None)
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    cached = _CACHE.get(os.path.abspath(output_dir))
    if cached is not None and cached[0] == _signature(info):
        return cached[1], cached[2]

    def damaged(why: str) -> ConfigError:
        return ConfigError(f"{path}: {why}, not the list of files a run wrote: remove "
                           f"{output_dir} yourself or choose another output_dir")
    if not stat.S_ISREG(info.st_mode):
        raise damaged("not a regular file")
    if info.st_size > _MAX_MANIFEST_BYTES:
        raise damaged(f"{info.st_size} bytes")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            value = json.loads(f.read(_MAX_MANIFEST_BYTES + 1).decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise damaged("invalid JSON") from None
    entries = value.get("entries") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("format") != _FORMAT or \
            not isinstance(entries, list):
        raise damaged(f"no format {_FORMAT} object with an 'entries' list")
    if len(entries) > MAX_ENTRIES:
        raise damaged(f"{len(entries):,} entries (a run lists at most {MAX_ENTRIES:,})")
    folders = {e for e in entries if isinstance(e, str) and e.endswith("/")}
    for entry in entries:
        parts = _parts(entry)
        if parts is None or (len(parts) == 2 and parts[0] + "/" not in folders):
            raise damaged(f"entry {str(entry)[:80]!r} is not a name inside the directory")
        if not is_run_entry(entry):
            raise damaged(f"entry {entry[:80]!r} is not a name a run writes")
    entries = list(dict.fromkeys(entries))
    _CACHE[os.path.abspath(output_dir)] = (_signature(info), entries, set(entries))
    return entries, set(entries)


def read_manifest(output_dir: str) -> Optional[List[str]]:
    """The entries the manifest in `output_dir` lists, or None when there is none (ConfigError
    for one that is not a run's: see _load)."""
    loaded = _load(output_dir)
    return None if loaded is None else list(loaded[0])


def _is_manifest_temp(name: str) -> bool:
    return name.startswith(MANIFEST + ".") and name.endswith(".tmp")


def _write_manifest(output_dir: str, entries: Iterable[str]) -> None:
    """Replace the manifest atomically, through a temporary file of a fresh name created
    with O_EXCL (a link planted at any name is never followed or reused)."""
    entries = sorted(set(entries))
    if len(entries) > MAX_ENTRIES:
        raise ConfigError(f"{os.path.join(output_dir, MANIFEST)}: a run lists at most "
                          f"{MAX_ENTRIES:,} entries")
    text = json.dumps({"format": _FORMAT, "written_by": "ernie-doc", "entries": entries},
                      indent=1) + "\n"
    path = os.path.join(output_dir, MANIFEST)
    tmp = os.path.join(output_dir, temp_name(MANIFEST + ".", ".tmp"))
    try:
        fd = create_new(tmp)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise OSError(e.errno, e.strerror, path) from e
    _CACHE[os.path.abspath(output_dir)] = (_signature(os.lstat(path)), entries, set(entries))


def open_run(output_dir: str) -> None:
    """Create `output_dir` if needed, start an empty manifest when it has none, and remove
    temporary files a killed run left in TEMP."""
    os.makedirs(output_dir, exist_ok=True)
    if read_manifest(output_dir) is None:
        _write_manifest(output_dir, [])
    remove_entry(output_dir, TEMP)


def _not_ours(output_dir: str, entry: str) -> ConfigError:
    return ConfigError(f"{os.path.join(output_dir, entry.rstrip('/'))}: exists and was not "
                       f"written by this run (not listed in {MANIFEST}): move it away")


def claim(output_dir: str, *entries: str) -> None:
    """List `entries` in the manifest before they are created. An existing entry not listed is
    refused (ConfigError naming it). Does nothing in a directory without a manifest."""
    loaded = _load(output_dir)
    if loaded is None:
        return
    listed, names = loaded
    new: List[str] = []
    for entry in entries:
        parts = _parts(entry)
        if parts is None or not is_run_entry(entry):
            raise ValueError(f"not a manifest entry: {entry!r}")
        for item in ([parts[0] + "/"] if len(parts) == 2 else []) + [entry]:
            if item in names or item in new:
                continue
            if os.path.lexists(os.path.join(output_dir, item.rstrip("/"))):
                raise _not_ours(output_dir, item)
            new.append(item)
    if new:
        _write_manifest(output_dir, listed + new)


def listed_in(output_dir: str, folder: str) -> List[str]:
    """The names the manifest lists inside `folder` (a folder listed as "folder/")."""
    prefix = folder.rstrip("/") + "/"
    loaded = _load(output_dir)
    return [e[len(prefix):] for e in (loaded[0] if loaded else [])
            if e.startswith(prefix) and e != prefix]


def _path(output_dir: str, entry: str) -> Optional[str]:
    """The path of `entry`, or None when its folder is not a real folder (a link put in
    its place is never followed)."""
    parts = _parts(entry)
    assert parts is not None   # a listed entry: the manifest's were checked when read
    if len(parts) == 2:
        parent = os.path.join(output_dir, parts[0])
        if os.path.islink(parent) or not os.path.isdir(parent):
            return None
    return os.path.join(output_dir, *parts)


def _remove_listed(output_dir: str, listed: List[str], entries: Iterable[str]) \
        -> Tuple[List[str], List[str]]:
    """Remove listed `entries` (children first) → (removed, still there). Links are unlinked,
    never followed; a listed folder goes only once nothing unlisted is in it."""
    removed, kept = [], []
    gone: Set[str] = set()
    for entry in sorted(entries, key=lambda e: (-len(_parts(e) or ()), e.endswith("/"), e)):
        path = _path(output_dir, entry)
        if path is None or not os.path.lexists(path):
            removed.append(entry)   # nothing there: no longer listed
            gone.add(entry)
            continue
        if entry.endswith("/"):
            inside = [e for e in listed if e.startswith(entry) and e != entry]
            if os.path.islink(path) or not os.path.isdir(path) or os.listdir(path) or \
                    any(e not in gone for e in inside):
                kept.append(entry)
                continue
            os.rmdir(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        removed.append(entry)
        gone.add(entry)
    return removed, kept


def remove_entries(output_dir: str, entries: Iterable[str]) -> bool:
    """Delete each listed entry of `entries`, then unlist them in one rewrite → whether all
    are gone."""
    entries = list(entries)
    loaded = _load(output_dir)
    names = set() if loaded is None else loaded[1]
    gone = all(not os.path.lexists(os.path.join(output_dir, e))
               for e in entries if e not in names)
    mine = [e for e in entries if e in names]
    if not mine or loaded is None:
        return gone
    removed, _ = _remove_listed(output_dir, loaded[0], mine)
    if removed:
        dropped = set(removed)
        _write_manifest(output_dir, [e for e in loaded[0] if e not in dropped])
    return gone and len(removed) == len(set(mine))


def remove_entry(output_dir: str, entry: str) -> bool:
    """Delete `entry` if, and only if, the manifest lists it (then unlist it) → whether it
    is gone."""
    return remove_entries(output_dir, [entry])


def make_room(output_dir: str, entry: str) -> None:
    """Before `entry` is created afresh: remove what is there if the manifest lists it;
    ConfigError (one line) when something the run did not write is in the way."""
    if not remove_entry(output_dir, entry):
        raise _not_ours(output_dir, entry)


def rename_entry(output_dir: str, src: str, dst: str) -> None:
    """Rename `src` to `dst` (both entries; `dst` listed before it appears)."""
    claim(output_dir, dst)
    os.rename(os.path.join(output_dir, src), os.path.join(output_dir, dst))
    loaded = _load(output_dir)
    if loaded is not None and src in loaded[1]:
        _write_manifest(output_dir, [e for e in loaded[0] if e != src])


@contextlib.contextmanager
def atomic_entry(output_dir: str, entry: str) -> Iterator[str]:
    """utils.atomic_path for OUTPUT_DIR/entry; in a run's folder `entry` is claimed first and
    the temporary file lives in the run's TEMP, so a kill leaves nothing unlisted."""
    path = os.path.join(output_dir, *entry.split("/"))
    if _load(output_dir) is None:
        with atomic_path(path) as tmp:
            yield tmp
        return
    claim(output_dir, TEMP, entry)
    temp = os.path.join(output_dir, TEMP)
    os.makedirs(temp, exist_ok=True)
    if os.path.islink(temp):
        raise _not_ours(output_dir, TEMP)
    with atomic_path(path, tmp_dir=temp) as tmp:
        yield tmp


def write_text(output_dir: str, entry: str, text: str) -> None:
    """OUTPUT_DIR/entry = text, atomically, listed first (atomic_entry)."""
    with atomic_entry(output_dir, entry) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def open_append(path: str):
    """A run's log file opened for appending (UTF-8) with O_NOFOLLOW: a link in its place is
    refused."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path}: is a symbolic link, not the log this run "
                              "writes: move it away") from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


# -- one run at a time -------------------------------------------------------------------------
_LOCKS: Dict[str, int] = {}   # abspath → descriptor of the directory this process has locked


def _holder(info: os.stat_result) -> str:
    """The pid holding a flock on the file of `info`, from /proc/locks ('unknown' without)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/locks", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6 or "->" in parts or parts[1] != "FLOCK":
                    continue
                major, minor, inode = parts[5].split(":")
                if int(inode) == info.st_ino and (int(major, 16), int(minor, 16)) == \
                        (os.major(info.st_dev), os.minor(info.st_dev)):
                    return parts[4]
    return "unknown"


def lock_output_dir(output_dir: str) -> bool:
    """Hold an exclusive flock on `output_dir` (created if missing → whether it was) until
    release_output_dir or exit; re-entrant. ConfigError (the holder's pid) if held elsewhere."""
    import fcntl
    key = os.path.abspath(output_dir)
    fd = _LOCKS.get(key)
    if fd is not None:
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(output_dir)):
                return False
        release_output_dir(output_dir)   # a directory since removed and made again
    created = not os.path.lexists(output_dir)
    if created:
        os.makedirs(output_dir)
    fd = os.open(output_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        info = os.fstat(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"output_dir {output_dir} is in use by another run (pid "
                              f"{_holder(info)})") from None
        # a file system without flock (NFS without lockd, Lustre without -o flock): the run
        # goes on unlocked, as predict's output lock does, and says so
        logger.warning(f"WARNING output_dir {output_dir}: cannot lock it ({e.strerror}); "
                       f"make sure no other run writes into it")
        return created
    _LOCKS[key] = fd
    return created


def release_output_dir(output_dir: str) -> None:
    """Give up the lock lock_output_dir took (nothing when this process holds none)."""
    fd = _LOCKS.pop(os.path.abspath(output_dir), None)
    if fd is not None:
        os.close(fd)   # closing the only descriptor releases the flock


# -- what is in a directory ------------------------------------------------------------------
def foreign_entries(directory: str) -> List[str]:
    """What in `directory` its manifest does not list (sorted; folders end in '/'), looking
    inside listed folders too; every name when there is no manifest."""
    loaded = _load(directory)
    listed = set() if loaded is None else loaded[1] | {MANIFEST}
    top = {e.split("/")[0] for e in listed}
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.name not in top:
            if loaded is None or not _is_manifest_temp(entry.name):
                out.append(entry.name + ("/" if is_dir else ""))
        elif is_dir and entry.name + "/" in listed:
            for child in sorted(os.scandir(entry.path), key=lambda e: e.name):
                if f"{entry.name}/{child.name}" not in listed:
                    out.append(f"{entry.name}/{child.name}"
                               + ("/" if child.is_dir(follow_symlinks=False) else ""))
    return out


def _shown(names: List[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_resumable(output_dir: str, listed: List[str]) -> None:
    """--resume: ConfigError naming the entry unless every name the run writes is absent or in
    `listed` and real (`best`, `checkpoints/latest`: links into checkpoints/)."""
    where = f"--resume {output_dir}"
    names = set(listed)
    for item in sorted(os.scandir(output_dir), key=lambda e: e.name):
        name = item.name + ("/" if item.name == CHECKPOINTS else "")
        if _matches(item.name, RUN_NAMES + (CHECKPOINTS,)) and name not in names:
            raise ConfigError(f"{where}: {_not_ours(output_dir, name)}")
    latest = f"{CHECKPOINTS}/latest"
    if latest not in names and os.path.lexists(os.path.join(output_dir, latest)):
        raise ConfigError(f"{where}: {_not_ours(output_dir, latest)}")
    home = os.path.realpath(os.path.join(output_dir, CHECKPOINTS))
    for entry in sorted(names):
        path = os.path.join(output_dir, entry.rstrip("/"))
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISLNK(info.st_mode) and entry in LINKS:
            target = os.path.realpath(path)
            if not (path_within(target, home) and target != home and os.path.isdir(target)):
                raise ConfigError(f"{where}: {path} points to {os.readlink(path)}, not to a "
                                  f"checkpoint of this run in {home}")
        elif stat.S_ISLNK(info.st_mode):
            raise ConfigError(f"{where}: {path} is a symbolic link, not the file or folder "
                              "this run wrote: put the run's own back or move the link away")
        elif entry.endswith("/") and not stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{where}: {path} is not a folder")
        elif not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            raise ConfigError(f"{where}: {path} is not a regular file or folder")


def check_output_dir(output_dir: str, inputs: Iterable[str] = (), resume: bool = False,
                     overwrite: bool = False, marker: str = "run_config.yaml",
                     source: str = "config") -> None:
    """Refuse an output directory this run must not write into (ConfigError, one line).

    inputs: paths the run reads (data directory, checkpoint, tokenizer ...); output_dir may
    not be, contain or lie inside any of them. A new run goes into a new or empty directory,
    or (overwrite) into one holding only what its manifest lists, run's `marker` among them;
    --resume into a run's directory (`marker` there) where nothing is in the run's way
    (check_resumable). Paths are taken as given (no `~` expansion: the caller resolves the
    config's paths once, and writes to what was checked). Nothing is created or changed
    here."""
    out = os.path.realpath(output_dir)
    where = f"output_dir {output_dir}"
    check_output_folder(out, where, inputs, source, ConfigError)
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out):
        raise ConfigError(f"{source}: {where} exists and is not a directory")
    listed = read_manifest(out)
    mark = os.path.join(out, marker)
    has_run = os.path.isfile(mark) and not os.path.islink(mark)   # the run's own, no link
    if resume:
        if not has_run:
            raise ConfigError(f"--resume {output_dir}: no run there ({marker} missing)")
        if listed is None:   # nothing says what was written there: not a run's folder
            raise ConfigError(f"--resume {output_dir}: no run there ({MANIFEST} missing)")
        check_resumable(out, listed)
        return
    foreign = foreign_entries(out)   # without a manifest: everything, a run_config.yaml too
    has_run = has_run and listed is not None
    owned = [e for e in listed or [] if os.path.lexists(os.path.join(out, e.rstrip("/")))]
    held = (has_run or owned) and not overwrite
    if held and has_run and os.path.lexists(os.path.join(out, CHECKPOINTS, "latest")):
        raise ConfigError(f"{where} already holds a run: resume it with --resume "
                          f"{output_dir}, or set overwrite_output_dir=true")
    if foreign:
        raise ConfigError(f"{source}: {where} holds files that are not a previous run's "
                          f"({_shown(foreign)}): choose an empty or new directory, or move "
                          "them")
    if owned and not (has_run and marker in (listed or [])):
        raise ConfigError(f"{source}: {where}: its {MANIFEST} lists {_shown(owned)} but not "
                          f"the run's {marker} beside them: overwrite_output_dir removes a "
                          "run's files only with its run_config.yaml; remove them yourself "
                          "or choose another directory")
    if held:   # stopped before its first checkpoint: --resume has nothing to continue
        raise ConfigError(f"{where} already holds a run that saved no checkpoint, so there "
                          "is nothing to resume: start it over with --set "
                          "overwrite_output_dir=true, or choose another directory")


def clear_previous_run(output_dir: str) -> Optional[List[str]]:
    """Remove what `output_dir`'s manifest lists (nothing else) → the names removed, or None
    when the directory does not exist."""
    if not os.path.isdir(output_dir):
        return None
    listed = read_manifest(output_dir)
    if not listed:
        return []
    there = [e for e in listed if os.path.lexists(os.path.join(output_dir, e.rstrip("/")))]
    removed, kept = _remove_listed(output_dir, listed, listed)
    _write_manifest(output_dir, kept)
    return sorted(e.rstrip("/") for e in removed if e in there and "/" not in e.rstrip("/"))
