"""`llmgw upgrade RELEASE_DIR`: roll a signed release of llmgw out to every agent over its stream, node by node.

    llmgw upgrade RELEASE_DIR [--trusted-key KEY | --settings DIR] [--max-unavailable N] [--paused]
                  [--confirm-timeout 120s] [--ready-timeout 300s] [--no-wait] [--url ...]
    llmgw upgrade --pause | --resume

The release (`llmgw release build`) is checked here first when keys are given (as `llmgw node add` does), then sent
to the control plane (its admin API) as a tar of its manifest, signature and files. The control plane verifies it
against releases.trusted_keys of its settings and rolls it out (llmgw.control.upgrades): each agent receives it in
pieces over its stream, verifies it again, installs it beside the version it runs (/opt/llmgw/<version>), flips
`current`, re-executes itself (its engines keep running and are adopted, same pids) and registers with the new
version; the next node starts once this one is back and its replicas are ready (at most --max-unavailable nodes at
once). A node whose new agent does not register within --confirm-timeout rolls back to the previous version by
itself, and the upgrade stops with the reason. Progress is printed as it goes (and is in `llmgw status`). Exit 0 once
every node runs the release, 1 when the upgrade failed.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import time
from pathlib import Path

import click

from llmgw.cli.node_add import admin_options
from llmgw.errors import LlmgwError, UsageError
from llmgw.units import parse_duration

POLL = 1.0


def release_tar(directory: Path) -> tuple[str, bytes]:
    """(version, tar bytes) of the release in `directory`: its manifest, its signature and every file the manifest
    lists (read, not verified: the control plane and each agent verify it). Raises ReleaseError when the manifest
    cannot be read."""
    from llmgw.errors import ReleaseError
    from llmgw.release import MANIFEST, SIGNATURE, parse_manifest

    try:
        manifest = parse_manifest((directory / MANIFEST).read_bytes())
    except OSError as exc:
        raise ReleaseError(f"{directory} is not a release: {exc} (make one with `llmgw release build`)") from exc
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in (MANIFEST, SIGNATURE, *(f.path for f in manifest.files)):
            tar.add(directory / name, arcname=name, recursive=False)
    return manifest.version, buffer.getvalue()


def _seconds(text: str, option: str) -> int:
    try:
        return max(1, round(parse_duration(text)))
    except ValueError as exc:
        raise UsageError(f"{option} {text!r} is not a duration ({exc}): write e.g. 120s or 5m") from exc


def _line(node: dict) -> str:
    return f"{node['node']:<20} {node['phase']:<11} {node.get('message', '')}"


def _follow(client, as_json: bool) -> bool:
    """Print each node's phase as it changes until the rollout ends; True when it is done."""
    shown: dict[str, tuple[str, str]] = {}
    while True:
        upgrade = client.get("/api/v1/status").get("upgrade")
        if not upgrade:
            raise LlmgwError("the control plane knows no upgrade any more (it was started again, or another took the "
                             "lead): `llmgw status` shows the nodes' versions; run `llmgw upgrade` again for the rest")
        for node in upgrade.get("nodes", []):
            now = (node["phase"], node.get("message", ""))
            if shown.get(node["node"]) != now:
                shown[node["node"]] = now
                click.echo(json.dumps(node) if as_json else _line(node))
        if upgrade.get("ended_at") is not None:
            done = upgrade.get("state") == "done"
            if not as_json:
                click.echo(f"upgrade to llmgw {upgrade['version']} {upgrade['state']}"
                           + (f": {upgrade['reason']}" if upgrade.get("reason") else "")
                           + f" in {upgrade['ended_at'] - upgrade['started_at']:.1f} s")
            return done
        time.sleep(POLL)


@click.command("upgrade")
@click.argument("release_dir", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--trusted-key", "keys", multiple=True, metavar="KEY",
              help="Check the release here first against this public key (a key line or .pub file; repeatable).")
@click.option("--settings", "settings_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="Check the release here first against this settings tree's releases.trusted_keys.")
@click.option("--max-unavailable", default=1, show_default=True, type=click.IntRange(1),
              help="Nodes upgrading at once (each is away from its restart until its replicas are ready again).")
@click.option("--paused", "start_paused", is_flag=True, help="Plan the rollout but start no node (--resume starts).")
@click.option("--confirm-timeout", default="120s", show_default=True,
              help="How long a node's new agent has to register before the node rolls back by itself.")
@click.option("--ready-timeout", default="300s", show_default=True,
              help="How long a node's replicas have to be ready again after its agent is back.")
@click.option("--pause", "pause", is_flag=True, help="Pause the upgrade under way: no further node starts.")
@click.option("--resume", "resume", is_flag=True, help="Resume a paused upgrade.")
@click.option("--no-wait", is_flag=True, help="Return once the rollout started (`llmgw status` shows it).")
@click.option("--json", "as_json", is_flag=True, help="Print the rollout's node lines as JSON.")
@admin_options
def upgrade_cmd(release_dir, keys, settings_dir, max_unavailable, start_paused, confirm_timeout, ready_timeout, pause,
                resume, no_wait, as_json, url, token, state_dir):
    """Upgrade every agent to a signed release over its stream, node by node, engines serving throughout."""
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    if pause + resume + (release_dir is not None) != 1:
        raise UsageError("say one of: a RELEASE_DIR to upgrade to, --pause, or --resume")
    url, token = resolve_admin(url, token, state_dir)
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        if pause or resume:
            upgrade = client.post(f"/api/v1/upgrade/{'pause' if pause else 'resume'}")["upgrade"]
            click.echo(f"upgrade to llmgw {upgrade['version']}: {upgrade['state']}")
            if resume and not no_wait:
                sys.exit(0 if _follow(client, as_json) else 1)
            return
        if keys or settings_dir:
            from llmgw.cli.release_cmds import _trusted
            from llmgw.release import verify_release

            manifest = verify_release(release_dir, _trusted(keys, settings_dir))
            click.echo(f"release llmgw {manifest.version} verified here: {len(manifest.files)} files, signed by key "
                       f"{manifest.key_id}")
        version, tar = release_tar(release_dir)
        started = client.post_bytes("/api/v1/upgrade", tar, "application/octet-stream", max_unavailable=max_unavailable,
                                    paused=int(start_paused),
                                    confirm_seconds=_seconds(confirm_timeout, "--confirm-timeout"),
                                    ready_timeout=_seconds(ready_timeout, "--ready-timeout"))["upgrade"]
        click.echo(f"upgrading {len(started['nodes'])} node(s) to llmgw {version}, {max_unavailable} at a time"
                   + "".join(f"\n  {note}" for note in started.get("notes", [])))
        if no_wait or start_paused:
            return
        sys.exit(0 if _follow(client, as_json) else 1)


def register(group: click.Group) -> None:
    """Add `upgrade` to the `llmgw` command."""
    group.add_command(upgrade_cmd)
