"""Which release a node runs (llmgw.release.installed): the record `llmgw node add` keeps in the venv, as `llmgw node
doctor` reads it (its "release" check). Real keys and signatures; the record is written here as node add writes it."""

from __future__ import annotations

import pytest

from llmgw import __version__
from llmgw.agent.doctor import release_checks
from llmgw.agent.doctor_health import FAIL, OK
from llmgw.errors import ReleaseError
from llmgw.release import (
    MANIFEST, PUBLIC_KEY_FILE, RECORD_DIR, SIGNATURE, InstalledRelease, Manifest, installed_release, keygen,
    read_secret_key, sign,
)


def record(prefix, version: str = __version__, *, other_key: bool = False):
    """A venv `prefix` with the release record of llmgw `version`; returns the id of the key that signed it."""
    secret = read_secret_key(keygen(prefix.parent / f"key-{prefix.name}")[0])
    manifest = Manifest(name="llmgw", version=version, created="2026-12-04T00:00:00Z", python="3.11",
                        platform="manylinux_2_17_x86_64", files=())
    directory = prefix / RECORD_DIR
    directory.mkdir(parents=True)
    (directory / MANIFEST).write_text(manifest.to_json())
    (directory / SIGNATURE).write_text(sign(manifest.to_json().encode(), secret, "llmgw release"))
    public = read_secret_key(keygen(prefix.parent / f"other-{prefix.name}")[0]) if other_key else secret
    (directory / PUBLIC_KEY_FILE).write_text(public.public_key().file_text())
    return secret.id_text


def test_a_venv_without_a_record_was_not_installed_from_a_release_and_doctor_says_nothing(tmp_path) -> None:
    assert installed_release(tmp_path) is None
    assert release_checks(tmp_path) == []


def test_the_record_names_the_key_that_signed_the_release_and_doctor_says_it(tmp_path) -> None:
    key_id = record(tmp_path / "venv")
    assert installed_release(tmp_path / "venv") == InstalledRelease(__version__, key_id)
    (check,) = release_checks(tmp_path / "venv")
    assert (check.name, check.status, check.detail) == (
        "release", OK, f"llmgw {__version__}, from a release signed by key {key_id}")


def test_a_changed_manifest_or_another_key_fails_doctor(tmp_path) -> None:
    record(tmp_path / "changed")
    manifest = tmp_path / "changed" / RECORD_DIR / MANIFEST
    manifest.write_text(manifest.read_text().replace("3.11", "3.12"))
    with pytest.raises(ReleaseError):
        installed_release(tmp_path / "changed")
    (check,) = release_checks(tmp_path / "changed")
    assert check.status == FAIL and check.detail.endswith(": this is not the release that was installed; install it "
                                                          "again")
    record(tmp_path / "other", other_key=True)
    (check,) = release_checks(tmp_path / "other")
    assert check.status == FAIL


def test_a_record_of_another_version_than_this_llmgw_fails_doctor(tmp_path) -> None:
    record(tmp_path / "venv", version="0.0.1")
    (check,) = release_checks(tmp_path / "venv")
    assert check.status == FAIL and check.detail.startswith(f"the release record says llmgw 0.0.1, this is "
                                                            f"{__version__}")
