"""`llmgw node add HOST` over real ssh to a host of its own, from real signed releases (llmgw.release): what it
runs (--dry-run), what it refuses (a changed byte, no Python 3.11, a host that fails its doctor, run from the release
before anything is installed), and that a failure halfway leaves the host as it was (a release without dependency
wheels: pip fails halfway, on purpose; an ssh connection cut while pip installs). A node added all the way, serving,
and removed again over its agent's stream is tests/install/test_fleet.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.in_process_cli import completed
from support.ssh_hosts import _children

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(bare_release):
    """A signed release of this checkout without dependency wheels, with the key that signed it (the run's one)."""
    return bare_release


def node_add(*args: str) -> subprocess.CompletedProcess:
    """`llmgw node add ...` from this checkout as the operator runs it, in this process (support.in_process_cli: the
    command and its error handling, without a Python start of about a second of CPU); it runs ssh as it would."""
    return completed(["node", "add", *args], cwd=CHECKOUT)


def test_dry_run_prints_every_command_it_would_run_on_the_host_and_connects_to_nothing(release) -> None:
    done = node_add("nowhere.invalid", "--release", str(release.directory), "--trusted-key", release.trusted_key,
                    "--control-plane", "10.0.0.1:8082", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("release llmgw 0.1.0 verified: ") and release.key_id in lines[0]
    whats = [line[2:] for line in lines if line.startswith("# ")]
    commands = [line for line in lines[1:] if not line.startswith("# ")]
    assert len(whats) == len(commands) == 17
    assert all(c.startswith("ssh -o BatchMode=yes nowhere.invalid ") for c in commands)
    assert whats[0].startswith("check that the host has Python 3.11 or newer")
    assert commands[1].endswith("tar -x -C /var/tmp/llmgw-add\" < the release (tar)")
    assert whats[3].startswith("check the host with `llmgw node doctor`, run from the release in /var/tmp/llmgw-add "
                               "before anything is installed")
    assert "PYTHONPATH=/var/tmp/llmgw-add/doctor python3 -m llmgw.cli node doctor " in commands[3]
    assert "--min-free 20Gi" in commands[3]
    assert whats[4] == "make /opt/llmgw"  # the first change, after every check
    assert "pip install --quiet --no-index --find-links /var/tmp/llmgw-add/wheels llmgw==0.1.0" in commands[6]
    assert whats[7] == "keep the release's signed manifest and the key that signed it in /opt/llmgw/0.1.0/release"
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
    """The release has no dependency wheels: pip fails after the journal recorded /opt/llmgw and the venv (--force:
    no doctor first, whose own install of the release would fail before anything is installed)."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(release.directory),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082", "--force")
    assert done.returncode == 1
    assert f"[{host.name}] install llmgw 0.1.0 into it from the release's wheels (no registry)" in done.stdout
    message = done.stderr.strip()
    assert message.startswith(f"error: {host.name}: install llmgw 0.1.0 into it from the release's wheels (no "
                              "registry) failed: ERROR: ")
    assert message.endswith("; the host was undone from its install journal, as it was before")
    assert host.snapshot() == before


def test_a_host_that_fails_doctor_is_stopped_in_its_own_words_before_anything_is_installed(
        ssh_hosts, full_release) -> None:
    """The host's doctor runs from the release in the scratch directory: less disk than --min-disk fails it."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(full_release.directory),
                    "--trusted-key", full_release.trusted_key, "--control-plane", "10.0.0.1:8082", "--min-disk", "1Ti")
    assert done.returncode == 1, done.stdout + done.stderr
    message = done.stderr.strip()
    assert message.startswith(f"error: {host.name} cannot take llmgw: check the host with `llmgw node doctor`, run "
                              "from the release in /var/tmp/llmgw-add before anything is installed: weights: only ")
    assert message.endswith(" free under /var/lib/llmgw/weights, less than the 1024.0 GiB asked for (--min-free): "
                            "free space or point weights_dir at a larger disk; nothing was installed"), message
    assert "make /opt/llmgw" not in done.stdout
    assert host.snapshot() == before


def _session_processes(host) -> list[int]:
    """The processes of every ssh session on `host` now (sshd's children but its keeper, and theirs), from /proc."""
    found, todo = [], [pid for pid in _children(host.pid) if pid != host.keeper]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += _children(pid)
    return found


def test_an_ssh_connection_cut_halfway_leaves_the_host_as_it_was(ssh_hosts, full_release) -> None:
    """The session is killed on the host (sshd's child and everything it ran: pip halfway through the venv) while
    the release installs: node add undoes the host from its journal over a new connection."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    add = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "node", "add", host.name, "--ssh-config", str(host.ssh_config),
         "--release", str(full_release.directory), "--trusted-key", full_release.trusted_key,
         "--control-plane", "10.0.0.1:8082", "--force"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)})
    try:
        lines = []
        for line in add.stdout:
            lines.append(line)
            if line.startswith(f"[{host.name}] install llmgw 0.1.0 into it"):
                break
        deadline = time.monotonic() + 60  # until pip has installed a first wheel into the venv, then cut
        site = host.root / "opt/llmgw/0.1.0/lib/python3.11/site-packages"  # the host's, read from here (no ssh)
        venv_own = re.compile(r"(pip|setuptools|_distutils_hack|distutils-precedence|pkg_resources|__pycache__)")
        while not [name for name in (os.listdir(site) if site.is_dir() else []) if not venv_own.match(name)]:
            assert time.monotonic() < deadline and add.poll() is None, "pip wrote nothing into the venv"
            time.sleep(0.02)
        cut = _session_processes(host)
        for pid in cut:
            os.kill(pid, signal.SIGKILL)
        out, err = add.communicate(timeout=120)
    finally:
        add.kill()
    assert add.returncode == 1, "".join(lines) + out + err
    assert err.strip().startswith(f"error: ssh to {host.name} was cut during install llmgw 0.1.0 into it from the "
                                  "release's wheels (no registry) ("), err
    assert err.strip().endswith("; the host was undone from its install journal, as it was before"), err
    assert host.snapshot() == before
