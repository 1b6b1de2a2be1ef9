"""The planner's inputs (the observed fleet) and outputs (the desired assignment and the actions), as plain data.

The control plane builds `Fleet` from agents' Register / Heartbeat / ShardStatus messages; the planner
(`llmgw.plan.make_plan`) turns (Settings, Fleet) into a `Plan`. Sizes in bytes, times in seconds.

Ids: a replica id is "<model>-<n>" (n from 0); a shard id is "<replica id>/<k>" for the k-th engine process of
the replica (k from 0; a tensor-parallel replica on one node has one shard).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmgw.identity import ShardState
from llmgw.tools.memory_bandwidth import MemoryBandwidth


@dataclass(frozen=True)
class GpuState:
    """One placeable device of a node: a whole GPU or a MIG instance.

    `device_id` is what the engine is given (index "0", or a MIG UUID "MIG-..."); `gpu_class` e.g. "h100-80g"
    or "a100-80g-mig-3g.40gb"; `foreign_processes` True when processes we did not start use the card (not placeable).
    `numa_node` None when unknown; `nvlink_peers` lists device_ids reachable over NVLink. `unhealthy` is why a
    health finding takes the card out of placement ("" when none does; see `llmgw.tools.health`); `parent_uuid`
    the whole card's UUID for a MIG instance ("" for a whole card).
    """

    device_id: str
    gpu_class: str
    memory_total_bytes: int
    memory_free_bytes: int
    uuid: str = ""
    foreign_processes: bool = False
    is_mig: bool = False
    numa_node: int | None = None
    nvlink_peers: tuple[str, ...] = ()
    unhealthy: str = ""
    parent_uuid: str = ""


@dataclass(frozen=True)
class ObservedShard:
    """A shard an agent reports as running (or failed).

    `fingerprint` identifies what it runs (see `llmgw.plan.fingerprint`): a change of weights, engine version or
    engine arguments changes it and makes the replica roll. `port` is where the engine listens on the node.
    `adopted_foreign` True for an engine process llmgw did not start (reported, never killed). `rank` the shard's
    rank in a replica spread over several nodes (0 otherwise) and `group` the shard id of its rank 0 (what tells two
    groups of one replica apart while one replaces the other; "" on one node): the agent echoes what StartShard said.
    """

    shard_id: str
    replica_id: str
    model: str
    state: ShardState
    fingerprint: str = ""
    settings_commit: str = ""
    devices: tuple[str, ...] = ()
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    port: int = 0
    error: str = ""
    restarts: int = 0
    adopted_foreign: bool = False
    rank: int = 0
    group: str = ""


@dataclass(frozen=True)
class Interconnect:
    """What a node offers a replica spread over several nodes (`llmgw.plan.multinode`), from its health report.

    `domain` its multi-node NVLink domain (a ClusterUUID; None: none), `domain_ready` whether every card joined it
    and IMEX is up, `domain_reason` why not ("" when ready); `adapters` ((adapter, fabric id, leaf), ...) of its
    active InfiniBand ports in rail order: fabric "" when no subnet manager was read, leaf "" when no fabric map
    (ibnetdiscover) placed it under a switch.
    """

    domain: str | None = None
    domain_ready: bool = False
    domain_reason: str = ""
    adapters: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class NodeState:
    """One node as last reported.

    `alive` False once it missed heartbeats for `node_lost_after`. `cpu_cores` and `memory_bytes` are the
    node's totals less what its agent settings reserve. `engines_installed` holds "llama.cpp@b11434"-style
    keys; `engines_installing` those being installed now. `address` is the host the gateway reaches shards on.
    `agent_settings_applied` is the fingerprint (`llmgw.plan.agent_settings_fingerprint`) of the agent settings
    the node acknowledged since it connected: "" none yet, None not tracked (the planner then plans no CONFIGURE).
    `engines_installable` the engines (names, "llama.cpp") its agent can install and `features` what its agent
    version can do (Register's `engines_installable` / `features`); None: unknown, taken as anything.
    `slurm_job_steps` the Slurm job steps running on it as its agent last read them (0: none, or no Slurm).
    `interconnect` its NVLink domain and InfiniBand adapters (empty before its first health report).
    `memory_bandwidth` what its agent's bandwidth probe measured once per boot (None: not measured, or an agent
    started without the probe).
    `inlet_too_hot` why its board inlet keeps new replicas off (`llmgw.plan.cordons.inlet_verdict`; "" when not).
    """

    node_id: str
    address: str = "127.0.0.1"
    alive: bool = True
    labels: tuple[tuple[str, str], ...] = ()
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    gpus: tuple[GpuState, ...] = ()
    engines_installed: frozenset[str] = frozenset()
    engines_installing: frozenset[str] = frozenset()
    shards: tuple[ObservedShard, ...] = ()
    agent_settings_applied: str | None = None
    engines_installable: frozenset[str] | None = None
    features: frozenset[str] | None = None
    slurm_job_steps: int = 0
    interconnect: Interconnect = Interconnect()
    memory_bandwidth: MemoryBandwidth | None = None
    inlet_too_hot: str = ""


@dataclass(frozen=True)
class Fleet:
    """Every node the control plane knows, by id order."""

    nodes: tuple[NodeState, ...] = ()

    def node(self, node_id: str) -> NodeState | None:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        return None


class ActionKind(str, enum.Enum):
    START = "start"        # start a shard of a replica on a node
    STOP = "stop"          # stop a shard
    KEEP = "keep"          # a shard that is where it should be
    INSTALL = "install"    # install an engine version on a node
    RESTART = "restart"    # a failed shard we own: start it again
    CONFIGURE = "configure"  # send a node its agent settings (agents/default.yaml + agents/nodes/<node>.yaml)


@dataclass(frozen=True)
class Assignment:
    """Where one replica runs: its node, devices (empty on CPU), reserved CPU cores and memory bytes.

    `shard_id` is the shard that runs (or will run) it: "<replica>/0", or "<replica>/0@<fingerprint[:8]>" for
    the new generation of a rolling replica whose old shard still holds "<replica>/0" (see llmgw.plan.planning).
    A replica spread over several nodes (`llmgw.plan.spanning`) has one assignment per shard: `rank` (0 the
    rendezvous) of `nodes`, `group` rank 0's shard id, `rendezvous` rank 0's address, and `env` the NCCL variables
    its engine is started with.
    """

    replica_id: str
    model: str
    node_id: str
    devices: tuple[str, ...] = ()
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    fingerprint: str = ""
    shard_id: str = ""
    rank: int = 0
    nodes: int = 1
    rendezvous: str = ""
    env: tuple[tuple[str, str], ...] = ()
    group: str = ""


@dataclass(frozen=True)
class FirewallTable:
    """One node's nftables table (`llmgw.plan.firewall`): `text` (nft syntax, the `table inet llmgw { ... }` block),
    `digest` 16 hex digits of its sha256, `rollback_after_seconds` (firewall.yaml), `unknown` the node ids whose
    address is not an IP address (left out of every set, sorted)."""

    node_id: str
    text: str
    digest: str
    rollback_after_seconds: float
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    """One step of a plan: `kind` on `node_id` for `replica_id` / `shard_id` (engine key for INSTALL), and why.

    `engine` is the engine key ("llama.cpp@b11434") of an INSTALL, `fingerprint` the agent-settings fingerprint a
    CONFIGURE sends (`llmgw.plan.planning`), `firewall` the node's nftables table a CONFIGURE sends (None: none,
    firewall.yaml off: the agent removes llmgw's table); each field means one thing only.

    `previous_node` is set on a START that replaces a shard of the same replica elsewhere (a lost node, a
    roll to another node): renderers show it as a move.
    """

    kind: ActionKind
    node_id: str
    replica_id: str = ""
    shard_id: str = ""
    model: str = ""
    engine: str = ""
    assignment: Assignment | None = None
    reason: str = ""
    previous_node: str = ""
    fingerprint: str = ""
    firewall: FirewallTable | None = None


@dataclass(frozen=True)
class Unplaced:
    """A replica that cannot be placed now, with one reason per node ("node02: 1 of 2 h100-80g free")."""

    replica_id: str
    model: str
    reasons: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        detail = "; ".join(f"{node}: {why}" for node, why in self.reasons) or "no nodes"
        return f"{self.replica_id} cannot be placed: {detail}"


@dataclass(frozen=True)
class Plan:
    """The desired assignment and the actions that reach it from the observed fleet.

    `actions` are ordered: agent settings (CONFIGURE), installs, then starts, then stops (a stop whose replacement is not ready yet is
    left out until it is: rolling). `changes` is True when any action other than KEEP is present.
    """

    assignments: tuple[Assignment, ...] = ()
    actions: tuple[Action, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    settings_commit: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return any(a.kind is not ActionKind.KEEP for a in self.actions)
