"""Health probes: each replica at its own phase of the interval, at most `health_concurrency` at once, a failing
replica ejected and readmitted as before. Real HTTP over loopback to an in-process engine stand-in; time runs on
trio's MockClock (autojump)."""

from __future__ import annotations

import pytest
import trio
from gateway_harness import make_table, replica, serve_asgi

from llmgw.gateway import Gateway
from llmgw.gateway.probing import probe_phase

INTERVAL = 5.0
REPLICAS = [f"r{i:02d}" for i in range(40)]


class HealthRecorder:
    """An ASGI engine stand-in for many replicas: GET /<replica id>/health answers 200 (503 while the id is in
    `sick`) after `hold` seconds. `probes` lists (time, replica id) of every probe as it arrives; `most_in_flight`
    is the most probes it held at once."""

    def __init__(self, hold: float = 0.0):
        self.hold = hold
        self.sick: set[str] = set()
        self.probes: list[tuple[float, str]] = []
        self.in_flight = self.most_in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        replica_id, _, path = scope["path"].strip("/").partition("/")
        assert path == "health", scope["path"]
        self.probes.append((trio.current_time(), replica_id))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await trio.sleep(self.hold)
        finally:
            self.in_flight -= 1
        status = 503 if replica_id in self.sick else 200
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


async def _gateway(nursery, store, engine: HealthRecorder, **kwargs) -> Gateway:
    port = await nursery.start(serve_asgi, engine)
    table = make_table({"gemma": [replica(r, f"http://127.0.0.1:{port}/{r}") for r in REPLICAS]})
    return Gateway(store, table, health_interval=INTERVAL, **kwargs)


@pytest.fixture
def clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_each_replica_is_probed_at_its_own_phase_not_all_at_once(nursery, store, clock):
    engine = HealthRecorder()
    engine.sick.add("r07")
    gateway = await _gateway(nursery, store, engine)
    started = trio.current_time()
    nursery.start_soon(gateway.watch_health)

    await trio.sleep(2 * INTERVAL)  # the first interval of probes starts one interval after watch_health
    first = {r: t - started - INTERVAL for t, r in engine.probes}
    assert sorted(first) == REPLICAS and len(engine.probes) == len(REPLICAS)  # each once in the interval
    for r, offset in first.items():
        assert offset == pytest.approx(probe_phase(r, INTERVAL), abs=1e-3)
    # Spread: all 40 at the same instant before; now no tenth of the interval holds more than a quarter of them.
    offsets = sorted(first.values())
    assert max(sum(1 for o in offsets if s <= o < s + INTERVAL / 10) for s in offsets) <= len(REPLICAS) // 4
    assert offsets[-1] - offsets[0] > INTERVAL / 2
    assert engine.most_in_flight <= 2
    now = trio.current_time()
    assert gateway.balancer.is_ejected("r07", now) and not gateway.balancer.is_ejected("r08", now)

    engine.sick.clear()  # r07 recovers: its next probe readmits it before the balancer's cooldown would
    await trio.sleep_until(started + 2 * INTERVAL + probe_phase("r07", INTERVAL) + 0.01)
    assert not gateway.balancer.is_ejected("r07", trio.current_time())
    second = [t for t, r in engine.probes if r == "r07"]
    assert second[1] - second[0] == pytest.approx(INTERVAL, abs=1e-3)


async def test_slow_replicas_wait_for_a_probe_slot_and_are_not_ejected(nursery, store, clock):
    # Each probe takes 2 s: 40 replicas every 5 s would keep 16 in flight; the limit of 4 holds them to 4, and the
    # probes still all happen (later), with nobody ejected for waiting.
    engine = HealthRecorder(hold=2.0)
    gateway = await _gateway(nursery, store, engine, health_concurrency=4)
    nursery.start_soon(gateway.watch_health)
    await trio.sleep(INTERVAL + len(REPLICAS) / 4 * 2.0 + 1.0)
    assert engine.most_in_flight == 4
    assert {r for _, r in engine.probes} == set(REPLICAS)
    now = trio.current_time()
    assert not any(gateway.balancer.is_ejected(r, now) for r in REPLICAS)


async def test_check_health_probes_every_replica_now_within_the_limit(nursery, store, clock):
    engine = HealthRecorder(hold=1.0)
    engine.sick.add("r03")
    gateway = await _gateway(nursery, store, engine, health_concurrency=8)
    started = trio.current_time()
    await gateway.check_health()
    assert sorted(r for _, r in engine.probes) == REPLICAS and engine.most_in_flight == 8
    assert trio.current_time() - started == pytest.approx(len(REPLICAS) / 8 * 1.0, abs=0.1)
    assert gateway.balancer.is_ejected("r03", trio.current_time())


async def test_a_new_table_changes_which_replicas_are_probed(nursery, store, clock):
    engine = HealthRecorder()
    gateway = await _gateway(nursery, store, engine)
    started = trio.current_time()
    nursery.start_soon(gateway.watch_health)
    await trio.sleep(2 * INTERVAL + 0.001)  # just after the second interval's schedule was made from the old table
    port = gateway.table.models["gemma"].replicas[0].base_url.split(":")[2].split("/")[0]
    gateway.set_table(make_table({"gemma": [replica(r, f"http://127.0.0.1:{port}/{r}") for r in ("r00", "new")]}))
    engine.probes.clear()
    # the rest of this interval (its schedule, replicas left out of the table skipped) and the next, up to just
    # after the new replica's probe in it
    await trio.sleep_until(started + 3 * INTERVAL + probe_phase("new", INTERVAL) + 0.01)
    probed = [r for _, r in engine.probes]
    assert set(probed) == {"r00", "new"} and probed.count("new") == 1
