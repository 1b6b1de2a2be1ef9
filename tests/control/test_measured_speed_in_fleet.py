"""A replica's speed appears from its engine's own counters after traffic: a control plane with an in-process agent
whose engine is the llama-server stand-in (its /metrics count prompt seconds at 1000 tokens/s and generation
seconds at 250); after one chat through the gateway, the replica's speed is in the status with its source and age,
in the routing table the gateway uses, and under its shard in `llmgw nodes`."""

from __future__ import annotations

import httpx
import trio
from click.testing import CliRunner

from llmgw.cli.main import cli

from .observed_fleet import chat_once, observed_fleet
from .test_in_process_fleet import wait_for


def _speed(plane):
    return plane.status()["replicas"]["tiny-0"].get("speed")


def _routed(plane):
    route = plane.feed.table.models.get("tiny")
    return next((r.speed for r in route.replicas if r.replica_id == "tiny-0"), None) if route else None


async def test_a_replicas_speed_appears_from_its_engines_metrics_after_traffic(tmp_path, weights_mirror, fake_engine):
    async with observed_fleet(tmp_path, weights_mirror, fake_engine) as plane:
        await trio.sleep(1.0)  # two readings of the idle engine: counters, but nothing done
        assert _speed(plane) is None and _routed(plane) is None
        async with httpx.AsyncClient(timeout=10) as client:
            await chat_once(plane, client)
            # the next reading (every 0.5 s) carries the counters after the request
            speed = await wait_for(lambda: _speed(plane), 10, "tiny-0's measured speed", lambda: plane.status())
            assert (speed["source"], speed["prefill_tokens_per_second"], speed["decode_tokens_per_second"]) == (
                "metrics", 1000.0, 250.0)
            assert speed["slots"] == 0 and 0 <= speed["age_seconds"] <= 10
            # the gateway routes by it from the next merge (every 5 s)
            routed = await wait_for(lambda: _routed(plane), 10, "tiny-0's speed in the routing table")
            assert (routed.source, round(routed.prefill_tokens_per_second), round(routed.decode_tokens_per_second)
                    ) == ("metrics", 1000, 250)
            nodes = (await client.get(f"{plane.admin_url}/api/v1/nodes",
                                      headers={"Authorization": f"Bearer {plane.admin_token}"})).json()
        assert nodes["speeds"]["tiny-0"]["source"] == "metrics"
        common = ["--url", plane.admin_url, "--token", plane.admin_token, "--state", str(tmp_path / "state")]
        listed = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, ["nodes", *common],
                                                                          catch_exceptions=False))
        replicas = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, ["replicas", *common],
                                                                            catch_exceptions=False))
    lines = listed.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("tiny-0/0"))
    assert lines[at + 1].strip().startswith("speed: prefill 1000.0 tokens/s, decode 250.0 tokens/s (metrics, ")
    assert lines[at + 1].endswith(" ago)")
    assert "speed: prefill 1000.0 tokens/s, decode 250.0 tokens/s (metrics, " in replicas.output
