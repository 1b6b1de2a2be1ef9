"""`llmgw node add HOST` over real ssh to a host of its own: what it refuses, and that a failure halfway leaves the
host as it was (a file-system diff of its root), from a real signed release (llmgw.release, no dependency wheels:
1.5 s to build, so the install itself fails at pip, halfway, on purpose).

Not here (not built yet): a node added all the way (a release with its dependency wheels, a control plane, the agent
connected). About 10 s in all here.
"""

from __future__ import annotations

import os
import shutil
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
