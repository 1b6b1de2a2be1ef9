"""The commands a plan's actions become: StartShard, StopShard, InstallEngine and AgentSettings messages
(llmgw/wire/agent.proto), AgentSettings with the node's part in Slurm.

Pure apart from looking secrets up: a planned `Action`, the settings in force and what the node reported in,
a pb message body out. Replica keys and weight tokens go into the message (the agent puts them in the engine's
environment); they are never written to status, audit or logs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.control.deciding import action_key, shard_id_of  # noqa: F401 - re-exported for callers
from llmgw.control.effects import platform_of  # noqa: F401 - re-exported for callers
from llmgw.errors import UsageError
from llmgw.identity import split_engine_key
from llmgw.plan.identity import engine_version_of
from llmgw.plan.slurm_accounts import desired_accounts
from llmgw.plan.slurm_conf import hosts_of
from llmgw.plan.slurm_users import WantedUser
from llmgw.plan.slurm_roles import STORAGE_HOST, STORAGE_PORT, slurm_roles, slurmdbd_conf, storage_names, storage_password
from llmgw.plan.types import Action, ActionKind, Fleet
from llmgw.settings.model import Settings
from llmgw.wire import pb


def start_shard(
    action: Action,
    settings: Settings,
    replica_key: Callable[[str], str],
    secret: Callable[[str], str],
) -> pb.StartShard:
    """The StartShard for a START or RESTART action (with the rank, group, rendezvous and NCCL variables of a
    replica spread over several nodes, `llmgw.plan.spanning`), and the model's LoRA adapters in catalog order.

    Raises: UsageError when the model is gone from the settings or a secret its weights name is missing.
    """
    model = settings.models.get(action.model)
    if model is None:
        raise UsageError(f"model {action.model!r} of replica {action.replica_id} is not in the settings in force.")
    assignment = action.assignment
    def files(items) -> list[pb.WeightsFile]:
        return [pb.WeightsFile(source=w.source, sha256=w.sha256, secret_value=secret(w.secret) if w.secret else "")
                for w in items]

    weights = files(model.weights)
    adapters = [pb.LoraAdapter(name=a.name, weights=files(a.weights)) for a in model.adapters]
    return pb.StartShard(
        shard_id=shard_id_of(action),
        replica_id=action.replica_id,
        model=model.name,
        engine=model.engine,
        engine_version=engine_version_of(settings, model) or "",
        weights=weights,
        devices=list(assignment.devices) if assignment else [],
        cpu_cores=assignment.cpu_cores if assignment else model.resources.cpu_cores,
        memory_bytes=(assignment.memory_bytes if assignment else model.resources.memory_bytes) or 0,
        context_size=model.context_size or 0,
        engine_args=list(model.engine_args),
        replica_key=replica_key(action.replica_id),
        fingerprint=assignment.fingerprint if assignment else "",
        settings_commit=settings.commit or "",
        tensor_parallel=model.resources.tensor_parallel,
        pipeline_parallel=model.resources.pipeline_parallel,
        allow_pickle=model.allow_pickle,
        served_name=model.name,
        rank=assignment.rank if assignment else 0,
        nodes=assignment.nodes if assignment else 1,
        group=assignment.group if assignment else "",
        rendezvous=assignment.rendezvous if assignment else "",
        env=dict(assignment.env) if assignment else {},
        adapters=adapters,
    )


def stop_shard(action: Action, settings: Settings) -> pb.StopShard:
    """The StopShard for a STOP action, with the node's `shard_stop_grace` (seconds) and the drain timeout
    (llmgw.yaml `listeners.gateway.drain_timeout`, seconds): a ready shard's requests in flight get that long
    to finish once it left the routing tables (`llmgw.agent.draining`)."""
    grace = settings.agent_settings_for(action.node_id).shard_stop_grace
    return pb.StopShard(shard_id=shard_id_of(action), grace_seconds=grace,
                        drain_seconds=settings.cluster.gateway.drain_timeout)


def install_engine(action: Action, settings: Settings, platform: str) -> pb.InstallEngine:
    """The InstallEngine for an INSTALL action ("llama.cpp@b11434"), with the archive for `platform`
    ("linux-x86_64") when engines.yaml lists one. Raises: UsageError when engines.yaml has no such version.
    """
    engine, version = split_engine_key(action.engine)
    entry = settings.engine_version(engine, version or None)
    if entry is None:
        raise UsageError(f"engines.yaml lists no {engine} version {version!r}; add it or change the model's engine_version.")
    url, sha = entry.archives.get(platform, ("", ""))
    return pb.InstallEngine(
        engine=entry.engine,
        version=entry.version,
        archive_url=url,
        archive_sha256=sha,
        sdist_package=entry.sdist_package or "",
        sdist_version=entry.sdist_version or "",
        sdist_sha256=entry.sdist_sha256 or "",
        mirror=entry.mirror or "",
        build_args=list(entry.build_args),
        python_packages=list(entry.python_packages),
    )


def may_take_part_in_slurm(settings: Settings, node_id: str) -> bool:
    """Whether `node_id` can have a part in Slurm at all: Slurm enabled and the node its controller or one of its
    nodes. Pure and O(1): a control plane asks it before building the whole fleet for `slurm_role` (the fleet built
    for every node's agent settings was a quarter of the server's CPU while 500 agents joined, docs/scale.md)."""
    slurm = settings.slurm
    return bool(slurm.enabled) and (node_id == slurm.controller or node_id in slurm.nodes)


def slurm_role(settings: Settings, fleet: Fleet, node_id: str, secret: Callable[[str], str],
               users: Sequence[WantedUser] = (), finished_since: float = 0.0) -> pb.SlurmRole:
    """`node_id`'s part in Slurm (llmgw.plan.slurm_roles) as the wire's SlurmRole, with the munge key (the secret
    slurm.yaml names, as UTF-8 bytes), the Linux users every Slurm node has (`users`, from
    `llmgw.control.slurm_store.users_from_store`) and, on the controller with accounting, slurmdbd.conf, the MariaDB
    user's password derived from the key, the accounts (members by their logins of `users`) and the sacct cursor
    `finished_since` (unix seconds, 0: none). An empty SlurmRole when the node has no part.

    Raises: UsageError when the munge key secret is missing.
    """
    slurm = settings.slurm
    if not may_take_part_in_slurm(settings, node_id):
        return pb.SlurmRole()
    hosts = hosts_of(fleet)
    role = slurm_roles(slurm, hosts, desired_accounts(settings)).get(node_id)
    if role is None:
        return pb.SlurmRole()
    key = secret(slurm.munge_key_secret).encode()
    message = pb.SlurmRole(
        daemons=list(role.daemons), node_name=role.node_name, lent=role.lent, drain_reason=role.drain_reason,
        slurm_conf=role.slurm_conf, gres_conf=role.gres_conf, munge_key=key,
        slurmctld_port=slurm.ports["slurmctld"], slurmdbd_port=slurm.ports["slurmdbd"],
        users=[pb.SlurmUser(login=u.login, uid=u.uid, email=u.email, home=u.home, shell=u.shell, keys=list(u.keys))
               for u in users],
        shared_path=slurm.shared_path if users or role.nfs_clients or role.nfs_server else "",
        containers=role.containers if role.containers != "none" else "", nfs_clients=list(role.nfs_clients),
        nfs_server=role.nfs_server)
    if role.accounting:
        password = storage_password(key, slurm)
        user, database = storage_names(slurm)
        message.slurmdbd_conf = slurmdbd_conf(slurm, hosts, password)
        message.storage_host, message.storage_port = STORAGE_HOST, STORAGE_PORT
        message.storage_user, message.storage_database, message.storage_password = user, database, password
        message.cluster_name = slurm.cluster_name
        message.finished_since = finished_since
        accounts = desired_accounts(settings, {u.email: u.login for u in users}) if users else dict(role.accounts)
        message.accounts.extend(pb.SlurmAccountWanted(name=name, parent=a.parent, description=a.description,
                                                      organisation=a.organisation, users=list(a.users))
                                for name, a in accounts.items())
    return message


def agent_settings(settings: Settings, node_id: str, slurm: pb.SlurmRole | None = None) -> pb.AgentSettings:
    """The AgentSettings message for `node_id` (its override file over agents/default.yaml), with its part in
    Slurm (`slurm_role`; None: none)."""
    agent = settings.agent_settings_for(node_id)
    return pb.AgentSettings(
        slurm=slurm,
        weights_dir=agent.weights_dir,
        engines_dir=agent.engines_dir,
        heartbeat_interval=agent.heartbeat_interval,
        telemetry_interval=agent.telemetry_interval,
        labels=dict(agent.labels),
        ignore_gpus=list(agent.ignore_gpus),
        mirrors=list(agent.mirrors),
        offline=agent.offline,
        shard_stop_grace=agent.shard_stop_grace,
        build=agent.build,
        certificate_renew_fraction=agent.certificate_renew_fraction,
        control_planes=list(settings.cluster.control_planes),
        tracing=pb.TraceSettings(endpoint=agent.tracing.endpoint or "", sample_ratio=agent.tracing.sample_ratio),
    )
