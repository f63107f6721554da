"""Unpacking a tar archive without trusting it.

The released archives are plain folders of parameter files, a config and vocabularies, so only
regular files and folders are unpacked, and tarfile's extraction (and its filters) is never
used. Every member is checked before anything is written, and every file is created with
O_EXCL | O_NOFOLLOW through a descriptor of its parent folder, so nothing is ever written
through a link. Details: docs/design-notes.md, "Hub: unpacking archives"."""
import contextlib
import lzma
import os
import tarfile
import zlib
from typing import Dict, List, Optional

from ernie_doc.errors import HubError
from ernie_doc.hub.fetch import CHUNK, check_space, shown, write_all

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")
MAX_MEMBERS = 10_000          # a released archive holds a few hundred files
MAX_UNPACKED = 32 << 30       # the default cap of the unpacked size (large-en: 1.6 GB)
MAX_PATH = 1024               # bytes of a member's path (UTF-8)
NAME_MAX = 255                # bytes of one component
_BLOCK = 4096                 # what one folder or the tail of one file takes on the disk
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def is_archive(path: str) -> bool:
    return os.fspath(path).lower().endswith(ARCHIVE_SUFFIXES)


def _parts(name: str) -> List[str]:
    """The components of a member's name (a leading `./` and `.` components dropped; [] for
    the root itself); HubError-worthy names raise ValueError with the reason."""
    if any(not c.isprintable() for c in name):
        raise ValueError("a name holding a control character")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ValueError("an absolute path")
    if "\\" in name:
        raise ValueError("a name holding a backslash")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise ValueError(f"a path longer than {MAX_PATH} bytes")
    parts = [p for p in name.split("/") if p != "."]
    if parts and parts[-1] == "":   # "dir/"
        parts.pop()
    for part in parts:
        if part == "..":
            raise ValueError("a '..' component")
        if part == "":
            raise ValueError("an empty path component")
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise ValueError(f"a path component longer than {NAME_MAX} bytes")
    return parts


def _kind(member: tarfile.TarInfo) -> Optional[str]:
    """Why a member's type may not be unpacked, or None (a regular file or a folder)."""
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.isfile() or member.isdir():
        return None
    return "a device, FIFO or other special file"


def plan(tar: tarfile.TarFile, what: str, max_bytes: int = MAX_UNPACKED
         ) -> List[tarfile.TarInfo]:
    """The members to unpack, read lazily (at most MAX_MEMBERS) and checked → in archive order,
    `.name` normalised. HubError naming `what` and the first refused member."""
    seen: Dict[str, str] = {}        # case-folded path → "file" / "dir"
    members: List[tarfile.TarInfo] = []
    total = count = 0

    def refuse(member_name, why):
        return HubError(f"{what}: refused to unpack: member {member_name!r} is {why}")

    for member in tar:
        count += 1
        if count > MAX_MEMBERS:
            raise HubError(f"{what}: refused to unpack: more than {MAX_MEMBERS:,} members (a "
                           f"released archive holds a few hundred)")
        kind = _kind(member)
        if kind:
            raise refuse(member.name, kind)
        try:
            parts = _parts(member.name)
        except ValueError as e:
            raise refuse(member.name, str(e)) from None
        if not parts:   # "." / "./": the root itself
            continue
        for depth in range(1, len(parts)):   # the folders it implies
            folder = "/".join(parts[:depth]).casefold()
            if seen.get(folder) == "file":
                raise refuse(member.name, f"under {'/'.join(parts[:depth])!r}, a file of "
                                          f"the archive")
            seen.setdefault(folder, "dir")
        key = "/".join(parts).casefold()
        if key in seen and not (member.isdir() and seen[key] == "dir"):
            raise refuse(member.name, "a name given twice (the case aside)")
        seen[key] = "dir" if member.isdir() else "file"
        if member.isfile():
            total += member.size
            if total > max_bytes:
                raise HubError(f"{what}: refused to unpack: more than {max_bytes:,} bytes "
                               f"unpacked")
        member.name = "/".join(parts)
        members.append(member)
        if len(seen) > MAX_MEMBERS:
            raise HubError(f"{what}: refused to unpack: more than {MAX_MEMBERS:,} files and "
                           f"folders (a released archive holds a few hundred)")
    return members


def disk_bytes(members: List[tarfile.TarInfo]) -> int:
    """What unpacking `members` takes on the disk, about: each file rounded up to a block,
    each folder (named or implied) one block."""
    folders = {m.name for m in members if m.isdir()}
    for m in members:
        parts = m.name.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    files = sum(-(-m.size // _BLOCK) * _BLOCK for m in members if m.isfile())
    return files + _BLOCK * len(folders)


@contextlib.contextmanager
def _folder(root_fd: int, parts: List[str], made: set, dest: str):
    """A descriptor of the folder `parts` under `root_fd`, each level made if this unpacking
    has not made it yet and opened with O_NOFOLLOW (a link there is never followed)."""
    fd = os.dup(root_fd)
    try:
        for depth, part in enumerate(parts, 1):
            path = "/".join(parts[:depth])
            if path not in made:
                os.mkdir(part, 0o755, dir_fd=fd)
                made.add(path)
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise OSError(e.errno, e.strerror, os.path.join(dest, path)) from None
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, parent_fd: int, name: str,
                  path: str, what: str) -> None:
    """Copy `member`'s bytes into the new file `name` of folder `parent_fd` (O_EXCL,
    O_NOFOLLOW); a write error is an OSError naming `path`."""
    source = tar.extractfile(member)
    fd = os.open(name, _NEW_FILE, 0o644, dir_fd=parent_fd)
    written = 0
    try:
        while written <= member.size:
            block = source.read(CHUNK)
            if not block:
                break
            written += len(block)
            write_all(fd, block, path)
    finally:
        os.close(fd)
    if written != member.size:
        raise HubError(f"{what}: member {member.name!r} holds {written:,} bytes, its header "
                       f"says {member.size:,} (a damaged archive)")


def extract(archive: str, dest: str, what: Optional[str] = None,
            max_bytes: int = MAX_UNPACKED) -> None:
    """Unpack `archive` into the existing, empty `dest` after checking every member and the
    space. HubError (named `what`) if unreadable or unsafe; OSError naming a failed write."""
    what = what or archive
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = plan(tar, what, max_bytes)
            check_space(dest, disk_bytes(members), f"{what} (unpacked)")
            root_fd = os.open(dest, _DIR_FLAGS)
            made: set = set()
            try:
                for member in members:
                    parts = member.name.split("/")
                    folder, leaf = (parts, None) if member.isdir() else (parts[:-1], parts[-1])
                    with _folder(root_fd, folder, made, dest) as fd:
                        if leaf is not None:
                            _write_member(tar, member, fd, leaf,
                                          os.path.join(dest, *parts), what)
            finally:
                os.close(root_fd)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as e:
        if isinstance(e, OSError) and not isinstance(e, tarfile.TarError) \
                and getattr(e, "filename", None) is not None:
            raise   # a write failure in the cache (full disk ...): the caller reports it
        reason = shown(" ".join(str(e).split()))   # tarfile's "r:*" error spans several lines
        raise HubError(f"{what}: not a readable tar archive ({type(e).__name__}: "
                       f"{reason})") from None
