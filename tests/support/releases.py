"""A signed release of this checkout, for tests that install llmgw the way nodes do (`llmgw.release`).

`build_signed_release(root)` makes a key pair (not encrypted) in root/keys and a release in root/release: llmgw's
wheel from this checkout and, with `dependencies`, every dependency wheel for this machine's Python and glibc
(from pip's cache when it has them: 7.5 s here, 35 MB; 1.5 s without them). Tests that need one share it
(a session or module fixture) and copy it before changing it.

`shared_signed_release(base)` is the one every test of a run shares (the session fixtures `full_release` and
`bare_release` of tests/conftest.py): built once under a file lock in `base`, a directory every xdist worker sees,
and named by the checkout's commit and a digest of what goes into the wheel, so a later run of the same checkout
reuses it and a changed one builds anew (the older builds of that kind are removed then).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from llmgw.release import build_release, keygen, read_public_key


@dataclass(frozen=True)
class SignedRelease:
    directory: Path
    secret_key: Path
    public_key: Path
    trusted_key: str  # the key line, as releases.trusted_keys takes it
    key_id: str
    seconds: float  # how long build_release took


def this_machine() -> tuple[str, str]:
    """(python, platform) of this machine, as build_release takes them ("3.11", "manylinux_2_36_x86_64")."""
    libc, version = platform.libc_ver()
    assert libc == "glibc", f"a manylinux platform needs glibc, this machine has {libc!r}"
    major, minor = version.split(".")[:2]
    return f"{sys.version_info.major}.{sys.version_info.minor}", f"manylinux_{major}_{minor}_{platform.machine()}"


def build_signed_release(root: Path, *, dependencies: bool = True) -> SignedRelease:
    secret, public = keygen(root / "keys")
    python, target = this_machine()
    started = time.monotonic()
    directory = build_release(root / "release", secret, python, target, dependencies=dependencies)
    key = read_public_key(public)
    return SignedRelease(directory, secret, public, key.line, key.id_text, time.monotonic() - started)


def release_beside(base: Path, out_dir: Path, secret_key: Path, source: Path) -> Path:
    """A signed release of the checkout `source` in `out_dir` whose dependency wheels are those of the release
    `base` (copied, not downloaded again: a build with its dependencies took 48 s here on a loaded machine, this one
    a few): llmgw's own wheel built from `source`, every other wheel of `base`, the manifest written and signed
    with `secret_key` as `build_release` does. For releases of the same checkout at another version."""
    import dataclasses
    import shutil

    from llmgw.release import MANIFEST, SIGNATURE, parse_manifest, read_secret_key
    from llmgw.release.manifest import describe, release_files, write_signed_manifest

    python, target = this_machine()
    key = read_secret_key(secret_key)
    build_release(out_dir, key, python, target, dependencies=False, source=source)
    for wheel in (base / "wheels").glob("*.whl"):
        if not wheel.name.startswith("llmgw-"):
            shutil.copy2(wheel, out_dir / "wheels" / wheel.name)
    manifest = parse_manifest((out_dir / MANIFEST).read_bytes())
    manifest = dataclasses.replace(manifest, files=describe(out_dir, release_files(out_dir)))
    (out_dir / SIGNATURE).unlink()
    write_signed_manifest(out_dir, manifest, key, f"file:{MANIFEST}\thashed\tllmgw {manifest.version} (test)")
    return out_dir


CHECKOUT = Path(__file__).resolve().parents[2]


def _sources_key() -> str:
    """The checkout's HEAD commit (the manifest records it) and the sha256 of every file that goes into the wheel
    (llmgw/, pyproject.toml, constraints.txt), 16 hex digits each."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=CHECKOUT).stdout.strip()
    digest = hashlib.sha256()
    files = [p for p in sorted((CHECKOUT / "llmgw").rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    for path in [*files, CHECKOUT / "pyproject.toml", CHECKOUT / "constraints.txt"]:
        if path.is_file():
            digest.update(path.relative_to(CHECKOUT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{head[:16]}-{digest.hexdigest()[:16]}"


def shared_signed_release(base: Path, *, dependencies: bool = True) -> SignedRelease:
    """The signed release of this checkout every test shares (module docstring): built by the first caller under
    `base/<kind>.lock`, read back by the others. Its `seconds` is how long its build took, once."""
    kind = "llmgw-release-full" if dependencies else "llmgw-release-bare"
    root = base / f"{kind}-{_sources_key()}"
    with open(base / f"{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = root / "signed-release.json"
        if record.is_file():
            fields = json.loads(record.read_text())
            return SignedRelease(**{k: Path(v) if k in ("directory", "secret_key", "public_key") else v
                                    for k, v in fields.items()})
        for old in base.glob(f"{kind}-*"):
            shutil.rmtree(old, ignore_errors=True)
        release = build_signed_release(root, dependencies=dependencies)
        record.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(release).items()}))
        return release
