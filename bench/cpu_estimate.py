"""The CPU decode estimator against llama-server's own measurement on this machine (issue 33, item 4).

    .venv/bin/python bench/cpu_estimate.py [--tries 2] [--requests 3] [--cache DIR]

Measures this machine's memory read bandwidth with the agent's probe (`llmgw.agent.bandwidth`, best of --tries),
then starts llama-server b11434 (`llmgw.engines.demo`'s build, as tests/support/llama_server_process.py does:
2 threads; one slot, 2048 context) with Gemma
3 270M Q4_K_M and SmolLM2 135M Q4_1 in turn and times --requests streamed completions of 32 prompt and 32 output
tokens each, one at a time (`llmgw.control.benching`), best of --tries: the engine's own `predicted_per_second`
(its `timings`) beside the estimate of `llmgw.plan.cpu_speed` for the GGUF's size at the bandwidth of 2
cores. Prints one row per model: size, bandwidth, measured and estimated tokens/s, and their ratio (the target:
within 30 %). Best of several tries on both sides: on a shared machine, other work only ever makes figures lower.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llmgw.agent.bandwidth import probe_memory_bandwidth  # noqa: E402
from llmgw.control.bench_stats import summarize  # noqa: E402
from llmgw.control.benching import BenchLoad, run_load  # noqa: E402
from llmgw.engines import demo  # noqa: E402
from llmgw.plan.cpu_speed import bandwidth_for_threads, estimate_decode_tokens_per_second  # noqa: E402
from llama_server_process import running_llama_server  # noqa: E402

KEY = "sk-bench-cpu-estimate"
THREADS = 2  # running_llama_server's --threads
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


async def measure(binary: Path, gguf: Path, tries: int, requests: int, log: Path) -> float:
    """The best of `tries` runs' median engine decode tokens/s for `gguf` on a fresh llama-server."""
    async with running_llama_server(binary, gguf, log, api_key=KEY, served_name="m",
                                    engine_args=("--parallel", "1")) as engine:
        best = 0.0
        for _ in range(tries):
            run = await run_load(BenchLoad(engine.base_url, KEY, "m", prompt_tokens=32, output_tokens=32,
                                           requests=requests))
            best = max(best, summarize(run.timings, run.wall_seconds).engine_decode_per_second.p50 or 0.0)
        return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args()
    cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = await trio.to_thread.run_sync(demo.ensure_llama_server, cache)
    gemma = await trio.to_thread.run_sync(demo.ensure_gemma_mirror, cache)
    smollm2 = await trio.to_thread.run_sync(demo.ensure_smollm2_mirror, cache)
    models = {"gemma-3-270m Q4_K_M": gemma / "sha256" / GEMMA_SHA256,
              "smollm2-135m Q4_1": smollm2 / "sha256" / demo.SMOLLM2_SHA256}
    probes = [await trio.to_thread.run_sync(probe_memory_bandwidth) for _ in range(args.tries)]
    one = max(p.one_core_bytes_per_second for p in probes)
    every = max(p.all_cores_bytes_per_second for p in probes)
    bandwidth = bandwidth_for_threads(one, every, THREADS)
    print(f"memory read bandwidth: one core {one / 1e9:.1f} GB/s, {probes[0].threads} cores {every / 1e9:.1f} GB/s; "
          f"{THREADS} threads: {bandwidth / 1e9:.1f} GB/s (best of {args.tries} probes of "
          f"{probes[0].seconds:.2f} s); load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':<22} {'GGUF MB':>8} {'measured tok/s':>15} {'estimated':>10} {'est/measured':>13}")
    with tempfile.TemporaryDirectory() as scratch:
        for name, gguf in models.items():
            measured = await measure(binary, gguf, args.tries, args.requests, Path(scratch) / "log")
            size = gguf.stat().st_size
            estimate = estimate_decode_tokens_per_second(size, bandwidth)
            print(f"{name:<22} {size / 1e6:>8.1f} {measured:>15.1f} {estimate:>10.1f} {estimate / measured:>13.2f}")


if __name__ == "__main__":
    trio.run(main)
