"""`llmgw node add HOST`: put a verified release of llmgw onto a machine over ssh and make it a node.

    llmgw node add HOST --release DIR (--trusted-key KEY | --settings DIR) [--control-plane HOST:PORT]
                   [--user U] [--port P] [--ssh-key FILE] [--ssh-config FILE] [--node-id ID] [--force]
                   [--min-disk SIZE] [--dry-run]

The release is checked here first (its signature by a trusted key, every file's digest: llmgw.release); nothing is
sent to a host for a release that does not check. Then the steps of llmgw.install.onboarding run on HOST with the
operator's own ssh (keys and ~/.ssh/config, or the options above), each shown as it goes: the host's Python, the
release copied into a scratch directory and its digests checked there, `llmgw node doctor` run from the release's wheels
unpacked in that scratch directory, before anything is installed (a host that cannot serve, or has less than --min-disk free
where weights go, stops there with the failed checks in its own words; --force skips it), the install into
/opt/llmgw/<version> (with the release's signed manifest and the key that signed it, which doctor and `llmgw nodes`
show), the CA, a one-time join token (asked of the control plane only then, through its admin API: --url,
--token, --state as for `llmgw status`), agent.env, llmgw-agent.service, the agent started, and the wait until
it is connected. Every change on the host goes into the host's install journal first; a step that fails, or whose
ssh connection is cut, undoes the host from it (over a new connection) and says so, with the host's own words.
`--dry-run` prints every command it would run on the host and connects to nothing.

It returns once the node is connected (`CONNECT_TIMEOUT`) and its engines are installable (`INSTALLABLE_TIMEOUT`):
`llmgw node doctor --installable` on the host passes (llmgw.agent.doctor_install: the agent has its settings from the
control plane, and reads every mirror they name, showing what each holds), polled over ssh with each reason shown.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import click

from llmgw.cli.release_cmds import _trusted
from llmgw.errors import InstallError

SCRATCH = "/var/tmp/llmgw-add"
STATE_LLMGW = "/opt/llmgw/current/bin/llmgw"
"""The installed release's llmgw on the host (llmgw.install.onboarding's layout)."""
MIN_DISK = "20Gi"
"""The free space `node add` asks of a host where weights go (`--min-disk`): one 8B model's weights and more."""


def ssh_argv(host: str, user: str | None, port: int | None, key: Path | None, config: Path | None) -> list[str]:
    """The ssh command line (without the remote command) for HOST with the operator's options."""
    argv = ["ssh", "-o", "BatchMode=yes"]
    if config:
        argv += ["-F", str(config)]
    if port:
        argv += ["-p", str(port)]
    if key:
        argv += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
    if user:
        argv += ["-l", user]
    return [*argv, host]


def release_tar(directory: Path, manifest, signer: str) -> bytes:
    """The release's files that the manifest lists, its manifest and signature, SHA256SUMS (sha256sum's format,
    from the verified manifest) and `signer`, the text of the trusted public key that verified it
    (PUBLIC_KEY_FILE), as one tar stream."""
    from llmgw.install.onboarding import SUMS
    from llmgw.release import MANIFEST, PUBLIC_KEY_FILE, SIGNATURE

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in (MANIFEST, SIGNATURE, *(f.path for f in manifest.files)):
            tar.add(directory / name, arcname=name, recursive=False)
        for name, text in ((SUMS, "".join(f"{f.sha256}  {f.path}\n" for f in manifest.files)),
                           (PUBLIC_KEY_FILE, signer)):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def _run_step(ssh: list[str], step, release: bytes) -> subprocess.CompletedProcess:
    stdin = release if step.release else step.payload
    try:
        return subprocess.run([*ssh, step.command], input=stdin if stdin is not None else b"",
                              capture_output=True, timeout=1800)
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{step.what}: no answer from the host in {exc.timeout:g} s") from exc


def _words(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr or done.stdout or b"").decode(errors="replace").strip()
    return text.splitlines()[-1] if text else f"exit status {done.returncode}"


def run_steps(host: str, ssh: list[str], steps, first_change: int, undo, release: bytes) -> None:
    """Run `steps` on the host in order, each announced; on a failure at index >= `first_change` run `undo` (the
    journal's undo and the scratch directory's removal) first, over a new connection when ssh was cut (exit
    status 255 and no output: the journal recorded each change before making it, so a step cut halfway is undone
    too). Raises InstallError in the host's own words."""
    for index, step in enumerate(steps):
        click.echo(f"[{host}] {step.what}")
        done = _run_step(ssh, step, release)
        if done.returncode == 0:
            continue
        cut = done.returncode == 255 and not done.stdout
        if cut and index == 0:
            raise InstallError(f"ssh to {host} failed: {_words(done)}")
        failed = (f"ssh to {host} was cut during {step.what} ({_words(done)})" if cut
                  else f"{host}: {step.what} failed: {_words(done)}")
        if index < first_change:
            _run_step(ssh, undo[-1], release)  # only the scratch directory to remove
            if cut:
                raise InstallError(f"{failed}; nothing was installed")
            raise InstallError(f"{host} cannot take llmgw: {step.what}: {_words(done)}; nothing was installed")
        undone = [_run_step(ssh, u, release) for u in undo]  # over a new connection when the last one was cut
        what = ("the host was undone from its install journal, as it was before" if not undone[0].returncode
                else f"undoing failed too ({_words(undone[0])}): once the host answers, run `{undo[0].command}` "
                     "there (the install journal lists what is left)")
        raise InstallError(f"{failed}; {what}")


def ssh_options(command):
    """The ssh options of `node add` and `node remove`: --user, --port, --ssh-key, --ssh-config (see `ssh_argv`)."""
    for option in reversed([
        click.option("--user", default=None, help="ssh user [default: yours, or ~/.ssh/config's]."),
        click.option("--port", type=int, default=None, help="ssh port [default: ssh's own, from ~/.ssh/config or 22]."),
        click.option("--ssh-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="Private key for ssh (ssh -i) [default: the keys ssh finds itself]."),
        click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="ssh configuration file (ssh -F) [default: ~/.ssh/config]."),
    ]):
        command = option(command)
    return command


def release_options(command):
    """A verified release and who is trusted to sign it: --release, --trusted-key, --settings."""
    for option in reversed([
        click.option("--release", "release_dir", required=True,
                     type=click.Path(exists=True, file_okay=False, path_type=Path),
                     help="The release directory (`llmgw release build`)."),
        click.option("--trusted-key", "keys", multiple=True, metavar="KEY",
                     help="A trusted public key: its key line (RW...) or its .pub file (repeatable)."),
        click.option("--settings", "settings_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
                     default=None, help="A settings tree whose llmgw.yaml releases.trusted_keys are trusted."),
    ]):
        command = option(command)
    return command


def admin_options(command):
    """Where the control plane's admin API is: --url, --token, --state (`llmgw.control.client.resolve_admin`)."""
    for option in reversed([
        click.option("--url", envvar="LLMGW_ADMIN_URL", default=None,
                     help="The control plane's admin API [default: <state>/admin-url]."),
        click.option("--token", envvar="LLMGW_ADMIN_TOKEN", default=None,
                     help="Its admin token [default: <state>/admin-token]."),
        click.option("--state", "state_dir", envvar="LLMGW_STATE", default=None, type=click.Path(path_type=Path),
                     help="The control plane's state directory (where admin-url and admin-token are)."),
    ]):
        command = option(command)
    return command


@click.command("add")
@click.argument("host")
@release_options
@click.option("--control-plane", "control_plane", default=None, metavar="HOST:PORT",
              help="The agents' listener as the node reaches it [default: the admin URL's host, port 8082].")
@click.option("--node-id", default=None, help="The node's id [default: HOST].")
@ssh_options
@click.option("--force", is_flag=True, help="Go on without `llmgw node doctor` on the host.")
@click.option("--min-disk", default=MIN_DISK, show_default=True, metavar="SIZE",
              help="Free space the host needs where weights go (/var/lib/llmgw): less fails its doctor.")
@click.option("--dry-run", is_flag=True, help="Print every command it would run on the host; connect to nothing.")
@admin_options
def add_cmd(host, release_dir, keys, settings_dir, control_plane, node_id, user, port, ssh_key, ssh_config, force,
            min_disk, dry_run, url, token, state_dir):
    """Install a verified release on HOST over ssh and make it a node (journaled; undone on failure)."""
    from llmgw.install import onboarding
    from llmgw.install.packaged import units_dir
    from llmgw.release import (
        MANIFEST, PUBLIC_KEY_FILE, RECORD_DIR, SIGNATURE, trusted_public_keys, verify_release,
    )

    trusted = trusted_public_keys(_trusted(keys, settings_dir))
    manifest = verify_release(release_dir, trusted)
    signer = next(key for key in trusted if key.id_text == manifest.key_id)
    click.echo(f"release llmgw {manifest.version} verified: {len(manifest.files)} files, signed by key "
               f"{manifest.key_id}")
    node_id = node_id or host
    if control_plane is None and not dry_run:  # the admin URL's host, the agents' default port
        from llmgw.control.client import resolve_admin

        control_plane = resolve_admin(url, token, state_dir)[0].split("://", 1)[-1].rsplit(":", 1)[0] + ":8082"
    facts = onboarding.NodeFacts(manifest.version, manifest.llmgw_wheel, node_id, control_plane or "CONTROL-PLANE:8082",
                                 (units_dir() / onboarding.UNIT).read_text(), SCRATCH,
                                 (MANIFEST, SIGNATURE, PUBLIC_KEY_FILE), RECORD_DIR)
    checks = onboarding.check_steps(facts, doctor=not force, min_disk=_size_text(min_disk))
    steps = checks + onboarding.install_steps(facts)
    ssh = ssh_argv(host, user, port, ssh_key, ssh_config)
    if dry_run:
        placeholder = onboarding.JoinFacts("CONTROL-PLANE:JOIN-PORT", "ONE-TIME-TOKEN", b"")
        for step in steps + onboarding.join_steps(facts, placeholder):
            sent = (" < the release (tar)" if step.release
                    else f" < {len(step.payload)} bytes" if step.payload is not None else "")
            click.echo(f"# {step.what}\n{subprocess.list2cmdline([*ssh, step.command])}{sent}")
        return
    release = release_tar(release_dir, manifest, signer.file_text())
    undo = onboarding.undo_steps(facts)
    run_steps(host, ssh, steps, len(checks), undo, release)
    join = _join_facts(url, token, state_dir, control_plane)
    run_steps(host, ssh, onboarding.join_steps(facts, join), 0, undo, release)
    click.echo(f"[{host}] llmgw {manifest.version} installed; waiting for node {node_id} to connect")
    state = _wait_connected(url, token, state_dir, node_id, CONNECT_TIMEOUT)
    click.echo(f"[{host}] node {node_id} connected ({state}); waiting until its engines are installable")
    ready = wait_installable(host, ssh, INSTALLABLE_TIMEOUT)
    click.echo(f"node {node_id} connected and its engines installable: {ready}")


def _size_text(text: str) -> str:
    """`--min-disk` as the host's doctor reads it ("" for 0). Raises UsageError when it is not a size."""
    from llmgw.errors import UsageError
    from llmgw.units import parse_size

    try:
        return "" if parse_size(text) == 0 else text
    except ValueError as exc:
        raise UsageError(f"--min-disk {text!r} is not a size ({exc}): write e.g. 20Gi") from exc


CONNECT_TIMEOUT = 120.0
"""Seconds `node add` waits for the new node's agent to connect to the control plane."""


def _wait_connected(url, token, state_dir, node_id: str, timeout: float) -> str:
    """Poll the control plane's status (every 0.5 s, `timeout` seconds) until `node_id` is there; its state.
    Raises InstallError when it does not come (the host keeps what was installed: `llmgw wipe` there removes it)."""
    import time

    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    url, token = resolve_admin(url, token, state_dir)
    deadline = time.monotonic() + timeout
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        while time.monotonic() < deadline:
            node = client.get("/api/v1/status").get("nodes", {}).get(node_id)
            if node:
                return node.get("state", "connected")
            time.sleep(0.5)
    raise InstallError(f"node {node_id} did not connect within {timeout:g} s: see /var/log/llmgw/agent.log or "
                       "`journalctl -u llmgw-agent` on it (it stays installed; `llmgw wipe` there takes it off)")


INSTALLABLE_TIMEOUT = 120.0
"""Seconds `node add` waits, once the node connected, for its engines and weights to be installable."""
INSTALLABLE = f"{STATE_LLMGW} node doctor --installable --state-dir /var/lib/llmgw/agent"
"""The check `node add` polls on the host (llmgw.agent.doctor_install): the agent has its settings from the control
plane and reads every mirror they name."""


def wait_installable(host: str, ssh: list[str], timeout: float) -> str:
    """Run INSTALLABLE on the host every second until it passes (`timeout` seconds), showing each new reason it
    gives meanwhile; what it found (its check lines, joined). Raises InstallError with its last words."""
    import time

    deadline, said = time.monotonic() + timeout, ""
    while True:
        done = subprocess.run([*ssh, INSTALLABLE], capture_output=True, text=True, timeout=120)
        lines = [line.split(None, 2)[-1] for line in done.stdout.splitlines()[:-1] if line.strip()]
        if done.returncode == 0:
            return "; ".join(lines)
        words = "; ".join(line for line in lines) or (done.stderr.strip().splitlines() or ["no answer"])[-1]
        if words != said:
            click.echo(f"[{host}] not installable yet: {words}")
            said = words
        if time.monotonic() >= deadline:
            raise InstallError(f"node {host} connected, but its engines were not installable within {timeout:g} s: "
                               f"{words}. It stays installed and connected: fix that (agents/ `mirrors:` in the "
                               f"settings) and check with `{INSTALLABLE}` there")
        time.sleep(1.0)


def _join_facts(url, token, state_dir, control_plane):
    """A one-time join token and the CA from the control plane's admin API."""
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin
    from llmgw.install.onboarding import JoinFacts

    url, token = resolve_admin(url, token, state_dir)
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        answer = client.post("/api/v1/join-tokens", {"ttl_seconds": 900})
    host = (control_plane or url.split("://", 1)[-1]).rsplit(":", 1)[0]
    return JoinFacts(f"{host}:{answer['join_port']}", answer["token"], answer["ca_pem"].encode())


def register(group: click.Group) -> None:
    """Add `node add` to the `node` group."""
    from llmgw.cli.node_cmds import node_group

    node_group(group).add_command(add_cmd)
