"""`llmgw server add HOST`: a standby control plane on another machine over ssh, sharing the store and the CA.

    llmgw server add HOST --release DIR (--trusted-key KEY | --settings DIR) --repo-url URL [--listen ADDRESS]
                     [--address HOST] [--state DIR] [--repo PATH] [--user U] [--port P] [--ssh-key FILE]
                     [--ssh-config FILE] [--author-name N --author-email E] [--dry-run]

Run on the first control plane's machine (`llmgw server init`). The release is verified here, then installed on
HOST as `llmgw node add` installs it (llmgw.install.onboarding: its checks, the install journal, undone on failure),
without the node's doctor (a control plane needs no accelerator). Then the first control plane's settings tree, its
agents' CA (ca.key, ca.crt, the rotation's ca.next.* when a rotation is under way, nodes.json) and the store's
password secret (from `<state>/store.json`, `llmgw.store.StoreRecord`) go over ssh into the host's scratch
directory (never into git), `llmgw server init` there sets the control plane up with them (the same PostgreSQL
store, the shared settings repository `--repo-url`, mutual TLS on the agents' listener with `--address` in its
certificates), it is started, `server add` waits until its admin API answers (SERVE_TIMEOUT), and llmgw.yaml
`control_planes:` gets HOST's agents address by a settings commit, so every agent connects to it too.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import click

from llmgw.archives import extract_tar
from llmgw.cli.node_add import SCRATCH, release_options, release_tar, run_steps, ssh_argv, ssh_options
from llmgw.cli.release_cmds import _trusted
from llmgw.errors import UsageError

CA_FILES = ("ca.key", "ca.crt", "ca.next.key", "ca.next.crt", "nodes.json")
"""The CA directory's files a standby shares (join tokens are one-time and stay with the control plane that made them)."""


def _add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    tar.addfile(info, io.BytesIO(data))


def shared_tar(state: Path, repo: Path, branch: str) -> tuple[bytes, str]:
    """The tar of settings/ (the repository's `branch`), ca/ and secrets/ (the store's password secret) that a
    standby's `server init` reads, and the store URL (without password). Raises UsageError when the first control
    plane's store is not PostgreSQL or a file is missing."""
    from llmgw.store import read_store_record

    record = read_store_record(state)
    if record is None or not record.url.startswith("postgresql"):
        raise UsageError(f"{state / 'store.json'}: the control plane's store is "
                         f"{record.url if record else 'unknown (it never ran here)'}; several control planes share "
                         "a PostgreSQL store: move to one first (`llmgw store copy`, docs/ha.md)")
    settings = subprocess.run(["git", "--git-dir", str(repo), "archive", "--format=tar", "--prefix=settings/", branch],
                              capture_output=True)
    if settings.returncode:
        raise UsageError(f"{repo}: cannot read branch {branch}: {settings.stderr.decode().strip()}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(settings.stdout)) as source, tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in source.getmembers():
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        for name in CA_FILES:
            if (state / "ca" / name).is_file():
                _add_file(tar, f"ca/{name}", (state / "ca" / name).read_bytes())
        tar.addfile(_dir("ca"))
        tar.addfile(_dir("secrets"))
        if record.password_secret:
            secrets = Path(record.secrets_dir) if record.secrets_dir else state / "secrets"
            secret = secrets / record.password_secret
            if not secret.is_file():
                raise UsageError(f"{secret}: the store's password secret {record.password_secret!r} is not there")
            _add_file(tar, f"secrets/{record.password_secret}", secret.read_bytes())
    return buffer.getvalue(), record.url


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o700
    return info


def add_control_plane(repo: Path, branch: str, address: str, author: tuple[str, str]) -> str:
    """Add `address` to llmgw.yaml `control_planes:` by a settings commit; its description. Run by root on a
    repository of another user (server init's is the user llmgw's: git refuses a repository of another user, and
    files root made there would lock that user out), the commit is made by a child process as that user. Raises
    SettingsError as `commit_edit` does (in the child's words)."""
    owner = repo.stat()
    if os.geteuid() == 0 and owner.st_uid != 0:
        return _as_owner(repo, branch, address, author, owner)
    from llmgw.settings.edit_commits import commit_edit

    def edit(document) -> bool:
        planes = list(document.get("control_planes") or [])
        if address in planes:
            return False
        document["control_planes"] = [*planes, address]
        return True

    done = commit_edit(repo, "llmgw.yaml", edit, f"control_planes: add {address} (llmgw server add)", *author, branch)
    return f"commit {done.commit[:12]}" if done.changed else "already there"


def _as_owner(repo: Path, branch: str, address: str, author: tuple[str, str], owner: os.stat_result) -> str:
    import json
    import pwd
    import sys

    from llmgw.errors import Issue, SettingsError

    try:
        home = pwd.getpwuid(owner.st_uid).pw_dir
    except KeyError:
        home = "/"
    code = ("import json, sys; from pathlib import Path; from llmgw.cli.server_add import add_control_plane as add; "
            "a = json.loads(sys.argv[1]); print(add(Path(a[0]), a[1], a[2], tuple(a[3])))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps([str(repo), branch, address, list(author)])],
                          capture_output=True, text=True, user=owner.st_uid, group=owner.st_gid, extra_groups=[],
                          env={**os.environ, "HOME": home}, cwd="/")
    if done.returncode:
        words = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise SettingsError([Issue(str(repo), 0, 0, "", f"cannot be committed to as its owner: {words}")])
    return done.stdout.strip()


@click.command("add")
@click.argument("host")
@release_options
@click.option("--repo-url", required=True, metavar="URL",
              help="The settings repository as HOST's user llmgw fetches it, with no credential of its own (git:// of "
                   "`git daemon` on this machine, https with a token, file://): shared by every control plane.")
@click.option("--listen", default="0.0.0.0", show_default=True, metavar="ADDRESS",
              help="Address of HOST's gateway, admin and agents' listeners.")
@click.option("--address", default=None, metavar="ADDRESS",
              help="HOST's address as agents reach it, for control_planes: [default: HOST].")
@click.option("--state", "state_dir", default="/var/lib/llmgw/server", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="The first control plane's state directory.")
@click.option("--repo", "repo", default=None, type=click.Path(path_type=Path),
              help="The settings repository here [default: <state>/settings.git].")
@click.option("--branch", default="main", show_default=True)
@ssh_options
@click.option("--author-name", default="llmgw server add", show_default=True)
@click.option("--author-email", default="llmgw@localhost", show_default=True)
@click.option("--dry-run", is_flag=True, help="Print every command it would run on the host; connect to nothing.")
def add_cmd(host, release_dir, keys, settings_dir, repo_url, listen, address, state_dir, repo, branch, user, port,
            ssh_key, ssh_config, author_name, author_email, dry_run):
    """Make HOST a standby control plane over ssh: the same store, CA and settings (journaled; undone on failure)."""
    from llmgw.install import onboarding
    from llmgw.release import MANIFEST, PUBLIC_KEY_FILE, RECORD_DIR, SIGNATURE, trusted_public_keys, verify_release
    from llmgw.settings import load_directory

    trusted = trusted_public_keys(_trusted(keys, settings_dir))
    manifest = verify_release(release_dir, trusted)
    signer = next(key for key in trusted if key.id_text == manifest.key_id)
    click.echo(f"release llmgw {manifest.version} verified: {len(manifest.files)} files, signed by key "
               f"{manifest.key_id}")
    repo = repo or state_dir / "settings.git"
    shared, store_url = shared_tar(state_dir, repo, branch)
    with tarfile.open(fileobj=io.BytesIO(shared)) as tar:
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            extract_tar(tar, scratch, [m for m in tar.getmembers() if m.name.startswith("settings/")])
            cluster = load_directory(Path(scratch) / "settings").cluster
    facts = onboarding.NodeFacts(manifest.version, manifest.llmgw_wheel, host, "-", "", SCRATCH,
                                 (MANIFEST, SIGNATURE, PUBLIC_KEY_FILE), RECORD_DIR)
    checks = onboarding.check_steps(facts, doctor=False)
    address = address or host
    steps = [*checks, *onboarding.install_steps(facts)[:-1],
             *onboarding.standby_steps(facts, store_url, listen, repo_url, shared, address)]
    ssh = ssh_argv(host, user, port, ssh_key, ssh_config)
    planes = f"{address}:{cluster.agents.port}"
    if dry_run:
        for step in steps:
            sent = (" < the release (tar)" if step.release
                    else f" < {len(step.payload)} bytes" if step.payload is not None else "")
            click.echo(f"# {step.what}\n{subprocess.list2cmdline([*ssh, step.command])}{sent}")
        click.echo(f"# then: llmgw.yaml control_planes: += {planes} (a settings commit to {repo})")
        return
    release = release_tar(release_dir, manifest, signer.file_text())
    run_steps(host, ssh, steps, len(checks), onboarding.undo_steps(facts), release)
    click.echo(f"[{host}] llmgw {manifest.version} installed; waiting for its admin API")
    health = _wait_serving(f"https://{address}:{cluster.admin.port}/api/v1/health", state_dir / "ca" / "ca.crt",
                           SERVE_TIMEOUT)
    what = add_control_plane(repo, branch, planes, (author_name, author_email))
    click.echo(f"control plane {host} added: llmgw {manifest.version} ({'leads' if health.get('leader') else 'stands by'}"
               f"), agents at {planes} in control_planes: ({what})")


SERVE_TIMEOUT = 120.0
"""Seconds `server add` waits for the new control plane's admin API to answer."""


def _wait_serving(url: str, ca_file: Path, timeout: float) -> dict:
    """Poll `url` (the admin API's health, over HTTPS checked with the shared CA: the host's certificate names the
    address) every 0.5 s until it answers; its JSON. Raises InstallError when it does not."""
    import ssl
    import time

    import httpx

    from llmgw.errors import InstallError

    context = ssl.create_default_context(cafile=str(ca_file))
    deadline, why = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            return httpx.get(url, verify=context, timeout=2).json()
        except (httpx.HTTPError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
        time.sleep(0.5)
    raise InstallError(f"the control plane did not answer at {url} within {timeout:g} s ({why}): see "
                       "/var/log/llmgw/server.log or `journalctl -u llmgw-server` on it (it stays installed; `llmgw "
                       "wipe` there takes it off)")



def register(group: click.Group) -> None:
    """Add `server add` to the `server` group (llmgw.cli.server_cmds registers the group first)."""
    from llmgw.cli.server_cmds import server_cmd

    server_cmd.add_command(add_cmd)
    group.add_command(server_cmd)
