"""Signatures in minisign's format: sign bytes with a SecretKey, verify them against trusted public keys.

A signature file is four lines: `untrusted comment: ...`; the base64 of 74 bytes, the algorithm ("ED": the
Ed25519 signature is over the BLAKE2b-512 digest of the data, minisign's default since 0.10; "Ed": over the data
itself, the legacy form), the key id (8 bytes) and the signature (64); `trusted comment: <text>`; and the base64 of
the global signature (64 bytes): Ed25519 over the signature's 64 bytes followed by the trusted comment's text, so
the trusted comment cannot be changed either. We write "ED" and read both.

Format: minisign 0.11's src/minisign.c (sign() and verify()); `minisign -Vm FILE -P KEY` accepts what `sign`
writes and `verify` accepts what `minisign -S` writes (tests/release/test_minisign_interop.py). Pure.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature

from llmgw.errors import ReleaseError
from llmgw.release.keys import COMMENT_PREFIX, PublicKey, SecretKey, decode_base64, format_key_id

PREHASHED = b"ED"
LEGACY = b"Ed"
TRUSTED_PREFIX = "trusted comment: "


@dataclass(frozen=True)
class Signature:
    """A verified signature: the key that made it (`key_id`, minisign's 16 hex digits), its trusted comment and
    whether the data was prehashed ("ED") or signed whole ("Ed")."""

    key_id: str
    trusted_comment: str
    prehashed: bool


def _message(data: bytes, prehashed: bool) -> bytes:
    return hashlib.blake2b(data, digest_size=64).digest() if prehashed else data


def sign(data: bytes, key: SecretKey, trusted_comment: str, *, prehashed: bool = True,
         untrusted_comment: str | None = None) -> str:
    """The signature file's text for `data`, signed with `key` (Ed25519), carrying `trusted_comment` (one line).

    Raises: ReleaseError when a comment holds a line break (the format has one line for each).
    """
    untrusted_comment = untrusted_comment or f"signature from llmgw release key {key.id_text}"
    if any(c in text for text in (trusted_comment, untrusted_comment) for c in "\r\n"):
        raise ReleaseError("a signature's comments are one line each: remove the line break")
    signer = key.signer()
    algorithm = PREHASHED if prehashed else LEGACY
    signature = signer.sign(_message(data, prehashed))
    global_signature = signer.sign(signature + trusted_comment.encode())
    return (f"{COMMENT_PREFIX}{untrusted_comment}\n"
            f"{base64.b64encode(algorithm + key.key_id + signature).decode()}\n"
            f"{TRUSTED_PREFIX}{trusted_comment}\n"
            f"{base64.b64encode(global_signature).decode()}\n")


def signature_key_id(signature_text: str, what: str = "signature") -> str:
    """The id of the key that claims to have made a signature (16 hex digits), read without verifying anything.

    Raises: ReleaseError naming `what` when the text is not a minisign signature.
    """
    lines = signature_text.splitlines()
    if len(lines) < 2 or not lines[0].startswith(COMMENT_PREFIX):
        raise ReleaseError(f"{what} is not a minisign signature (its first line is not '{COMMENT_PREFIX.strip()}')")
    return format_key_id(decode_base64(lines[1], 74, f"{what}'s second line")[2:10])


def verify(data: bytes, signature_text: str, trusted: Iterable[PublicKey], what: str = "signature") -> Signature:
    """Check that `signature_text` (a minisign signature file) signs `data` with one of the `trusted` keys.

    Returns the Signature (its key id, its verified trusted comment).
    Raises: ReleaseError naming `what` and saying what failed: not a minisign signature; made by a key that is not
    trusted (`key_id` set: its id, and the trusted ids listed); a signature that does not match the data (changed
    data, or a forged signature); a trusted comment that was changed.
    """
    lines = signature_text.splitlines()
    if len(lines) != 4 or not lines[0].startswith(COMMENT_PREFIX) or not lines[2].startswith(TRUSTED_PREFIX):
        raise ReleaseError(f"{what} is not a minisign signature (four lines: untrusted comment, signature, trusted "
                           "comment, global signature)")
    body = decode_base64(lines[1], 74, f"{what}'s second line")
    algorithm, key_id, signature = body[:2], body[2:10], body[10:]
    if algorithm not in (PREHASHED, LEGACY):
        raise ReleaseError(f"{what}: algorithm {algorithm!r} is neither minisign's 'ED' nor its legacy 'Ed'")
    keys = {key.key_id: key for key in trusted}
    key = keys.get(key_id)
    if key is None:
        known = ", ".join(sorted(format_key_id(k) for k in keys)) or "none"
        raise ReleaseError(f"{what} was made by key {format_key_id(key_id)}, which is not trusted (trusted keys: "
                           f"{known}); add its public key to releases.trusted_keys only if you know who holds it",
                           key_id=format_key_id(key_id))
    verifier = key.verifier()
    try:
        verifier.verify(signature, _message(data, algorithm == PREHASHED))
    except InvalidSignature as exc:
        raise ReleaseError(f"{what}: the signature of key {key.id_text} does not match the signed file (the file "
                           "was changed after signing, or the signature is forged)", key_id=key.id_text) from exc
    trusted_comment = lines[2][len(TRUSTED_PREFIX):]
    global_signature = decode_base64(lines[3], 64, f"{what}'s fourth line")
    try:
        verifier.verify(global_signature, signature + trusted_comment.encode())
    except InvalidSignature as exc:
        raise ReleaseError(f"{what}: its trusted comment was changed after signing", key_id=key.id_text) from exc
    return Signature(key.id_text, trusted_comment, algorithm == PREHASHED)
