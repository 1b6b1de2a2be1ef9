"""A one-node Slurm cluster under a test directory: munged, slurmdbd on the running MariaDB, slurmctld and slurmd,
with their own sockets, ports, state and database, never the system's. slurm.conf and slurmdbd.conf are rendered by
llmgw (llmgw.plan.slurm_conf) from this machine's `slurmd -C`.

Debian's slurm-wlm, slurmdbd, munge and slurm-client must be installed (`make system-packages`); when they are not,
`require_slurm` fails the test, it never skips. These machines have cgroup v1 only, hence proctrack/linuxproc and
task/none.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import MappingProxyType

import pytest

from llmgw.plan.slurm_conf import SlurmPaths, host_from_slurmd, render_slurm, render_slurmdbd_conf
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from llmgw.tools.slurm import SlurmNodeState, parse_scontrol_nodes, parse_slurmd_config

PROGRAMS = ("munged", "munge", "slurmdbd", "slurmctld", "slurmd", "scontrol", "srun", "sbatch", "sacct", "sacctmgr",
            "mysql")
NODE = "n1"


def require_slurm() -> None:
    """Fail (never skip) when a program the test needs is missing."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make system-packages` (Debian slurm-wlm, slurmdbd, munge, "
                    "slurm-client) and have MariaDB's client; the real-Slurm test does not skip")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def mysql(sql: str) -> str:
    """Run SQL on MariaDB at 127.0.0.1:3306 as root (no password); the SQL goes on stdin, never the command line."""
    done = subprocess.run(["mysql", "-h", "127.0.0.1", "-P", "3306", "-u", "root", "-N", "-B"], input=sql,
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.fail(f"MariaDB at 127.0.0.1:3306 (root, no password) refused: {done.stderr.strip()}")
    return done.stdout


def loopback_settings(node: str, *, accounting: bool = True, lent: bool = False) -> SlurmSettings:
    """slurm.yaml for a one-node cluster on loopback: `node` the controller and the only node (partition "debug"),
    free ports, a cluster name of its own, and the plugins a cgroup v1 only machine needs."""
    ctld, slurmd_port, dbd = free_ports(3)
    return SlurmSettings(
        enabled=True, cluster_name=f"t{secrets.token_hex(3)}", controller=node,
        nodes=MappingProxyType({node: SlurmNode("debug", lent=lent)}),
        partitions=MappingProxyType({"debug": SlurmPartition(default=True)}), accounting=accounting,
        proctrack_type="proctrack/linuxproc", task_plugin="task/none",
        ports=MappingProxyType({"slurmctld": ctld, "slurmd": slurmd_port, "slurmdbd": dbd}))


def drop_storage(database: str, user: str) -> None:
    """Drop slurmdbd's database and MariaDB user (both hosts) made for a test."""
    mysql(f"DROP DATABASE IF EXISTS `{database}`;\n"
          + "".join(f"DROP USER IF EXISTS '{user}'@'{host}';\n" for host in ("localhost", "127.0.0.1")))


class LocalSlurm:
    """The cluster; `start()` brings it up (node drained with llmgw's reason, as every new node enters), `stop()`
    ends every process it started and drops its database and MariaDB user."""

    def __init__(self, root: Path):
        self.root = root
        self.processes: list[subprocess.Popen] = []
        self.database = f"llmgw_slurm_{secrets.token_hex(4)}"
        self.env = dict(os.environ, SLURM_CONF=str(root / "etc" / "slurm.conf"))

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}\n{self.logs()}")
        return done

    def logs(self) -> str:
        out = []
        for log in sorted((self.root / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            out.append(f"== {log.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def _daemon(self, *args: str) -> None:
        log = open(self.root / "log" / f"{Path(args[0]).name}.out", "w")  # noqa: SIM115 - closed with the process
        self.processes.append(subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, env=self.env))

    def _wait(self, what: str, check, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"{process.args[0]} exited {process.returncode} while waiting for {what}\n"
                                         f"{self.logs()}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{self.logs()}")

    def start(self) -> None:
        root = self.root
        for sub in ("etc", "state", "spool", "log", "run", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        (root / "munge").chmod(0o700)
        socket_path = str(root / "munge" / "munge.sock")
        self._daemon("munged", "-F", "-f", f"--socket={socket_path}", f"--key-file={key}",
                     f"--log-file={root / 'log' / 'munged.log'}", f"--pid-file={root / 'run' / 'munged.pid'}",
                     f"--seed-file={root / 'munge' / 'seed'}")
        self._wait("munged", lambda: Path(socket_path).exists())

        password = secrets.token_hex(16)
        user = self.database
        mysql(f"CREATE DATABASE {self.database};\n"
              + "".join(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '{password}';\n"
                        f"GRANT ALL ON {self.database}.* TO '{user}'@'{host}';\n" for host in ("localhost", "127.0.0.1")))

        self.slurm = loopback_settings(NODE)
        ctld, dbd = self.slurm.ports["slurmctld"], self.slurm.ports["slurmdbd"]
        paths = SlurmPaths(str(root / "state"), str(root / "spool"), str(root / "log"), str(root / "run"), "root",
                           socket_path)
        config = parse_slurmd_config(self.run("slurmd", "-C").stdout)
        self.hostname = config.node_name
        host = host_from_slurmd(config, NODE, "127.0.0.1")
        rendered = render_slurm(self.slurm, {NODE: host}, paths)
        (root / "etc" / "slurm.conf").write_text(rendered.slurm_conf)
        (root / "etc" / "gres.conf").write_text(rendered.gres_conf)
        dbd_conf = render_slurmdbd_conf(self.slurm, storage_host="127.0.0.1", storage_port=3306, storage_user=user,
                                        storage_password=password, storage_database=self.database,
                                        dbd_host=host.hostname, dbd_address="127.0.0.1", paths=paths)
        descriptor = os.open(root / "etc" / "slurmdbd.conf", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(dbd_conf)

        self._daemon("slurmdbd", "-D")
        self._wait("slurmdbd's port", lambda: listening(dbd))
        self._daemon("slurmctld", "-D", "-i")
        self._wait("slurmctld's port", lambda: listening(ctld))
        self._daemon("slurmd", "-D", "-N", NODE)
        self._wait("the node registered", lambda: self.node().state != "unknown" and self.node().responding
                   if self.run("scontrol", "show", "node", NODE, check=False).returncode == 0 else False)

    def node(self) -> SlurmNodeState:
        [node] = parse_scontrol_nodes(self.run("scontrol", "show", "node", NODE).stdout)
        return node

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        drop_storage(self.database, self.database)


def listening(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0
