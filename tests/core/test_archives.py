"""`llmgw.archives.extract_tar` refuses what tarfile's "data" filter refuses, on a Python with the filter and on
one without it (Debian bookworm's 3.11.2, the hosts' Python: `HAS_DATA_FILTER` False, the refusals made by hand),
and extracts a release-like tar the same on both."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from llmgw import archives


@pytest.fixture(params=[True, False], ids=["with the filter", "without it"])
def filter_present(request, monkeypatch):
    if request.param and not archives.HAS_DATA_FILTER:
        pytest.fail("this Python has no tarfile data filter: the suite runs on 3.11.4 or newer")
    monkeypatch.setattr(archives, "HAS_DATA_FILTER", request.param)
    return request.param


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


def _member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def test_a_release_like_tar_is_extracted_with_its_files_links_and_safe_modes(tmp_path: Path, filter_present):
    tar = _tar((_member("wheels", tarfile.DIRTYPE, 0o755), None),
               (_member("wheels/llmgw.whl", mode=0o4777), b"wheel"),
               (_member("manifest.json"), b"{}"),
               (_member("current", tarfile.SYMTYPE, link="manifest.json"), None))
    archives.extract_tar(tar, tmp_path)
    assert (tmp_path / "wheels" / "llmgw.whl").read_bytes() == b"wheel"
    assert (tmp_path / "current").is_symlink() and (tmp_path / "current").read_text() == "{}"
    mode = stat.S_IMODE((tmp_path / "wheels" / "llmgw.whl").stat().st_mode)
    assert not mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH), oct(mode)


def test_an_absolute_name_lands_inside_the_directory(tmp_path: Path, filter_present):
    archives.extract_tar(_tar((_member("/etc/escaped"), b"x")), tmp_path / "target")
    assert (tmp_path / "target" / "etc" / "escaped").read_bytes() == b"x"


def test_only_the_members_asked_for_are_extracted(tmp_path: Path, filter_present):
    tar = _tar((_member("settings/llmgw.yaml"), b"name: x\n"), (_member("ca/ca.key"), b"secret"))
    archives.extract_tar(tar, tmp_path, [m for m in tar.getmembers() if m.name.startswith("settings/")])
    assert (tmp_path / "settings" / "llmgw.yaml").is_file() and not (tmp_path / "ca").exists()


@pytest.mark.parametrize("member", [
    _member("../escaped"),
    _member("link", tarfile.SYMTYPE, link="/etc/passwd"),
    _member("link", tarfile.SYMTYPE, link="../../outside"),
    _member("hard", tarfile.LNKTYPE, link="../outside"),
    _member("device", tarfile.CHRTYPE),
    _member("fifo", tarfile.FIFOTYPE),
], ids=["parent", "absolute link", "link out", "hard link out", "device", "fifo"])
def test_a_member_that_would_leave_the_directory_or_make_a_device_is_refused(tmp_path: Path, filter_present, member):
    target = tmp_path / "target"
    target.mkdir()
    data = b"x" if member.isreg() else None
    with pytest.raises(tarfile.TarError):
        archives.extract_tar(_tar((member, data)), target)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "outside").exists()
