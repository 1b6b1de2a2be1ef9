"""`llmgw upgrade RELEASE_DIR`: roll a signed release of llmgw out to every agent over its stream, node by node.

    llmgw upgrade RELEASE_DIR [--trusted-key KEY | --settings DIR] [--max-unavailable N] [--paused]
                  [--confirm-timeout 120s] [--ready-timeout 300s] [--no-wait] [--url ...]
    llmgw upgrade RELEASE_DIR (--trusted-key KEY | --settings DIR) --control-plane HOST [--control-plane HOST ...]
                  [--control-planes-only] [--user U] [--port P] [--ssh-key FILE] [--ssh-config FILE] [...]
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

With `--control-plane HOST` (each control plane's host, reached over ssh as `llmgw server add` reaches it) the
control planes go first (llmgw.cli.server_upgrade): the standbys one at a time, then the leader, which hands over
to an upgraded standby as it restarts; each is back with the new version before the next starts, and one that does
not come back is switched back and the upgrade stops. Then the agents' rollout above runs on the host of the new
leader (`llmgw upgrade` there, the release copied over ssh, its output shown here), unless --control-planes-only.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import time
from pathlib import Path

import click

from llmgw.cli.node_add import admin_options, ssh_argv, ssh_options
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
@click.option("--confirm-timeout", default="120s", show_default=True, metavar="DURATION",
              help="How long a node's new agent has to register before the node rolls back by itself (and a "
                   "--control-plane's restarted control plane to answer before it is switched back).")
@click.option("--ready-timeout", default="300s", show_default=True, metavar="DURATION",
              help="How long a node's replicas have to be ready again after its agent is back.")
@click.option("--pause", "pause", is_flag=True, help="Pause the upgrade under way: no further node starts.")
@click.option("--resume", "resume", is_flag=True, help="Resume a paused upgrade.")
@click.option("--no-wait", is_flag=True, help="Return once the rollout started (`llmgw status` shows it).")
@click.option("--json", "as_json", is_flag=True, help="Print the rollout's node lines as JSON.")
@click.option("--control-plane", "planes", multiple=True, metavar="HOST",
              help="A control plane's host, upgraded over ssh first: standbys, then the leader (repeatable; name "
                   "every control plane; needs --trusted-key or --settings).")
@click.option("--control-planes-only", is_flag=True, help="Upgrade the --control-plane hosts and stop there.")
@ssh_options
@admin_options
def upgrade_cmd(release_dir, keys, settings_dir, max_unavailable, start_paused, confirm_timeout, ready_timeout, pause,
                resume, no_wait, as_json, planes, control_planes_only, user, port, ssh_key, ssh_config, url, token,
                state_dir):
    """Upgrade the control planes (--control-plane, over ssh), then every agent to the signed release in
    RELEASE_DIR (`llmgw release build`) over its stream, node by node, engines serving throughout."""
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    if pause + resume + (release_dir is not None) != 1:
        raise UsageError("say one of: a RELEASE_DIR to upgrade to, --pause, or --resume")
    if control_planes_only and not planes:
        raise UsageError("--control-planes-only upgrades the --control-plane hosts: name them")
    if planes:
        if not (keys or settings_dir):
            raise UsageError("--control-plane needs --trusted-key or --settings: the release is verified here "
                             "before it goes to a host")
        sys.exit(_through_control_planes(
            release_dir, keys, settings_dir, planes, lambda host: ssh_argv(host, user, port, ssh_key, ssh_config),
            _seconds(confirm_timeout, "--confirm-timeout"), control_planes_only,
            [f"--max-unavailable {max_unavailable}", "--paused" if start_paused else "",
             f"--confirm-timeout {_seconds(confirm_timeout, '--confirm-timeout')}s",
             f"--ready-timeout {_seconds(ready_timeout, '--ready-timeout')}s", "--no-wait" if no_wait else "",
             "--json" if as_json else ""]))
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


AGENTS_SCRATCH = "/var/tmp/llmgw-upgrade-agents"
"""The leader's host's directory for the release while `llmgw upgrade` runs there (removed after)."""


def _through_control_planes(release_dir: Path, keys, settings_dir, planes, ssh_for, timeout: float,
                            only: bool, options: list[str]) -> int:
    """The control planes on `planes` upgraded (llmgw.cli.server_upgrade), then, unless `only`, the agents' rollout
    run by `llmgw upgrade` on the new leader's host with `options`, its output shown as it comes. The exit
    status. Raises InstallError or UsageError from the control planes' part."""
    import subprocess

    from llmgw.cli.node_add import release_tar as host_release_tar
    from llmgw.cli.node_add import run_steps
    from llmgw.cli.server_upgrade import Release, upgrade_control_planes
    from llmgw.install import onboarding

    release = Release.verified(release_dir, keys, settings_dir)
    click.echo(f"release llmgw {release.manifest.version} verified here: {len(release.manifest.files)} files, "
               f"signed by key {release.manifest.key_id}")
    leader = upgrade_control_planes(planes, ssh_for, release, timeout)
    if only:
        return 0
    ssh = ssh_for(leader.host)
    facts = onboarding.NodeFacts(release.manifest.version, release.manifest.llmgw_wheel, leader.host, "-", "",
                                 AGENTS_SCRATCH)
    copy = onboarding.check_steps(facts, doctor=False)[1:]  # the release copied and its digests checked
    run_steps(leader.host, ssh, copy, len(copy), [onboarding.undo_steps(facts)[-1]],
              host_release_tar(release.directory, release.manifest, release.signer))
    click.echo(f"[{leader.host}] the agents' rollout, run by the leader's host:")
    command = (f"{onboarding.LLMGW} upgrade {AGENTS_SCRATCH} --state {onboarding.SERVER_STATE} "
               + " ".join(option for option in options if option) + f"; status=$?; rm -rf {AGENTS_SCRATCH}; "
               "exit $status")
    with subprocess.Popen([*ssh, command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            click.echo(f"[{leader.host}] {line.rstrip()}")
    return proc.returncode


def register(group: click.Group) -> None:
    """Add `upgrade` to the `llmgw` command."""
    group.add_command(upgrade_cmd)
