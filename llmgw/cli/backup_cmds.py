"""`llmgw backup --state DIR OUT` and `llmgw restore ARCHIVE --state NEWDIR [--store URL]` (llmgw.backup;
docs/ha.md, "Backup and restore")."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import click

from llmgw.errors import UsageError


def _settings_repo(state: Path, repo: Path | None) -> Path:
    if repo is not None:
        return repo
    for name in ("settings.git", "settings-mirror.git"):
        if (state / name).is_dir():
            return state / name
    raise UsageError(f"{state} holds no settings repository (settings.git or settings-mirror.git); give the one "
                     "`llmgw server --repo` reads, with --repo PATH.")


def _branch(repo: Path) -> str:
    done = subprocess.run(["git", "-C", str(repo), "config", "llmgw.branch"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "main"


@click.command("backup")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--state", "state_dir", envvar="LLMGW_STATE", default=".state", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="The control plane's state directory.")
@click.option("--repo", default=None, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Its settings repository (a local path) [default: <state>/settings.git, else the mirror "
                   "<state>/settings-mirror.git].")
@click.option("--branch", default=None, help="The settings branch [default: the repository's llmgw.branch, else main].")
@click.option("--store", "store_url", envvar="LLMGW_STORE", default=None, metavar="URL",
              help="Its store [default: the one recorded in <state>/store.json].")
def backup_command(out: Path, state_dir: Path, repo: Path | None, branch: str | None, store_url: str | None) -> None:
    """Write one archive (mode 0600) of the control plane: its store (an online SQLite copy, or pg_dump of its
    PostgreSQL schema), its CA with the CA's private key, the admin token, the secrets and the settings repository's
    branches and audit refs. The control plane may keep running."""
    from llmgw.backup import write_backup
    from llmgw.cli.credentials import resolve_store_url
    from llmgw.store import read_store_record

    url = resolve_store_url(state_dir, store_url)
    record = read_store_record(state_dir)
    secrets_dir = Path(record.secrets_dir) if record and record.secrets_dir else None
    settings = _settings_repo(state_dir, repo)
    began = time.monotonic()
    summary = write_backup(state_dir, out, store_url=url, repo=settings, branch=branch or _branch(settings),
                           secrets_dir=secrets_dir)
    size = out.stat().st_size
    ca = "the CA" if summary.manifest.holds_ca_key else f"no CA (none in {state_dir / 'ca'})"
    secrets = sum(1 for member in summary.manifest.members if member.name.startswith("secrets/"))
    held = f"{secrets} secret{'' if secrets == 1 else 's'}" if secrets else "no secrets (none in the state)"
    click.echo(f"Wrote {out} ({len(summary.manifest.members)} files, {size / 1e6:.1f} MB, mode 0600) in "
               f"{time.monotonic() - began:.1f} s: the {summary.manifest.store_kind} store, {ca}, the admin token, "
               f"{held} and the settings refs of {settings}.")
    if summary.manifest.holds_ca_key:
        click.echo("It holds the CA's private key and the admin token: whoever reads it can issue node certificates "
                   "and act as an operator. Keep it as you keep the CA key.")
    else:
        click.echo("It holds the admin token: keep it where only the control plane's operators can read it.")


@click.command("restore")
@click.argument("archive", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--state", "state_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The new state directory (empty or absent).")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="For an archive of a PostgreSQL store: the postgresql:// URL whose (empty) schema receives it.")
def restore_command(archive: Path, state_dir: Path, store_url: str | None) -> None:
    """Bring a control plane back from ARCHIVE on a new state directory: every member's digest is checked first
    (a damaged archive is refused, naming the member), then the store, the CA, the admin token, the secrets and the
    settings repository (<state>/settings.git) are written. Agents that joined before reconnect without joining
    again."""
    from llmgw.backup import restore_backup
    from llmgw.store import redacted

    began = time.monotonic()
    summary = restore_backup(archive, state_dir, store_url=store_url)
    click.echo(f"Restored {archive} (written {summary.manifest.created} by llmgw {summary.manifest.llmgw_version}) "
               f"into {state_dir} in {time.monotonic() - began:.1f} s; store {redacted(summary.store)}.")
    store = f" --store {redacted(store_url)}" if store_url else ""  # over a store: in llmgw.yaml naming the old one
    if summary.manifest.holds_ca_key:
        click.echo(f"Start it with: llmgw server --repo {summary.repo} --state {state_dir}{store} --tls "
                   "--agents HOST:PORT (the address the agents dial: the old control plane's, or move it there)")
    else:  # no CA: agents join it as they joined the old one (a --tls start would make a new CA)
        click.echo(f"Start it with: llmgw server --repo {summary.repo} --state {state_dir}{store} (the archive "
                   "holds no CA: the old control plane served agents without TLS)")
    if store_url:
        click.echo("--store overrides a store: in llmgw.yaml, which may still name the old database.")


def register(group: click.Group) -> None:
    group.add_command(backup_command)
    group.add_command(restore_command)
