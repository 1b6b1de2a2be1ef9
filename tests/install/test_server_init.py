"""`llmgw server init` on a host of its own over real ssh: it sets the machine up, a second run changes nothing, the
control plane then runs from what it wrote (as its user, with the command init printed: no systemd on the host), its
unit passes `systemd-analyze verify` there, and `llmgw wipe` leaves the host's root as before.

llmgw reaches the host as this checkout's source (tests/support/ssh_hosts.py, `push_llmgw_source`), run by the
test's venv, shown read-only on the host with its Python (`share`): what a release installed by `node add` will
bring. About 15-25 s here (the control plane's start is most of it).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from llmgw.store import open_store
from support.postgres import POSTGRES_URL, postgres_schema, schema_url
from support.ssh_hosts import SOURCE, push_llmgw_source

CHECKOUT = Path(__file__).resolve().parents[2]
SHARE = [sys.prefix, sys.base_prefix]
LLMGW = f"PYTHONPATH={SOURCE} {sys.prefix}/bin/llmgw"


def diff(before: dict, after: dict) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def test_server_init_sets_up_a_control_plane_that_runs_and_a_second_run_changes_nothing(ssh_hosts) -> None:
    host, = ssh_hosts(1, share=SHARE)
    push_llmgw_source(host)
    host.ssh("chmod o+x /root")  # the user llmgw reaches the shared venv's Python under /root (a release is in /opt)
    before = host.snapshot()

    first = host.ssh(f"{LLMGW} server init --listen {host.address}")
    made = [line.split(None, 1)[1] for line in first.stdout.splitlines() if line.startswith("made ")]
    assert made[:6] == ["user llmgw", "/var/lib/llmgw", "/var/lib/llmgw/server", "/var/lib/llmgw/server/secrets",
                        "/etc/llmgw", "/var/lib/llmgw/server/settings.git, seeded from "
                        "/tmp/llmgw/examples/cluster-repo (commit " + made[5].rsplit(" ", 1)[1]]
    assert made[6:] == ["/var/lib/llmgw/server/ca (the agents' CA)",
                        "/var/lib/llmgw/server/admin-token (its hash in the store: SQLite, "
                        "/var/lib/llmgw/server/llmgw.sqlite3)",
                        "/etc/llmgw/server.env", "/etc/systemd/system/llmgw-server.service",
                        "/etc/systemd/system/llmgw-server.service.d/llmgw.conf"]
    assert "systemd is not running here (PID 1 is sshd)" in first.stdout
    unit = host.root / "etc/systemd/system/llmgw-server.service"
    assert unit.read_text() == (CHECKOUT / "deploy/systemd/llmgw-server.service").read_text()
    verify = host.ssh("systemd-analyze verify /etc/systemd/system/llmgw-server.service", check=False)
    assert (verify.returncode, verify.stderr) == (0, "")
    after_init = host.snapshot()

    second = host.ssh(f"{LLMGW} server init --listen {host.address}")
    assert "nothing to do: this machine was set up already" in second.stdout
    assert not [line for line in second.stdout.splitlines() if line.startswith("made ")]
    assert host.snapshot() == after_init

    # the control plane runs from what init wrote, as init said to run it (without systemd), as its own user
    by_hand = first.stdout.split("Run the control plane by hand:\n", 1)[1].split("\n\n", 1)[0].strip()
    host.ssh(f"export PYTHONPATH={SOURCE}; ( {by_hand.replace(chr(10), ' ; ')} ) >/tmp/server.log 2>&1 &")
    deadline = time.monotonic() + 90
    admin_url, looked = host.root / "var/lib/llmgw/server/admin-url", time.monotonic()
    while not admin_url.is_file():  # written once it listens; looked for from here: `llmgw status` is a process
        if time.monotonic() - looked > 2:  # still running? (an ssh command: not at every poll)
            assert host.ssh("pgrep -u llmgw", check=False).returncode == 0, host.ssh("cat /tmp/server.log").stdout
            looked = time.monotonic()
        assert time.monotonic() < deadline, host.ssh("cat /tmp/server.log").stdout
        time.sleep(0.1)
    while (status := host.ssh(f"{LLMGW} status --state /var/lib/llmgw/server", check=False)).returncode:
        running = host.ssh("pgrep -u llmgw", check=False).returncode == 0
        assert running and time.monotonic() < deadline, (status.stderr, host.ssh("cat /tmp/server.log").stdout)
        time.sleep(0.5)
    assert status.stdout.startswith("settings    ")
    assert host.ssh("ps -o user= -C llmgw").stdout.split() == ["llmgw"]
    host.ssh("pkill -TERM -u llmgw && while pgrep -u llmgw >/dev/null; do sleep 0.1; done")

    wiped = host.ssh(f"PYTHONPATH={SOURCE} /usr/bin/python3 -m llmgw.cli wipe --yes")
    assert wiped.stdout.splitlines()[-1].endswith("no journal left")
    assert diff(before, host.snapshot()) == set()


def test_server_init_refuses_a_seed_that_does_not_validate_before_making_anything(ssh_hosts, tmp_path) -> None:
    host, = ssh_hosts(1, share=SHARE)
    push_llmgw_source(host)
    before = host.snapshot()
    host.ssh(f"cp -r {SOURCE}/examples/cluster-repo /tmp/seed && echo 'listeners: 12' >> /tmp/seed/llmgw.yaml")
    refused = host.ssh(f"{LLMGW} server init --from /tmp/seed", check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: llmgw.yaml:") and "listeners" in refused.stderr
    assert host.snapshot() == before


def test_server_init_keeps_the_admin_tokens_hash_in_a_postgresql_store(ssh_hosts) -> None:
    """The host reaches the machine's PostgreSQL through the ssh connection itself (`ssh -R`, a port on the host's
    loopback): init opens that store, migrates it and keeps the admin token's hash there."""
    host, = ssh_hosts(1, share=SHARE)
    push_llmgw_source(host)
    with postgres_schema() as schema:
        remote = schema_url(schema, "postgresql://127.0.0.1:15432/test")
        argv = host.ssh_argv(f"{LLMGW} server init --store {shlex.quote(remote)}")
        done = subprocess.run([*argv[:-2], "-R", f"15432:{urlsplit(POSTGRES_URL).netloc}", *argv[-2:]],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "(its hash in the store: postgresql://127.0.0.1:15432/test?options" in done.stdout
        assert f"--store {remote}" in (host.root / "etc/llmgw/server.env").read_text()
        token = (host.root / "var/lib/llmgw/server/admin-token").read_text().strip()
        store = open_store(schema_url(schema))
        try:
            assert store.check_admin_token(token) and not store.check_admin_token(token[:-1] + "x")
        finally:
            store.close()
        assert not (host.root / "var/lib/llmgw/server/llmgw.sqlite3").exists()
