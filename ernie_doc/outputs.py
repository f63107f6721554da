"""Where a command may write: one rule for every output path, checked before any work and
before any byte is written. Errors are one line, raised as the caller's error class.

An output file is never an input (by device and inode), never inside an input folder, never in
/dev, /proc or /sys, never a FIFO or device; replaced only with `--overwrite`, appended to only
with `--resume` (check_output, OutputFolder). An output folder (a training run's OUTPUT_DIR)
is no input, holds none and lies in none, and is not the current directory, the repository,
$HOME or / (check_output_folder); what a run may put in it is training.outdir's manifest.
Details: docs/design-notes.md, "Output paths". Imports no paddle."""
import os
import stat
from typing import BinaryIO, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union

from ernie_doc.errors import OutputError
from ernie_doc.utils import mode_kind, path_within

FileId = Tuple[int, int]   # (st_dev, st_ino): what a path is, whatever its spelling
# The most entries of the input folders walked to learn what an existing output may not be:
# past it, an existing output is refused (it cannot be shown not to be an input).
MAX_SCANNED = 1_000_000
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME_MAX, PATH_MAX = 255, 4096   # when the filesystem does not say (os.pathconf)
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | \
    getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
    getattr(os, "O_CLOEXEC", 0)


def _stat(path: str, follow: bool = True, dir_fd: Optional[int] = None) \
        -> Optional[os.stat_result]:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except (OSError, ValueError):   # missing, a dangling link, a NUL byte, no permission
        return None


def _file_id(st: os.stat_result) -> FileId:
    return st.st_dev, st.st_ino


class InputSet:
    """What a command reads, by file id: the files and folders given and every file directly
    in those folders."""

    def __init__(self, paths: Iterable[Optional[str]] = ()):
        self.files: Dict[FileId, str] = {}
        self.folders: Dict[FileId, str] = {}
        self.entries: Dict[FileId, Tuple[str, str]] = {}   # id → (entry, its input folder)
        self.complete = True   # False: a folder had more than MAX_SCANNED entries
        for given in filter(None, paths):   # None or "": nothing given
            st = _stat(os.fspath(given))
            if st is not None:
                (self.folders if stat.S_ISDIR(st.st_mode) else self.files)[_file_id(st)] = \
                    os.fspath(given)
        for folder in list(self.folders.values()):
            self._walk(folder)

    def _walk(self, top: str) -> None:
        """The entries directly in `top`, by kind (links followed). Subfolders are not walked,
        so a link to an ancestor cannot make the whole tree an input."""
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    if len(self.entries) >= MAX_SCANNED:
                        self.complete = False
                        return
                    st = _stat(entry.path)   # links followed: what reading it reads
                    if st is not None and not stat.S_ISDIR(st.st_mode):
                        self.entries.setdefault(_file_id(st), (entry.path, top))
        except OSError:   # unreadable: its files cannot be read as inputs either
            return

    def which(self, file_id: FileId) -> Optional[str]:
        """The one-line phrase naming the input `file_id` is ("the input X", "X of the input
        folder F"), or None."""
        if file_id in self.files:
            return f"the input {self.files[file_id]}"
        if file_id in self.entries:
            entry, folder = self.entries[file_id]
            return f"{entry} of the input folder {folder}"
        return None


def _system_folders() -> Dict[FileId, Tuple[str, bool]]:
    """id → (folder, whether everything under it is refused too): /proc and /sys wholly,
    /dev itself (its subfolders, e.g. /dev/shm, are ordinary places)."""
    found = {}
    for folder, whole in (("/proc", True), ("/sys", True), ("/dev", False)):
        st = _stat(folder)
        if st is not None:
            found[_file_id(st)] = (folder, whole)
    return found


def _name_problem(path: str) -> Optional[str]:
    """Why `path` cannot be created for its length (a name past the filesystem's limit, a
    path past PATH_MAX), or None."""
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = NAME_MAX
    if len(os.fsencode(full)) >= PATH_MAX:
        return f"the path is {len(os.fsencode(full))} bytes, the limit is {PATH_MAX - 1}"
    for part in full.split(os.sep):
        if len(os.fsencode(part)) > name_max:
            return f"the name {part[:24]}... is {len(os.fsencode(part))} bytes, longer than " \
                   f"the {name_max} this filesystem allows"
    return None


def check_output(path: str, inputs: Union[Sequence[str], InputSet] = (), *,
                 what: str = "--output", exists_ok: bool = False,
                 hint: str = "--overwrite replaces it",
                 error: Type[Exception] = OutputError) -> Optional[FileId]:
    """Refuse `path` as an output (error(one line)) unless it follows the module's rule → the
    file id already there, or None. exists_ok: --overwrite / --resume. Opens nothing."""
    path = os.fspath(path)
    where = f"{what} {path}"
    if not path or path.endswith(os.sep) or os.path.isdir(path):
        raise error(f"{where}: is a directory; give a file name")
    problem = _name_problem(path)
    if problem:
        raise error(f"{where}: {problem}")
    link = _stat(path, follow=False)
    target = _stat(path) if link is not None else None
    for st in (link, target):
        if st is not None and not stat.S_ISLNK(st.st_mode) and mode_kind(st.st_mode):
            raise error(f"{where}: is {mode_kind(st.st_mode)}, not a regular file")
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    for system in ("/proc", "/sys"):
        if folder == system or folder.startswith(system + os.sep):
            raise error(f"{where}: is in {system} (the system's), not a place for files")
    if folder == "/dev":
        raise error(f"{where}: is in /dev (the system's devices), not a place for files")
    inputs = inputs if isinstance(inputs, InputSet) else InputSet(inputs)
    for parent, parent_id in _ancestors(path):
        if parent_id in inputs.folders:
            raise error(f"{where}: inside the input folder {inputs.folders[parent_id]}; write "
                        f"it elsewhere")
    if target is not None:
        found = inputs.which(_file_id(target))
        if found is not None:
            raise error(f"{where}: is {found} (the same file)")
        if not inputs.complete:
            raise error(f"{where}: exists, and an input folder has more than {MAX_SCANNED:,} "
                        f"entries to compare it with; give a new file name")
    if link is not None and not exists_ok:
        raise error(f"{where}: exists; {hint}")
    return None if link is None else _file_id(link)


def check_stream(fd: int, inputs: InputSet, *, what: str = "--output -",
                 stream: str = "standard output",
                 error: Type[Exception] = OutputError) -> None:
    """Refuse an output the shell already opened (`--output - >> input.jsonl`): error(one line)
    when `fd` is closed or is one of `inputs`. Pipes, terminals and other files pass."""
    try:
        st = os.fstat(fd)
    except OSError:
        raise error(f"{what}: {stream} is closed; give --output a file name") from None
    if not stat.S_ISREG(st.st_mode):
        return
    found = inputs.which(_file_id(st))
    if found is not None:
        raise error(f"{what}: {stream} is {found} (the same file); write it elsewhere")


def _ancestors(path: str) -> Iterable[Tuple[str, FileId]]:
    """The folders holding `path`, nearest first, links resolved, each with its file id (the
    last component is not resolved: it is the name that gets written)."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    while True:
        st = _stat(folder)
        if st is not None:
            yield folder, _file_id(st)
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def check_appendable(path: str, *, what: str = "--output",
                     error: Type[Exception] = OutputError) -> None:
    """Refuse to append to `path` unless it is a regular file with no other name: appending
    through a symbolic link or to a hard-linked file changes what another path shows."""
    where = f"{what} {os.fspath(path)}"
    st = _stat(path, follow=False)
    if st is None:
        raise error(f"{where}: does not exist")
    if stat.S_ISLNK(st.st_mode):
        raise error(f"{where}: is a symbolic link (to {os.path.realpath(path)}); appending "
                    f"goes to a file itself: give its own path")
    if mode_kind(st.st_mode):
        raise error(f"{where}: is {mode_kind(st.st_mode)}, not a regular file")
    if st.st_nlink > 1:
        raise error(f"{where}: has {st.st_nlink} names (hard links); appending would change "
                    f"the others too")


def check_output_folder(folder: str, where: str, inputs: Iterable[str], source: str,
                        error: Type[Exception] = OutputError) -> None:
    """Refuse an output folder (`folder`, resolved) that is, contains or lies inside one of
    `inputs`, or is or contains the current directory, the repository, $HOME or / (error, one
    line: "{source}: {where} lies inside ...")."""
    for path in inputs:
        for given in dict.fromkeys([os.fspath(path or ""),
                                    os.path.expanduser(os.fspath(path or ""))]):
            if not given or not os.path.exists(given):
                continue
            real = os.path.realpath(given)
            if path_within(folder, real) or path_within(real, folder):
                relation = ("is" if folder == real else "lies inside"
                            if path_within(folder, real) else "contains")
                raise error(f"{source}: {where} {relation} {path}, an input of this "
                            "run: choose a directory of its own")
    protected = [("the current directory", os.getcwd()), ("the repository", REPOSITORY),
                 ("$HOME", os.path.expanduser("~")), ("the root directory", os.sep)]
    for what, path in protected:
        real = os.path.realpath(path)
        if path_within(real, folder):
            relation = "is" if folder == real else "contains"
            raise error(f"{source}: {where} {relation} {what} ({real}): choose a "
                        "directory of its own")


def unwritable_file(path: str) -> Optional[str]:
    """Why `path` cannot be written as a file (checked before a long job), or None: the nearest
    existing parent must be a writable directory and `path` no directory."""
    path = os.fspath(path)
    if path.endswith(os.sep) or os.path.isdir(path):
        return f"{path}: is a directory; give a file name"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{path}: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK):
        return f"{path}: cannot write in {parent}"
    return None


def temp_name(prefix: str = ".tmp-ernie-doc-", suffix: str = "") -> str:
    """A fresh name for a temporary file beside an output, for create_new: short, whatever the
    output's name (an output name near the length limit must not make its temporary too long)."""
    return prefix + os.urandom(8).hex() + suffix


def create_new(path: str, dir_fd: Optional[int] = None) -> int:
    """A write-only descriptor of a new regular file at `path` (mode 0666 less the umask, what
    open() gives); FileExistsError when anything is there, a planted link included."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o666,
                   dir_fd=dir_fd)


class OutputFolder:
    """The folder of one output file, opened once: the file and its sidecar are opened,
    created and renamed relative to it, the file locked. See check_output, open_append, create."""

    def __init__(self, path: str, inputs: InputSet, *, what: str = "--output",
                 error: Type[Exception] = OutputError, writer: str = "another run"):
        self.path, self.name = os.fspath(path), os.path.basename(os.fspath(path))
        self.inputs, self.error, self.writer = inputs, error, writer
        self.where = f"{what} {self.path}"
        real = os.path.realpath(os.path.dirname(os.path.abspath(self.path)))
        try:
            self.fd = os.open(real, _DIR_FLAGS)
        except OSError as e:
            raise error(f"{self.where}: cannot open its folder {real} ({e.strerror})") from None
        self._held: List[int] = []   # descriptors whose locks last for the run
        self.file: Optional[BinaryIO] = None   # the output, once opened or created
        try:
            self._check_folder()
        except BaseException:
            self.close()
            raise

    def _check_folder(self) -> None:
        """The opened folder, by its descriptor: it and every folder above it ('..' by '..')
        is no input folder and not in /proc or /sys, and it is not /dev itself."""
        system = _system_folders()
        fd, nearest = os.dup(self.fd), True
        try:
            while True:
                here = _file_id(os.fstat(fd))
                if here in self.inputs.folders:
                    raise self.error(f"{self.where}: its folder is now inside the input folder "
                                     f"{self.inputs.folders[here]} (it changed after the "
                                     f"check); nothing written")
                folder, whole = system.get(here, (None, False))
                if folder and (whole or nearest):
                    raise self.error(f"{self.where}: its folder is now in {folder} (it changed "
                                     f"after the check); nothing written")
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                if _file_id(os.fstat(parent)) == here:   # the root
                    os.close(parent)
                    return
                os.close(fd)
                fd, nearest = parent, False
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the output file, the folder, and release the locks."""
        if self.file is not None:
            self.file.close()
            self.file = None
        for fd in self._held:
            os.close(fd)
        self._held = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "OutputFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _lock(self, fd: int, name: str) -> None:
        """An exclusive lock on `fd` (the file now at `name`) for the run, else error: another
        run holds it. A filesystem without locks is written unlocked."""
        import fcntl
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self.error(f"{self.where}: {self.writer} is writing it; wait for it to finish "
                             f"or choose another path") from None
        except OSError:
            return
        st = _stat(name, False, self.fd)
        if st is None or _file_id(st) != _file_id(os.fstat(fd)):
            raise self.error(f"{self.where}: changed while it was opened; run again")

    def read(self, name: str, limit: int) -> Optional[bytes]:
        """The bytes of the regular file `name` beside the output (never through a link, a
        FIFO never opened), at most `limit`; None when there is none. Larger: error."""
        st = _stat(name, False, self.fd)
        if st is None:
            return None
        if mode_kind(st.st_mode):   # a device or FIFO is never opened (opening may act)
            raise self.error(f"{self.where}: {name} is {mode_kind(st.st_mode)}, not a regular file")
        try:
            fd = os.open(name, os.O_RDONLY | _OPEN_FLAGS, dir_fd=self.fd)
        except OSError as e:
            raise self.error(f"{self.where}: cannot read {name} ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if mode_kind(st.st_mode):
                raise self.error(f"{self.where}: {name} is {mode_kind(st.st_mode)}, not a regular "
                                 f"file")
            data = f.read(limit + 1)
        if len(data) > limit:
            raise self.error(f"{self.where}: {name} is over {limit:,} bytes, more than such a "
                             f"record holds")
        return data

    def open_append(self, expected: Optional[FileId] = None) -> BinaryIO:
        """The existing output opened "r+b" and locked: a regular file with one name, no input,
        and (when given) the checked file `expected`; anything else is refused unread."""
        st = _stat(self.name, False, self.fd)
        if st is None or mode_kind(st.st_mode):
            raise self.error(f"{self.where}: changed since it was checked; run again")
        try:
            fd = os.open(self.name, os.O_RDWR | _OPEN_FLAGS, dir_fd=self.fd)
        except OSError as e:
            raise self.error(f"{self.where}: cannot open it ({e.strerror}); give a regular "
                             f"file of its own") from None
        try:
            st = os.fstat(fd)
            if mode_kind(st.st_mode) or st.st_nlink > 1 or \
                    (expected is not None and _file_id(st) != expected):
                raise self.error(f"{self.where}: changed since it was checked; run again")
            found = self.inputs.which(_file_id(st))
            if found:
                raise self.error(f"{self.where}: is {found} (the same file)")
            self._lock(fd, self.name)
        except BaseException:
            os.close(fd)
            raise
        self.file = open(fd, "r+b")
        return self.file

    def _create(self, name: str, exclusive_name: bool = False) -> Tuple[int, str]:
        name = name if exclusive_name else temp_name()
        try:
            fd = create_new(name, self.fd)
        except FileExistsError:
            raise self.error(f"{self.where}: appeared after it was checked ({name}); run "
                             f"again") from None
        return fd, name

    def _remove(self, name: str, file_id: FileId) -> None:
        """Remove `name` if it is still the file this run created (`file_id`)."""
        st = _stat(name, False, self.fd)
        if st is not None and _file_id(st) == file_id:
            os.unlink(name, dir_fd=self.fd)

    def create(self, beside: Mapping[str, bytes], replace: bool) -> BinaryIO:
        """A new, empty, locked output file after the files `beside` it; each is complete under
        a temporary name before its rename, so nothing of an existing output is lost."""
        made = []   # (name, id) of what this run created, removed on failure
        try:
            staged = []
            for name, data in beside.items():
                fd, tmp = self._create(name)
                made.append((tmp, _file_id(os.fstat(fd))))
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                staged.append((tmp, name))
            fd, tmp = self._create(self.name, exclusive_name=not replace)
            made.append((tmp, _file_id(os.fstat(fd))))
            self._held.append(fd)
            self._lock(fd, tmp)
            if replace:
                self._lock_old()
                os.rename(tmp, self.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                made[-1] = (self.name, made[-1][1])
            for tmp, name in staged:
                os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            for name, file_id in made:
                self._remove(name, file_id)
            raise
        self.file = open(os.dup(fd), "wb")
        return self.file

    def _lock_old(self) -> None:
        """The file that `create(replace=True)` replaces: when it is a regular file, its lock
        (another run writing it refuses this one) and no input."""
        st = _stat(self.name, False, self.fd)
        if st is None or mode_kind(st.st_mode):   # missing, a link (replaced, never followed)
            return
        try:
            fd = os.open(self.name, os.O_RDONLY | _OPEN_FLAGS, dir_fd=self.fd)
        except OSError:
            return
        self._held.append(fd)
        st = os.fstat(fd)
        if mode_kind(st.st_mode):
            return
        found = self.inputs.which(_file_id(st))
        if found:
            raise self.error(f"{self.where}: is {found} (the same file)")
        self._lock(fd, self.name)
