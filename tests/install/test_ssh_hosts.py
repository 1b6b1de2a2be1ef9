"""The hosts' fixture itself (tests/support/ssh_hosts.py): real sshd, own root, own address, nothing left behind.

About 2.5 s in all here (three hosts start in about 0.3 s; each ssh command about 0.1-0.3 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_ssh_runs_a_command_on_the_host_which_sees_its_own_etc_and_not_the_checkout(ssh_hosts) -> None:
    host, = ssh_hosts(1)
    done = host.ssh("hostname; cat /etc/hostname; ls -A /work; echo $HOME; ls -A ~; ps -eo pid,comm --no-headers")
    lines = done.stdout.splitlines()
    assert lines[:2] == ["host1", "host1"]
    assert lines[2] == "/root"  # /work is an empty directory there: the checkout and the venvs are hidden
    assert lines[3] == ".ssh"  # a fresh home: no caches, no pyenv
    processes = dict(line.split() for line in lines[4:])
    assert processes["1"] == "sshd"  # sshd is PID 1 of the host: nothing of the machine's processes is seen
    assert Path("/etc/hostname").read_text().strip() != "host1"
    assert not (host.root / "work" / "main").exists() and Path(TESTS).exists()


def test_a_file_written_on_one_host_is_absent_on_another_and_on_the_machine(ssh_hosts) -> None:
    _, two, three = ssh_hosts(3)
    marker = f"/etc/llmgw-fixture-marker-{os.getpid()}"
    before = three.snapshot()
    two.ssh(f"echo written-on-host2 > {marker}")
    assert two.ssh(f"cat {marker}").stdout == "written-on-host2\n"
    assert three.ssh(f"test -e {marker}", check=False).returncode == 1
    assert not Path(marker).exists()
    assert two.snapshot()[marker][0] == "file"
    assert three.snapshot() == before


def test_killing_the_process_that_started_the_hosts_leaves_no_process_of_them(tmp_path) -> None:
    """The starter is SIGKILLed (no cleanup of its own runs): sshd, what ran on the hosts and `unshare` end with
    it. Its namespaces and routes are then removed here (the fixture's own teardown never ran)."""
    script = tmp_path / "starter.py"
    script.write_text(
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from support.netns import open_lab\n"
        "from support.ssh_hosts import open_ssh_hosts\n"
        "with open_lab() as lab, open_ssh_hosts(lab, 2, Path(sys.argv[1])) as hosts:\n"
        "    hosts[0].ssh('sleep 1000 >/dev/null 2>&1 &')\n"
        "    print(json.dumps({'pids': [p for h in hosts for p in (h.pid, h.keeper, h.process.pid)],\n"
        "                      'netns': [h.netns for h in lab.hosts.values()] + [lab.switch],\n"
        "                      'link': lab.prefix + '-r', 'routes': [str(lab.network), str(lab.network6)]}),\n"
        "          flush=True)\n"
        "    time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    starter = subprocess.Popen([sys.executable, str(script), str(tmp_path / "hosts")], stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        started = json.loads(starter.stdout.readline())
    finally:
        starter.kill()
        starter.wait()
    try:
        deadline = time.monotonic() + 10
        while (alive := [pid for pid in started["pids"] if _running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive == []
        assert not [line for line in Path("/proc/mounts").read_text().splitlines() if str(tmp_path) in line]
    finally:
        subprocess.run(["ip", "link", "del", started["link"]], capture_output=True)
        for netns in started["netns"]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "route", "del", "unreachable", started["routes"][0]], capture_output=True)
        subprocess.run(["ip", "-6", "route", "del", "unreachable", started["routes"][1]], capture_output=True)


def _running(pid: int) -> bool:
    """True while `pid` is a process that is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
