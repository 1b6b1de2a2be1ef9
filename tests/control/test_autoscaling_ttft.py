"""The autoscaler's TTFT target against a real control plane, its gateway and store, an in-process agent running the
llama-server stand-in and a real settings repository (pushes with the git CLI, hooks running).

tiny gets `replicas: {min: 1, max: 2, ttft_p90: 100ms}` and a queue target no load here reaches; its engine waits
300 ms before each answer. One client's streamed requests, one after the other, have a TTFT p90 of about 300 ms: the
control plane reads it from the usage records the gateway writes (`MeasureTtft`), the rule wants 2, tiny-1 starts
and serves. The TTFTs are read over a span shortened from 60 s to 3 s here: once the client stops, no request is
left in the span, no p90 counts, and the count comes back to 1. About 15 s.
"""

from __future__ import annotations

from pathlib import Path

import trio

from llmgw.cli.server_cmds import render_status
from llmgw.control import autoscaling

from .test_autoscaling_fleet import ranged_plane, scaling_of, set_range, slow_streams
from .test_in_process_fleet import replica_states, wait_for

RANGE = ("replicas:\n  min: 1\n  max: 2\n  queue_per_replica: 100\n  kv_cache_usage: 1\n  ttft_p90: 100ms\n"
         "  scale_up_window: 0s\n  scale_down_window: 1s\n  cooldown: 1s\n")


def timed(checkout: Path) -> None:
    set_range(checkout, RANGE + 'engine_args: ["--fake-first-token-delay", "0.3"]\n')


async def test_a_ttft_p90_above_its_target_starts_a_second_replica_and_none_measured_stops_it(
    tmp_path, settings_repo, weights_mirror, fake_engine, monkeypatch,
):
    monkeypatch.setattr(autoscaling, "TTFT_SPAN", 3.0)
    async with trio.open_nursery() as nursery:
        plane, _commit = await ranged_plane(nursery, tmp_path, settings_repo, weights_mirror, fake_engine, timed,
                                            "tiny: 1 to 2 replicas, TTFT p90 100 ms")

        answered: list[int] = []
        async with trio.open_nursery() as clients:  # one client, its requests one after the other
            clients.start_soon(slow_streams, plane.gateway_url, plane.store.create_api_key("demo")[1], answered)
            await wait_for(lambda: scaling_of(plane).get("wanted") == 2, 20, "the TTFT asking for 2", plane.status)
            reason = scaling_of(plane)["reason"]
            assert "scaled up" in reason and "TTFT p90" in reason and "(target 100 ms)" in reason, reason
            p90 = plane.snapshot().ttfts["tiny"].p90
            assert p90 is not None and 0.3 <= p90 < 2.0, p90  # the engine's 300 ms wait, as the gateway saw it
            await wait_for(lambda: replica_states(plane).get("tiny-1") == "ready", 20, "tiny-1 ready", plane.status)
            clients.cancel_scope.cancel()
        assert answered and set(answered) == {200}
        assert "TTFT p90" in "\n".join(render_status(plane.status()))  # `llmgw status` names the target

        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready"}, 30, "tiny-1 stopped after the load",
                       plane.status)
        assert scaling_of(plane)["wanted"] == 1 and "scaled down" in scaling_of(plane)["reason"]
        assert "TTFT" not in scaling_of(plane)["reason"]  # no request in the span: no p90 counted
        nursery.cancel_scope.cancel()
