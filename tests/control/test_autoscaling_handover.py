"""Two control planes on one PostgreSQL store (a schema of the test's own), one agent connected to both with the
llama-server stand-in, tiny autoscaled `{min: 1, max: 2, queue_per_replica: 1}` with a cooldown of 8 s.

Both apply the autoscaler's rule to the same heartbeats, so the standby has the counts; only the lease holder sends
the START of the second replica (the standby's passes skip it). The leader then goes and the standby takes the
lease: it keeps the count (2, its reason "scaled up", not a count started afresh from what runs) and the cooldown of
that change, so the second replica stops only once the scale-down window and the cooldown since the scale-up have
passed, by the new leader's command. About 20 s.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository

from .conftest import stand_in_agent, write_seed
from .test_autoscaling_fleet import scaling_of, set_range, slow_streams
from .test_failover import postgres_url  # noqa: F401  (the fixture: a schema of its own in the test database)
from .test_in_process_fleet import replica_states, wait_for

COOLDOWN = 8.0
RANGE = ("replicas:\n  min: 1\n  max: 2\n  queue_per_replica: 1\n  kv_cache_usage: 1\n  scale_up_window: 0s\n"
         f"  scale_down_window: 2s\n  cooldown: {COOLDOWN:g}s\n"
         'engine_args: ["--fake-token-delay", "0.1"]\n')


def settings(tmp_path: Path, sha: str) -> Path:
    seed = write_seed(tmp_path / "seed", sha)
    set_range(seed, RANGE)
    agents = seed / "agents" / "default.yaml"  # the engines' load read every 200 ms
    agents.write_text(agents.read_text() + "telemetry_interval: 200ms\n")
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return repo


def sent_starts(plane: ControlPlane, replica: str) -> Counter:
    """The outcomes of the START actions of `replica` in `plane`'s recent passes."""
    return Counter(a.outcome.value for p in plane.passes for a in p.actions if a.kind == "start" and a.subject
                   .startswith(replica))


async def test_only_the_leader_scales_and_the_standby_that_takes_over_keeps_the_count_and_its_cooldown(
    tmp_path, postgres_url, weights_mirror, fake_engine,  # noqa: F811
):
    mirror, sha = weights_mirror
    repo = settings(tmp_path, sha)

    def plane(name: str) -> ControlPlane:
        return ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / name, store=postgres_url,
                                          lease_seconds=1.5))

    first, second = plane("a"), plane("b")
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as leader_nursery:
            await leader_nursery.start(first.run)
            await nursery.start(second.run)
            assert first.leader and not second.leader
            await nursery.start(run_agent, stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine),
                                [first.local_connector(), second.local_connector()])
            for each in (first, second):
                await wait_for(lambda p=each: replica_states(p) == {"tiny-0": "ready"} and scaling_of(p), 30,
                               "tiny-0 ready on both", each.status)
            _record, api_key = first.store.create_api_key("demo")
            answered: list[int] = []
            async with trio.open_nursery() as clients:  # 4 requests at once fill tiny-0's queue: 2 replicas wanted
                for _ in range(4):
                    clients.start_soon(slow_streams, first.gateway_url, api_key, answered)
                for each in (first, second):  # the standby decides the same from the same heartbeats
                    await wait_for(lambda p=each: scaling_of(p).get("wanted") == 2, 10, "2 wanted on both",
                                   each.status)
                    assert "scaled up" in scaling_of(each)["reason"]
                    await wait_for(lambda p=each: replica_states(p).get("tiny-1") == "ready", 20, "tiny-1 ready",
                                   each.status)
                clients.cancel_scope.cancel()
            assert answered and set(answered) == {200}
            scaled_up_at = second.snapshot().scales["tiny"].changed_at
            assert scaled_up_at is not None
            assert sent_starts(first, "tiny-1")["sent"] == 1  # the leader started tiny-1 once ...
            assert sent_starts(second, "tiny-1") and set(sent_starts(second, "tiny-1")) == {"skipped"}  # ... not the standby
            shards = second.status()["nodes"]["n1"]["shards"].values()
            assert [s["replica"] for s in shards].count("tiny-1") == 1
            leader_nursery.cancel_scope.cancel()  # the leader goes

        await wait_for(lambda: second.leader, 5, "the standby to take the lease")
        took_over = trio.current_time()
        scale = second.snapshot().scales["tiny"]
        assert scale.wanted == 2 and "scaled up" in scale.reason and scale.changed_at == scaled_up_at
        await wait_for(lambda: replica_states(second) == {"tiny-0": "ready"}, 30, "tiny-1 stopped by the new leader",
                       second.status)
        scale = second.snapshot().scales["tiny"]
        assert scale.wanted == 1 and "scaled down" in scale.reason
        assert scale.changed_at - scaled_up_at >= COOLDOWN  # the cooldown of the change before the hand-over held
        assert [a for p in second.passes for a in p.actions if a.kind == "stop" and a.subject.startswith("tiny-1")
                and a.outcome.value == "sent"], "the new leader sent no STOP of tiny-1"
        print(f"took over {took_over - scaled_up_at:.1f} s after the scale-up; scaled down "
              f"{scale.changed_at - scaled_up_at:.1f} s after it (cooldown {COOLDOWN:g} s)")
        nursery.cancel_scope.cancel()
