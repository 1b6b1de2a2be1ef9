"""Offline bundles: a release, engine builds, weights (and optionally vLLM's wheels) in one signed directory that a
site without internet imports as its nodes' mirror (docs/operations.md, "Offline sites").

A bundle directory is laid out exactly as the agents' mirror directories already are (`llmgw agent --mirror`,
agents/ `mirrors`), so an imported bundle is the mirror, not a second layout:

    sha256/<digest>                      weights (and engine archives) by content (llmgw.agent.weights)
    llama.cpp/<version>/bin/...          an installed llama-server tree (llmgw.engines.installing)
    releases/<version>/                  a signed llmgw release as `llmgw release build` makes it
    wheels/*.whl, locks/<lock>.txt       a vLLM lock's wheels (only with `llmgw bundle create --vllm`)
    manifest.json, manifest.json.minisig the bundle's manifest (the release format, name "llmgw-bundle"), signed

The manifest lists every file with its sha256 and size; `verify_bundle` checks the signature against trusted keys,
then every file, and refuses a file that was changed, removed or added, naming it (`verify_release` does the work).
`import_bundle` takes a bundle directory or a tar of one, places it beside the mirror's final place, verifies that
copy and only then moves it into place. Files are hard-linked when source and target share a file system (a 270 MB
model costs nothing), else copied. Blocking; `progress(done_bytes, total_bytes, what)` is told every file.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llmgw.archives import extract_tar
from llmgw.errors import ReleaseError
from llmgw.release.keys import PublicKey, SecretKey
from llmgw.release.manifest import (
    MANIFEST, SIGNATURE, Manifest, ReleaseFile, file_sha256, verify_release, write_signed_manifest,
)

NAME = "llmgw-bundle"
RELEASES = "releases"

BundleProgress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Bundle:
    """A verified bundle: `directory`, its manifest (`key_id` the key that signed it), and what it holds."""

    directory: Path
    manifest: Manifest

    @property
    def releases(self) -> list[str]:
        return sorted({PurePosixPath(f.path).parts[1] for f in self.manifest.files
                       if f.path.startswith(f"{RELEASES}/")})

    @property
    def engines(self) -> list[str]:
        return sorted({"/".join(PurePosixPath(f.path).parts[:2]) for f in self.manifest.files
                       if f.path.startswith("llama.cpp/")})

    @property
    def weights(self) -> list[str]:
        return [PurePosixPath(f.path).name for f in self.manifest.files if f.path.startswith("sha256/")]

    @property
    def wheels(self) -> list[str]:
        return [f.path for f in self.manifest.files if f.path.startswith("wheels/")]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.manifest.files)

    def to_json(self) -> dict:
        return {"directory": str(self.directory), "version": self.manifest.version, "key_id": self.manifest.key_id,
                "created": self.manifest.created, "platform": self.manifest.platform, "files":
                len(self.manifest.files), "bytes": self.size, "releases": self.releases, "engines": self.engines,
                "weights": self.weights, "wheels": len(self.wheels)}


def _place(source: Path, target: Path) -> None:
    """Hard-link `source` at `target` (a new plain file), or copy it when they are on different file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        shutil.copymode(source, target)


def tree_entries(root: Path, prefix: str) -> dict[str, Path]:
    """Every file under directory `root` as {`prefix`/relative path: its real file}; symbolic links are followed
    (a bundle holds plain files: a build's `libx.so -> libx.so.1` becomes a second copy). Raises ReleaseError for a
    link that leads nowhere."""
    found: dict[str, Path] = {}
    for base, _dirs, files in os.walk(root, followlinks=True):
        for name in files:
            path = Path(base, name)
            if not path.is_file():
                raise ReleaseError(f"{path} is a link that leads to no file: fix or remove it before bundling",
                                   paths=(str(path),))
            found[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.resolve()
    return found


def create_bundle(out_dir: Path, entries: Mapping[str, Path], key: SecretKey, *, version: str, python: str,
                  platform: str, progress: BundleProgress | None = None) -> Bundle:
    """Make the bundle `out_dir` (new or empty) of `entries` ({path in the bundle: file}) signed with `key`.
    `version` is the llmgw release it carries, `python`/`platform` the nodes' (as the release's). Returns it,
    verified against `key`'s own public half. Raises ReleaseError (a path that leaves the bundle, a missing file,
    an `out_dir` that is not empty); `out_dir` is removed again when it was made here and anything failed."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ReleaseError(f"{out_dir} exists and is not an empty directory: create a bundle into a new one")
    made = not out_dir.exists()
    tell = progress or (lambda _done, _total, _what: None)
    try:
        total = 0
        for rel, source in entries.items():
            pure = PurePosixPath(rel)
            if pure.is_absolute() or ".." in pure.parts or rel in (MANIFEST, SIGNATURE) or str(pure) != rel:
                raise ReleaseError(f"{rel!r} is not a plain path inside a bundle", paths=(rel,))
            if not Path(source).is_file():
                raise ReleaseError(f"{source} (for {rel} in the bundle) is not a file", paths=(rel,))
            total += Path(source).stat().st_size
        out_dir.mkdir(parents=True, exist_ok=True)
        done, files = 0, []
        for rel in sorted(entries):
            target = out_dir / rel
            _place(Path(entries[rel]), target)
            size = target.stat().st_size
            files.append(ReleaseFile(rel, file_sha256(target), size))
            done += size
            tell(done, total, rel)
        created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        manifest = Manifest(NAME, version, created, python, platform, tuple(files))
        write_signed_manifest(out_dir, manifest, key, f"{NAME} {version} for python {python} on {platform}, "
                                                      f"{len(files)} files, created {created}")
        return verify_bundle(out_dir, [key.public_key()])
    except BaseException:
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def verify_bundle(directory: Path, trusted_keys: Sequence[str | PublicKey], *,
                  progress: BundleProgress | None = None) -> Bundle:
    """Verify the bundle in `directory`: signed by one of `trusted_keys`, every file as its manifest says, nothing
    added; and each release inside verifies on its own. Raises ReleaseError naming the files at fault."""
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        try:
            total = sum(f["size"] for f in json.loads((directory / MANIFEST).read_bytes())["files"])
        except (ValueError, KeyError, TypeError):
            total = 0  # verify_release says what is wrong with it
    done = [0]

    def checked(entry: ReleaseFile) -> None:
        done[0] += entry.size
        if progress is not None:
            progress(done[0], total, entry.path)

    try:
        manifest = verify_release(directory, trusted_keys, checked=checked)
    except ReleaseError as exc:
        raise ReleaseError(f"bundle: {exc}".replace("the release ", "the bundle ", 1), paths=exc.paths,
                           key_id=exc.key_id) from exc
    if manifest.name != NAME:
        raise ReleaseError(f"{directory} is a release of {manifest.name}, not a bundle: install it with `llmgw node "
                           "add --release`, or put it in a bundle with `llmgw bundle create --release`")
    bundle = Bundle(directory, manifest)
    for version in bundle.releases:
        verify_release(directory / RELEASES / version, trusted_keys)
    return bundle


def _unpack(archive: Path, target: Path) -> None:
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if not (member.isfile() or member.isdir()):
                    raise ReleaseError(f"{archive}: {member.name} is a link or special file: a bundle holds plain "
                                       "files only", paths=(member.name,))
            extract_tar(tar, target)
    except (tarfile.TarError, OSError) as exc:
        raise ReleaseError(f"{archive} is not a readable tar of a bundle ({exc})") from exc


def write_tarball(bundle_dir: Path, archive: Path) -> Path:
    """A tar (not compressed: weights and wheels do not shrink) of the bundle's files, paths relative to it."""
    with tarfile.open(archive, "w") as tar:
        for path in sorted(bundle_dir.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(bundle_dir).as_posix(), recursive=False)
    return archive


def import_bundle(source: Path, mirror: Path, trusted_keys: Sequence[str | PublicKey], *,
                  progress: BundleProgress | None = None) -> Bundle:
    """Verify the bundle `source` (a directory or a tar of one) and make it the mirror directory `mirror`.

    It is placed beside `mirror` first (`.<name>.importing`), verified there (the copy the nodes will read, not the
    source), then moved into place; a mirror already there is replaced only after that. Nothing changes when the
    bundle does not verify. Raises ReleaseError naming the files at fault."""
    source, mirror = Path(source), Path(mirror)
    staging = mirror.parent / f".{mirror.name}.importing"
    shutil.rmtree(staging, ignore_errors=True)
    mirror.parent.mkdir(parents=True, exist_ok=True)
    try:
        if source.is_dir():
            entries = {p.relative_to(source).as_posix(): p for p in source.rglob("*") if p.is_file()}
            total = sum(p.stat().st_size for p in entries.values())
            done = 0
            for rel, path in sorted(entries.items()):
                _place(path, staging / rel)
                done += path.stat().st_size
                if progress is not None:
                    progress(done, total, f"placing {rel}")
        elif source.is_file():
            staging.mkdir()
            _unpack(source, staging)
        else:
            raise ReleaseError(f"{source} is neither a bundle directory nor a tar of one")
        try:
            bundle = verify_bundle(staging, trusted_keys, progress=progress)
        except ReleaseError as exc:  # name what the operator gave, not the copy being checked
            raise ReleaseError(str(exc).replace(str(staging), str(source)), paths=exc.paths,
                               key_id=exc.key_id) from exc
        old = mirror.parent / f".{mirror.name}.replaced"
        shutil.rmtree(old, ignore_errors=True)
        if mirror.exists():
            mirror.rename(old)
        staging.rename(mirror)
        shutil.rmtree(old, ignore_errors=True)
        return Bundle(mirror, bundle.manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def imported_bundle(mirror: Path) -> Manifest | None:
    """The manifest of the bundle imported as `mirror` (not verified: `verify_bundle` does that), or None when the
    mirror was not made by `llmgw bundle import`."""
    from llmgw.release.manifest import parse_manifest

    try:
        manifest = parse_manifest((Path(mirror) / MANIFEST).read_bytes())
    except (OSError, ReleaseError):
        return None
    return manifest if manifest.name == NAME else None
