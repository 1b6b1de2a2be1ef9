"""Control planes upgraded over ssh, the standbys first and the leader last: `llmgw server upgrade HOST` and the
first part of `llmgw upgrade RELEASE_DIR --control-plane HOST ...`.

    llmgw server upgrade HOST --release DIR (--trusted-key KEY | --settings DIR) [--confirm-timeout 120s]
                         [--user U] [--port P] [--ssh-key FILE] [--ssh-config FILE] [--dry-run]

A control plane set up by `llmgw server init` (or `server add`) runs as the user llmgw from /opt/llmgw/current, which
that user cannot write: its upgrade is done over the operator's ssh, as root, like its install. On the host
(llmgw.install.onboarding): the release copied into a scratch directory and its digests checked, installed beside
the running one (/opt/llmgw/<version>, journaled), `current` switched to it, the control plane restarted from it
(SIGTERM: it drains its gateway and, leading, releases the leader lease, so an upgraded standby takes over; systemd's
`systemctl restart` where systemd runs). Then it waits until the control plane answers again with the new version
and serves (its fleet back; `llmgw status --state /var/lib/llmgw/server --json` run on the host, polled), then
SETTLE seconds for load balancers to see it (until its admin-url file is newer than the restart's mark, a shell
test answers the poll, not a Python start). One that does not within --confirm-timeout
is switched back to the version it ran and restarted from it, and the command fails saying so with the last lines
of its log.

`upgrade_control_planes` orders several: those that stand by first, the leader last (each host asked which it is),
one at a time, each back before the next; hosts that run the release already are skipped.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from llmgw.cli.node_add import _run_step, _words, release_options, release_tar, run_steps, ssh_argv, ssh_options
from llmgw.errors import InstallError, UsageError

SCRATCH = "/var/tmp/llmgw-upgrade"
"""The host's directory for the release while it installs (removed after)."""
BACK_TIMEOUT = 120.0
"""Seconds a restarted control plane has to answer with the new version before it is switched back."""
POLL = 1.0
NOT_OPENED = "it has not opened its admin API since it was restarted"
"""What `ask_plane` says of a control plane whose admin-url is older than its restart (onboarding.RESTART_MARK)."""
SETTLE = 5.0
"""Seconds between one control plane back and serving and the next one's restart, so that load balancers' health
checks (docs/ha.md's haproxy checks every 2 s) see it back before the next one goes away."""


@dataclass(frozen=True)
class PlaneOnHost:
    """What a host's control plane says of itself (`llmgw status --state ... --json` there): the `version` it runs,
    whether it `leads`, whether it `serves` (its fleet is back: its gateway's /health answers 200, so a load balancer
    sends it requests); `error`: why it could not be asked ("" when it answered)."""

    host: str
    version: str = ""
    leads: bool = False
    error: str = ""
    serves: bool = True


def ask_plane(host: str, ssh: Sequence[str]) -> PlaneOnHost:
    """Ask the control plane on `host` (over `ssh`) for its version and leadership. Never raises: a control plane
    that does not answer (stopped, restarting, not set up there) is a PlaneOnHost with its `error`."""
    from llmgw.install.onboarding import LLMGW, RESTART_MARK, SERVER_STATE

    opened = (f"[ ! -e {RESTART_MARK} ] || [ {SERVER_STATE}/admin-url -nt {RESTART_MARK} ] || "
              f"{{ echo '{NOT_OPENED}' >&2; exit 3; }}")
    try:
        done = subprocess.run([*ssh, f"{opened}; {LLMGW} status --state {SERVER_STATE} --json"], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return PlaneOnHost(host, error="no answer over ssh within 60 s")
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines()
        return PlaneOnHost(host, error=said[-1] if said else f"exit status {done.returncode}")
    try:
        plane = json.loads(done.stdout)["control_plane"]
        return PlaneOnHost(host, str(plane["version"]), bool(plane.get("leader")),
                           serves=str(plane.get("fleet", "ready")).startswith("ready"))
    except (ValueError, KeyError, TypeError) as exc:
        return PlaneOnHost(host, error=f"its status is not what llmgw writes ({exc!r})")


def upgrade_order(planes: Sequence[PlaneOnHost], version: str) -> list[PlaneOnHost]:
    """The control planes to upgrade to `version`, standbys first (in the order given) and the leader last; those
    that run `version` already are left out. Raises UsageError naming a host that did not answer or runs a newer
    version (a control plane is never taken back by an upgrade), or when several say they lead."""
    from llmgw.control.upgrade_run import version_refusal

    for plane in planes:
        if plane.error:
            raise UsageError(f"the control plane on {plane.host} did not say what it runs ({plane.error}): start it "
                             "(or leave it out of --control-plane), then run the upgrade again")
        if version_refusal(plane.version, version) is not None:
            raise UsageError(f"the control plane on {plane.host} runs llmgw {plane.version}, newer than the release "
                             f"({version}): an upgrade never takes a control plane back")
    leaders = [p.host for p in planes if p.leads]
    if len(leaders) > 1:
        raise UsageError(f"{' and '.join(leaders)} both say they lead: wait until one leads, then run it again")
    todo = [p for p in planes if p.version != version]
    return [p for p in todo if not p.leads] + [p for p in todo if p.leads]


def wait_back(host: str, ssh: Sequence[str], version: str, timeout: float,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> PlaneOnHost:
    """Poll the control plane on `host` until it answers with `version` and serves (its fleet back); what it said
    last. Raises InstallError when it does not within `timeout` seconds (with what it said last)."""
    deadline, last = clock() + timeout, PlaneOnHost(host, error="not asked yet")
    while clock() < deadline:
        last = ask_plane(host, ssh)
        if not last.error and last.version == version and last.serves:
            return last
        sleep(POLL)
    said = last.error or (f"it answers with llmgw {last.version}" if last.version != version
                          else "its fleet is not back: its gateway does not serve yet")
    raise InstallError(f"the control plane on {host} did not answer with llmgw {version} within {timeout:g} s "
                       f"({said})")


def _log_tail(ssh: Sequence[str]) -> str:
    from llmgw.install.onboarding import SERVER_LOG, SERVER_UNIT

    done = subprocess.run([*ssh, f"if [ -d /run/systemd/system ]; then journalctl -u {SERVER_UNIT} -n 5 --no-pager; "
                                 f"else tail -n 5 {SERVER_LOG}; fi"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


@dataclass(frozen=True)
class Release:
    """A verified release to install: its `directory`, `manifest` and the text of the key that verified it."""

    directory: Path
    manifest: object
    signer: str

    @classmethod
    def verified(cls, directory: Path, keys: Sequence[str], settings_dir: Path | None) -> Release:
        """Verify the release in `directory` against the keys given (`--trusted-key`, `--settings`); it, verified.
        Raises ReleaseError (it does not check) or UsageError (no key)."""
        from llmgw.cli.release_cmds import _trusted
        from llmgw.release import trusted_public_keys, verify_release

        trusted = trusted_public_keys(_trusted(tuple(keys), settings_dir))
        manifest = verify_release(directory, trusted)
        signer = next(key for key in trusted if key.id_text == manifest.key_id)
        return cls(directory, manifest, signer.file_text())


def _facts(release: Release, host: str):
    """The install facts of `release` on `host` (llmgw.install.onboarding.NodeFacts): the scratch directory SCRATCH,
    the release's record kept in the venv."""
    from llmgw.install import onboarding
    from llmgw.release import MANIFEST, PUBLIC_KEY_FILE, RECORD_DIR, SIGNATURE

    return onboarding.NodeFacts(release.manifest.version, release.manifest.llmgw_wheel, host, "-", "", SCRATCH,
                                (MANIFEST, SIGNATURE, PUBLIC_KEY_FILE), RECORD_DIR)


def upgrade_plane(plane: PlaneOnHost, ssh: Sequence[str], release: Release, timeout: float = BACK_TIMEOUT) -> None:
    """Upgrade the control plane on `plane.host` to `release` (module docstring) and wait until it answers with the
    new version. Raises InstallError: a step failed (what ran before the switch is undone; after it, switched back),
    or it did not come back in time (switched back, restarted, the log's last lines in the sentence)."""
    from llmgw.install import onboarding

    manifest, host = release.manifest, plane.host
    facts = _facts(release, host)
    checks = onboarding.check_steps(facts, doctor=False)
    steps = onboarding.server_upgrade_steps(facts)
    switch = next(i for i, step in enumerate(steps) if step.what.startswith(f"link {onboarding.OPT}/current"))
    tar = release_tar(release.directory, manifest, release.signer)
    run_steps(host, list(ssh), [*checks, *steps[:switch]], len(checks), onboarding.server_upgrade_undo(facts), tar)
    back = onboarding.server_rollback_steps(facts, plane.version)
    try:
        for step in steps[switch:]:
            click.echo(f"[{host}] {step.what}")
            done = _run_step(list(ssh), step, tar)
            if done.returncode:
                raise InstallError(f"{host}: {step.what} failed: {_words(done)}")
        wait_back(host, ssh, manifest.version, timeout)
    except InstallError as exc:
        log = _log_tail(ssh)  # the new version's last words, before the old one writes its own
        click.echo(f"[{host}] switching back to llmgw {plane.version}")
        for step in [*back, onboarding.server_upgrade_undo(facts)[-1]]:
            click.echo(f"[{host}] {step.what}")
            done = _run_step(list(ssh), step, tar)
            if done.returncode:
                raise InstallError(f"{exc}; switching back failed too ({step.what}: {_words(done)}): on {host}, "
                                   f"link {onboarding.OPT}/current to {plane.version} and restart the control "
                                   "plane") from exc
        try:
            wait_back(host, ssh, plane.version, max(timeout, BACK_TIMEOUT))  # the version it ran: its own time
        except InstallError as again:
            raise InstallError(f"{exc}; switched back to llmgw {plane.version}, but {again}. Its log ends: "
                               f"{log}") from exc
        raise InstallError(f"{exc}; it runs llmgw {plane.version} again. Its log ends: {log}") from exc


def upgrade_control_planes(hosts: Sequence[str], ssh_for: Callable[[str], list[str]], release: Release,
                           timeout: float = BACK_TIMEOUT) -> PlaneOnHost:
    """Upgrade the control planes on `hosts` to `release`, standbys first and the leader last (`upgrade_order`),
    each back before the next. Returns the one that leads at the end (asked again). Raises UsageError
    (`upgrade_order`) or InstallError (`upgrade_plane`, or no host leads at the end)."""
    version = release.manifest.version
    planes = [ask_plane(host, ssh_for(host)) for host in hosts]
    for plane in planes:
        if not plane.error:
            click.echo(f"[{plane.host}] control plane: llmgw {plane.version}, {'leads' if plane.leads else 'stands by'}")
    order = upgrade_order(planes, version)
    for plane in order:
        started = time.monotonic()
        click.echo(f"[{plane.host}] upgrading the control plane ({'leads: last' if plane.leads else 'stands by'}) "
                   f"from llmgw {plane.version} to {version}")
        upgrade_plane(plane, ssh_for(plane.host), release, timeout)
        click.echo(f"[{plane.host}] control plane back with llmgw {version} in {time.monotonic() - started:.1f} s")
        if plane is not order[-1]:
            time.sleep(SETTLE)  # load balancers see it back before the next one goes away
    deadline = time.monotonic() + timeout
    while True:
        now = [ask_plane(host, ssh_for(host)) for host in hosts]
        leader = next((p for p in now if p.leads and p.version == version), None)
        if leader is not None:
            click.echo(f"control planes on llmgw {version}; {leader.host} leads")
            return leader
        if time.monotonic() > deadline:
            raise InstallError(f"no control plane of {', '.join(hosts)} leads with llmgw {version} within "
                               f"{timeout:g} s: " + "; ".join(f"{p.host}: {p.error or p.version}" for p in now))
        time.sleep(POLL)


@click.command("upgrade")
@click.argument("host")
@release_options
@click.option("--confirm-timeout", "timeout_text", default="120s", show_default=True, metavar="DURATION",
              help="How long the restarted control plane has to answer with the new version before it is switched "
                   "back (as `llmgw upgrade --confirm-timeout`).")
@ssh_options
@click.option("--dry-run", is_flag=True, help="Print every command it would run on the host; connect to nothing.")
def upgrade_cmd(host, release_dir, keys, settings_dir, timeout_text, user, port, ssh_key, ssh_config, dry_run):
    """Upgrade the control plane on HOST over ssh to a verified release (beside the running one; switched back when
    it does not come back). With several control planes, upgrade the standbys first: `llmgw upgrade --control-plane`
    orders them itself."""
    from llmgw.units import parse_duration

    release = Release.verified(release_dir, keys, settings_dir)
    version = release.manifest.version
    click.echo(f"release llmgw {version} verified: {len(release.manifest.files)} files, signed by key "
               f"{release.manifest.key_id}")
    ssh = ssh_argv(host, user, port, ssh_key, ssh_config)
    if dry_run:
        from llmgw.install import onboarding

        facts = _facts(release, host)
        for step in [*onboarding.check_steps(facts, doctor=False), *onboarding.server_upgrade_steps(facts)]:
            click.echo(f"# {step.what}\n{subprocess.list2cmdline([*ssh, step.command])}"
                       + (" < the release (tar)" if step.release else ""))
        return
    try:
        timeout = parse_duration(timeout_text)
    except ValueError as exc:
        raise UsageError(f"--confirm-timeout {timeout_text!r}: {exc}") from None
    upgrade_control_planes([host], lambda _: ssh, release, timeout)


def register(group: click.Group) -> None:
    """Add `server upgrade` to the `server` group (llmgw.cli.server_cmds registers the group first)."""
    from llmgw.cli.server_cmds import server_cmd

    server_cmd.add_command(upgrade_cmd)
    group.add_command(server_cmd)
