"""A release's manifest: every file of the release with its sha256 and size, signed in minisign's format.

A release directory holds `manifest.json`, `manifest.json.minisig` (its signature) and the files the manifest
lists (`wheels/*.whl`). manifest.json:

    {"format": 1, "name": "llmgw", "version": "0.1.0", "created": "2026-12-04T20:00:00Z",
     "python": "3.11", "platform": "manylinux_2_28_x86_64",
     "source": {"commit": "<40 hex>" or null, "dirty": false},
     "files": [{"path": "wheels/llmgw-0.1.0-py3-none-any.whl", "sha256": "<64 hex>", "size": 1027015}, ...]}

`verify_release` trusts nothing in the directory before the signature checks: the signature first (against the
trusted keys), then the manifest's shape, then every file's size and digest, then that no file is there that the
manifest does not list (a wheel slipped in beside the signed ones would be installed by `pip --find-links`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from llmgw.errors import ReleaseError
from llmgw.release.keys import PublicKey, SecretKey, parse_public_key
from llmgw.release.signatures import sign, signature_key_id, verify

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.minisig"
FORMAT = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ReleaseFile:
    """One file of a release: `path` relative to the release directory (POSIX, no `..`), its sha256 (hex) and
    size in bytes."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """A release's verified manifest. `key_id`: the key that signed it (minisign's 16 hex digits; "" for a manifest
    not verified); `source_commit`: the git commit it was built from (None: not from a git checkout), `dirty`: the
    checkout had changes not committed."""

    name: str
    version: str
    created: str
    python: str
    platform: str
    files: tuple[ReleaseFile, ...]
    source_commit: str | None = None
    dirty: bool = False
    key_id: str = ""
    trusted_comment: str = ""

    @property
    def llmgw_wheel(self) -> str:
        """The path of llmgw's own wheel in the release ("wheels/llmgw-0.1.0-py3-none-any.whl")."""
        prefix = f"wheels/{self.name}-{self.version}-"
        return next(f.path for f in self.files if f.path.startswith(prefix) and f.path.endswith(".whl"))

    def to_json(self) -> str:
        document = {
            "format": FORMAT, "name": self.name, "version": self.version, "created": self.created,
            "python": self.python, "platform": self.platform,
            "source": {"commit": self.source_commit, "dirty": self.dirty},
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
        }
        return json.dumps(document, indent=2) + "\n"


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at `path` (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def release_files(directory: Path) -> list[str]:
    """Every file under `directory` but the manifest and its signature, as sorted POSIX paths relative to it.

    Raises: ReleaseError for anything that is not a plain file or directory (a symbolic link could point out of
    the release).
    """
    found = []
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root, name)
            rel = path.relative_to(directory).as_posix()
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise ReleaseError(f"{rel} in the release {directory} is a link or special file: a release holds "
                                   "plain files only", paths=(rel,))
        found += [Path(root, name).relative_to(directory).as_posix() for name in files]
    return sorted(rel for rel in found if rel not in (MANIFEST, SIGNATURE))


def describe(directory: Path, paths: Iterable[str]) -> tuple[ReleaseFile, ...]:
    """ReleaseFile entries (digest and size read now) for `paths` under `directory`, in the order given."""
    return tuple(ReleaseFile(rel, file_sha256(directory / rel), (directory / rel).stat().st_size) for rel in paths)


def write_signed_manifest(directory: Path, manifest: Manifest, key: SecretKey, trusted_comment: str) -> None:
    """Write `manifest` to directory/manifest.json and its signature by `key` to manifest.json.minisig."""
    text = manifest.to_json().encode()
    (directory / MANIFEST).write_bytes(text)
    (directory / SIGNATURE).write_text(sign(text, key, trusted_comment))


def _field(document: dict[str, Any], key: str, kind: type) -> Any:
    value = document.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise ReleaseError(f"{MANIFEST}: field {key!r} is missing or not a {kind.__name__}")
    return value


def parse_manifest(text: bytes) -> Manifest:
    """The Manifest in manifest.json's bytes (already verified: this checks its shape, not its origin).

    Raises: ReleaseError naming the field that is missing or wrong, or a path that leaves the release.
    """
    try:
        document = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReleaseError(f"{MANIFEST} is not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ReleaseError(f"{MANIFEST}: not a release manifest of format {FORMAT}: this llmgw cannot read it")
    files = []
    for entry in _field(document, "files", list):
        if not isinstance(entry, dict):
            raise ReleaseError(f"{MANIFEST}: an entry of 'files' is not an object")
        path, digest, size = _field(entry, "path", str), _field(entry, "sha256", str), _field(entry, "size", int)
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or path in (MANIFEST, SIGNATURE) or str(pure) != path:
            raise ReleaseError(f"{MANIFEST}: file path {path!r} is not a plain path inside the release", paths=(path,))
        if not _SHA256.match(digest) or size < 0:
            raise ReleaseError(f"{MANIFEST}: {path}: sha256 or size is malformed", paths=(path,))
        files.append(ReleaseFile(path, digest, size))
    source = document.get("source") or {}
    return Manifest(name=_field(document, "name", str), version=_field(document, "version", str),
                    created=_field(document, "created", str), python=_field(document, "python", str),
                    platform=_field(document, "platform", str), files=tuple(files),
                    source_commit=source.get("commit"), dirty=bool(source.get("dirty", False)))


def trusted_public_keys(trusted_keys: Sequence[str | PublicKey]) -> list[PublicKey]:
    """PublicKeys of `trusted_keys`: key lines ("RWQ..."), whole public key files' texts or PublicKeys.
    Raises: ReleaseError naming the entry (its index) that is not a minisign public key."""
    return [key if isinstance(key, PublicKey) else parse_public_key(key, what=f"trusted key {index + 1}")
            for index, key in enumerate(trusted_keys)]


def verify_release(directory: Path | str, trusted_keys: Sequence[str | PublicKey], *,
                   checked: Callable[[ReleaseFile], None] | None = None) -> Manifest:
    """Verify the release in `directory` against `trusted_keys` (see trusted_public_keys) and return its manifest,
    with `key_id` the key that signed it. `checked` is called with each listed file once it was read (a progress
    bar's step); an offline bundle (`llmgw.release.bundle`) is verified the same way.

    Raises: ReleaseError saying what failed, first of: no manifest or signature; a signature by a key not trusted
    (`key_id` set); a signature that does not match the manifest; a malformed manifest; then every file that is
    missing, of another size or digest, or present but not listed (all of them in one error, `paths` set).
    Reads every file once: about 0.1 s for 35 MB here.
    """
    directory = Path(directory)
    if not (directory / MANIFEST).is_file() or not (directory / SIGNATURE).is_file():
        raise ReleaseError(f"{directory} is not a release: it needs {MANIFEST} and {SIGNATURE} (made by `llmgw "
                           "release build`)")
    keys = trusted_public_keys(trusted_keys)
    text = (directory / MANIFEST).read_bytes()
    signature_text = (directory / SIGNATURE).read_text(errors="replace")
    if not keys:
        raise ReleaseError(f"no trusted key to verify {directory} with (it is signed by key "
                           f"{signature_key_id(signature_text, SIGNATURE)}): list the release signers' public keys "
                           "in releases.trusted_keys of llmgw.yaml, or pass --trusted-key")
    signature = verify(text, signature_text, keys, what=f"{directory / SIGNATURE}")
    manifest = parse_manifest(text)
    problems, paths = [], []
    listed = {f.path for f in manifest.files}
    for entry in manifest.files:
        path = directory / entry.path
        if not path.is_file() or path.is_symlink():
            problems.append(f"{entry.path} is missing")
        elif (size := path.stat().st_size) != entry.size:
            problems.append(f"{entry.path} holds {size} bytes, the manifest says {entry.size}")
        elif (digest := file_sha256(path)) != entry.sha256:
            problems.append(f"{entry.path} has sha256 {digest}, the manifest says {entry.sha256}")
        else:
            if checked is not None:
                checked(entry)
            continue
        paths.append(entry.path)
    for rel in release_files(directory):
        if rel not in listed:
            problems.append(f"{rel} is not in the manifest")
            paths.append(rel)
    if problems:
        raise ReleaseError(f"the release {directory} (signed by key {signature.key_id}) does not match its signed "
                           "manifest: " + "; ".join(problems) + ". Do not install it: build it again or copy it "
                           "again from its source", paths=tuple(paths), key_id=signature.key_id)
    return replace(manifest, key_id=signature.key_id, trusted_comment=signature.trusted_comment)
