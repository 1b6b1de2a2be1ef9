"""Signing keys in minisign's formats: Ed25519 key pairs, their key ids, the public and secret key files.

A public key file is two lines: `untrusted comment: minisign public key <KEY ID>` and the base64 of 42 bytes,
"Ed" + the key id (8 bytes) + the Ed25519 public key (32 bytes). The key line alone ("RWQ...", 56 characters) is
what `minisign -P` and the settings key `releases.trusted_keys` take. The key id is shown as minisign shows it: the
8 bytes read as a little-endian integer, in 16 upper-case hex digits.

A secret key file is two lines: an untrusted comment and the base64 of 158 bytes: "Ed", the KDF ("Sc" scrypt, or
two zero bytes: not encrypted), "B2" (the checksum's algorithm), the KDF's salt (32 bytes), its opslimit and
memlimit (8 bytes each, little-endian), then 104 bytes: the key id (8), libsodium's secret key (the 32-byte seed
then the 32-byte public key) and a BLAKE2b-256 checksum of "Ed" + key id + secret key (32). Encrypted, those 104
bytes are XORed with as many bytes of scrypt(passphrase, salt), its N, r and p chosen from opslimit and memlimit
as libsodium's `crypto_pwhash_scryptsalsa208sha256` chooses them (`_scrypt_parameters`).

Format: minisign 0.11's src/minisign.h and src/minisign.c (https://github.com/jedisct1/minisign); checked against
the real `minisign` binary in tests/release/test_minisign_interop.py. Pure but for `keygen`, `read_secret_key` and
`read_public_key`, which read and write the key files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from llmgw.errors import ReleaseError

SIGNATURE_ALGORITHM = b"Ed"
KDF_SCRYPT = b"Sc"
KDF_NONE = b"\0\0"
CHECKSUM_ALGORITHM = b"B2"
COMMENT_PREFIX = "untrusted comment: "
PUBLIC_KEY_BYTES = 42
SECRET_KEY_BYTES = 158
PASSPHRASE_ENV = "LLMGW_RELEASE_PASSPHRASE"
"""The environment variable `llmgw release keygen|build` read a secret key's passphrase from."""

# minisign's own work factor (libsodium's ..._OPSLIMIT_SENSITIVE / _MEMLIMIT_SENSITIVE): scrypt with N = 2^20,
# r = 8, p = 1, 1 GiB of memory and about 3 s here, for each signature.
OPSLIMIT_SENSITIVE = 33554432
MEMLIMIT_SENSITIVE = 1073741824
# The cheap one (libsodium's _INTERACTIVE: N = 2^14, 16 MiB, about 50 ms), for tests.
OPSLIMIT_INTERACTIVE = 524288
MEMLIMIT_INTERACTIVE = 16777216

SECRET_KEY_FILE = "llmgw-release.key"
PUBLIC_KEY_FILE = "llmgw-release.pub"


def format_key_id(key_id: bytes) -> str:
    """The 8 bytes of a key id as minisign prints them: little-endian, 16 upper-case hex digits."""
    return key_id[::-1].hex().upper()


@dataclass(frozen=True)
class _Identified:
    key_id: bytes

    @property
    def id_text(self) -> str:
        """The key id as minisign prints it ("B1A4C5D2E3F40516")."""
        return format_key_id(self.key_id)


@dataclass(frozen=True)
class PublicKey(_Identified):
    """A minisign public key: `key_id` (8 bytes) and the raw Ed25519 public key (32 bytes)."""

    raw: bytes

    @property
    def line(self) -> str:
        """The key line of the public key file ("RWQ..."), as `minisign -P` and releases.trusted_keys take it."""
        return base64.b64encode(SIGNATURE_ALGORITHM + self.key_id + self.raw).decode()

    def file_text(self) -> str:
        """The public key file minisign writes: comment line and key line."""
        return f"{COMMENT_PREFIX}minisign public key {self.id_text}\n{self.line}\n"

    def verifier(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.raw)


@dataclass(frozen=True)
class SecretKey(_Identified):
    """A decrypted minisign secret key: `key_id` (8 bytes) and the Ed25519 seed (32 bytes)."""

    seed: bytes

    def signer(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)

    def public_key(self) -> PublicKey:
        raw = self.signer().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return PublicKey(self.key_id, raw)


def _base64_line(text: str, size: int, what: str) -> bytes:
    """The one base64 line of `text` (a key line alone, or a file whose other lines are comments) as `size` bytes."""
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and not line.startswith(COMMENT_PREFIX)]
    if len(lines) != 1:
        raise ReleaseError(f"{what}: expected one base64 line (after an optional '{COMMENT_PREFIX.strip()}' line), "
                           f"found {len(lines)}")
    return decode_base64(lines[0], size, what)


def decode_base64(line: str, size: int, what: str) -> bytes:
    """`line` decoded from base64, which must give `size` bytes. Raises: ReleaseError naming `what` otherwise."""
    try:
        data = base64.b64decode(line.strip(), validate=True)
    except binascii.Error as exc:
        raise ReleaseError(f"{what}: not base64 ({exc})") from exc
    if len(data) != size:
        raise ReleaseError(f"{what}: {len(data)} bytes where minisign's format has {size}")
    return data


def parse_public_key(text: str, what: str = "public key") -> PublicKey:
    """A minisign public key from its key line ("RWQ...") or its whole file (comment line and key line).

    Raises: ReleaseError naming `what` when it is not one (not base64, wrong size, not an Ed25519 key).
    """
    data = _base64_line(text, PUBLIC_KEY_BYTES, what)
    if data[:2] != SIGNATURE_ALGORITHM:
        raise ReleaseError(f"{what}: algorithm {data[:2]!r} where minisign's keys have {SIGNATURE_ALGORITHM!r}")
    return PublicKey(data[2:10], data[10:])


def _scrypt_parameters(opslimit: int, memlimit: int) -> tuple[int, int, int]:
    """(N, r, p) for scrypt from libsodium's opslimit and memlimit, as its pickparams() chooses them
    (libsodium src/libsodium/crypto_pwhash/scryptsalsa208sha256/pwhash_scryptsalsa208sha256.c)."""
    opslimit = max(opslimit, 32768)
    r = 8
    by_time = opslimit < memlimit // 32
    max_n = opslimit // (r * 4) if by_time else memlimit // (r * 128)
    n_log2 = 1
    while n_log2 < 63 and (1 << n_log2) <= max_n // 2:
        n_log2 += 1
    if by_time:
        return 1 << n_log2, r, 1
    max_rp = min((opslimit // 4) // (1 << n_log2), 0x3FFFFFFF)
    return 1 << n_log2, r, max(max_rp // r, 1)


def _keystream(passphrase: str, salt: bytes, opslimit: int, memlimit: int, size: int) -> bytes:
    n, r, p = _scrypt_parameters(opslimit, memlimit)
    needed = 128 * r * (n + p + 2) + (32 << 20)  # scrypt's V and B arrays, and room for OpenSSL's own
    return hashlib.scrypt(passphrase.encode(), salt=salt, n=n, r=r, p=p, maxmem=min(needed, 2**31 - 1), dklen=size)


def _checksum(key_id: bytes, secret: bytes) -> bytes:
    return hashlib.blake2b(SIGNATURE_ALGORITHM + key_id + secret, digest_size=32).digest()


def _xor(data: bytes, stream: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(data, stream, strict=True))


def secret_key_text(key: SecretKey, passphrase: str | None, *, opslimit: int = OPSLIMIT_SENSITIVE,
                    memlimit: int = MEMLIMIT_SENSITIVE) -> str:
    """The secret key file of `key`: encrypted with `passphrase` (scrypt at `opslimit`/`memlimit`), or not (None)."""
    secret = key.seed + key.public_key().raw
    body = key.key_id + secret + _checksum(key.key_id, secret)
    salt = secrets.token_bytes(32)
    if passphrase is not None:
        body = _xor(body, _keystream(passphrase, salt, opslimit, memlimit, len(body)))
    data = (SIGNATURE_ALGORITHM + (KDF_NONE if passphrase is None else KDF_SCRYPT) + CHECKSUM_ALGORITHM + salt
            + struct.pack("<QQ", opslimit, memlimit) + body)
    comment = "minisign encrypted secret key" if passphrase is not None else "minisign secret key (not encrypted)"
    return f"{COMMENT_PREFIX}{comment}\n{base64.b64encode(data).decode()}\n"


def parse_secret_key(text: str, passphrase: str | None, what: str = "secret key") -> SecretKey:
    """A minisign secret key from its file's text, decrypted with `passphrase` when it is encrypted.

    Raises: ReleaseError naming `what`: not a minisign secret key, encrypted and no passphrase given, or a
    checksum that fails (a wrong passphrase, or a damaged file). Encrypted keys cost one scrypt (minisign's own:
    about 1 GiB and 3 s).
    """
    data = _base64_line(text, SECRET_KEY_BYTES, what)
    algorithm, kdf, checksum_algorithm, salt = data[:2], data[2:4], data[4:6], data[6:38]
    opslimit, memlimit = struct.unpack("<QQ", data[38:54])
    body = data[54:]
    if algorithm != SIGNATURE_ALGORITHM or checksum_algorithm != CHECKSUM_ALGORITHM or kdf not in (KDF_NONE, KDF_SCRYPT):
        raise ReleaseError(f"{what}: not a minisign Ed25519 secret key (algorithms {algorithm!r}, {kdf!r}, "
                           f"{checksum_algorithm!r})")
    if kdf == KDF_SCRYPT:
        if passphrase is None:
            raise ReleaseError(f"{what} is encrypted: set {PASSPHRASE_ENV} to its passphrase")
        if memlimit > 4 * MEMLIMIT_SENSITIVE:
            raise ReleaseError(f"{what}: its scrypt wants {memlimit} bytes of memory, more than 4 GiB")
        body = _xor(body, _keystream(passphrase, salt, opslimit, memlimit, len(body)))
    key_id, secret, checksum = body[:8], body[8:72], body[72:]
    # `minisign -G -W` (0.11) leaves the checksum of a key it does not encrypt zero; the public half still checks it.
    if (kdf == KDF_SCRYPT or checksum != bytes(32)) and _checksum(key_id, secret) != checksum:
        raise ReleaseError(f"{what}: checksum fails: " + ("wrong passphrase (or a damaged file)"
                                                          if kdf == KDF_SCRYPT else "the file is damaged"))
    key = SecretKey(key_id, secret[:32])
    if key.public_key().raw != secret[32:]:
        raise ReleaseError(f"{what}: its public half does not belong to its seed (a damaged file)")
    return key


def new_secret_key() -> SecretKey:
    """A fresh key pair with a random key id."""
    return SecretKey(secrets.token_bytes(8), secrets.token_bytes(32))


def keygen(directory: Path | str, passphrase: str | None = None, *, opslimit: int = OPSLIMIT_SENSITIVE,
           memlimit: int = MEMLIMIT_SENSITIVE) -> tuple[Path, Path]:
    """Make a signing key pair in `directory` (made if missing): SECRET_KEY_FILE (mode 0600; encrypted with
    `passphrase`, or not when None) and PUBLIC_KEY_FILE, both in minisign's formats (`minisign -S -s` and
    `minisign -V -p` read them). Returns (secret key path, public key path).

    Raises: ReleaseError when either file exists already (a key is never overwritten).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    secret_path, public_path = directory / SECRET_KEY_FILE, directory / PUBLIC_KEY_FILE
    for path in (secret_path, public_path):
        if path.exists():
            raise ReleaseError(f"{path} exists already: a signing key is never overwritten (choose another "
                               "directory, or remove it yourself if it is no longer trusted anywhere)")
    key = new_secret_key()
    text = secret_key_text(key, passphrase, opslimit=opslimit, memlimit=memlimit)
    descriptor = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    public_path.write_text(key.public_key().file_text())
    return secret_path, public_path


def read_secret_key(path: Path | str, passphrase: str | None = None) -> SecretKey:
    """The secret key in file `path` (see parse_secret_key). Raises: ReleaseError naming the file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"cannot read the secret key {path}: {exc}") from exc
    return parse_secret_key(text, passphrase, what=f"secret key {path}")


def read_public_key(path: Path | str) -> PublicKey:
    """The public key in file `path`. Raises: ReleaseError naming the file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"cannot read the public key {path}: {exc}") from exc
    return parse_public_key(text, what=f"public key {path}")
