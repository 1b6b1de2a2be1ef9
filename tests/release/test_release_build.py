"""A release built from this checkout with real pip (llmgw.release.build_release) holds llmgw's wheel and every
wheel it needs, so pip installs llmgw from it with no index at all; its manifest is signed so that the real
`minisign -V` accepts it; and verify_release refuses it, naming the file or the key, once one byte of a wheel
changed, a wheel was added or removed, the manifest was edited, or the signer is not trusted. The CLI does the same
with exit 1 and a sentence. One full build per module, pip downloading the dependencies itself (this machine's Python
and glibc, about 35 MB), as `llmgw release build` does, but from a directory of them instead of an index: the
on-disk cache of support.releases, which build_release filled from the index once per machine (`dependency_wheels`;
other modules take the wheels from it as they are). pip resolves, picks the platform's wheels and downloads them all
the same; the index's round trips (26 s of 31 s for the build at a load of 6 here, 3 s of its 9 s of CPU) are left
out. The other tests copy it. About 12 s in all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llmgw.errors import ReleaseError
from llmgw.release import (
    MEMLIMIT_INTERACTIVE, OPSLIMIT_INTERACTIVE, build_release, keygen, read_public_key, verify_release,
)
from support.in_process_cli import run_llmgw
from support.releases import SignedRelease, build_signed_release, dependency_wheels

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> SignedRelease:
    """The module's release: pip downloads every dependency, as the CLI does, from the wheels cached on disk
    (`--find-links`, no index, no pip configuration of this machine's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIP_CONFIG_FILE", os.devnull)
        patch.setenv("PIP_NO_INDEX", "1")
        patch.setenv("PIP_FIND_LINKS", str(dependency_wheels()))
        return build_signed_release(tmp_path_factory.mktemp("built"), real_download=True)


@pytest.fixture
def release(built: SignedRelease, tmp_path: Path) -> Path:
    """A copy of the module's release, to change."""
    return Path(shutil.copytree(built.directory, tmp_path / "release"))


def test_the_release_holds_llmgw_and_its_dependencies_and_its_manifest_lists_every_file(built: SignedRelease) -> None:
    manifest = verify_release(built.directory, [built.trusted_key])
    assert manifest.key_id == built.key_id and manifest.version == "0.1.0"
    names = {Path(f.path).name.split("-")[0].lower() for f in manifest.files}
    assert {"llmgw", "trio", "grpcio", "cryptography", "pygit2", "psycopg_binary", "jsonschema_rs"} <= names
    on_disk = sorted(p.relative_to(built.directory).as_posix() for p in (built.directory / "wheels").iterdir())
    assert [f.path for f in manifest.files] == on_disk
    assert manifest.llmgw_wheel in on_disk
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).parent).stdout.strip()
    assert manifest.source_commit == commit
    print(f"full release built in {built.seconds:.1f} s: {len(manifest.files)} wheels, "
          f"{sum(f.size for f in manifest.files) / 1e6:.1f} MB")


def test_pip_installs_llmgw_from_the_release_alone_with_no_index(built: SignedRelease, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--no-index",
         "--find-links", str(built.directory / "wheels"), "--report", str(report), "llmgw"],
        capture_output=True, text=True, timeout=120,
        env={"PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert resolved.returncode == 0, resolved.stderr
    installed = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"llmgw", "trio", "grpcio", "quart-trio"} <= installed


def test_the_real_minisign_accepts_the_manifests_signature(built: SignedRelease) -> None:
    minisign = shutil.which("minisign")
    assert minisign, "minisign is missing: run `make system-packages` (Debian package minisign)"
    checked = subprocess.run([minisign, "-Vm", str(built.directory / "manifest.json"), "-P", built.trusted_key],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "llmgw 0.1.0 for python 3." in checked.stdout


def test_one_byte_changed_in_a_wheel_fails_naming_the_file(release: Path, built: SignedRelease) -> None:
    wheel = next((release / "wheels").glob("trio-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    rel = wheel.relative_to(release).as_posix()
    with pytest.raises(ReleaseError, match=rf"{rel} has sha256 [0-9a-f]{{64}}, the manifest says") as failed:
        verify_release(release, [built.trusted_key])
    assert failed.value.paths == (rel,)


def test_a_wheel_added_or_removed_fails_naming_it(release: Path, built: SignedRelease) -> None:
    removed = next((release / "wheels").glob("h11-*.whl"))
    removed.unlink()
    (release / "wheels" / "evil-1.0-py3-none-any.whl").write_bytes(b"PK\x05\x06" + bytes(18))
    with pytest.raises(ReleaseError) as failed:
        verify_release(release, [built.trusted_key])
    assert failed.value.paths == (f"wheels/{removed.name}", "wheels/evil-1.0-py3-none-any.whl")
    assert f"wheels/{removed.name} is missing" in str(failed.value)
    assert "wheels/evil-1.0-py3-none-any.whl is not in the manifest" in str(failed.value)


def test_an_edited_manifest_fails_its_signature(release: Path, built: SignedRelease) -> None:
    manifest = release / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"version": "0.1.0"', '"version": "0.1.1"'))
    with pytest.raises(ReleaseError, match=f"the signature of key {built.key_id} does not match the signed file"):
        verify_release(release, [built.trusted_key])


def test_a_manifest_signed_by_an_untrusted_key_fails_naming_the_key_id(built: SignedRelease, tmp_path: Path) -> None:
    _, other = keygen(tmp_path / "other")
    other_key = read_public_key(other)
    with pytest.raises(ReleaseError, match=f"made by key {built.key_id}, which is not trusted \\(trusted keys: "
                                           f"{other_key.id_text}\\)") as failed:
        verify_release(built.directory, [other_key.line])
    assert failed.value.key_id == built.key_id


def test_the_cli_builds_without_dependencies_and_verifies_against_the_settings_trusted_keys(tmp_path: Path) -> None:
    secret, public = keygen(tmp_path / "keys", "pass phrase", opslimit=OPSLIMIT_INTERACTIVE,
                            memlimit=MEMLIMIT_INTERACTIVE)
    out = tmp_path / "rel"
    code, stdout, stderr = run_llmgw(["release", "build", str(out), "--key", str(secret), "--no-deps", "--json"],
                                     env={"LLMGW_RELEASE_PASSPHRASE": "pass phrase"})
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert (summary["files"], summary["key_id"]) == (1, read_public_key(public).id_text)

    settings = Path(shutil.copytree(EXAMPLE, tmp_path / "settings"))
    code, _, stderr = run_llmgw(["release", "verify", str(out), "--settings", str(settings)])
    assert code == 1 and "llmgw.yaml lists no releases.trusted_keys" in stderr, stderr
    llmgw_yaml = settings / "llmgw.yaml"
    llmgw_yaml.write_text(llmgw_yaml.read_text() + f"releases:\n  trusted_keys:\n    - {read_public_key(public).line}\n")
    code, stdout, stderr = run_llmgw(["release", "verify", str(out), "--settings", str(settings)])
    assert code == 0, stderr
    assert f"signed by key {summary['key_id']}" in stdout

    wheel = next((out / "wheels").glob("llmgw-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    code, _, stderr = run_llmgw(["release", "verify", str(out), "--trusted-key", str(public)])
    assert code == 1
    assert f"wheels/{wheel.name} holds" in stderr and "Do not install it" in stderr
    assert "Traceback" not in stderr


def test_keygen_wants_a_passphrase_or_says_it_will_not_encrypt(tmp_path: Path) -> None:
    code, _, stderr = run_llmgw(["release", "keygen", str(tmp_path / "a")], env={"LLMGW_RELEASE_PASSPHRASE": ""})
    assert code == 1 and "set LLMGW_RELEASE_PASSPHRASE" in stderr and not (tmp_path / "a").exists()
    code, stdout, stderr = run_llmgw(["release", "keygen", str(tmp_path / "b"), "--unencrypted"])
    assert code == 0, stderr
    assert "NOT encrypted" in stdout and read_public_key(tmp_path / "b" / "llmgw-release.pub").line in stdout


def test_build_refuses_a_directory_in_use_and_a_python_too_old(built: SignedRelease, tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    with pytest.raises(ReleaseError, match="exists and is not an empty directory"):
        build_release(tmp_path / "used", built.secret_key, dependencies=False)
    with pytest.raises(ReleaseError, match="llmgw needs Python 3.11 or newer"):
        build_release(tmp_path / "new", built.secret_key, python="3.10", dependencies=False)
    assert not (tmp_path / "new").exists()
