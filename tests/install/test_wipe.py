"""`llmgw wipe` on a host of its own over real ssh (tests/support/ssh_hosts.py): after an install through the
journal, the host's root is as it was before (a file-system diff against the machine), or holds only the weights.

llmgw itself reaches the host as its source and click's, copied over ssh into the host's /tmp (a tmpfs outside the
diff), run by the host's Debian python3: the host has no venv or checkout of its own. About 5 s in all here.
"""

from __future__ import annotations

from support.ssh_hosts import LLMGW_ON_HOST as LLMGW
from support.ssh_hosts import push_llmgw_source

INSTALL = r"""
import os, sys
from pathlib import Path
from llmgw.install import InstalledUnit, Journal, create_user
journal = Journal.open()
journal.make_dirs(Path("/opt/llmgw/0.1.0/bin"))
journal.write_file(Path("/opt/llmgw/0.1.0/bin/llmgw"), b"#!/bin/sh\n" * 100, mode=0o755)
journal.symlink(Path("/opt/llmgw/current"), "0.1.0")
journal.write_file(Path("/etc/llmgw/agent.yaml"), b"control_plane: 10.0.0.1:8082\n", mode=0o600)
journal.write_file(Path("/etc/systemd/system/llmgw-agent.service"), b"[Service]\nExecStart=/opt/llmgw/current/bin/llmgw agent\n")
journal.record(InstalledUnit("llmgw-agent.service", enabled=True, started=True))
create_user(journal, "llmgw")
journal.write_file(Path("/etc/hosts"), Path("/etc/hosts").read_bytes() + b"10.0.0.1 control-plane\n")
journal.make_dirs(Path("/var/lib/llmgw/weights"), weights=True)
(Path("/var/lib/llmgw/weights/sha256")).mkdir()
(Path("/var/lib/llmgw/weights/sha256") / ("ab" * 32)).write_bytes(os.urandom(1 << 20))
journal.make_dirs(Path("/var/lib/llmgw/engines/llama.cpp"))
"""

WEIGHTS = {"/var/lib/llmgw", "/var/lib/llmgw-install", "/var/lib/llmgw-install/journal.json", "/var/lib/llmgw/weights",
           "/var/lib/llmgw/weights/sha256", f"/var/lib/llmgw/weights/sha256/{'ab' * 32}"}


def installed(host) -> dict:
    """The host with llmgw's source pushed, `INSTALL` run on it; its snapshot from before the install."""
    push_llmgw_source(host)
    before = host.snapshot()
    host.ssh(f"PYTHONPATH=/tmp/llmgw /usr/bin/python3 -c '{INSTALL}'")
    assert host.ssh("id -u llmgw && readlink /opt/llmgw/current").stdout.split()[1] == "0.1.0"
    return before


def diff(before: dict, after: dict) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def test_wipe_lists_with_sizes_asks_and_leaves_the_hosts_root_as_it_was(ssh_hosts) -> None:
    host, = ssh_hosts(1)
    before = installed(host)
    after_install = host.snapshot()
    assert {"/opt/llmgw/current", "/etc/llmgw/agent.yaml", "/etc/hosts", "/etc/passwd"} <= diff(before, after_install)

    declined = host.ssh(f"{LLMGW} wipe", input="n\n", check=False)
    assert declined.returncode == 130, declined.stderr
    lines = declined.stdout.splitlines()
    assert lines[0] == "/var/lib/llmgw-install/journal.json lists 17 things llmgw made on this machine (newest first):"
    assert lines[1].split() == ["directory", "/var/lib/llmgw/engines/llama.cpp"]  # newest first, nothing in it
    assert "1Mi  directory /var/lib/llmgw/weights (weights)" in declined.stdout
    assert "user llmgw" in declined.stdout and "unit llmgw-agent.service" in declined.stdout
    assert "file /etc/hosts (replaced one that is restored)" in declined.stdout
    assert host.snapshot() == after_install  # declined: nothing removed

    wiped = host.ssh(f"{LLMGW} wipe --yes")
    assert wiped.stdout.splitlines()[-1].endswith("no journal left")
    assert diff(before, host.snapshot()) == set()
    assert host.ssh("id llmgw", check=False).returncode == 1


def test_wipe_keep_weights_leaves_only_the_weights_and_the_journal_listing_them(ssh_hosts) -> None:
    host, = ssh_hosts(1)
    before = installed(host)
    kept = host.ssh(f"{LLMGW} wipe --yes --keep-weights")
    assert "(kept: --keep-weights)" in kept.stdout
    assert diff(before, host.snapshot()) == WEIGHTS
    host.ssh(f"{LLMGW} wipe --yes")  # a later wipe takes them too
    assert diff(before, host.snapshot()) == set()


def test_wipe_is_refused_while_an_agent_runs_and_removes_nothing(ssh_hosts) -> None:
    """The agent process is a stand-in with the agent's command line (`llmgw agent ...`): the real agent needs a
    release on the host, which `llmgw node add` brings (not built yet)."""
    host, = ssh_hosts(1)
    installed(host)
    host.ssh("mkdir /tmp/bin && printf '#!/bin/sh\\nsleep 600\\n' > /tmp/bin/llmgw && chmod +x /tmp/bin/llmgw && "
             "(setsid /tmp/bin/llmgw agent --control-plane 10.0.0.1:8082 >/dev/null 2>&1 &)")
    after_install = host.snapshot()
    refused = host.ssh(f"{LLMGW} wipe --yes", check=False)
    assert refused.returncode == 1
    assert "an llmgw agent runs here: pid " in refused.stderr and "/tmp/bin/llmgw agent" in refused.stderr
    assert "llmgw node drain NODE" in refused.stderr and "Nothing was removed" in refused.stderr
    assert host.snapshot() == after_install


def test_wipe_without_a_journal_says_there_is_nothing_of_llmgw_here(ssh_hosts) -> None:
    host, = ssh_hosts(1)
    push_llmgw_source(host)
    done = host.ssh(f"{LLMGW} wipe --yes", check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: /var/lib/llmgw-install/journal.json: no install journal here: llmgw "
                                   "installed nothing on this machine (or it was wiped already)")
