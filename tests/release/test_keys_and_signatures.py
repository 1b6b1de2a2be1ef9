"""Keys and signatures in minisign's formats (llmgw.release.keys, .signatures), with real cryptography: what is
signed verifies, and every change to the data, the trusted comment, the key or the passphrase is refused with a
message that says which. (The real minisign binary against them: test_minisign_interop.py.) About 1 s."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from llmgw.errors import ReleaseError
from llmgw.release import (
    MEMLIMIT_INTERACTIVE, OPSLIMIT_INTERACTIVE, keygen, parse_public_key, parse_secret_key, read_public_key,
    read_secret_key, sign, verify,
)
from llmgw.release.keys import new_secret_key, _scrypt_parameters, secret_key_text

CHEAP = {"opslimit": OPSLIMIT_INTERACTIVE, "memlimit": MEMLIMIT_INTERACTIVE}


@pytest.mark.parametrize(("opslimit", "memlimit", "expected"), [
    (33554432, 1073741824, (1 << 20, 8, 1)),  # libsodium's SENSITIVE: minisign's own keys
    (8388608, 268435456, (1 << 18, 8, 1)),  # MODERATE
    (524288, 16777216, (1 << 14, 8, 1)),  # INTERACTIVE
    (1 << 30, 16777216, (1 << 14, 8, 2048)),  # more time than memory: p grows
    (100000, 1 << 30, (1 << 11, 8, 1)),  # less time than memory allows: N from the time
])
def test_scrypt_parameters_are_libsodiums_choice(opslimit, memlimit, expected) -> None:
    assert _scrypt_parameters(opslimit, memlimit) == expected


@pytest.mark.parametrize("prehashed", [True, False], ids=["ED", "Ed"])
def test_a_signature_verifies_and_names_its_key_and_trusted_comment(prehashed: bool) -> None:
    key = new_secret_key()
    text = sign(b"release manifest", key, "timestamp:1\tfile:manifest.json", prehashed=prehashed)
    signature = verify(b"release manifest", text, [new_secret_key().public_key(), key.public_key()])
    assert (signature.key_id, signature.trusted_comment, signature.prehashed) == (
        key.id_text, "timestamp:1\tfile:manifest.json", prehashed)


def test_changed_data_changed_trusted_comment_and_unknown_key_are_each_refused_with_their_reason() -> None:
    key, other = new_secret_key(), new_secret_key()
    text = sign(b"data", key, "llmgw 0.1.0")
    with pytest.raises(ReleaseError, match="does not match the signed file") as changed:
        verify(b"dat4", text, [key.public_key()])
    assert changed.value.key_id == key.id_text
    lines = text.splitlines(keepends=True)
    forged = "".join(lines[:2] + ["trusted comment: llmgw 9.9.9\n"] + lines[3:])
    with pytest.raises(ReleaseError, match="trusted comment was changed"):
        verify(b"data", forged, [key.public_key()])
    with pytest.raises(ReleaseError, match=f"made by key {key.id_text}, which is not trusted "
                                           rf"\(trusted keys: {other.id_text}\)") as untrusted:
        verify(b"data", text, [other.public_key()])
    assert untrusted.value.key_id == key.id_text
    with pytest.raises(ReleaseError, match="not a minisign signature"):
        verify(b"data", "".join(lines[:2]), [key.public_key()])


def test_keygen_writes_a_private_secret_key_and_never_overwrites_one(tmp_path: Path) -> None:
    secret, public = keygen(tmp_path, "correct horse", **CHEAP)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert public.read_text().startswith("untrusted comment: minisign public key ")
    key = read_secret_key(secret, "correct horse")
    assert key.public_key() == read_public_key(public)
    assert public.read_text().split()[-2] == key.id_text  # the comment names the key id as minisign does
    with pytest.raises(ReleaseError, match="exists already: a signing key is never overwritten"):
        keygen(tmp_path)
    assert read_secret_key(secret, "correct horse") == key


def test_an_encrypted_secret_key_needs_its_passphrase(tmp_path: Path) -> None:
    key = new_secret_key()
    text = secret_key_text(key, "s3cret", **CHEAP)
    assert parse_secret_key(text, "s3cret") == key
    with pytest.raises(ReleaseError, match="is encrypted: set LLMGW_RELEASE_PASSPHRASE"):
        parse_secret_key(text, None)
    with pytest.raises(ReleaseError, match="checksum fails: wrong passphrase"):
        parse_secret_key(text, "secret")
    plain = secret_key_text(key, None)
    assert parse_secret_key(plain, "ignored") == key


@pytest.mark.parametrize(("text", "reason"), [
    ("RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO", "not base64"),
    ("RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GF==", "40 bytes where minisign's format has 42"),
    ("untrusted comment: x\n", "expected one base64 line"),
    ("AAAf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3", "algorithm b'\\\\x00\\\\x00'"),
])
def test_a_malformed_public_key_is_refused_saying_why(text: str, reason: str) -> None:
    with pytest.raises(ReleaseError, match=f"trusted key 1: .*{reason}"):
        parse_public_key(text, what="trusted key 1")


def test_a_public_key_reads_from_its_line_or_its_whole_file() -> None:
    key = new_secret_key().public_key()
    assert parse_public_key(key.line) == parse_public_key(key.file_text()) == key
