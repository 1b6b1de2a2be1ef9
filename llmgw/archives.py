"""Tar archives extracted safely on every Python llmgw runs on.

tarfile's "data" filter (PEP 706) refuses members that would land outside the target or make devices, and drops
set-uid bits; it exists from Python 3.11.4, but Debian bookworm's python3 (the hosts' Python, which `llmgw node
add` and `server add` make llmgw's venvs with) is 3.11.2, where `extractall(filter=...)` is a TypeError. On such a
Python `extract_tar` applies the same refusals itself.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
"""Whether this Python's tarfile has PEP 706's filters (3.11.4 and newer)."""


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _checked(member: tarfile.TarInfo, root: str) -> tarfile.TarInfo:
    """`member` as the "data" filter would let it through (modes and owner changed in place), or
    tarfile.TarError naming why not."""
    name = member.name = member.name.lstrip("/")  # as the filter does: an absolute name lands inside
    target = os.path.realpath(os.path.join(root, name))
    if not _inside(root, target):
        raise tarfile.TarError(f"{name!r} would land outside the directory: refused")
    if member.ischr() or member.isblk() or member.isfifo():
        raise tarfile.TarError(f"{name!r} is a device or a FIFO: refused")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise tarfile.TarError(f"{name!r} links to the absolute path {member.linkname!r}: refused")
        if not _inside(root, os.path.realpath(os.path.join(os.path.dirname(target), member.linkname))):
            raise tarfile.TarError(f"{name!r} links outside the directory ({member.linkname!r}): refused")
    if member.islnk() and not _inside(root, os.path.realpath(os.path.join(root, member.linkname))):
        raise tarfile.TarError(f"{name!r} is a hard link outside the directory ({member.linkname!r}): refused")
    if member.isreg() or member.isdir() or member.islnk():
        member.mode &= 0o755  # no set-uid, set-gid or sticky bit, no write by group or others
        if member.isreg() or member.islnk():
            member.mode |= 0o600
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    return member


def extract_tar(tar: tarfile.TarFile, target: Path | str, members: Iterable[tarfile.TarInfo] | None = None) -> None:
    """Extract `members` of `tar` (default: all) into `target` with the "data" filter's refusals (module docstring).
    Raises tarfile.TarError naming the first member refused (nothing of a refused archive is written on a Python
    without the filter; with it, tarfile stops at that member) or OSError."""
    if HAS_DATA_FILTER:
        tar.extractall(target, members=members, filter="data")
        return
    root = os.path.realpath(target)
    chosen = [_checked(member, root) for member in (tar.getmembers() if members is None else members)]
    tar.extractall(target, members=chosen)
