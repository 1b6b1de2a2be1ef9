"""Two control planes sharing one store: only the lease holder sends commands; the other takes over when it goes.
An agent connected to both is known to both, and the standby's gateway serves its replicas."""

from __future__ import annotations

import httpx
import trio

from llmgw.agent import run_agent
from llmgw.cli.server_cmds import render_status
from llmgw.control import ControlConfig, ControlPlane

from .conftest import stand_in_agent
from .test_in_process_fleet import replica_states, wait_for


async def test_only_the_leader_acts_and_the_other_takes_over_when_it_stops(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _ = weights_mirror
    store = str(tmp_path / "shared.sqlite3")

    def plane(name: str) -> ControlPlane:
        return ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / name, store=store,
                                          gateway=False, lease_seconds=1.5))

    first, second = plane("a"), plane("b")
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as leader_nursery:
            await leader_nursery.start(first.run)
            await nursery.start(second.run)
            assert first.leader and not second.leader
            await nursery.start(run_agent, agent, second.local_connector())
            await wait_for(lambda: second.registry.get("n1") is not None, 10, "n1 registered with the second")
            record = await second.wait_pass()
            assert record.actions and all(a.outcome == "skipped" and "leader lease" in a.error for a in record.actions)
            assert second.status()["control_plane"]["leader_holder"] == first.holder
            leader_nursery.cancel_scope.cancel()
        await wait_for(lambda: second.leader, 5, "the second to take the lease")
        await wait_for(lambda: replica_states(second).get("tiny-0") == "ready", 30, "tiny-0 ready via the second")
        nursery.cancel_scope.cancel()


async def test_an_agent_on_both_control_planes_is_known_to_both_and_the_standby_routes_to_its_replica(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _ = weights_mirror
    store = str(tmp_path / "shared.sqlite3")

    def plane(name: str) -> ControlPlane:
        return ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / name, store=store,
                                          lease_seconds=1.5))

    first, second = plane("a"), plane("b")
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as leader_nursery:
            await leader_nursery.start(first.run)
            await nursery.start(second.run)
            token = first.snapshot().leadership.token
            assert first.leader and token >= 1 and not second.leader
            await nursery.start(run_agent, agent, [first.local_connector(), second.local_connector()])
            await wait_for(lambda: replica_states(first).get("tiny-0") == "ready", 30, "tiny-0 ready via the leader")
            # the standby was told everything too: same replica, ready, in its own routing table
            await wait_for(lambda: replica_states(second).get("tiny-0") == "ready", 10, "the standby to see tiny-0")
            await wait_for(lambda: second.table.models["tiny"].replicas, 5, "a route to tiny on the standby")
            _record, api_key = second.store.create_api_key("demo")
            async with httpx.AsyncClient(base_url=second.gateway_url, timeout=10) as client:
                reply = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                                          json={"model": "tiny-alias", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "hi"}]})
            assert reply.status_code == 200, reply.text
            async with httpx.AsyncClient(timeout=10) as client:
                leads = [(await client.get(f"{p.admin_url}/api/v1/health")).json() for p in (first, second)]
                gateways = [(await client.get(f"{p.gateway_url}/health")).json() for p in (first, second)]
            assert [h["leader"] for h in leads] == [True, False] and leads[1]["leader_holder"] == first.holder
            assert [h["leader"] for h in gateways] == [True, False]
            said = "\n".join(render_status(second.status()))
            assert f"leader      {first.holder}; this control plane stands by" in said
            leader_nursery.cancel_scope.cancel()
        await wait_for(lambda: second.leader, 5, "the standby to take the lease")
        assert second.snapshot().leadership.token > token
        await second.wait_pass()
        record = await second.wait_pass()
        assert not [a for a in record.actions if a.kind == "start"]  # the running replica is kept, not placed again
        assert replica_states(second).get("tiny-0") == "ready"
        nursery.cancel_scope.cancel()
