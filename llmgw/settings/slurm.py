"""`slurm.yaml` as a typed model: Slurm beside llmgw (issue 15), and its cross-file checks.

`build_slurm(data, found, file, fleet)` turns the schema-valid mapping into `SlurmSettings` and adds an error at
file:line for each of: a node of `nodes` (or the controller) the fleet does not know, a node naming a partition
that `partitions` lacks, a partition with no node, two default partitions, and `users: llmgw` without a
`shared_path`, and a `shared.export` node without a `shared_path` or that is not the controller or a lendable node
(and a warning for `ssh_keys` without `users: llmgw`). "The fleet" here is what the settings know of it: the node ids with an `agents/nodes/<node>.yaml`.
Durations are in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from llmgw.units import parse_duration

DEFAULT_PORTS = {"slurmctld": 6817, "slurmd": 6818, "slurmdbd": 6819}


@dataclass(frozen=True)
class SlurmNode:
    """A node that may be lent to Slurm: its `partition`, and `lent` True while Slurm has it."""

    partition: str
    lent: bool = False


@dataclass(frozen=True)
class SlurmPartition:
    """A partition: `default` True for the one jobs go to unasked; `max_time_seconds` None means unlimited."""

    default: bool = False
    max_time_seconds: float | None = None


@dataclass(frozen=True)
class SlurmSettings:
    """`slurm.yaml`. `nodes` by node id, `partitions` by name (both in file order); `users` "none" or "llmgw";
    `shared_path` "" when not given; `shared_export` the node id that exports `shared_path` over NFS to the other
    Slurm nodes ("": the site mounts it); `containers` the OCI runtime of `srun --container` ("none" or "runc");
    `ssh_keys` each member's SSH public keys by e-mail (file order); `ports` maps "slurmctld" / "slurmd" /
    "slurmdbd" to a TCP port."""

    enabled: bool = False
    cluster_name: str = "llmgw"
    controller: str = ""
    nodes: Mapping[str, SlurmNode] = field(default_factory=lambda: MappingProxyType({}))
    partitions: Mapping[str, SlurmPartition] = field(default_factory=lambda: MappingProxyType({}))
    accounting: bool = False
    users: str = "none"
    shared_path: str = ""
    shared_export: str = ""
    containers: str = "none"
    ssh_keys: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    munge_key_secret: str = "munge-key"
    proctrack_type: str = "proctrack/cgroup"
    task_plugin: str = "task/cgroup,task/affinity"
    ports: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict(DEFAULT_PORTS)))

    @property
    def lent(self) -> frozenset[str]:
        """Ids of the nodes lent to Slurm now."""
        return frozenset(node for node, entry in self.nodes.items() if entry.lent)


def build_slurm(data: Mapping[str, Any], found: Any, file: str, fleet: frozenset[str] | None) -> SlurmSettings:
    """`slurm.yaml` data (schema-valid) -> SlurmSettings; cross-checks added to `found` (building.Found) as errors.

    `fleet`: the node ids the settings know (agents/nodes/<node>.yaml stems); None skips the fleet checks.
    """
    nodes = {name: SlurmNode(entry["partition"], bool(entry.get("lent", False)))
             for name, entry in data.get("nodes", {}).items()}
    partitions = {name: SlurmPartition(bool(entry.get("default", False)),
                                       parse_duration(entry["max_time"]) if "max_time" in entry else None)
                  for name, entry in data.get("partitions", {}).items()}
    settings = SlurmSettings(
        enabled=bool(data.get("enabled", False)),
        cluster_name=data.get("cluster_name", "llmgw"),
        controller=data.get("controller", ""),
        nodes=MappingProxyType(nodes),
        partitions=MappingProxyType(partitions),
        accounting=bool(data.get("accounting", False)),
        users=data.get("users", "none"),
        shared_path=data.get("shared_path", ""),
        shared_export=data.get("shared", {}).get("export", ""),
        containers=data.get("containers", "none"),
        ssh_keys=MappingProxyType({email: tuple(keys) for email, keys in data.get("ssh_keys", {}).items()}),
        munge_key_secret=data.get("munge_key_secret", "munge-key"),
        proctrack_type=data.get("proctrack_type", "proctrack/cgroup"),
        task_plugin=data.get("task_plugin", "task/cgroup,task/affinity"),
        ports=MappingProxyType({**DEFAULT_PORTS, **data.get("ports", {})}),
    )
    known = "the settings know nodes by their agents/nodes/<node>.yaml (an empty mapping `{}` will do)"
    if fleet is not None:
        if settings.controller and settings.controller not in fleet:
            found.add(file, ("controller",), f"node {settings.controller!r} is not in the fleet: {known}")
        for name in nodes:
            if name not in fleet:
                found.add(file, ("nodes", name), f"node {name!r} may be lent but is not in the fleet: {known}",
                          of_key=True)
    for name, node in nodes.items():
        if node.partition not in partitions:
            found.add(file, ("nodes", name, "partition"), f"partition {node.partition!r} is not among `partitions` "
                      f"({', '.join(partitions) or 'none defined'})")
    used = {node.partition for node in nodes.values()}
    for name in partitions:
        if name not in used:
            found.add(file, ("partitions", name), f"partition {name!r} has no nodes: give it one in `nodes` or "
                      "remove it", of_key=True)
    defaults = [name for name, partition in partitions.items() if partition.default]
    for name in defaults[1:]:
        found.add(file, ("partitions", name, "default"), f"partitions {defaults[0]!r} and {name!r} are both the "
                  "default; keep one")
    if settings.users == "llmgw" and not settings.shared_path:
        found.add(file, ("users",), "users: llmgw needs a shared_path (the file system holding the users' homes)")
    if settings.shared_export and not settings.shared_path:
        found.add(file, ("shared", "export"), "shared.export needs a shared_path (the directory the node exports)")
    elif settings.shared_export and settings.shared_export not in (settings.controller, *nodes):
        found.add(file, ("shared", "export"), f"node {settings.shared_export!r} exports the shared path but is "
                  "neither the controller nor a lendable node: name one of them")
    if settings.ssh_keys and settings.users != "llmgw":
        found.add(file, ("ssh_keys",), "ssh_keys are written only for users llmgw makes: set `users: llmgw` (and "
                  "shared_path), or remove them", of_key=True, severity="warning")
    if nodes and not settings.controller:
        found.add(file, ("nodes",), "nodes may be lent but no controller is named: add `controller: <node>`",
                  of_key=True)
    return settings
