"""A reviewed change's forecast checked by the control loop on trio's MockClock: once the fleet converged to the
reviewed commit, `reconcile.forecast_check_after` passes in virtual time, then the real handler reads the usage
records the test wrote into a real SQLite store (those before the change left out) and the check of each model
(`llmgw forecast-check`'s comparison) lands in the state, in status.yaml's `forecast_check` and in the audit
commit message's section. Against a running control plane: test_review_against_a_running_plane.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.control import ControlLoop
from llmgw.control.admin_inputs import AdminInputError, body_reviewed
from llmgw.control.effects import MeasureForecast
from llmgw.control.forecast_audit import forecast_lines, forecast_status
from llmgw.control.handlers import EffectContext, _measure_forecast
from llmgw.control.handling import Handlers, every_command
from llmgw.control.state import WatchState
from llmgw.errors import StoreError
from llmgw.plan import fingerprint
from llmgw.plan.reviewed import ReviewedPlan
from llmgw.plan.types import NodeState, ObservedShard, Plan
from llmgw.settings import load_directory
from llmgw.store import UsageRecord, open_store

from support.waiting import wait_in_real_time

from .conftest import write_seed
from .loop_world import control_state, report, shard

AFTER = 900.0
BASE = 1_790_000_000.0
FORECAST = ({"model": "tiny", "requests_per_second": 0.02, "expected_tokens_per_second": 2.5, "ttft_p90_after": 0.4},
            {"model": "gone", "requests_per_second": 1.0, "expected_tokens_per_second": 9.0, "ttft_p90_after": 1.0})


@pytest.fixture
def autojump_clock():
    """MockClock jumping after 2 ms of real idleness, not at once: the handler reads the store in a worker thread,
    and with a threshold of 0 the event loop spun through jump after jump (beats, passes) holding the GIL while
    that thread waited for it (0.02-0.9 s real, thousands of MockClock seconds: both tests failed in a full run).
    Idle 2 ms per jump, the thread ends within a jump or two."""
    return trio.testing.MockClock(autojump_threshold=0.002)


@pytest.fixture
def settings(tmp_path: Path):
    loaded = load_directory(write_seed(tmp_path / "seed", "ab" * 32, replicas=1))
    return replace(loaded, commit="a" * 40, cluster=replace(loaded.cluster, forecast_check_after=AFTER))


async def beat(loop: ControlLoop, ready, every: float = 1.0) -> None:
    """Node n1's heartbeat, every `every` seconds (MockClock; the node is lost after 30 s without one), reporting
    `ready`."""
    while True:
        loop.update(report("n1", ready), "heartbeat")
        await trio.sleep(every)


async def measured(loop: ControlLoop, limit: float) -> None:
    """Wait until the loop's forecast audit holds its checks: MockClock seconds (at most `limit` of them) while
    nothing is being measured, real time while the handler's store read runs in its thread (a trio sleep there let
    the autojump clock pass any deadline before a 0.3 s read ended: both tests failed so in a full run)."""
    slept = 0.0
    while (audit := loop.state.forecast_audit) is None or audit.checks is None:
        if audit is not None and audit.measuring:
            await wait_in_real_time(lambda: not loop.state.forecast_audit.measuring, 60, "the forecast's store read")
            continue
        assert slept < limit, f"no forecast check after {limit:g} s of MockClock: {audit}"
        await trio.sleep(1)
        slept += 1


def reviewed_loop(settings, store) -> tuple[ControlLoop, ObservedShard, list[tuple[float, MeasureForecast]]]:
    """A control loop over node n1 running tiny-0 (`ready`) converged to `settings` (commit a...), reviewed with
    `FORECAST`, whose unix clock follows MockClock from `BASE`, and whose `MeasureForecast` goes to the real handler
    over `store`; each one asked is recorded (MockClock time, the effect)."""
    ready = shard("tiny-0", fingerprint(settings.models["tiny"], "b11434"))
    node = NodeState("n1", cpu_cores=4, memory_bytes=8 << 30, shards=(ready,),
                     engines_installed=frozenset({"llama.cpp@b11434"}))
    state = replace(control_state(settings, node), watch=WatchState(settings=settings),
                    reviewed=ReviewedPlan("a" * 40, "sha256:" + "0" * 64, Plan(), FORECAST))
    handlers = Handlers(every_command(lambda command: trio.lowlevel.checkpoint()))
    loop = ControlLoop(state, handlers, interval=lambda: 1000.0)
    loop.unix_clock = lambda: BASE + trio.current_time()
    ctx = EffectContext(agents=None, secret=None, replica_key=None, audit=None, status=None, update=loop.update,
                        store=store)
    asked: list[tuple[float, MeasureForecast]] = []

    async def measure(effect: MeasureForecast) -> None:
        asked.append((trio.current_time(), effect))
        await _measure_forecast(ctx, effect)

    handlers.register(MeasureForecast, measure)
    return loop, ready, asked


async def test_the_forecast_is_checked_once_the_window_after_the_apply_passed(settings, tmp_path, autojump_clock):
    store = open_store(tmp_path / "store.sqlite3")
    loop, ready, asked = reviewed_loop(settings, store)

    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        nursery.start_soon(beat, loop, ready)
        with trio.fail_after(60):
            while loop.state.forecast_audit is None:
                await trio.sleep(1)
        audit = loop.state.forecast_audit
        began = audit.converged_at
        assert audit.converged_at_unix == pytest.approx(BASE + began) and audit.checks is None
        assert forecast_status(audit)["state"] == "waiting" and forecast_lines(audit) == []
        store.record_usage(UsageRecord("demo", "tiny", BASE + began - 5, completion_tokens=9999, ttft_seconds=9.0))
        for i in range(10):  # 10 requests in the window, 200 completion tokens each, TTFT 0.1 .. 1.0 s
            await trio.sleep(30)
            store.record_usage(UsageRecord("demo", "tiny", BASE + trio.current_time(), prompt_tokens=20,
                                           completion_tokens=200, ttft_seconds=(i + 1) / 10, duration_seconds=2.0))
        await measured(loop, 2 * AFTER)
        nursery.cancel_scope.cancel()
    assert len(asked) == 1 and asked[0][0] - began == pytest.approx(AFTER, abs=1.5)  # not before the window
    audit = loop.state.forecast_audit
    assert audit.window == pytest.approx(AFTER, abs=1.5)
    tiny, gone = audit.checks
    assert tiny.requests == 10 and tiny.rate_measured == pytest.approx(10 / audit.window)
    assert tiny.tokens_measured == pytest.approx(2000 / audit.window)  # the record before the change left out
    assert tiny.tokens_error == pytest.approx(2000 / audit.window / 2.5 - 1)
    assert tiny.ttft_p90_measured == pytest.approx(0.9) and tiny.ttft_p90_error == pytest.approx(0.9 / 0.4 - 1)
    assert gone.requests == 0 and gone.tokens_measured is None and gone.tokens_error is None
    lines = forecast_lines(audit)
    assert lines[0].startswith(f"- forecast of reviewed {'a' * 12} checked over the 900 s up to ")
    assert lines[1] == (f"  - tiny: completion tokens/s forecast 2.5, measured {2000 / audit.window:.3g} (error "
                        f"{tiny.tokens_error:+.0%}); TTFT p90 forecast 0.4 s, measured 0.9 s (error +125%); "
                        f"requests/s forecast 0.02, measured {10 / audit.window:.3g} (traffic moved "
                        f"{tiny.rate_error:+.0%}; 10 requests)")
    assert "gone: completion tokens/s forecast 9, measured unknown (error unknown)" in lines[2]
    status = forecast_status(audit)
    assert status["state"] == "measured" and [m["model"] for m in status["models"]] == ["tiny", "gone"]


async def test_a_review_without_a_forecast_checks_nothing(settings, autojump_clock):
    ready = shard("tiny-0", fingerprint(settings.models["tiny"], "b11434"))
    node = NodeState("n1", cpu_cores=4, memory_bytes=8 << 30, shards=(ready,),
                     engines_installed=frozenset({"llama.cpp@b11434"}))
    state = replace(control_state(settings, node), watch=WatchState(settings=settings),
                    reviewed=ReviewedPlan("a" * 40, "sha256:" + "0" * 64, Plan()))
    loop = ControlLoop(state, Handlers(every_command(lambda command: trio.lowlevel.checkpoint())),
                       interval=lambda: 10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        nursery.start_soon(beat, loop, ready, 10.0)  # each MockClock jump costs 2 ms of real time: 180 beats, not 1,800
        await trio.sleep(2 * AFTER)
        assert loop.state.last_pass.converged and loop.state.forecast_audit is None
        nursery.cancel_scope.cancel()


def test_an_apply_body_whose_forecast_is_not_a_reviews_is_refused_naming_it():
    plan = {"assignments": [], "actions": [], "unplaced": [], "settings_commit": "a" * 40, "notes": []}
    body = {"reviewed": {"commit": "a" * 40, "fleet": "sha256:0", "plan": plan,
                         "forecast": [{"model": "tiny", "ttft_p90_after": "fast"}]}}
    with pytest.raises(AdminInputError) as refused:
        body_reviewed(body)
    assert refused.value.field == "reviewed" and "reviewed.forecast" in str(refused.value)
    assert "ttft_p90_after is 'fast', not a number" in str(refused.value)
    body["reviewed"]["forecast"] = list(FORECAST)
    assert [doc["model"] for doc in body_reviewed(body).forecast] == ["tiny", "gone"]


class FailingOnce:
    """A store whose first `usage_load` fails (a database that was away), then reads `store`."""

    def __init__(self, store):
        self.store, self.calls = store, 0

    def usage_load(self, since: float):
        self.calls += 1
        if self.calls == 1:
            raise StoreError("database is locked")
        return self.store.usage_load(since)


async def test_a_store_that_fails_is_read_again_a_tenth_of_the_window_later(settings, tmp_path, autojump_clock):
    store = FailingOnce(open_store(tmp_path / "store.sqlite3"))
    loop, ready, asked = reviewed_loop(settings, store)
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        nursery.start_soon(beat, loop, ready)
        await measured(loop, 3 * AFTER)
        nursery.cancel_scope.cancel()
    began = loop.state.forecast_audit.converged_at
    assert [at - began for at, _effect in asked] == [pytest.approx(AFTER, abs=3), pytest.approx(AFTER * 1.1, abs=3)]
    audit = loop.state.forecast_audit
    assert audit.error == "" and audit.window == pytest.approx(AFTER * 1.1, abs=1.5)
    assert [c.requests for c in audit.checks] == [0, 0]
