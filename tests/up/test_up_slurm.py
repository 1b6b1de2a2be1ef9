"""`llmgw up --slurm`: Slurm beside llmgw on this one machine, so `llmgw slurm lend|reclaim|status` act on it.

Fast: the seed it makes (this host the controller and the lendable node, cgroup-v1 plugins where there is no
cgroup v2) validates and gives the host both parts; the munge key secret is made once, mode 0600; a state made
without Slurm is refused with what to do. Slow (real llama-server, Gemma, and Debian's Slurm; fails, never skips,
without them): `llmgw up --slurm` as a process, then `llmgw slurm status`, `lend` (srun runs there), `reclaim`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from llmgw.cli.up_slurm import check_resumed, ensure_munge_key, short_hostname, slurm_seed
from llmgw.errors import UsageError
from llmgw.plan.slurm_conf import SlurmHost
from llmgw.plan.slurm_roles import slurm_roles
from llmgw.settings import init_repository, load_directory

from up.test_up import REPO_ROOT, UpProcess, ask, llmgw, quick_seed, wait_until

EXAMPLE = REPO_ROOT / "examples" / "cluster-repo"
# one pytest-xdist worker for the real-Slurm modules, vLLM and llmgw up (tests/conftest.py, MACHINE_WIDE)
pytestmark = pytest.mark.xdist_group("machine-wide")


@pytest.mark.parametrize(("cgroup2", "proctrack", "task"), [
    (False, "proctrack/linuxproc", "task/none"), (True, "proctrack/cgroup", "task/cgroup,task/affinity")])
def test_the_seed_names_this_host_controller_and_lendable_node(tmp_path: Path, cgroup2: bool, proctrack: str,
                                                               task: str) -> None:
    seed = slurm_seed(EXAMPLE, tmp_path / "seed", "vm", cgroup2=cgroup2)
    settings = load_directory(seed)
    slurm = settings.slurm
    assert (slurm.enabled, slurm.controller, dict(slurm.nodes)["vm"].partition) == (True, "vm", "debug")
    assert (slurm.proctrack_type, slurm.task_plugin, slurm.accounting) == (proctrack, task, False)
    assert not [w for w in settings.warnings if w.file == "slurm.yaml"]
    host = SlurmHost("vm", "127.0.0.1", cpus=2, memory_mib=4096)
    assert slurm_roles(slurm, {"vm": host})["vm"].daemons == ("slurmctld", "slurmd")
    assert (EXAMPLE / "slurm.yaml").read_text() != (seed / "slurm.yaml").read_text()  # the example is untouched


def test_the_seeds_own_ports_are_kept(tmp_path: Path) -> None:
    source = shutil.copytree(EXAMPLE, tmp_path / "example")
    (source / "slurm.yaml").write_text((source / "slurm.yaml").read_text() + "ports: {slurmctld: 7817, slurmd: 7818}\n")
    assert load_directory(slurm_seed(source, tmp_path / "seed", "vm", cgroup2=False)).slurm.ports == {
        "slurmctld": 7817, "slurmd": 7818, "slurmdbd": 6819}


def test_the_munge_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    path = ensure_munge_key(tmp_path / "secrets")
    key = path.read_text()
    assert len(key.strip()) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert ensure_munge_key(tmp_path / "secrets").read_text() == key


def test_a_state_made_without_slurm_is_refused_with_what_to_do(tmp_path: Path) -> None:
    repo = tmp_path / "settings.git"
    init_repository(repo, EXAMPLE)
    with pytest.raises(UsageError, match="do not run Slurm on vm: start with a new --state, or set enabled: true"):
        check_resumed(repo, "vm")
    made = tmp_path / "slurm.git"
    init_repository(made, slurm_seed(EXAMPLE, tmp_path / "seed", "vm", cgroup2=False))
    check_resumed(made, "vm")  # a state made with --slurm resumes


@pytest.mark.slow
def test_lend_reclaim_and_status_under_llmgw_up(tmp_path: Path, llama_server_binary, gemma_mirror) -> None:
    from slurm.local_slurm import free_ports, require_slurm

    require_slurm()
    host = short_hostname()
    seed = quick_seed(shutil.copytree(EXAMPLE, tmp_path / "cluster-repo"))
    ports = dict(zip(("slurmctld", "slurmd", "slurmdbd"), free_ports(3)))  # not the system's Slurm's
    (seed / "slurm.yaml").write_text((seed / "slurm.yaml").read_text() + f"ports: {json.dumps(ports)}\n")
    # munged's socket (<state>/agent/slurm/munge/munge.socket) must fit a Unix socket name (107 bytes): under
    # pytest-xdist, tmp_path (/tmp/pytest-of-root/pytest-NN/popen-gw0/test_lend_reclaim_and_status_u0) made it 108
    state = Path(tempfile.mkdtemp(prefix="llmgw-up-slurm-")) / "state"
    up = UpProcess(state, seed, "--slurm")
    env = dict(os.environ, SLURM_CONF=str(state / "agent" / "slurm" / "etc" / "slurm.conf"))

    def status() -> dict:
        return json.loads(ask("slurm", "status", "--json", state=state).stdout)

    try:
        up.wait_for(r"^gateway ", 300)
        assert (state / "secrets" / "munge-key").stat().st_mode & 0o777 == 0o600
        seen: list[dict] = []

        def drained() -> dict | None:
            seen[:] = [s := status()]
            ready = s["controller"] and s["controller"]["slurmctld"] == "running"
            return s if ready and "drain" in s["nodes"].get(host, {}).get("state", "") else None

        try:
            view = wait_until(drained, 120, "slurmctld running and the node drained (not lent)")
        except AssertionError as timed_out:  # what Slurm said last, and what llmgw up printed
            raise AssertionError(f"{timed_out}: {seen}; llmgw up said: {up.lines[-40:]}") from None
        assert view["nodes"][host]["slurmd"] == "running" and not view["nodes"][host]["lent"]

        out = llmgw("slurm", "lend", host, "--author-name", "Op", "--author-email", "op@x", state=state).stdout
        assert f"{host} lent to Slurm" in out
        wait_until(lambda: (n := status()["nodes"][host])["lent"] and "drain" not in n["state"], 60, "the node lent")
        done = subprocess.run(["srun", "-N1", "hostname"], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0 and done.stdout.strip() == host, done.stderr

        llmgw("slurm", "reclaim", host, "--author-name", "Op", "--author-email", "op@x", state=state)
        wait_until(lambda: not (n := status()["nodes"][host])["lent"] and "drain" in n["state"], 60,
                   "the node drained again")
        assert f"{host}: not lent" in ask("slurm", "status", state=state).stdout
    finally:
        up.process.send_signal(signal.SIGINT)
        up.process.wait(timeout=60)
        shutil.rmtree(state.parent, ignore_errors=True)
