"""`llmgw release keygen|build|verify`: signed releases of llmgw (llmgw.release; docs/install.md, "Releases").

keygen writes a key pair in minisign's formats (the secret key stays with whoever builds releases: never on a
control plane or a node), encrypted with the passphrase in $LLMGW_RELEASE_PASSPHRASE, or not with --unencrypted.
build makes a release directory (llmgw's wheel, its dependency wheels for the target, a signed manifest); verify
checks one against trusted public keys (given, or releases.trusted_keys of a settings tree). Exit codes: 0 done or
verified, 1 anything failed (the message says what: a file's digest, a key not trusted, a bad signature).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click

from llmgw.errors import UsageError
from llmgw.units import format_size


def _passphrase() -> str | None:
    from llmgw.release import PASSPHRASE_ENV

    return os.environ.get(PASSPHRASE_ENV) or None


@click.group("release")
def release_group() -> None:
    """Signed releases of llmgw: make a signing key (keygen), build a release (build), check one (verify)."""


@release_group.command("keygen")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--unencrypted", is_flag=True,
              help="Write the secret key without a passphrase (else it is encrypted with $LLMGW_RELEASE_PASSPHRASE).")
@click.option("--json", "as_json", is_flag=True, help="Print the paths, key id and public key as JSON.")
def keygen_command(directory: Path, unencrypted: bool, as_json: bool) -> None:
    """Make a release signing key pair in DIRECTORY (default: here): llmgw-release.key and llmgw-release.pub."""
    from llmgw.release import PASSPHRASE_ENV, keygen, read_public_key

    passphrase = _passphrase()
    if passphrase is None and not unencrypted:
        raise UsageError(f"set {PASSPHRASE_ENV} to the passphrase that encrypts the secret key, or pass "
                         "--unencrypted to keep it in plain text (then only its file mode 0600 protects it)")
    secret, public = keygen(directory, None if unencrypted else passphrase)
    key = read_public_key(public)
    if as_json:
        click.echo(json.dumps({"secret_key": str(secret), "public_key": str(public), "key_id": key.id_text,
                               "trusted_key": key.line, "encrypted": not unencrypted}))
        return
    click.echo(f"secret key {secret} ({'encrypted' if not unencrypted else 'NOT encrypted'}; keep it off control "
               f"planes and nodes)\npublic key {public}, key id {key.id_text}\n"
               "Add this line to releases.trusted_keys in llmgw.yaml of the settings repository:\n"
               f"    - {key.line}")


@release_group.command("build")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The secret key to sign with (from `llmgw release keygen`; $LLMGW_RELEASE_PASSPHRASE opens it).")
@click.option("--python", "python", default="3.11", show_default=True, help="The nodes' Python (3.11 or newer).")
@click.option("--platform", "platform", default="manylinux_2_28_x86_64", show_default=True,
              help="The nodes' wheel platform tag (manylinux_2_<glibc minor>_<arch>: older manylinux wheels count).")
@click.option("--no-deps", "no_deps", is_flag=True,
              help="llmgw's wheel only, without its dependency wheels (nodes then need a registry).")
@click.option("--source", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="The llmgw checkout to build (default: the one this llmgw runs from).")
@click.option("--json", "as_json", is_flag=True, help="Print the release's summary as JSON.")
def build_command(out_dir: Path, key_path: Path, python: str, platform: str, no_deps: bool, source: Path | None,
                  as_json: bool) -> None:
    """Build a signed release into OUT_DIR (new or empty): wheels/, manifest.json, manifest.json.minisig."""
    from llmgw.release import build_release, read_secret_key

    key = read_secret_key(key_path, _passphrase())
    started = time.monotonic()
    built = build_release(out_dir, key, python, platform, dependencies=not no_deps, source=source,
                          progress=lambda step: click.echo(f"release: {step}", err=True))
    seconds = time.monotonic() - started
    manifest = json.loads((built / "manifest.json").read_text())
    size = sum(f["size"] for f in manifest["files"])
    summary = {"directory": str(built), "version": manifest["version"], "python": python, "platform": platform,
               "files": len(manifest["files"]), "bytes": size, "key_id": key.id_text, "seconds": round(seconds, 1),
               "source": manifest["source"]}
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"release llmgw {manifest['version']} for Python {python} on {platform} in {built}: "
               f"{len(manifest['files'])} wheel{'s' if len(manifest['files']) != 1 else ''}, {format_size(size)}, signed by key {key.id_text} "
               f"({seconds:.1f} s)")


def _trusted(keys: tuple[str, ...], settings_dir: Path | None) -> list[str]:
    """Key lines or key texts from --trusted-key (a key line, or a public key file) and a settings tree."""
    trusted = [Path(k).read_text() if Path(k).is_file() else k for k in keys]
    if settings_dir is not None:
        from llmgw.settings import load_directory

        found = load_directory(settings_dir).cluster.trusted_release_keys
        if not found:
            raise UsageError(f"{settings_dir}/llmgw.yaml lists no releases.trusted_keys: add the public key of "
                             "whoever builds releases there (`llmgw release keygen` prints it)")
        trusted += found
    if not trusted:
        raise UsageError("say which keys to trust: --trusted-key KEY (a key line or a .pub file; repeatable) or "
                         "--settings DIR (its llmgw.yaml releases.trusted_keys)")
    return trusted


@release_group.command("verify")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--trusted-key", "keys", multiple=True, metavar="KEY",
              help="A trusted public key: its key line (RW...) or its .pub file (repeatable).")
@click.option("--settings", "settings_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="A settings tree whose llmgw.yaml releases.trusted_keys are trusted.")
@click.option("--json", "as_json", is_flag=True, help="Print the verified manifest's summary as JSON.")
def verify_command(directory: Path, keys: tuple[str, ...], settings_dir: Path | None, as_json: bool) -> None:
    """Check the release in DIRECTORY: its signature by a trusted key and every file's sha256 and size."""
    from llmgw.release import verify_release

    manifest = verify_release(directory, _trusted(keys, settings_dir))
    size = sum(f.size for f in manifest.files)
    if as_json:
        click.echo(json.dumps({"version": manifest.version, "python": manifest.python, "platform": manifest.platform,
                               "created": manifest.created, "key_id": manifest.key_id, "files": len(manifest.files),
                               "bytes": size, "source_commit": manifest.source_commit, "dirty": manifest.dirty}))
        return
    source = f", from {manifest.source_commit[:12]}" if manifest.source_commit else ""
    source += " with changes not committed" if manifest.dirty else ""
    click.echo(f"verified: llmgw {manifest.version} for Python {manifest.python} on {manifest.platform} "
               f"(built {manifest.created}{source}), {len(manifest.files)} files, {format_size(size)}, signed by "
               f"key {manifest.key_id}")


def register(group: click.Group) -> None:
    """Add `release` to the `llmgw` command group."""
    group.add_command(release_group)
