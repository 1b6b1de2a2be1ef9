"""Which release a node runs: the signed manifest `llmgw node add` keeps in the installed venv.

    /opt/llmgw/<version>/release/manifest.json, manifest.json.minisig, llmgw-release.pub

`node add` copies the release's manifest and signature there, with the trusted public key that verified it, so the
node itself can say which key signed what it runs (`llmgw node doctor`, and the agent's Register: `llmgw nodes`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from llmgw.errors import ReleaseError
from llmgw.release.keys import PUBLIC_KEY_FILE, read_public_key
from llmgw.release.manifest import MANIFEST, SIGNATURE, parse_manifest
from llmgw.release.signatures import verify

RECORD_DIR = "release"
"""The directory of the installed venv (sys.prefix) that holds the release's record."""


@dataclass(frozen=True)
class InstalledRelease:
    """The release this llmgw was installed from: its `version` and the id of the key that signed it (`key_id`,
    minisign's 16 hex digits), its signature checked against the key kept beside it."""

    version: str
    key_id: str


def installed_release(prefix: Path | str | None = None) -> InstalledRelease | None:
    """The release the venv `prefix` (default: this interpreter's, sys.prefix) was installed from, or None when it
    holds no release record (llmgw installed otherwise: pip, a checkout). Blocking (reads three small files).

    Raises: ReleaseError naming the file when the record is there but does not check (a changed manifest, a
    signature of another key, a file missing).
    """
    directory = Path(sys.prefix if prefix is None else prefix) / RECORD_DIR
    if not directory.is_dir():
        return None
    try:
        text = (directory / MANIFEST).read_bytes()
        signature_text = (directory / SIGNATURE).read_text(errors="replace")
    except OSError as exc:
        raise ReleaseError(f"the release record {directory} is incomplete: {exc}") from exc
    key = read_public_key(directory / PUBLIC_KEY_FILE)
    signature = verify(text, signature_text, [key], what=str(directory / SIGNATURE))
    return InstalledRelease(parse_manifest(text).version, signature.key_id)
