"""`llmgw bench` against the real llama-server (b11434, Gemma 3 270M), started once: the load's figures are there
and agree with the engine's own `timings`, as does the speed its /metrics counters give, prompts have the length
asked, and the CLI keeps its run in the store where `llmgw nodes` finds it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
import trio
from click.testing import CliRunner

from llmgw.cli.bench_cmds import bench_line, latest_benches
from llmgw.cli.main import cli
from llmgw.control.bench_stats import summarize
from llmgw.control.benching import BenchLoad, run_load
from llmgw.control.engine_speeds import decode_batch, next_speed
from llmgw.engines import llamacpp
from llmgw.tools.engine_metrics import EngineLoad, parse_engine_metrics
from llmgw.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from llama_server_process import running_llama_server  # noqa: E402

KEY = "sk-engine-bench-1"


async def _engine_counters(base_url: str) -> EngineLoad:
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as client:
        answer = await client.get(f"{base_url}{llamacpp.METRICS_PATH}")
    assert answer.status_code == 200, answer.text
    return parse_engine_metrics(answer.text, llamacpp.METRICS.candidates())


@pytest.mark.slow
async def test_bench_figures_agree_with_the_engines_own_timings_and_the_cli_keeps_them(
        llama_server_binary, gemma_gguf, tmp_path):
    async with running_llama_server(llama_server_binary, gemma_gguf, tmp_path / "engine.log", api_key=KEY,
                                    served_name="gemma") as engine:
        done = []
        load = BenchLoad(engine.base_url, KEY, "gemma", prompt_tokens=32, output_tokens=8, concurrency=2,
                         requests=4)
        before = await _engine_counters(engine.base_url)
        run = await run_load(load, done.append)
        after = await _engine_counters(engine.base_url)
        measured, batch = next_speed(next_speed(None, before, 0.0), after, 1.0), decode_batch(before, after)
        summary = summarize(run.timings, run.wall_seconds)
        assert len(done) == 4 and summary.failed == 0
        assert run.engine_build  # llama-server names its build in system_fingerprint
        assert run.slots >= 1  # and its slots in GET /props
        assert all(t.prompt_tokens == 32 and t.completion_tokens == 8 for t in run.timings)  # ignore_eos
        for timing in run.timings:
            # the first token cannot come before the engine finished the prompt; our decode rate is the engine's
            # (the stream's first chunk to its last, against the engine's predicted_ms: same tokens, same span)
            assert timing.ttft >= timing.engine["prompt_ms"] / 1000 * 0.95
            assert 1 / timing.itl == pytest.approx(timing.engine["predicted_per_second"], rel=0.35)
        assert summary.ttft.p50 <= summary.ttft.p90 <= summary.ttft.p99
        # the speed its /metrics counters give (llmgw.control.engine_speeds) agrees with its own timings: decode
        # is what one request got (its generation seconds are summed over requests) times the requests decoded at
        # once (at most the load's 2); prefill near its requests' prompt times (two prompts may share a batch's
        # wall time, and a batch mixing one's prompt with another's decode counts whole as prompt time); the
        # warm-up is in the counters, not in the timings
        own = [t.engine for t in run.timings]
        decode = sum(e["predicted_n"] for e in own) / sum(e["predicted_ms"] for e in own) * 1000
        prefill = sum(e["prompt_n"] for e in own) / sum(e["prompt_ms"] for e in own) * 1000
        assert 1.0 <= batch <= 2.0
        assert measured.decode_tokens_per_second / batch == pytest.approx(decode, rel=0.2)
        assert prefill * 0.5 <= measured.prefill_tokens_per_second <= prefill * 2.5
        assert 0 < summary.output_tokens_per_second <= 4 * 8 / summary.ttft.p50

        store_path = tmp_path / "llmgw.sqlite3"
        open_store(store_path).close()
        argv = ["bench", "gemma", "--engine-url", engine.base_url, "--key", KEY, "--prompt-tokens", "16",
                "--output-tokens", "4", "--requests", "2", "--store", str(store_path), "--json"]
        result = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, argv, catch_exceptions=False))
        assert result.exit_code == 0, result.output
        printed = json.loads(result.output)
        assert printed["summary"]["requests"] == 2 and printed["summary"]["completion_tokens"] == 8
        assert printed["kept"].startswith("kept as bench 1 in ")

        refused = await trio.to_thread.run_sync(lambda: CliRunner().invoke(
            cli, ["bench", "gemma", "--engine-url", engine.base_url, "--key", "wrong", "--no-save"]))
    assert refused.exit_code == 1 and "did not answer a warm-up completion of model 'gemma': HTTP 401" in str(
        refused.exception)
    store = open_store(store_path)
    try:
        [kept] = store.benches()
    finally:
        store.close()
    assert (kept.replica, kept.via, kept.engine_build, kept.requests) == ("gemma", "engine", run.engine_build, 2)
    assert kept.ttft_p50_seconds == printed["summary"]["ttft_seconds"]["p50"]
    assert kept.summary["engine_slots"] == printed["engine_slots"] == run.slots
    assert bench_line(latest_benches(tmp_path)["gemma"]).endswith(f"(class unknown, build {run.engine_build})")
