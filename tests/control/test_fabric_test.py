"""`llmgw fabric-test A B` end to end: a real control plane, two in-process agents over its streams, each with three
active 200 Gb/s HDR InfiniBand ports in sysfs's layout (listed out of order: rails pair in adapter-name order), and a stand-in `ib_write_bw` on PATH
(tests/support/fake_ib_write_bw.py) that prints perftest's tables: rail 0 healthy, rail 1 at half its rate, and on
rail 2 an adapter it does not find (the server fails). The CLI
runs as a real process through the admin API."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.discovery import ToolOutput
from llmgw.agent.health import HealthReader
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository
from support.stand_ins import python_tool

from .conftest import write_seed
from .test_cli_over_admin_api import llmgw
from .test_in_process_fleet import wait_for
from .test_multinode_end_to_end import ib_sysfs

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def no_tools(argv):
    return None if argv[0] != "nvidia-smi" else ToolOutput(tuple(argv), 127, "")


async def test_fabric_test_grades_each_rail_from_the_stand_in_ib_write_bw_tables(tmp_path, monkeypatch):
    records = tmp_path / "perftest"
    monkeypatch.setenv("FAKE_PERFTEST_RECORDS", str(records))
    tool = python_tool(tmp_path / "bin" / "ib_write_bw", SUPPORT / "fake_ib_write_bw.py")
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    init_repository(tmp_path / "settings.git", write_seed(tmp_path / "seed", "ab" * 32, replicas=0))
    plane = ControlPlane(ControlConfig(repo=str(tmp_path / "settings.git"), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        for name in ("ib1", "ib2"):
            sys_root = ib_sysfs(tmp_path / name / "sys", ("mlx5_1", "mlx5_2", "mlx5_0"), "200 Gb/sec (4X HDR)")
            reader = HealthReader(no_tools, sys_root=sys_root, etc_root=tmp_path / name, interval=0.3)
            agent = AgentConfig(node_id=name, state_dir=tmp_path / name / "agent", heartbeat_interval=0.2,
                                stop_shards_on_exit=True)
            await nursery.start(lambda task_status, agent=agent, reader=reader: run_agent(
                agent, plane.local_connector(), health=reader, task_status=task_status))

        def both_report_rails() -> bool:
            fleet = plane.snapshot().fleet
            return all(fleet.get(n) is not None and fleet.get(n).health is not None
                       and len(fleet.get(n).health.ib_ports) == 3 for n in ("ib1", "ib2"))

        await wait_for(both_report_rails, 30, "both nodes reporting two InfiniBand ports")

        code, out, err = await llmgw(plane, "fabric-test", "ib1", "ib2")
        assert code == 2, out + err  # a rail is not ok
        lines = out.splitlines()
        assert lines[0] == "ib1 -> ib2: ib_write_bw, 3 rails"
        assert lines[1] == "rail 0  mlx5_0 -> mlx5_0  196.4 of 200 Gb/s (98.2 %)  ok"
        assert lines[2].startswith("rail 1  mlx5_1 -> mlx5_1  98.2 of 200 Gb/s (49.1 %)  degraded: below 90 % of the "
                                   "200 Gb/s link"), lines[2]
        assert lines[3] == ("rail 2  mlx5_2 -> mlx5_2  no result  failed: on ib2: ib_write_bw server on mlx5_2 exited "
                            "with status 1: Unable to find the Infiniband/RoCE device")

        calls = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
        assert calls == [["-d", "mlx5_0", "-p", "18515"], ["-d", "mlx5_0", "-p", "18515", "127.0.0.1"],
                         ["-d", "mlx5_1", "-p", "18516"], ["-d", "mlx5_1", "-p", "18516", "127.0.0.1"],
                         ["-d", "mlx5_2", "-p", "18517"]]  # its server failed: no client was run

        code, out, err = await llmgw(plane, "fabric-test", "ib1", "nowhere")
        assert code == 1 and "node 'nowhere' is not in the fleet" in out + err, out + err
        # the plane keeps the pair's last test (a refused one is not a test) for the console's Fabrics page
        [kept] = plane.last_fabric_tests()
        assert (kept["a"], kept["b"], [r["grade"] for r in kept["rails"]]) == ("ib1", "ib2", ["ok", "degraded",
                                                                                                "failed"])
        assert abs(kept["at"] - time.time()) < 60
        page = await fabrics_page_of(plane)
        assert "1 degraded, 1 failed, 1 ok" in page and "rail 0 mlx5_0 → mlx5_0 196.4 Gb/s 98 % of 200 Gb/s ok" in page
        nursery.cancel_scope.cancel()


async def fabrics_page_of(plane) -> str:
    """The console's Fabrics page over the plane's snapshot and last fabric tests (as llmgw.cli.console_mount gives
    them), its markup stripped to words."""
    import html
    import re

    from llmgw.console import Console, Login

    async def anyone(token: str):
        return Login("t", None)

    console = Console(plane.snapshot, authorise=anyone, history=lambda limit: [],
                      fabric_tests=plane.last_fabric_tests)
    response = await console.app.test_client().get("/console/fabrics", headers={"Authorization": "Bearer t"})
    assert response.status_code == 200
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", await response.get_data(as_text=True))).split())


async def test_a_missing_ib_write_bw_is_that_rails_error(tmp_path):
    from llmgw.agent.fabric_test import run_perftest
    from llmgw.plan import Rail, grade_rail
    from llmgw.wire import pb

    async with trio.open_nursery() as nursery:
        answer = await run_perftest(pb.FabricTest(adapter="mlx5_0", port=18515, server="10.0.0.2"), nursery,
                                    which=lambda name: None)
    assert answer.output == "" and "ib_write_bw is not installed on this node" in answer.error
    assert "apt install perftest" in answer.error
    grade = grade_rail(Rail(0, "mlx5_0", "mlx5_0", 200.0), answer.output, answer.error)
    assert grade.grade == "failed" and grade.reason == answer.error


def test_an_agent_without_fabric_tests_or_adapters_is_refused_with_what_to_do():
    import pytest

    from llmgw.control.fabric_test import check_nodes
    from llmgw.control.registry import NodeRecord
    from llmgw.errors import UsageError
    from llmgw.plan import NodeState
    from llmgw.tools import IbPort
    from llmgw.tools.node_report import NodeHealthReport
    from llmgw.wire.features import FABRIC_TEST

    rails = NodeHealthReport(ib_ports=(IbPort("mlx5_0", 1, "Active", 200.0, "InfiniBand"),))
    new = NodeRecord(NodeState("ib1"), 0.0, features=frozenset({FABRIC_TEST}), health=rails)
    old = NodeRecord(NodeState("ib2"), 0.0, agent_version="0.9.0", features=frozenset({"logs"}), health=rails)
    bare = NodeRecord(NodeState("ib3"), 0.0, features=frozenset({FABRIC_TEST}), health=NodeHealthReport())
    with pytest.raises(UsageError, match=r"node 'ib2' runs agent 0.9.0, which cannot run fabric tests; upgrade"):
        check_nodes(new, old, ("ib1", "ib2"), {"ib1", "ib2"})
    with pytest.raises(UsageError, match=r"node 'ib3' reports no InfiniBand or RoCE adapter"):
        check_nodes(new, bare, ("ib1", "ib3"), {"ib1", "ib3"})
    with pytest.raises(UsageError, match=r"node 'ib1' is not connected"):
        check_nodes(new, new, ("ib1", "ib1"), set())
    check_nodes(new, new, ("ib1", "ib1"), {"ib1"})  # fit: no error
