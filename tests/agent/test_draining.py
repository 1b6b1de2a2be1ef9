"""A ready shard told to stop drains first: the agent reads its engine's count of requests running and waiting
(/metrics, llama.cpp's series names) and sends the SIGTERM only once the engine read idle for QUIET seconds, or at
the drain timeout. Timer logic on trio's MockClock; the engine's /metrics is an httpx.MockTransport that answers
what a llama-server with those requests in flight publishes."""

from __future__ import annotations

import httpx
import pytest
import trio
from trio.testing import MockClock

from llmgw.agent.draining import POLL, QUIET, busy_requests, drain_engine, drain_verdict
from llmgw.agent.shards import ShardSpec
from llmgw.engines import llamacpp
from llmgw.tools.engine_metrics import EngineLoad

KEY = "sk-replica-key-7"
SPEC = ShardSpec(shard_id="tiny-0/0", argv=(), port=8080, env={llamacpp.API_KEY_ENV: KEY}, engine="llama.cpp@b11434")


def metrics_text(running: int, waiting: int = 0) -> str:
    return ("# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {running}\n"
            "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            f"llamacpp:requests_deferred {waiting}\n")


def engine(answer):
    """A transport whose /metrics answers `answer(now)`: (running, waiting), or an HTTP status for an error."""
    asked = []

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics" and request.headers["authorization"] == f"Bearer {KEY}"
        asked.append(trio.current_time())
        got = answer(trio.current_time())
        if isinstance(got, int):
            return httpx.Response(got, json={"error": {"code": got, "message": "no"}})
        return httpx.Response(200, text=metrics_text(*got))

    return httpx.MockTransport(handle), asked


@pytest.mark.parametrize("started, now, idle_since, timeout, expected", [
    (0.0, 0.0, 0.0, 30.0, None),              # idle at the first reading: not yet QUIET long
    (0.0, QUIET, 0.0, 30.0, "idle"),           # idle for QUIET seconds
    (0.0, 5.0, 4.5, 30.0, None),               # a request came and went: the quiet wait starts again
    (0.0, 29.9, None, 30.0, None),             # busy, time left
    (0.0, 30.0, None, 30.0, "timeout"),        # busy at the drain timeout
    (10.0, 40.0, 39.5, 30.0, "timeout"),       # idle too briefly at the timeout: the timeout wins
    (0.0, 0.0, 0.0, 0.0, "timeout"),           # a zero timeout stops at once
])
def test_the_drain_verdict_waits_for_quiet_idle_or_the_timeout(started, now, idle_since, timeout, expected):
    assert drain_verdict(started, now, idle_since, timeout) == expected


@pytest.mark.parametrize("load, counted_before, expected", [
    (EngineLoad(requests_running=2.0, requests_waiting=1.0), False, 3),
    (EngineLoad(requests_running=0.0, requests_waiting=0.0), True, 0),
    (EngineLoad(), True, 0),       # an engine that publishes neither series
    (None, False, 0),              # never gave a count: unknown reads as idle
    (None, True, 1),               # gave one before and now fails to answer: a busy engine may be slow
])
def test_busy_requests_reads_running_and_waiting(load, counted_before, expected):
    assert busy_requests(load, counted_before) == expected


async def test_the_engine_stops_quiet_seconds_after_its_last_request_ended(autojump_clock: MockClock):
    transport, asked = engine(lambda now: (2, 1) if now < 3.0 else (0, 0))
    began = trio.current_time()
    assert await drain_engine(SPEC, 30.0, transport=transport) == "idle"
    took = trio.current_time() - began
    assert 3.0 + QUIET <= took <= 3.0 + QUIET + POLL + 1e-6
    assert len(asked) >= 3.0 / POLL  # read every POLL seconds


async def test_a_request_routed_during_the_quiet_wait_starts_it_again(autojump_clock: MockClock):
    transport, _ = engine(lambda now: (1, 0) if 0.5 <= now < 0.7 else (0, 0))
    assert await drain_engine(SPEC, 30.0, transport=transport) == "idle"
    assert trio.current_time() >= 0.7 + QUIET


async def test_an_engine_busy_past_the_drain_timeout_is_stopped_at_the_timeout(autojump_clock: MockClock):
    transport, _ = engine(lambda now: (4, 0))
    assert await drain_engine(SPEC, 5.0, transport=transport) == "timeout"
    assert 5.0 <= trio.current_time() <= 5.0 + POLL + 1e-6


async def test_an_engine_without_metrics_is_stopped_after_quiet_seconds(autojump_clock: MockClock):
    transport, _ = engine(lambda now: 501)  # llama-server started without --metrics
    assert await drain_engine(SPEC, 30.0, transport=transport) == "idle"
    assert QUIET <= trio.current_time() <= QUIET + POLL + 1e-6


async def test_an_engine_that_counted_and_then_fails_to_answer_reads_busy(autojump_clock: MockClock):
    transport, _ = engine(lambda now: (1, 0) if now < 0.3 else 500 if now < 4.0 else (0, 0))
    assert await drain_engine(SPEC, 30.0, transport=transport) == "idle"
    assert trio.current_time() >= 4.0 + QUIET
