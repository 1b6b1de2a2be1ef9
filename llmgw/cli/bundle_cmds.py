"""`llmgw bundle create|verify|import`: signed offline bundles for a site without internet (llmgw.release.bundle;
docs/operations.md, "Offline sites").

create collects a release (`llmgw release build`), llama.cpp builds (installed trees, `llama.cpp/<version>`), weights
files (by content, `sha256/<digest>`) and, with --vllm LOCK, that lock's wheels into one directory laid out as the
agents' mirror, signed like a release; --tar also writes it as one tar. import verifies a bundle (directory or tar)
against trusted keys and makes it the mirror directory that nodes read (`llmgw agent --mirror DIR --offline`, or
agents/ `mirrors:`). Exit codes: 0 done, 1 anything failed (the message names the file or the key).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from llmgw.cli.release_cmds import _passphrase, _trusted
from llmgw.errors import ReleaseError, UsageError
from llmgw.units import format_size


@contextmanager
def _bar(what: str, quiet: bool) -> Iterator:
    """A rich progress bar on stderr (bytes done of total, speed, time left), told `(done, total, file)`."""
    if quiet:
        yield lambda _done, _total, _name: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
    )

    with Progress(TextColumn(f"{what} [dim]{{task.fields[name]}}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                  transient=True) as progress:
        task = progress.add_task(what, total=None, name="")

        def tell(done: int, total: int, name: str) -> None:
            progress.update(task, completed=done, total=total or None, name=name[-48:])

        yield tell


def _engine_entries(engines_dir: Path, version: str) -> dict[str, Path]:
    """An installed llama.cpp `version` under `engines_dir` as bundle entries: its bin/ at llama.cpp/<version>/bin
    (the mirror layout `llmgw.engines.installing` reads)."""
    from llmgw.engines.installing import install_dir, installed_binary
    from llmgw.release import tree_entries

    binary = installed_binary(engines_dir, version)
    if binary is None:
        raise UsageError(f"llama.cpp {version} is not installed under {engines_dir}: install or build it there "
                         "first (`make engine`, or an agent's engines directory given with --engines-dir)")
    return tree_entries(binary.parent, f"{install_dir(Path(), version).as_posix()}/bin")


def _vllm_entries(lock: Path, index_url: str | None, scratch: Path) -> dict[str, Path]:
    """The wheels of the vLLM lock `lock` (every package pinned with its sha256), downloaded by pip with
    --require-hashes into `scratch`, at wheels/<file>; the lock itself at locks/<its name>."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "--only-binary",
               ":all:", "-r", str(lock), "-d", str(scratch), *(["--index-url", index_url] if index_url else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise ReleaseError(f"downloading the wheels of {lock} failed (pip exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")
    wheels = {f"wheels/{p.name}": p for p in sorted(scratch.glob("*.whl"))}
    if not wheels:
        raise ReleaseError(f"{lock} pins no wheel: a vLLM lock lists every package with --hash=sha256:...")
    return {**wheels, f"locks/{lock.name}": lock}


@click.group("bundle")
def bundle_group() -> None:
    """Offline bundles: collect a release, engines and weights into one signed mirror (create), check one (verify),
    make it this site's mirror (import)."""


@bundle_group.command("create")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The secret key to sign with (`llmgw release keygen`; $LLMGW_RELEASE_PASSPHRASE opens it).")
@click.option("--release", "release_dir", required=True,
              type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="A release directory (`llmgw release build`), signed by --key or a --trusted-key.")
@click.option("--trusted-key", "keys", multiple=True, metavar="KEY",
              help="Another key the release may be signed by: a key line or a .pub file (repeatable).")
@click.option("--engine", "engines", multiple=True, metavar="VERSION",
              help="A llama.cpp version installed under --engines-dir (e.g. b11434), built for the bundle's "
                   "platform (repeatable; one bundle per target).")
@click.option("--engines-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the engines are installed (default: the engine cache, $LLMGW_CACHE/engines or "
                   "~/.cache/llmgw/engines).")
@click.option("--weights", "weights", multiple=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A weights file, kept by its sha256 as the models' catalog pins it (repeatable).")
@click.option("--vllm", "vllm_lock", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Also collect the wheels of this vLLM lock (llmgw/engines/locks/*.txt; about 3.5 GB for vLLM "
                   "0.32 on CPU). Off by default.")
@click.option("--index-url", default=None, help="The package index pip downloads --vllm's wheels from.")
@click.option("--tar", "tar_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the bundle as one tar file (not compressed) to carry to the site.")
@click.option("--json", "as_json", is_flag=True, help="Print the bundle's summary as JSON.")
def create_command(out_dir: Path, key_path: Path, release_dir: Path, keys: tuple[str, ...], engines: tuple[str, ...],
                   engines_dir: Path | None, weights: tuple[Path, ...], vllm_lock: Path | None, index_url: str | None,
                   tar_path: Path | None, as_json: bool) -> None:
    """Collect a signed offline bundle into OUT_DIR (new or empty), laid out as the agents' mirror."""
    from llmgw.engines.installing import default_cache_dir
    from llmgw.release import create_bundle, file_sha256, read_secret_key, verify_release, write_tarball

    started = time.monotonic()
    key = read_secret_key(key_path, _passphrase())
    release = verify_release(release_dir, [key.public_key(), *(_trusted(keys, None) if keys else [])])
    entries = {f"releases/{release.version}/{f.path}": release_dir / f.path for f in release.files}
    entries.update({f"releases/{release.version}/{name}": release_dir / name
                    for name in ("manifest.json", "manifest.json.minisig")})
    for version in engines:
        entries.update(_engine_entries(engines_dir or default_cache_dir() / "engines", version))
    for path in weights:
        entries[f"sha256/{file_sha256(path)}"] = path
    with tempfile.TemporaryDirectory(prefix="llmgw-bundle-wheels-", dir=out_dir.parent if out_dir.parent.is_dir()
                                     else None) as scratch:
        if vllm_lock is not None:
            click.echo(f"bundle: downloading the wheels of {vllm_lock} ...", err=True)
            entries.update(_vllm_entries(vllm_lock, index_url, Path(scratch)))
        with _bar("bundling", as_json) as tell:
            bundle = create_bundle(out_dir, entries, key, version=release.version, python=release.python,
                                   platform=release.platform, progress=tell)
    if tar_path is not None:
        write_tarball(out_dir, tar_path)
    summary = {**bundle.to_json(), "tar": str(tar_path) if tar_path else None,
               "seconds": round(time.monotonic() - started, 1)}
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"bundle {out_dir}: llmgw {release.version} for Python {release.python} on {release.platform}, "
               f"engines {', '.join(bundle.engines) or 'none'}, {len(bundle.weights)} weights file(s), "
               f"{len(bundle.wheels)} vLLM wheel(s); {len(bundle.manifest.files)} files, {format_size(bundle.size)}, "
               f"signed by key {bundle.manifest.key_id} ({summary['seconds']} s)"
               + (f"; tar {tar_path}" if tar_path else ""))


def _trust_options(command):
    command = click.option("--settings", "settings_dir", type=click.Path(file_okay=False, exists=True,
                                                                         path_type=Path), default=None,
                           help="A settings tree whose llmgw.yaml releases.trusted_keys are trusted.")(command)
    return click.option("--trusted-key", "keys", multiple=True, metavar="KEY",
                        help="A trusted public key: its key line (RW...) or its .pub file (repeatable).")(command)


@bundle_group.command("verify")
@click.argument("bundle_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@_trust_options
@click.option("--json", "as_json", is_flag=True, help="Print the verified bundle's summary as JSON.")
def verify_command(bundle_dir: Path, keys: tuple[str, ...], settings_dir: Path | None, as_json: bool) -> None:
    """Check the bundle in BUNDLE_DIR: its signature by a trusted key and every file's sha256 and size."""
    from llmgw.release import verify_bundle

    with _bar("verifying", as_json) as tell:
        bundle = verify_bundle(bundle_dir, _trusted(keys, settings_dir), progress=tell)
    click.echo(json.dumps(bundle.to_json()) if as_json else
               f"verified: bundle llmgw {bundle.manifest.version}, {len(bundle.manifest.files)} files, "
               f"{format_size(bundle.size)}, signed by key {bundle.manifest.key_id}")


@bundle_group.command("import")
@click.argument("bundle", type=click.Path(exists=True, path_type=Path))
@click.argument("mirror", type=click.Path(path_type=Path))
@_trust_options
@click.option("--json", "as_json", is_flag=True, help="Print the imported bundle's summary as JSON.")
def import_command(bundle: Path, mirror: Path, keys: tuple[str, ...], settings_dir: Path | None,
                   as_json: bool) -> None:
    """Verify BUNDLE (a directory or a tar from `llmgw bundle create --tar`) and make it the mirror MIRROR."""
    from llmgw.release import import_bundle

    started = time.monotonic()
    with _bar("importing", as_json) as tell:
        imported = import_bundle(bundle, mirror, _trusted(keys, settings_dir), progress=tell)
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        click.echo(json.dumps({**imported.to_json(), "seconds": seconds}))
        return
    click.echo(f"imported bundle llmgw {imported.manifest.version} (signed by key {imported.manifest.key_id}, "
               f"{len(imported.manifest.files)} files, {format_size(imported.size)}) as the mirror {mirror} "
               f"({seconds} s).\nNodes install from it only with agents/ `mirrors: [{mirror}]` and `offline: true` in the "
               f"settings (or `llmgw agent --mirror {mirror} --offline`); releases are under {mirror}/releases/ "
               "(`llmgw node add --release`).")


def register(group: click.Group) -> None:
    """Add `bundle` to the `llmgw` command group."""
    group.add_command(bundle_group)
