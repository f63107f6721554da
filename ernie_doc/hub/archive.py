"""Unpacking a tar archive without trusting it.

Every member is checked before anything is written: a member whose name is absolute, holds a
`..` component or a drive letter, a link (symbolic or hard) whose target is absolute or lies
outside the extraction directory, and any device, FIFO or other special file make the whole
archive a HubError naming the archive and the member. The declared sizes are summed first, so
an archive that cannot fit is refused before it is unpacked. Members are written into a fresh
directory that the caller renames into place.
"""
import os
import posixpath
import tarfile
from typing import List

from ernie_doc.hub.fetch import HubError, check_space

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")


def is_archive(path: str) -> bool:
    return os.fspath(path).lower().endswith(ARCHIVE_SUFFIXES)


def _escapes(path: str) -> bool:
    """A normalised relative posix path that climbs out of its root."""
    return path == ".." or path.startswith("../")


def _member_problem(member: tarfile.TarInfo) -> str:
    """Why `member` may not be unpacked, or ""."""
    name = member.name
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a '..' component"
    if member.issym() or member.islnk():
        target = member.linkname.replace("\\", "/")
        if target.startswith("/") or (len(target) > 1 and target[1] == ":"):
            return f"a link to the absolute path {member.linkname!r}"
        # a symlink's target is relative to its own folder, a hard link's to the root
        base = posixpath.dirname(name) if member.issym() else ""
        if _escapes(posixpath.normpath(posixpath.join(base, target))):
            return f"a link to {member.linkname!r}, outside the archive"
        return ""
    if not (member.isfile() or member.isdir()):
        return "a device, FIFO or other special file"
    return ""


def safe_members(tar: tarfile.TarFile, archive: str) -> List[tarfile.TarInfo]:
    """The archive's members, all checked (HubError naming the first refused one)."""
    members = tar.getmembers()
    for member in members:
        problem = _member_problem(member)
        if problem:
            raise HubError(f"{archive}: refused to unpack: member {member.name!r} is {problem}")
    return members


def extract(archive: str, dest: str) -> None:
    """Unpack `archive` into the existing, empty directory `dest` after checking every member
    and the free space. HubError for an unreadable or unsafe archive; `dest` may then hold a
    partial tree, which the caller (who created it) removes."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = safe_members(tar, archive)
            check_space(dest, sum(m.size for m in members if m.isfile()),
                        f"{archive} (unpacked)")
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=members, **kwargs)   # checked above, filter again
    except (tarfile.TarError, EOFError, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, tarfile.TarError) \
                and getattr(e, "filename", None) is not None:
            raise   # a write failure in the cache (full disk ...): the caller reports it
        reason = " ".join(str(e).split())   # tarfile's "r:*" error spans several lines
        raise HubError(f"{archive}: not a readable tar archive ({type(e).__name__}: "
                       f"{reason})") from None
