"""`llmgw fabric-test A B`: perftest's `ib_write_bw` between two nodes, rail by rail, through the agents' streams.

For each rail (`llmgw.plan.pair_rails`: A's i-th active adapter with B's i-th), B's agent starts an
`ib_write_bw -d <B's adapter> -p <port>` server, then A's agent runs `ib_write_bw -d <A's adapter> -p <port>
<B's address>`; the client's table is graded against the link's rate (`llmgw.plan.grade_rail`). Rails run one after
the other, each on its own TCP port (`BASE_PORT + index`), so one rail's traffic never skews another's figure. No
SSH: both agents are told over the streams they already hold (agent.proto FabricTest).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from llmgw.control.registry import NodeRecord
from llmgw.control.sessions import AgentSession
from llmgw.errors import TemporaryError, UsageError
from llmgw.plan import OK_FRACTION, RailGrade, grade_rail, pair_rails
from llmgw.wire import pb
from llmgw.wire.features import FABRIC_TEST

BASE_PORT = 18515
"""perftest's default TCP port; rail i uses BASE_PORT + i."""
RAIL_TIMEOUT = 60.0
"""Seconds one rail's client may run (a default ib_write_bw run takes about 5 s)."""


def check_nodes(a: NodeRecord | None, b: NodeRecord | None, names: tuple[str, str],
                connected: set[str]) -> None:
    """Refuse a test that cannot run: an unknown or disconnected node, an agent without the feature, or a node
    that reports no InfiniBand / RoCE port. Raises: UsageError saying which node and what to do. Pure."""
    for name, record in zip(names, (a, b)):
        if record is None:
            raise UsageError(f"node {name!r} is not in the fleet; `llmgw nodes` lists them.")
        if name not in connected:
            raise UsageError(f"node {name!r} is not connected; the test needs both agents.")
        if FABRIC_TEST not in record.features:
            raise UsageError(f"node {name!r} runs agent {record.agent_version or 'of an older version'}, which cannot "
                             "run fabric tests; upgrade its agent (llmgw restart, or reinstall llmgw there).")
        if record.health is None or not record.health.ib_ports:
            raise UsageError(f"node {name!r} reports no InfiniBand or RoCE adapter (its fabric discovery found none "
                             "yet; see `llmgw node doctor` there).")


async def run_fabric_test(sessions: dict[str, AgentSession], a: NodeRecord, b: NodeRecord,
                          rail_timeout: float = RAIL_TIMEOUT) -> list[RailGrade]:
    """Run every rail between `a` (client) and `b` (server) and grade each; rails run in order.

    A checkpoint; cancellable. Raises: TemporaryError when a node goes away or does not answer.
    """
    assert a.health is not None and b.health is not None  # check_nodes said so
    grades = []
    for rail in pair_rails(a.health.ib_ports, b.health.ib_ports):
        if rail.a is None or rail.b is None:
            grades.append(grade_rail(rail, ""))
            continue
        port = BASE_PORT + rail.index
        server = await _session(sessions, b).fabric_test(
            pb.FabricTest(adapter=rail.b, port=port, timeout_seconds=rail_timeout + 10, client=a.state.address),
            rail_timeout)
        if server.error:
            grades.append(grade_rail(rail, "", f"on {b.node_id}: {server.error}"))
            continue
        client = await _session(sessions, a).fabric_test(
            pb.FabricTest(adapter=rail.a, port=port, server=b.state.address, timeout_seconds=rail_timeout),
            rail_timeout + 10)
        grades.append(grade_rail(rail, client.output, f"on {a.node_id}: {client.error}" if client.error else ""))
    return grades


def _session(sessions: dict[str, AgentSession], record: NodeRecord) -> AgentSession:
    session = sessions.get(record.node_id)
    if session is None:
        raise TemporaryError(f"node {record.node_id} went away during the fabric test.")
    return session


def grades_document(a: str, b: str, grades: list[RailGrade]) -> dict[str, Any]:
    """The admin API's answer: {"a", "b", "ok_fraction", "rails": [{"index", "a", "b", "rate_gbps", "grade",
    "measured_gbps", "percent", "reason"}]} (docs/admin-api.yaml FabricTest)."""
    rails = [{**asdict(g.rail), **{k: v for k, v in asdict(g).items() if k != "rail"}} for g in grades]
    return {"a": a, "b": b, "ok_fraction": OK_FRACTION, "rails": rails}
