"""Our keys and signatures against the real minisign (Debian's minisign 0.11, `make system-packages`), both ways:
`minisign -V` accepts what llmgw signs (prehashed and legacy) and refuses it once the file changes; llmgw accepts
what `minisign -S` signs; minisign opens our encrypted secret keys (so our scrypt parameters are libsodium's, both
of its branches) and llmgw signs with a secret key minisign made. Fails, never skips, without minisign. About 1 s."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw.errors import ReleaseError
from llmgw.release import keygen, read_public_key, read_secret_key, sign, verify

PASSPHRASE = "correct horse battery staple"


@pytest.fixture(scope="module")
def minisign() -> str:
    found = shutil.which("minisign")
    assert found, "minisign is missing: run `make system-packages` (Debian package minisign)"
    return found


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("prehashed", [True, False], ids=["ED", "legacy Ed"])
def test_minisign_verifies_what_llmgw_signs_and_refuses_it_once_changed(minisign, tmp_path: Path, prehashed) -> None:
    secret, public = keygen(tmp_path / "keys")
    data = tmp_path / "manifest.json"
    data.write_text('{"version": "0.1.0"}\n')
    Path(f"{data}.minisig").write_text(sign(data.read_bytes(), read_secret_key(secret), "timestamp:1\tfile:x",
                                            prehashed=prehashed))
    checked = run(minisign, "-Vm", str(data), "-p", str(public))
    assert checked.returncode == 0, checked.stderr
    assert "Signature and comment signature verified" in checked.stdout
    assert "Trusted comment: timestamp:1\tfile:x" in checked.stdout
    by_line = run(minisign, "-Vm", str(data), "-P", read_public_key(public).line)
    assert by_line.returncode == 0, by_line.stderr
    data.write_text('{"version": "0.1.1"}\n')
    assert run(minisign, "-Vm", str(data), "-p", str(public)).returncode == 1


@pytest.mark.parametrize(("opslimit", "memlimit"), [(524288, 16777216), (65536, 16777216)],
                         ids=["N from memory", "N from time"])
def test_minisign_opens_our_encrypted_secret_key_and_llmgw_verifies_what_minisign_signs(
        minisign, tmp_path: Path, opslimit: int, memlimit: int) -> None:
    secret, public = keygen(tmp_path / "keys", PASSPHRASE, opslimit=opslimit, memlimit=memlimit)
    data = tmp_path / "release.txt"
    data.write_bytes(b"wheels\n" * 1000)
    signed = run(minisign, "-S", "-s", str(secret), "-m", str(data), "-t", "made by minisign", stdin=PASSPHRASE + "\n")
    assert signed.returncode == 0, signed.stderr
    text = Path(f"{data}.minisig").read_text()
    signature = verify(data.read_bytes(), text, [read_public_key(public)])
    assert (signature.trusted_comment, signature.prehashed) == ("made by minisign", True)
    wrong = run(minisign, "-S", "-s", str(secret), "-m", str(data), "-x", str(tmp_path / "x.sig"),
                stdin="not the passphrase\n")
    assert wrong.returncode != 0 and "Wrong password for that key" in wrong.stderr


def test_llmgw_signs_with_a_key_minisign_made_and_refuses_minisigns_signature_by_another_key(
        minisign, tmp_path: Path) -> None:
    made = run(minisign, "-G", "-W", "-p", str(tmp_path / "m.pub"), "-s", str(tmp_path / "m.key"))
    assert made.returncode == 0, made.stderr
    data = tmp_path / "data"
    data.write_bytes(bytes(range(256)))
    key = read_secret_key(tmp_path / "m.key")
    assert key.public_key() == read_public_key(tmp_path / "m.pub")
    Path(f"{data}.minisig").write_text(sign(data.read_bytes(), key, "signed by llmgw"))
    assert run(minisign, "-Vm", str(data), "-p", str(tmp_path / "m.pub")).returncode == 0
    legacy = run(minisign, "-S", "-l", "-s", str(tmp_path / "m.key"), "-m", str(data), "-x", str(tmp_path / "l.sig"))
    assert legacy.returncode == 0, legacy.stderr
    assert verify(data.read_bytes(), (tmp_path / "l.sig").read_text(), [key.public_key()]).prehashed is False
    _, other = keygen(tmp_path / "other")
    with pytest.raises(ReleaseError, match=f"made by key {key.id_text}, which is not trusted"):
        verify(data.read_bytes(), (tmp_path / "l.sig").read_text(), [read_public_key(other)])
