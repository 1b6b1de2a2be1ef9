"""slurm.conf, gres.conf and slurmdbd.conf written from the fleet and slurm.yaml. Pure and deterministic.

`render_slurm(slurm, hosts, paths)` returns the files as text: the same settings and fleet give byte-identical
files (nodes, partitions and GPUs sorted; no time stamps), so a reconfigure is needed only on a real change.
Every lendable node the fleet reports appears once, in its partition, with its GPUs by type; a lendable node the
fleet does not report (yet) is left out and named in `missing`, and a partition left with no node is left out too.

Every node enters `State=DRAIN` with llmgw's drain reason (DRAIN_REASON): lending resumes it in Slurm
(`scontrol update NodeName=... State=RESUME`), reclaiming drains it again, so lending never rewrites the file.
Slurm keeps a node's state across reconfigures; the State= of slurm.conf is only where a new node starts.

Format: slurm.schedmd.com/slurm.conf.html, gres.conf.html and slurmdbd.conf.html (Slurm 22.05): one `Key=Value`
per line, node and partition lines as `NodeName=...` / `PartitionName=...` with their parameters; MaxTime in
minutes or UNLIMITED; RealMemory in MiB. GPUs go to gres.conf one line per device file (`File=/dev/nvidiaN`);
MIG instances are left out (they need AutoDetect=nvml, not written here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.plan.conf_lines import Options, Quoted, Value, conf_line, conf_value
from llmgw.plan.types import Fleet, NodeState
from llmgw.settings.slurm import SlurmSettings
from llmgw.tools.conf_keys import GRES_CONF_KEYS, SLURM_CONF_KEYS, SLURMDBD_CONF_KEYS
from llmgw.tools.slurm import SlurmdConfig

DRAIN_REASON = "llmgw: not lent"
"""The Reason= llmgw sets when it drains a node; a drain with any other reason was made by someone else."""

_MIB = 1024 * 1024
_GRES_TYPE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class SlurmHost:
    """A node as Slurm is told of it: `address` slurmctld reaches its slurmd on, whole `cpus`, `memory_mib`,
    `gpus` as (type, device file) pairs in device order, and its `hostname` ("" unknown: the node id is taken).
    slurmctld and slurmdbd refuse to start on a host whose short hostname is not the one slurm.conf names."""

    node_id: str
    address: str
    cpus: int
    memory_mib: int
    gpus: tuple[tuple[str, str], ...] = ()
    hostname: str = ""


@dataclass(frozen=True)
class SlurmPaths:
    """Where the daemons keep their files on a node, and who runs them: not settings (the agent, or a test, says).

    Defaults are Debian's slurm-wlm. `slurm_user` runs slurmctld and slurmdbd; `munge_socket` "" is munged's
    default socket."""

    state_dir: str = "/var/spool/slurmctld"
    spool_dir: str = "/var/spool/slurmd"
    log_dir: str = "/var/log/slurm"
    run_dir: str = "/run/slurm"
    slurm_user: str = "slurm"
    munge_socket: str = ""  # "" munge's default socket; else AuthInfo=socket=<path>


@dataclass(frozen=True)
class RenderedSlurm:
    """The files as text, and the lendable nodes of slurm.yaml the fleet did not report (`missing`, sorted)."""

    slurm_conf: str
    gres_conf: str
    missing: tuple[str, ...] = ()


def gres_type(gpu_class: str) -> str:
    """A GPU class as a Slurm GRES type: characters other than letters, digits, '_' and '-' become '_'."""
    return _GRES_TYPE.sub("_", gpu_class) or "gpu"


def host_of(node: NodeState, ignore_gpus: Iterable[str] = ()) -> SlurmHost:
    """The Slurm view of one reported node: its CPU cores rounded down, memory in MiB, whole GPUs (not MIG
    instances, not `ignore_gpus`) with device file /dev/nvidia<index>."""
    ignored = set(ignore_gpus)
    gpus = sorted(((gres_type(g.gpu_class), f"/dev/nvidia{g.device_id}") for g in node.gpus
                   if not g.is_mig and g.device_id.isdigit() and g.device_id not in ignored),
                  key=lambda pair: (int(pair[1].removeprefix("/dev/nvidia")), pair[0]))
    return SlurmHost(node.node_id, node.address, max(1, math.floor(node.cpu_cores)), node.memory_bytes // _MIB,
                     tuple(gpus))


def hosts_of(fleet: Fleet, ignore_gpus: Mapping[str, Iterable[str]] | None = None) -> dict[str, SlurmHost]:
    """`host_of` for every node of the fleet that is alive, by node id."""
    ignore = ignore_gpus or {}
    return {node.node_id: host_of(node, ignore.get(node.node_id, ())) for node in fleet.nodes if node.alive}


def host_from_slurmd(config: SlurmdConfig, node_id: str, address: str) -> SlurmHost:
    """A host from `slurmd -C` (llmgw.tools.slurm): typed GPUs get device files /dev/nvidia0.. in type order."""
    gpus: list[tuple[str, str]] = []
    for kind in sorted(config.gpus):
        for _ in range(config.gpus[kind]):
            gpus.append((gres_type(kind or "gpu"), f"/dev/nvidia{len(gpus)}"))
    return SlurmHost(node_id, address, config.cpus, config.memory_mib, tuple(gpus), config.node_name)


def _minutes(seconds: float | None) -> str:
    return "UNLIMITED" if seconds is None else str(max(1, math.ceil(seconds / 60)))


def _gres(gpus: tuple[tuple[str, str], ...]) -> str:
    counts: dict[str, int] = {}
    for kind, _ in gpus:
        counts[kind] = counts.get(kind, 0) + 1
    return ",".join(f"gpu:{kind}:{counts[kind]}" for kind in sorted(counts))


def render_slurm(slurm: SlurmSettings, hosts: Mapping[str, SlurmHost], paths: SlurmPaths = SlurmPaths(),
                 *, controller_address: str | None = None) -> RenderedSlurm:
    """slurm.conf and gres.conf for `slurm` over `hosts` (by node id, e.g. `hosts_of(fleet)`).

    `controller_address`: where slurmctld listens (default: the controller's host address, else its node id).
    Returns RenderedSlurm; never raises for a fleet that lacks nodes (they go to `missing`). Every line is written by
    `llmgw.plan.conf_lines.conf_line` with the keys of `llmgw.tools.conf_keys` (SLURM_CONF_KEYS, GRES_CONF_KEYS).
    Raises GeneratedFileError naming the key and value when a value (an address, a host name) would change the
    file's meaning: a newline, `#`, `=` or whitespace.
    """
    present = sorted(n for n in slurm.nodes if n in hosts)
    missing = tuple(sorted(n for n in slurm.nodes if n not in hosts))
    controller = slurm.controller
    address = controller_address or (hosts[controller].address if controller in hosts else controller)
    hostname = (hosts[controller].hostname if controller in hosts else "") or controller
    ports = slurm.ports

    def line(*pairs: tuple[str, Value]) -> str:
        return conf_line(SLURM_CONF_KEYS, *pairs)

    pairs: list[tuple[str, Value] | None] = [
        ("ClusterName", slurm.cluster_name),
        ("SlurmctldHost", f"{conf_value('SlurmctldHost', hostname)}({conf_value('SlurmctldHost', address)})")
        if controller else None,
        ("SlurmctldPort", ports["slurmctld"]),
        ("SlurmdPort", ports["slurmd"]),
        ("SlurmctldParameters", "enable_configless"),
        ("AuthType", "auth/munge"),
        ("CredType", "cred/munge"),
        ("AuthInfo", Options((("socket", paths.munge_socket),))) if paths.munge_socket else None,
        ("SlurmUser", paths.slurm_user),
        ("StateSaveLocation", paths.state_dir),
        ("SlurmdSpoolDir", paths.spool_dir),
        ("SlurmctldPidFile", f"{paths.run_dir}/slurmctld.pid"),
        ("SlurmdPidFile", f"{paths.run_dir}/slurmd.pid"),
        ("SlurmctldLogFile", f"{paths.log_dir}/slurmctld.log"),
        ("SlurmdLogFile", f"{paths.log_dir}/slurmd.log"),
        ("ProctrackType", slurm.proctrack_type),
        ("TaskPlugin", slurm.task_plugin),
        ("SchedulerType", "sched/backfill"),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core_Memory"),
        ("ReturnToService", 1),
        ("MpiDefault", "none"),
        ("MailProg", "/bin/true"),
        ("JobAcctGatherType", "jobacct_gather/linux"),
    ]
    if slurm.accounting:
        pairs += [("AccountingStorageType", "accounting_storage/slurmdbd"), ("AccountingStorageHost", address),
                  ("AccountingStoragePort", ports["slurmdbd"]), ("AccountingStorageEnforce", "associations")]
        if paths.munge_socket:  # the accounting_storage/slurmdbd plugin takes its munge socket from here
            pairs.append(("AccountingStoragePass", paths.munge_socket))
    else:
        pairs += [("AccountingStorageType", "accounting_storage/none")]
    if any(hosts[n].gpus for n in present):
        pairs += [("GresTypes", "gpu"), ("AccountingStorageTRES", "gres/gpu")]
    lines = ["# Written by llmgw from slurm.yaml and the fleet: edits here are overwritten.",
             *(line(pair) for pair in pairs if pair is not None), ""]
    gres_lines = ["# Written by llmgw from the fleet: edits here are overwritten."]
    for node_id in present:
        host = hosts[node_id]
        node: list[tuple[str, Value]] = [("NodeName", node_id), ("NodeAddr", host.address)]
        if host.hostname and host.hostname != node_id:
            node.append(("NodeHostname", host.hostname))
        node += [("CPUs", host.cpus), ("RealMemory", host.memory_mib)]
        if host.gpus:
            node.append(("Gres", _gres(host.gpus)))
        lines.append(line(*node, ("State", "DRAIN"), ("Reason", Quoted(DRAIN_REASON))))
        for kind, device in host.gpus:
            gres_lines.append(conf_line(GRES_CONF_KEYS, ("NodeName", node_id), ("Name", "gpu"), ("Type", kind),
                                        ("File", device)))
    lines.append("")
    for name in slurm.partitions:
        members = [n for n in present if slurm.nodes[n].partition == name]
        if not members:
            continue
        partition = slurm.partitions[name]
        lines.append(line(("PartitionName", name), ("Nodes", ",".join(members)),
                          ("Default", "YES" if partition.default else "NO"),
                          ("MaxTime", _minutes(partition.max_time_seconds)), ("State", "UP")))
    return RenderedSlurm("\n".join(lines) + "\n", "\n".join(gres_lines) + "\n", missing)


def render_slurmdbd_conf(slurm: SlurmSettings, *, storage_host: str, storage_port: int, storage_user: str,
                         storage_password: str, storage_database: str, dbd_host: str, dbd_address: str,
                         paths: SlurmPaths = SlurmPaths()) -> str:
    """slurmdbd.conf for the controller: slurmdbd on MariaDB/MySQL at storage_host:storage_port, on the host whose
    short hostname is `dbd_host` (slurmdbd checks), listening on `dbd_address`.

    The password goes into the file (which the caller writes mode 0600, owner `paths.slurm_user`), never onto a
    command line. Format: slurm.schedmd.com/slurmdbd.conf.html. Written by `conf_line` with SLURMDBD_CONF_KEYS;
    raises GeneratedFileError like `render_slurm`.
    """
    pairs: list[tuple[str, Value] | None] = [
        ("AuthType", "auth/munge"),
        ("AuthInfo", Options((("socket", paths.munge_socket),))) if paths.munge_socket else None,
        ("DbdHost", dbd_host),
        ("DbdAddr", dbd_address),
        ("DbdPort", slurm.ports["slurmdbd"]),
        ("SlurmUser", paths.slurm_user),
        ("PidFile", f"{paths.run_dir}/slurmdbd.pid"),
        ("LogFile", f"{paths.log_dir}/slurmdbd.log"),
        ("StorageType", "accounting_storage/mysql"),
        ("StorageHost", storage_host),
        ("StoragePort", storage_port),
        ("StorageUser", storage_user),
        ("StoragePass", storage_password),
        ("StorageLoc", storage_database),
    ]
    lines = ["# Written by llmgw from slurm.yaml: edits here are overwritten.",
             *(conf_line(SLURMDBD_CONF_KEYS, pair) for pair in pairs if pair is not None)]
    return "\n".join(lines) + "\n"
