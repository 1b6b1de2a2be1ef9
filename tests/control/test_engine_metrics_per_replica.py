"""The engines' own metrics per replica on the admin /metrics: the agent reads its engines' /metrics (here the
llama-server stand-in, started with `--metrics` and the replica key as llama-server is) with its readings, and
the control plane exports them with the replica's labels; promtool accepts the scrape."""

from __future__ import annotations

import httpx
import trio

from .observed_fleet import chat_once, observed_fleet
from .prometheus_tools import promtool
from .test_metrics_scrape import samples, value

SHARD = {"node": "n1", "model": "tiny", "replica": "tiny-0", "shard": "tiny-0/0"}


async def test_a_replicas_engine_counters_reach_the_admin_metrics_with_its_labels(
    tmp_path, weights_mirror, fake_engine,
):
    async with observed_fleet(tmp_path, weights_mirror, fake_engine) as plane:
        async with httpx.AsyncClient(timeout=10) as client:
            usage = (await chat_once(plane, client))["usage"]

            async def scrape() -> str:
                answer = await client.get(f"{plane.admin_url}/metrics",
                                          headers={"Authorization": f"Bearer {plane.admin_token}"})
                return answer.text

            # the next reading (every 0.5 s here) carries the engine's counters after the request
            text = ""
            with trio.move_on_after(10):
                while "llmgw_engine_generation_tokens_total{" not in text or f"{usage['completion_tokens']}.0" \
                        not in _line(text, "llmgw_engine_generation_tokens_total{"):
                    await trio.sleep(0.2)
                    text = await scrape()
        found = samples(text)
        assert value(found, "llmgw_engine_prompt_tokens_total", **SHARD) == usage["prompt_tokens"]
        assert value(found, "llmgw_engine_generation_tokens_total", **SHARD) == usage["completion_tokens"]
        assert value(found, "llmgw_engine_requests_running", **SHARD) == 0
        assert value(found, "llmgw_engine_requests_waiting", **SHARD) == 0
        assert 0 <= value(found, "llmgw_engine_kv_cache_usage_ratio", **SHARD) <= 1
        # llama-server publishes no prefix-cache counters: absent, never 0
        assert not [k for k in found if k[0].startswith("llmgw_engine_prefix_cache")]
        promtool("check", "metrics", stdin=text.encode())


def _line(text: str, prefix: str) -> str:
    return next((line for line in text.splitlines() if line.startswith(prefix)), "")
