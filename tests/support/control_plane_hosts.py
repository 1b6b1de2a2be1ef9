"""Helpers of the tests that run control planes on ssh hosts (tests/support/ssh_hosts.py): files pushed over ssh,
commands started in the background there, the admin API's health over HTTPS with the shared CA, the lab's ssh key
given to a host (so that it runs `llmgw server add` itself), and the machine's PostgreSQL forwarded to the hosts
(DESIGN.md, "Known traps": the hosts reach the root namespace only at the lab's root address)."""

from __future__ import annotations

import contextlib
import getpass
import io
import socket
import ssl
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from support.ssh_hosts import SOURCE, SshHost

STATE = "/var/lib/llmgw/server"
"""The control plane's state directory `llmgw server init` sets up."""
LAB_SSH = "/root/.ssh/lab"
"""Where `give_lab_ssh` puts the lab's ssh configuration and key on a host."""


def push_files(host: SshHost, directory: str, files: dict[str, bytes]) -> None:
    """Write `files` (name: content, mode 0600) into `directory` on `host` over ssh (one tar on stdin)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    host.ssh(f"mkdir -p -m 700 {directory} && tar -x -C {directory}", input=buffer.getvalue(), text=False)


def start_on(host: SshHost, command: str, log: str) -> None:
    """Run the shell `command` on `host` in the background (llmgw's pushed source on PYTHONPATH), its output in
    `log` there."""
    host.ssh(f"export PYTHONPATH={SOURCE}; ( {command} ) >{log} 2>&1 </dev/null &")


def health(address: str, ca: Path, port: int = 8081) -> dict | None:
    """The admin API's unauthenticated health at `address` over HTTPS checked with `ca`; None while it does not
    answer."""
    try:
        return httpx.get(f"https://{address}:{port}/api/v1/health",
                         verify=ssl.create_default_context(cafile=str(ca)), timeout=2).json()
    except httpx.HTTPError:
        return None


def admin_status(host: SshHost, address: str) -> dict:
    """The admin API's status of the control plane on `host` (its own admin token and CA, read from the host's
    root), at `address`."""
    state = host.root / STATE.lstrip("/")
    token = (state / "admin-token").read_text().strip()
    context = ssl.create_default_context(cafile=str(state / "ca" / "ca.crt"))
    reply = httpx.get(f"https://{address}:8081/api/v1/status", verify=context, timeout=5,
                      headers={"Authorization": f"Bearer {token}"})
    reply.raise_for_status()
    return reply.json()


def give_lab_ssh(host: SshHost) -> str:
    """The lab's ssh configuration, key and known hosts copied to `host` (LAB_SSH), so that commands run there reach
    the other hosts as the test does; the configuration's path there."""
    workdir = str(host.ssh_config.parent)
    push_files(host, LAB_SSH, {
        "config": host.ssh_config.read_text().replace(workdir + "/keys", LAB_SSH).replace(workdir, LAB_SSH).encode(),
        "id_ed25519": (host.ssh_config.parent / "keys" / "id_ed25519").read_bytes(),
        "known_hosts": (host.ssh_config.parent / "known_hosts").read_bytes()})
    return f"{LAB_SSH}/config"


def serve_settings(host: SshHost) -> str:
    """`git daemon` on `host` serving the control plane's state directory (its settings.git) to the other hosts;
    the settings repository's git:// URL."""
    start_on(host, f"exec git -c safe.directory='*' daemon --reuseaddr --export-all --listen={host.address} "
                   f"--base-path={STATE} {STATE}", "/var/log/git-daemon.log")
    return f"git://{host.address}/settings.git"


@contextlib.contextmanager
def forwarded_postgres(root_address: str) -> Iterator[str]:
    """The machine's PostgreSQL (127.0.0.1:5432) forwarded by socat on the lab's `root_address`: yields the base URL
    of its database `test` as the hosts reach it (give it to support.postgres.schema_url)."""
    with socket.socket() as probe:
        probe.bind((root_address, 0))
        port = probe.getsockname()[1]
    forwarder = subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind={root_address},fork,reuseaddr",
                                  "TCP:127.0.0.1:5432"])
    try:
        yield f"postgresql://{getpass.getuser()}@{root_address}:{port}/test"
    finally:
        forwarder.kill()
        forwarder.wait()
