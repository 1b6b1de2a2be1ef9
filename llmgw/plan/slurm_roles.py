"""Each node's part in Slurm, from slurm.yaml and the fleet: which daemons its agent runs, whether it is lent, and the
files it writes. Pure.

`slurm_roles(slurm, hosts)` gives every node with a part its SlurmRole; a node with none (Slurm disabled, or
neither the controller nor a lendable node) has no entry. The controller runs slurmctld (and slurmdbd first, with accounting); a lendable node runs slurmd;
a node may be both. Every node with a part runs munged (the agent adds it). The files are rendered once for the
whole cluster (`llmgw.plan.slurm_conf`) with placeholders for what only the node knows (AGENT_PATHS): the agent
fills them from its own layout, so the control plane need not know where a node keeps Slurm's state.

The controller's node id is its short hostname (the agent's default node id): slurmctld and slurmdbd refuse to
start on a host whose name is not the one slurm.conf names.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from llmgw.plan.slurm_conf import DRAIN_REASON, SlurmHost, SlurmPaths, render_slurm, render_slurmdbd_conf
from llmgw.settings.slurm import SlurmSettings
from llmgw.tools.slurm_accounts import WantedAccount

SLURM_DIR = "@SLURM_DIR@"
SLURM_USER = "@SLURM_USER@"
MUNGE_SOCKET = "@MUNGE_SOCKET@"
AGENT_PATHS = SlurmPaths(state_dir=f"{SLURM_DIR}/state", spool_dir=f"{SLURM_DIR}/spool", log_dir=f"{SLURM_DIR}/log",
                         run_dir=f"{SLURM_DIR}/run", slurm_user=SLURM_USER, munge_socket=MUNGE_SOCKET)
"""The paths the files are rendered with; the agent replaces SLURM_DIR, SLURM_USER and MUNGE_SOCKET."""

STORAGE_HOST = "127.0.0.1"
STORAGE_PORT = 3306
"""MariaDB for slurmdbd: on the controller itself (Debian's mariadb-server listens there)."""

_NAME = re.compile(r"[^a-z0-9_]")


@dataclass(frozen=True)
class SlurmRole:
    """One node's part. `daemons` in start order ("slurmdbd", "slurmctld", "slurmd"); `node_name` its NodeName
    ("" without slurmd); `lent` from slurm.yaml; `slurm_conf`/`gres_conf` with AGENT_PATHS' placeholders;
    `accounting` True on the controller when slurmdbd runs (its conf needs the password: `slurmdbd_conf`), and then
    `accounts` the Slurm accounts it keeps with sacctmgr (`llmgw.plan.slurm_accounts.desired_accounts`), in order;
    `members` what the Linux users of `users: llmgw` depend on (`llmgw.plan.slurm_users.users_digest_input`): the
    control plane adds their logins and UIDs from the store when it sends the role; `containers` slurm.yaml's
    runtime for `srun --container` ("none" or "runc": the agent writes oci.conf from llmgw.tools.slurm_oci);
    `nfs_clients` on the node of `shared.export`: the other Slurm nodes' addresses, sorted (the only NFS clients of
    `shared_path`); `nfs_server` on those nodes: the exporting node's address ("" when there is no export or the
    fleet does not report that node yet)."""

    daemons: tuple[str, ...]
    node_name: str
    lent: bool
    slurm_conf: str
    gres_conf: str
    accounting: bool
    drain_reason: str = DRAIN_REASON
    accounts: tuple[tuple[str, WantedAccount], ...] = ()
    members: tuple[tuple[str, tuple[str, ...]], ...] = ()
    containers: str = "none"
    nfs_clients: tuple[str, ...] = ()
    nfs_server: str = ""

    def digest(self) -> str:
        """16 hex digits of sha256 over everything the agent is told (not the secret): a change means a CONFIGURE."""
        described = repr((self.daemons, self.node_name, self.lent, self.slurm_conf, self.gres_conf,
                          self.accounting, self.drain_reason, self.accounts, self.members, self.containers,
                          self.nfs_clients, self.nfs_server))
        return hashlib.sha256(described.encode()).hexdigest()[:16]


def slurm_roles(slurm: SlurmSettings, hosts: Mapping[str, SlurmHost],
                accounts: Mapping[str, WantedAccount] | None = None,
                members: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> dict[str, SlurmRole]:
    """Every node's part, by node id (a node with none is absent; {} when Slurm is disabled). `accounts` go to the
    controller with accounting (`llmgw.plan.slurm_accounts.desired_accounts(settings)`), `members` to every node
    (`llmgw.plan.slurm_users.users_digest_input(settings)`). `hosts` by node id,
    e.g. `llmgw.plan.slurm_conf.hosts_of(fleet)`; a lendable node the fleet does not report yet is left out of
    slurm.conf until it does (then every node's files change, and each is configured again). Renders once."""
    if not slurm.enabled:
        return {}
    rendered = None
    roles: dict[str, SlurmRole] = {}
    exporter = slurm.shared_export if slurm.shared_path else ""
    server = hosts[exporter].address if exporter in hosts else ""
    for node_id in dict.fromkeys([slurm.controller, *slurm.nodes]):
        daemons: list[str] = []
        if node_id == slurm.controller:
            daemons += ["slurmdbd", "slurmctld"] if slurm.accounting else ["slurmctld"]
        if node_id in slurm.nodes and node_id in hosts:
            daemons.append("slurmd")
        if not node_id or not daemons:
            continue
        rendered = rendered or render_slurm(slurm, hosts, AGENT_PATHS)
        node = slurm.nodes.get(node_id)
        kept = tuple((accounts or {}).items()) if "slurmdbd" in daemons else ()
        roles[node_id] = SlurmRole(tuple(daemons), node_id if "slurmd" in daemons else "", bool(node and node.lent),
                                   rendered.slurm_conf, rendered.gres_conf, "slurmdbd" in daemons, accounts=kept,
                                   members=members, containers=slurm.containers,
                                   nfs_server=server if exporter and node_id != exporter else "")
    if exporter in roles:
        clients = sorted({hosts[n].address for n in roles if n != exporter and n in hosts})
        roles[exporter] = replace(roles[exporter], nfs_clients=tuple(clients))
    return roles


def storage_names(slurm: SlurmSettings) -> tuple[str, str]:
    """(MariaDB user, database) for slurmdbd: "slurm_<cluster>" both, the cluster name lower case with other
    characters than letters, digits and '_' as '_', at most 32 characters (MariaDB's limit on user names)."""
    name = ("slurm_" + _NAME.sub("_", slurm.cluster_name.lower()))[:32]
    return name, name


def storage_password(munge_key: bytes, slurm: SlurmSettings) -> str:
    """slurmdbd's MariaDB password: 32 hex digits of HMAC-SHA256(munge key, "llmgw slurmdbd <cluster>"). Derived,
    so it is never stored apart from the key; it changes when the key does."""
    message = f"llmgw slurmdbd {slurm.cluster_name}".encode()
    return hmac.new(munge_key, message, hashlib.sha256).hexdigest()[:32]


def slurmdbd_conf(slurm: SlurmSettings, hosts: Mapping[str, SlurmHost], password: str) -> str:
    """slurmdbd.conf for the controller (AGENT_PATHS' placeholders), listening on the controller's address."""
    controller = hosts.get(slurm.controller)
    address = controller.address if controller else slurm.controller
    user, database = storage_names(slurm)
    return render_slurmdbd_conf(slurm, storage_host=STORAGE_HOST, storage_port=STORAGE_PORT, storage_user=user,
                                storage_password=password, storage_database=database,
                                dbd_host=(controller.hostname if controller else "") or slurm.controller,
                                dbd_address=address, paths=AGENT_PATHS)
