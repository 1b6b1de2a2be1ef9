"""A signed release of this checkout, for tests that install llmgw the way nodes do (`llmgw.release`).

`build_signed_release(root)` makes a key pair (not encrypted) in root/keys and a release in root/release: llmgw's
wheel from this checkout and, with `dependencies`, every dependency wheel for this machine's Python and glibc.
Those dependency wheels are downloaded once (`build_release` with pip: 45-88 s on this loaded machine) and kept
on disk, in $LLMGW_CACHE/test-releases/<key>/wheels (default ~/.cache/llmgw), keyed by what decides them
(pyproject.toml's dependencies, constraints.txt, the Python, platform and interpreter), under a file lock so that
xdist workers and later sessions share them; a release is then llmgw's own wheel (a few seconds) beside copies of
them, signed (`release_beside`). `dependency_venv()` is a venv with those wheels installed, kept the same way, for
tests that install a node: copy it and add llmgw's wheel (`install_from_venv`), seconds instead of an offline pip install of everything (33-47 s here). Only
tests/release/test_release_build.py builds with pip's download itself (`real_download=True`). Tests that need a
release share it (a session or module fixture) and copy it before changing it.

`shared_signed_release(base)` is the one every test of a run shares (the session fixtures `full_release` and
`bare_release` of tests/conftest.py): built once under a file lock in `base`, a directory every xdist worker sees,
and named by the checkout's commit and a digest of what goes into the wheel, so a later run of the same checkout
reuses it and a changed one builds anew (the older builds of that kind are removed then, but not one a session
took in the last hour: without xdist, `base` is the parent of pytest's base directory, shared by every session of
the user, other checkouts' too). The full one is the bare one with the dependency wheels added and signed again by
its key: llmgw's wheel is built once a run, not twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from llmgw.release import MANIFEST, SIGNATURE, build_release, keygen, parse_manifest, read_public_key, read_secret_key
from llmgw.release.manifest import describe, release_files, write_signed_manifest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw") / "test-releases"  # as conftest's


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


def build_signed_release(root: Path, *, dependencies: bool = True, real_download: bool = False) -> SignedRelease:
    """A key pair in root/keys and a release of this checkout in root/release signed by it; `dependencies`: with
    every dependency wheel (from the on-disk cache, `dependency_wheels`; `real_download`: pip downloads them, as
    `llmgw release build` does)."""
    secret, public = keygen(root / "keys")
    python, target = this_machine()
    started = time.monotonic()
    if dependencies and not real_download:
        directory = release_beside(dependency_wheels(), root / "release", secret, ROOT)
    else:
        directory = build_release(root / "release", secret, python, target, dependencies=dependencies)
    key = read_public_key(public)
    return SignedRelease(directory, secret, public, key.line, key.id_text, time.monotonic() - started)


def release_beside(base: Path, out_dir: Path, secret_key: Path, source: Path,
                   llmgw_wheel: Path | None = None) -> Path:
    """A signed release of the checkout `source` in `out_dir` whose dependency wheels are those in `base` (a
    release, or `dependency_wheels()`; copied, not downloaded again): llmgw's own wheel built from `source` (or the
    wheel `llmgw_wheel`, built already), every other wheel of `base`, the manifest written and signed with
    `secret_key` as `build_release` does."""
    python, target = this_machine()
    key = read_secret_key(secret_key)
    build_release(out_dir, key, python, target, dependencies=False, source=source)
    if llmgw_wheel is not None:
        for wheel in (out_dir / "wheels").glob("llmgw-*.whl"):
            wheel.unlink()
        shutil.copy2(llmgw_wheel, out_dir / "wheels" / llmgw_wheel.name)
    _add_dependencies(out_dir, base, key)
    return out_dir


def _add_dependencies(out_dir: Path, base: Path, key) -> None:
    """Copy every wheel of `base` (a release, or a directory of wheels) but llmgw's into the release `out_dir`, then
    write its manifest again (every file's digest) and sign it with `key` (a SecretKey)."""
    wheels = base / "wheels" if (base / "wheels").is_dir() else base
    for wheel in wheels.glob("*.whl"):
        if not wheel.name.startswith("llmgw-"):
            shutil.copy2(wheel, out_dir / "wheels" / wheel.name)
    manifest = parse_manifest((out_dir / MANIFEST).read_bytes())
    manifest = dataclasses.replace(manifest, files=describe(out_dir, release_files(out_dir)))
    (out_dir / SIGNATURE).unlink()
    write_signed_manifest(out_dir, manifest, key, f"file:{MANIFEST}\thashed\tllmgw {manifest.version} (test)")


def _with_dependencies(bare: SignedRelease, root: Path) -> SignedRelease:
    """The release `bare` (llmgw's wheel alone) with every dependency wheel of `dependency_wheels()` beside it, in
    root/release, signed by the same key (copied into root/keys): what `release_beside` makes, without building
    llmgw's wheel again (`pip wheel`, 2-3 s of CPU)."""
    started = time.monotonic()
    keys = Path(shutil.copytree(bare.secret_key.parent, root / "keys"))
    directory = Path(shutil.copytree(bare.directory, root / "release"))
    secret = keys / bare.secret_key.name
    _add_dependencies(directory, dependency_wheels(), read_secret_key(secret))
    return dataclasses.replace(bare, directory=directory, secret_key=secret, public_key=keys / bare.public_key.name,
                               seconds=time.monotonic() - started)


def _sources_key() -> str:
    """The checkout's HEAD commit (the manifest records it) and the sha256 of every file that goes into the wheel
    (llmgw/, pyproject.toml, constraints.txt), 16 hex digits each."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout.strip()
    digest = hashlib.sha256()
    files = [p for p in sorted((ROOT / "llmgw").rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    for path in [*files, ROOT / "pyproject.toml", ROOT / "constraints.txt"]:
        if path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
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
            os.utime(record)  # in use: see below
            fields = json.loads(record.read_text())
            return SignedRelease(**{k: Path(v) if k in ("directory", "secret_key", "public_key") else v
                                    for k, v in fields.items()})
        for old in base.glob(f"{kind}-*"):  # but those another session (another checkout) took in the last hour
            taken = old / "signed-release.json"
            if not taken.is_file() or taken.stat().st_mtime < time.time() - 3600:
                shutil.rmtree(old, ignore_errors=True)
        if dependencies:  # the bare release with the dependency wheels added: one build of llmgw's wheel a run
            release = _with_dependencies(shared_signed_release(base, dependencies=False), root)
        else:
            release = build_signed_release(root, dependencies=False)
        record.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(release).items()}))
        return release


def _dependency_key() -> str:
    """What decides the dependency wheels: pyproject.toml's dependencies (not its version), constraints.txt, this
    machine's Python, platform and interpreter (the venv's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    digest = hashlib.sha256(repr((sorted(project.get("dependencies", [])), (ROOT / "constraints.txt").read_text(),
                                  this_machine(), sys.executable)).encode())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers and other sessions wait for the one that builds
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cached(name: str, make) -> Path:
    """CACHE/<key>/<name>, made by `make(scratch_directory)` once (atomically renamed into place)."""
    target = CACHE / _dependency_key() / name
    if target.is_dir():
        return target
    with _locked(target.parent / f"{name}.lock"):
        if not target.is_dir():
            scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
            try:
                make(scratch)
                scratch.rename(target)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
    return target


def dependency_wheels() -> Path:
    """A directory of every dependency wheel of llmgw for this machine (not llmgw's own), downloaded once by pip
    (`build_release`) and kept in CACHE."""
    def make(scratch: Path) -> None:
        secret, _ = keygen(scratch / "keys")
        python, target = this_machine()
        release = build_release(scratch / "release", secret, python, target, source=ROOT)
        (scratch / "wheels").mkdir()
        for wheel in (release / "wheels").glob("*.whl"):
            if not wheel.name.startswith("llmgw-"):
                shutil.copy2(wheel, scratch / "wheels" / wheel.name)
        shutil.rmtree(scratch / "release")
        shutil.rmtree(scratch / "keys")
    return _cached("dependencies", make) / "wheels"


def dependency_venv() -> Path:
    """A venv (this interpreter's) with every wheel of `dependency_wheels()` installed offline, kept in CACHE:
    copy it (`install_from_venv`), never change it."""
    def make(scratch: Path) -> None:
        venv = scratch / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                        "--disable-pip-version-check", *map(str, sorted(dependency_wheels().glob("*.whl")))],
                       check=True, capture_output=True, timeout=900)
    return _cached("venv", make) / "venv"


def install_from_venv(venv: Path, wheels: Path, version: str) -> None:
    """`venv` made as `llmgw.agent.upgrading.install_venv` makes it (llmgw `version` from the release's `wheels`,
    offline), but from a copy of `dependency_venv()`: pip then installs llmgw's wheel alone and checks that every
    dependency is there. The copy runs by `python -m` (a venv's scripts name the place it was made in)."""
    shutil.copytree(dependency_venv(), venv, symlinks=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(wheels), f"llmgw=={version}"],
                   check=True, capture_output=True, timeout=300)


def raised_release(base: Path, out_dir: Path, secret_key: Path, version: str) -> Path:
    """The release `base` (0.1.0, llmgw's wheel and its dependency wheels) as llmgw `version`, in `out_dir`, signed
    with `secret_key`: what `release_beside(base, out_dir, secret_key, version_tree(..., version))` makes, but
    llmgw's wheel is `base`'s with its version raised (`raised_wheel`) instead of built again from a copy of the
    checkout (`pip wheel`: 10-13 s at a load of 13). For tests about installing a next release, not building one;
    a release whose code differs (tests/control/test_upgrade_fleet.py's broken agent) needs `version_tree`."""
    shutil.copytree(base, out_dir)
    [old] = (out_dir / "wheels").glob("llmgw-*.whl")
    raised_wheel(old, out_dir / "wheels", version)
    old.unlink()
    manifest = parse_manifest((out_dir / MANIFEST).read_bytes())
    manifest = dataclasses.replace(manifest, version=version, files=describe(out_dir, release_files(out_dir)))
    (out_dir / SIGNATURE).unlink()
    write_signed_manifest(out_dir, manifest, read_secret_key(secret_key),
                          f"file:{MANIFEST}\thashed\tllmgw {version} (test)")
    return out_dir


def raised_wheel(wheel: Path, out_dir: Path, version: str) -> Path:
    """llmgw's wheel `wheel` (0.1.0) as llmgw `version` in `out_dir`: what `version_tree` changes (llmgw/__init__.py's
    `__version__`; pyproject.toml's version, so the dist-info directory's name and METADATA's Version) and the RECORD
    of every file's digest written again, as pip checks it. Returns the new wheel. Raises AssertionError when the
    wheel no longer says 0.1.0 where it is changed (update the bump)."""
    import base64
    import zipfile

    old_info, new_info = "llmgw-0.1.0.dist-info/", f"llmgw-{version}.dist-info/"
    target = out_dir / wheel.name.replace("-0.1.0-", f"-{version}-")
    assert target != wheel, f"{wheel.name} is not llmgw 0.1.0's wheel"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        record = []
        for info in source.infolist():
            name, data = info.filename, source.read(info)
            if name == old_info + "RECORD":
                continue
            if name == "llmgw/__init__.py":
                assert b'__version__ = "0.1.0"' in data, "llmgw/__init__.py no longer says 0.1.0: update the bump"
                data = data.replace(b'__version__ = "0.1.0"', f'__version__ = "{version}"'.encode())
            elif name == old_info + "METADATA":
                assert b"\nVersion: 0.1.0\n" in data, "METADATA no longer says Version: 0.1.0: update the bump"
                data = data.replace(b"\nVersion: 0.1.0\n", f"\nVersion: {version}\n".encode())
            name = new_info + name[len(old_info):] if name.startswith(old_info) else name
            assert not name.startswith("llmgw-") or name.startswith(new_info), f"{name}: another dist-info"
            entry = zipfile.ZipInfo(name, info.date_time)
            entry.external_attr = info.external_attr
            out.writestr(entry, data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        out.writestr(zipfile.ZipInfo(new_info + "RECORD", (1980, 1, 1, 0, 0, 0)),
                     "\n".join([*record, f"{new_info}RECORD,,", ""]), zipfile.ZIP_DEFLATED)
    return target


def version_tree(target: Path, version: str) -> Path:
    """This checkout's tracked (and untracked, not ignored) files copied to `target`, its version set to `version`
    (pyproject.toml and llmgw/__init__.py): the source of a release of the next version (`release_beside`); returns
    `target`. Raises AssertionError when those files no longer say 0.1.0 (update the bump)."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, names):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    for name, old, new in (("pyproject.toml", 'version = "0.1.0"', f'version = "{version}"'),
                           ("llmgw/__init__.py", '__version__ = "0.1.0"', f'__version__ = "{version}"')):
        text = (target / name).read_text()
        assert old in text, f"{name} no longer says {old}: update version_tree's bump"
        (target / name).write_text(text.replace(old, new))
    return target
