"""What an operator asks of the nodes through the control plane, answered over their agents' streams: a shard's
log lines, a fabric test between two nodes; and what the store holds for them: Slurm's Linux users, join tokens."""

from __future__ import annotations

from typing import Any

import trio

from llmgw.control.agents import AgentHub
from llmgw.control.fabric_test import check_nodes, grades_document, run_fabric_test
from llmgw.control.slurm_store import users_from_store
from llmgw.control.state import ControlState
from llmgw.errors import UsageError


async def node_logs(state: ControlState, agents: AgentHub, node_id: str, shard_id: str, lines: int) -> list[str]:
    """The last `lines` log lines of `shard_id` ("" for the agent's own) on `node_id`.

    Raises: UsageError for an unknown or disconnected node, or a shard the node does not report (in `state`);
    TemporaryError when it does not answer.
    """
    record = state.fleet.get(node_id)
    if shard_id and record is not None and shard_id not in {s.shard_id for s in record.state.shards}:
        known = ", ".join(sorted(s.shard_id for s in record.state.shards)) or "none"
        raise UsageError(f"node {node_id!r} reports no shard {shard_id!r} (its shards: {known}); leave out "
                         "--shard for the agent's own log.")
    return await agents.logs(node_id, shard_id, lines)


async def fabric_test(state: ControlState, agents: AgentHub, a: str, b: str) -> dict[str, Any]:
    """Run perftest's ib_write_bw from node `a` (client) to node `b` (server), rail by rail, and grade each
    (`llmgw.control.fabric_test`). A checkpoint; takes a few seconds per rail.

    Raises: UsageError for an unknown, disconnected or unfit node (or a == b); TemporaryError when one goes
    away or does not answer.
    """
    if a == b:
        raise UsageError("a fabric test needs two different nodes: llmgw fabric-test A B.")
    records = state.fleet.get(a), state.fleet.get(b)
    check_nodes(*records, names=(a, b), connected=state.connected())
    grades = await run_fabric_test(agents.sessions, *records)  # type: ignore[arg-type]
    return grades_document(a, b, grades)


async def slurm_users(state: ControlState, store: Any) -> dict[str, Any]:
    """`llmgw slurm users`: {"users": [{"email", "login", "uid", "home", "member", "keys"}]}: every member the
    store ever gave a login and UID (by UID; `member` False for one who left, whose UID stays theirs), with the
    home and SSH keys the settings in force give them; members not given one yet are assigned now."""
    settings = state.settings
    if settings is None or store is None:
        return {"users": []}
    wanted = {user.email: user for user in await trio.to_thread.run_sync(users_from_store, store, settings)}
    rows = await trio.to_thread.run_sync(store.slurm_users)
    return {"users": [{"email": row.email, "login": row.login, "uid": row.uid,
                       "home": wanted[row.email].home if row.email in wanted else "",
                       "member": row.email in wanted,
                       "keys": list(wanted[row.email].keys) if row.email in wanted else []} for row in rows]}


def join_token(ca: Any, join_port: int | None, ttl_seconds: float) -> dict[str, Any]:
    """A one-time join token for a new node: {"token", "join_port", "ca_pem", "expires_in"}.

    Raises: UsageError when the control plane does not serve agents with mutual TLS (`ca` None).
    """
    if ca is None or join_port is None:
        raise UsageError("this control plane serves agents without TLS, so nodes need no join token; "
                         "start `llmgw server --tls` for mutual TLS with join tokens.")
    return {"token": ca.create_join_token(ttl_seconds), "join_port": join_port,
            "ca_pem": ca.certificate_pem.decode(), "expires_in": ttl_seconds}


async def forget_node(state: ControlState, ca: Any, identities: Any, node_id: str) -> dict[str, Any]:
    """What `llmgw node remove` asks last, once the node's agent is stopped: revoke every certificate of `node_id`
    (mutual TLS: `ca`, None without), forget its node secret (`identities`, a NodeIdentities), so neither lets
    that machine in again without a new join token. The caller drops its fleet record. Returns {"node", "known"
    (it had a record), "certificates_revoked", "identity_forgotten"}. Blocking parts run in worker threads.

    Raises: UsageError while the node is connected (its agent still runs: stop it first).
    """
    record = state.fleet.get(node_id)
    if record is not None and record.connected:
        raise UsageError(f"node {node_id!r} is connected: its agent still runs there. Stop it first (`llmgw node "
                         f"remove {node_id}` does so over ssh), then forget it.")
    revoked = await trio.to_thread.run_sync(ca.revoke, node_id) if ca is not None else 0
    forgotten = await trio.to_thread.run_sync(identities.forget, node_id)
    return {"node": node_id, "known": record is not None, "certificates_revoked": revoked,
            "identity_forgotten": forgotten}
