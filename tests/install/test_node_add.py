"""`llmgw node add HOST` over real ssh to a host of its own, from real signed releases (llmgw.release): a node added
all the way (a release with its dependency wheels, a control plane with mutual TLS, the agent connected; `llmgw wipe`
then leaves the host's root as it was), what it refuses, and that a failure halfway leaves the host as it was (a
release without dependency wheels: pip fails halfway, on purpose).

Not here: a replica served by the added node (engines and weights from the control plane's mirror), an ssh
connection cut halfway. About 65 s in all here (12 s of it building the full release, 20 s the node add itself).
"""

from __future__ import annotations

import os
import shutil
import time
import subprocess
import sys
from pathlib import Path

import pytest

from support.releases import build_signed_release

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A signed release of this checkout without dependency wheels, with the key that signed it."""
    return build_signed_release(tmp_path_factory.mktemp("release"), dependencies=False)


def node_add(*args: str) -> subprocess.CompletedProcess:
    """`llmgw node add ...` from this checkout, as the operator runs it."""
    return subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "add", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(CHECKOUT)}, cwd=CHECKOUT)


def test_dry_run_prints_every_command_it_would_run_on_the_host_and_connects_to_nothing(release) -> None:
    done = node_add("nowhere.invalid", "--release", str(release.directory), "--trusted-key", release.trusted_key,
                    "--control-plane", "10.0.0.1:8082", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("release llmgw 0.1.0 verified: ") and release.key_id in lines[0]
    whats = [line[2:] for line in lines if line.startswith("# ")]
    commands = [line for line in lines[1:] if not line.startswith("# ")]
    assert len(whats) == len(commands) == 16
    assert all(c.startswith("ssh -o BatchMode=yes nowhere.invalid ") for c in commands)
    assert whats[0].startswith("check that the host has Python 3.11 or newer")
    assert commands[1].endswith("tar -x -C /var/tmp/llmgw-add\" < the release (tar)")
    assert "pip install --quiet --no-index --find-links /var/tmp/llmgw-add/wheels llmgw==0.1.0" in commands[5]
    assert "node join --control-plane CONTROL-PLANE:JOIN-PORT --token ONE-TIME-TOKEN" in done.stdout
    assert 'write /etc/llmgw/agent.env --mode 0640" < ' in done.stdout
    assert whats[-1] == "remove /var/tmp/llmgw-add"


def test_a_release_with_one_byte_changed_is_refused_and_nothing_reaches_the_host(ssh_hosts, release, tmp_path) -> None:
    host, = ssh_hosts(1)
    changed = shutil.copytree(release.directory, tmp_path / "release")
    wheel = next((changed / "wheels").glob("llmgw-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    wheel.write_bytes(bytes(data))
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(changed),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082")
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and wheel.name in done.stderr
    assert f"[{host.name}]" not in done.stdout  # not one step ran on the host
    assert host.snapshot() == before


def test_a_host_without_python_3_11_is_refused_in_its_own_words_and_left_as_it_was(ssh_hosts, release) -> None:
    host, = ssh_hosts(1)
    host.ssh("rm /usr/bin/python3 /usr/bin/python3.11")  # on the host's overlay only
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(release.directory),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082")
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: {host.name} cannot take llmgw: check that the host has Python 3.11 or "
                                   "newer, with venv (Debian: python3-venv): bash: line 1: python3: command not found; "
                                   "nothing was installed")
    assert host.snapshot() == before


def test_a_failure_halfway_undoes_the_host_from_its_journal(ssh_hosts, release) -> None:
    """The release has no dependency wheels: pip fails after the journal recorded /opt/llmgw and the venv."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(release.directory),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082")
    assert done.returncode == 1
    assert f"[{host.name}] install llmgw 0.1.0 into it from the release's wheels (no registry)" in done.stdout
    message = done.stderr.strip()
    assert message.startswith(f"error: {host.name}: install llmgw 0.1.0 into it from the release's wheels (no "
                              "registry) failed: ERROR: ")
    assert message.endswith("; the host was undone from its install journal, as it was before")
    assert host.snapshot() == before


@pytest.fixture(scope="module")
def full_release(tmp_path_factory):
    """A signed release of this checkout with every dependency wheel for this machine (7.5 s from pip's cache)."""
    return build_signed_release(tmp_path_factory.mktemp("full-release"))


def test_a_node_added_over_ssh_joins_with_mutual_tls_and_wipe_then_leaves_the_host_as_it_was(
        ssh_hosts, netns_lab, full_release, tmp_path) -> None:
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin
    from llmgw.settings import init_repository
    from llmgw.settings.packaged import example_dir
    from support.llmgw_processes import LlmgwProcesses
    from support.waiting import wait_for

    host, = ssh_hosts(1)
    root = netns_lab.join_root()
    before = host.snapshot()
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, example_dir())
    processes = LlmgwProcesses(tmp_path)
    try:
        processes.spawn("server", "server", "--repo", str(repo), "--state", str(state), "--tls",
                        "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", f"{root}:0")
        wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 60, "the server",
                 lambda: (tmp_path / "server.log").read_text())
        url, token = resolve_admin(None, None, state)
        with AdminClient(url, token, ca_file=admin_ca_file(state)) as admin:
            status = lambda: admin.get("/api/v1/status")  # noqa: E731
            agents_port = wait_for(lambda: status()["control_plane"]["agents_port"], 30, "the admin API")
            started = time.monotonic()
            done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(full_release.directory),
                            "--trusted-key", full_release.trusted_key, "--control-plane", f"{root}:{agents_port}",
                            "--state", str(state))
            assert done.returncode == 0, done.stdout + done.stderr + host.ssh("cat /var/log/llmgw/agent.log").stdout
            print(f"node add took {time.monotonic() - started:.1f} s")
            assert done.stdout.splitlines()[-1].startswith(f"node {host.name} connected (")
            assert status()["nodes"][host.name]["state"] not in ("lost", "")
        assert host.ssh("readlink /opt/llmgw/current").stdout.strip() == "0.1.0"
        assert host.ssh("test -e /var/lib/llmgw/agent/tls/node.crt && test ! -e /var/tmp/llmgw-add").returncode == 0

        refused = host.ssh("/opt/llmgw/current/bin/llmgw wipe --yes", check=False)
        assert refused.returncode == 1 and "an llmgw agent runs here" in refused.stderr
        agent = "'[/]opt/llmgw/current/bin/llmgw agent'"  # [/]: not this command's own line
        host.ssh(f"pkill -TERM -f {agent}; while pgrep -f {agent} >/dev/null; do sleep 0.1; done")
        wiped = host.ssh("/opt/llmgw/current/bin/llmgw wipe --yes")
        assert wiped.stdout.splitlines()[-1].endswith("no journal left"), wiped.stdout
        assert host.snapshot() == before
    finally:
        processes.stop()
