"""Unpacking refuses archives whose members or links leave the install directory, and unpacks good ones."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from llmgw.engines import unpack_archive
from llmgw.errors import EngineError


def make_tar(path: Path, members: list[tuple[str, str, object]]) -> Path:
    """members: (name, kind, payload) with kind "file" (bytes), "dir", "symlink" (target), "hardlink" (target),
    "fifo"."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                info.mode = 0o755
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("symlink", "hardlink"):
                info.linkname = payload
            tar.addfile(info)
    return path


def make_zip(path: Path, members: list[tuple[str, str, bytes | str]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, kind, payload in members:
            info = zipfile.ZipInfo(name)
            if kind == "symlink":
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(info, payload)
            else:
                info.external_attr = (stat.S_IFREG | 0o755) << 16
                zf.writestr(info, payload)
    return path


def test_a_release_tar_unpacks_with_its_executable_bit_and_inner_links(tmp_path):
    archive = make_tar(tmp_path / "llama.tar.gz", [
        ("build/bin", "dir", None),
        ("build/bin/llama-server", "file", b"#!/bin/sh\necho ok\n"),
        ("build/bin/libggml.so.0.1", "file", b"lib"),
        ("build/bin/libggml.so.0", "symlink", "libggml.so.0.1"),
        ("build/bin/copy.so", "hardlink", "build/bin/libggml.so.0.1"),
    ])
    target = tmp_path / "out"
    written = unpack_archive(archive, target)
    assert sorted(p.name for p in written) == ["copy.so", "libggml.so.0.1", "llama-server"]
    assert (target / "build/bin/llama-server").stat().st_mode & 0o100
    assert (target / "build/bin/libggml.so.0").resolve() == (target / "build/bin/libggml.so.0.1").resolve()


@pytest.mark.parametrize("members,words", [
    ([("../evil", "file", b"x")], "leaves the install directory"),
    ([("/etc/evil", "file", b"x")], "leaves the install directory"),
    ([("bin/../../evil", "file", b"x")], "leaves the install directory"),
    ([("bin/link", "symlink", "/etc/passwd")], "outside the install directory"),
    ([("bin/link", "symlink", "../../etc")], "outside the install directory"),
    ([("bin/hard", "hardlink", "../../etc/passwd")], "outside the install directory"),
    ([("dev", "fifo", None)], "special file"),
    # a link that looks inside by name but, through an earlier link, leads out
    ([("a", "symlink", "."), ("a/b", "symlink", ".."), ("a/b/evil", "file", b"x")], "outside the install directory"),
    # a file written through a directory link pointing out of the tree
    ([("d", "symlink", "../.."), ("d/evil", "file", b"x")], "outside the install directory"),
])
def test_a_crafted_tar_is_refused_and_nothing_lands_outside(tmp_path, members, words):
    archive = make_tar(tmp_path / "bad.tar.gz", members)
    target = tmp_path / "deep" / "out"
    with pytest.raises(EngineError, match=words):
        unpack_archive(archive, target)
    assert not (tmp_path / "deep" / "evil").exists()
    assert not (tmp_path / "evil").exists()
    assert not any(p.name == "evil" for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("members", [
    [("../evil", "file", b"x")],
    [("bin/link", "symlink", "../../../etc/passwd")],
    [("bin/abs", "symlink", "/etc/passwd")],
])
def test_a_crafted_zip_is_refused(tmp_path, members):
    archive = make_zip(tmp_path / "bad.zip", members)
    with pytest.raises(EngineError, match="refusing to unpack bad.zip"):
        unpack_archive(archive, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_a_good_zip_unpacks_with_modes(tmp_path):
    archive = make_zip(tmp_path / "ok.zip", [("bin/llama-server", "file", b"x"), ("bin/lib.so", "symlink", "llama-server")])
    unpack_archive(archive, tmp_path / "out")
    assert (tmp_path / "out/bin/llama-server").stat().st_mode & 0o100
    assert (tmp_path / "out/bin/lib.so").is_symlink()


def test_a_file_that_is_no_archive_says_so(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(EngineError, match="neither a tar nor a zip"):
        unpack_archive(junk, tmp_path / "out")


@pytest.mark.parametrize("make", [make_tar, make_zip], ids=["tar", "zip"])
def test_chained_links_that_resolve_outside_are_refused_even_with_nothing_written_through_them(tmp_path, make):
    # `a -> .` is harmless and `a/b -> ..` looks inside by name (a/..), but through `a` it is `<root>/..`: a link
    # left pointing out of the install directory, with no later member to trip the final check.
    archive = make(tmp_path / ("chained.tar.gz" if make is make_tar else "chained.zip"),
                   [("a", "symlink", "."), ("a/b", "symlink", "..")])
    target = tmp_path / "deep" / "out"
    with pytest.raises(EngineError, match="'a/b' is a link to '..', which resolves outside the install directory"):
        unpack_archive(archive, target)
    root = target.resolve()
    assert all(Path(p).resolve().is_relative_to(root) for p in target.rglob("*"))
