"""`llmgw bench MODEL --via-gateway` through a real gateway to a llama-server stand-in: the load goes through the
gateway with a project's API key, the figures come back, the run is kept as the gateway's (no one replica), and a
key the gateway refuses is an error naming the gateway's answer."""

from __future__ import annotations

import json

import trio
from click.testing import CliRunner
from gateway_harness import make_table, replica, start_engine, start_gateway

from llmgw.cli.main import cli


async def test_a_bench_through_the_gateway_measures_and_keeps_the_run_as_the_gateways(nursery, store, tmp_path):
    engine, url = await start_engine(nursery, token_delay=0.002)
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("r0", url)]}))
    _key, plaintext = store.create_api_key("chat")
    root = base.removesuffix("/v1")
    argv = ["bench", "gemma", "--via-gateway", "--gateway-url", root, "--key", plaintext, "--prompt-tokens", "24",
            "--output-tokens", "6", "--concurrency", "2", "--requests", "4", "--store", store.url, "--json"]
    result = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, argv, catch_exceptions=False))
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["via"] == "gateway" and printed["target"]["replica"] == "" and printed["engine_slots"] == 0
    summary = printed["summary"]
    assert (summary["requests"], summary["failed"], summary["completion_tokens"]) == (4, 0, 24)
    assert summary["ttft_seconds"]["count"] == 4 and summary["itl_seconds"]["p50"] > 0
    sent = [body for body in engine.stats.bodies if body.get("max_tokens") == 6]
    assert len(sent) == 4 and all(body["ignore_eos"] and body["stream"] for body in sent)
    [kept] = await trio.to_thread.run_sync(store.benches)
    assert (kept.replica, kept.via, kept.model, kept.concurrency) == ("gateway/gemma", "gateway", "gemma", 2)

    refused = await trio.to_thread.run_sync(lambda: CliRunner().invoke(
        cli, ["bench", "gemma", "--via-gateway", "--gateway-url", root, "--key", "sk-llmgw-wrong", "--no-save"]))
    assert refused.exit_code == 1 and "did not answer a warm-up completion of model 'gemma': HTTP 401" in str(
        refused.exception)
