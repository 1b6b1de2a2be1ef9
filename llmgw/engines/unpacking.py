"""Unpacking engine archives (tar, tar.gz/.xz/.bz2, zip) without letting any member escape the target directory.

Every member is checked before anything is written: absolute paths, `..` components, links (symbolic or hard)
whose target resolves outside the directory, device files and FIFOs are refused. The whole archive is refused on the
first bad member, so a half-unpacked tree never results from a malicious archive.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from llmgw.errors import EngineError


def _inside(root: Path, relative: str) -> bool:
    """True when `root/relative`, resolved lexically (no file system access), stays under `root`."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or relative.startswith("/") or (len(relative) > 1 and relative[1] == ":"):
        return False
    depth = 0
    for part in pure.parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def _check_link(root: Path, member_name: str, target: str, archive: Path) -> None:
    if PurePosixPath(target).is_absolute() or not _inside(root, str(PurePosixPath(member_name).parent / target)):
        raise EngineError(f"refusing to unpack {archive.name}: link {member_name!r} points to {target!r}, "
                          "outside the install directory; the archive is unsafe, fetch it from a trusted source")


def _safe_destination(root: Path, name: str, link_target: str | None, archive: Path, *, directory: bool = False) -> Path:
    """The real path to write member `name` to, after following links already written; refused when outside.
    Creates the parent directories (and the member itself when `directory`)."""
    path = root / name
    if directory:
        path = path / "_"
    existing = path.parent
    while not existing.exists() and existing != root:
        existing = existing.parent
    if not existing.resolve().is_relative_to(root):
        raise _refuse(archive, name, "would be written through a link outside the install directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    parent = path.parent.resolve()
    if not parent.is_relative_to(root):
        raise _refuse(archive, name, "would be written through a link outside the install directory")
    if link_target is not None and not Path(os.path.realpath(parent / link_target)).is_relative_to(root):
        raise _refuse(archive, name, f"is a link to {link_target!r}, which resolves outside the install directory")
    return parent / path.name


def _refuse(archive: Path, name: str, why: str) -> EngineError:
    return EngineError(f"refusing to unpack {archive.name}: member {name!r} {why}; the archive is unsafe, "
                       "fetch it from a trusted source")


def unpack_archive(archive: Path, target: Path) -> list[Path]:
    """Unpack `archive` (.tar, .tar.gz, .tgz, .tar.xz, .tar.bz2, .zip) into `target` (created if missing).

    Returns the regular files written. Raises EngineError naming the member when any member's path or link would
    leave `target`, or when a member is a device or FIFO, or when the file is not an archive of a known kind.
    Blocking (run it in a thread from async code).
    """
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    if zipfile.is_zipfile(archive):
        return _unpack_zip(archive, root)
    try:
        tar = tarfile.open(archive)
    except (tarfile.TarError, OSError) as exc:
        raise EngineError(f"{archive} is neither a tar nor a zip archive ({exc}); the download may be damaged") from exc
    with tar:
        return _unpack_tar(tar, archive, root)


def _unpack_tar(tar: tarfile.TarFile, archive: Path, root: Path) -> list[Path]:
    members = tar.getmembers()
    for member in members:
        if not _inside(root, member.name):
            raise _refuse(archive, member.name, "leaves the install directory")
        if member.issym():
            _check_link(root, member.name, member.linkname, archive)
        elif member.islnk():
            if not _inside(root, member.linkname):
                raise _refuse(archive, member.name, f"is a hard link to {member.linkname!r} outside the install directory")
        elif not (member.isfile() or member.isdir()):
            raise _refuse(archive, member.name, "is a device, FIFO or other special file")
    written: list[Path] = []
    for member in members:
        if member.isdir():
            _safe_destination(root, member.name, None, archive, directory=True)
            continue
        path = _safe_destination(root, member.name, member.linkname if member.issym() else None, archive)
        if path.is_symlink() or path.exists():
            path.unlink()
        if member.issym():
            os.symlink(member.linkname, path)
            continue
        if member.islnk():
            linked = (root / member.linkname).resolve()
            if not linked.is_relative_to(root):
                raise _refuse(archive, member.name, f"is a hard link to {member.linkname!r} outside the install directory")
            shutil.copy2(linked, path)
        else:
            source = tar.extractfile(member)
            assert source is not None  # a regular file always has content
            with source, path.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        path.chmod(member.mode & 0o755 | stat.S_IRUSR | stat.S_IWUSR)
        written.append(path)
    # A symlink written earlier could make a later member's parent point elsewhere: check the final tree.
    for path in written:
        if not path.resolve().is_relative_to(root):
            raise _refuse(archive, str(path.relative_to(root)), "was written through a link outside the install directory")
    return written


def _unpack_zip(archive: Path, root: Path) -> list[Path]:
    written: list[Path] = []
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            if not _inside(root, info.filename):
                raise _refuse(archive, info.filename, "leaves the install directory")
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                _check_link(root, info.filename, zf.read(info).decode("utf-8", "replace"), archive)
        for info in infos:
            mode = info.external_attr >> 16
            if info.is_dir():
                _safe_destination(root, info.filename, None, archive, directory=True)
                continue
            link = zf.read(info).decode("utf-8", "replace") if stat.S_ISLNK(mode) else None
            path = _safe_destination(root, info.filename, link, archive)
            if path.is_symlink() or path.exists():
                path.unlink()
            if stat.S_ISLNK(mode):
                os.symlink(link, path)
                continue
            with zf.open(info) as source, path.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            path.chmod((mode & 0o755) | stat.S_IRUSR | stat.S_IWUSR if mode else 0o644)
            written.append(path)
    for path in written:
        if not path.resolve().is_relative_to(root):
            raise _refuse(archive, str(path.relative_to(root)), "was written through a link outside the install directory")
    return written
