"""Capacity that follows demand: a model with `min: 0, max: 2` on real llama-server replicas (issue 34's benchmark).

    .venv/bin/python bench/autoscale.py [--idle-first 5] [--burst 4] [--clients 8] [--sustain 45] [--after 40]
        [--max-tokens 16] [--chart PNG] [--json FILE] [--cache DIR]

Set-up (no hand steps): a control plane in process (`llmgw.control.ControlPlane`: a settings repository made for the
run, SQLite store, its gateway), one agent in process (`llmgw.agent.run_agent`) running the real llama-server b11434
with Gemma 3 270M Q4_K_M (`llmgw.engines.demo`'s build and mirror), each replica on one core (`-t 1`). The model:

    replicas: {min: 0, max: 2, queue_per_replica: 4, scale_up_window: 10s, scale_down_window: 10s,
               cooldown: 5s, idle: 20s}

The load, through the gateway (streamed chat completions of --max-tokens tokens, TTFT read by the client):
1. idle: nothing runs for --idle-first seconds (the model sits at 0);
2. burst: --burst requests at once. The gateway holds them, the control plane wakes the model, the agent starts
   the engine, and then they are served: the first request's TTFT includes the start;
3. sustained: --clients clients in a closed loop for --sustain seconds: with 4 requests per replica as the target,
   8 requests running or waiting ask for 2 replicas (and so do 5 to 7; 4, between a client's requests, asks for 1);
   once the wish was for 2 during three quarters of the scale-up window, dips included, the second replica starts;
4. after: no load for --after seconds: back to 1 replica after the scale-down window, then to 0 after `idle`.

Every 0.5 s it samples the autoscaler's wanted count, the ready replicas, the requests running and waiting on the
engines (the agents' readings, as the autoscaler reads them) and the requests the gateway holds, and keeps the
autoscaler's wishes (`Scale.wishes`, each pass's count before windows and cooldown). It prints the phases' figures,
a timeline per --bucket seconds (replicas, queue, held, requests answered, TTFT p90, failed) and
writes the same as a PNG chart (matplotlib, from the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llmgw.agent import AgentConfig, run_agent  # noqa: E402
from llmgw.control import ControlConfig, ControlPlane  # noqa: E402
from llmgw.control.autoscaling import autoscaled, model_loads  # noqa: E402
from llmgw.engines import demo  # noqa: E402
from llmgw.settings import init_repository  # noqa: E402
import settings_seed  # noqa: E402

MODEL = "gemma-3-270m"
RANGE = ("{min: 0, max: 2, queue_per_replica: 4, scale_up_window: 10s, scale_down_window: 10s, cooldown: 5s, "
         "idle: 20s}")
MODEL_YAML = settings_seed.GEMMA_YAML.format(replicas=RANGE).replace(
    "node_selector: {engine: real}\n", "")  # one thread per replica (its cpu_cores): two replicas on two cores


@dataclass
class Sample:
    at: float  # seconds since the run began
    wanted: int
    ready: int
    queue: float  # requests running + waiting on the model's engines
    held: int  # requests the gateway holds


@dataclass
class Answer:
    phase: str
    sent: float  # seconds since the run began
    ttft: float | None  # None: failed
    status: int
    error: str = ""


@dataclass
class Run:
    began: float = field(default_factory=trio.current_time)
    samples: list[Sample] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (name, start)
    wishes: dict[float, int] = field(default_factory=dict)  # the autoscaler's wishes as it kept them: {time: wish}

    def now(self) -> float:
        return trio.current_time() - self.began

    def phase(self, name: str, at: float | None = None) -> None:
        """Phase `name` began `at` (control-plane clock; None: now)."""
        since = self.now() if at is None else at - self.began
        self.phases.append((name, since))
        print(f"{since:7.1f} s  {name}", flush=True)


async def sample(plane: ControlPlane, run: Run) -> None:
    while True:
        state = plane.snapshot()
        scales = state.scales.get(MODEL)
        models = autoscaled(state.settings) if state.settings is not None else {}
        load = model_loads(state, trio.current_time(), models).get(MODEL)
        if scales is not None:
            run.wishes.update((at - run.began, wish) for at, wish in scales.wishes)
        if scales is not None and load is not None:
            run.samples.append(Sample(run.now(), scales.wanted, load.ready, load.requests,
                                      plane.gateway.holding.held.get(MODEL, 0)))
        await trio.sleep(0.5)


async def ask(client: httpx.AsyncClient, key: str, run: Run, phase: str, max_tokens: int, number: int) -> None:
    """One streamed chat completion; its TTFT is the first content chunk's arrival."""
    sent = run.now()
    began = trio.current_time()
    ttft = None
    try:
        async with client.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                 json={"model": MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0,
                                       "messages": [{"role": "user", "content": f"Count from {number} upwards."}]}
                                 ) as reply:
            if reply.status_code != 200:
                body = (await reply.aread()).decode(errors="replace")
                run.answers.append(Answer(phase, sent, None, reply.status_code, body[:200]))
                return
            async for line in reply.aiter_lines():
                if ttft is None and line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        ttft = trio.current_time() - began
        run.answers.append(Answer(phase, sent, ttft, 200, "" if ttft is not None else "no content"))
    except httpx.HTTPError as exc:
        run.answers.append(Answer(phase, sent, None, 0, repr(exc)))


async def closed_loop(client: httpx.AsyncClient, key: str, run: Run, phase: str, max_tokens: int, until: float,
                      first: int) -> None:
    number = first
    while trio.current_time() < until:
        await ask(client, key, run, phase, max_tokens, number)
        number += 7


async def wait_until(check, timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.1)
        return
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def percentile(values: list[float], share: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def first_time(samples: list[Sample], since: float, check) -> float | None:
    return next((s.at - since for s in samples if s.at >= since and check(s)), None)


def report(run: Run, args) -> list[dict]:
    starts = dict(run.phases)
    burst = [a for a in run.answers if a.phase == "burst"]
    first = min(burst, key=lambda a: a.sent) if burst else None
    failed = [a for a in run.answers if a.ttft is None]
    woken = first_time(run.samples, starts["burst"], lambda s: s.ready >= 1)
    print()
    print(f"burst after {args.idle_first:g} s at 0 replicas: {len(burst)} requests, a replica ready after {_s(woken)}, "
          f"first TTFT "
          f"{first.ttft if first and first.ttft is not None else float('nan'):.2f} s (engine start and model load "
          f"included), TTFT p90 {_ms(percentile([a.ttft for a in burst if a.ttft is not None], 0.9))} ms, "
          f"most held at once {max((s.held for s in run.samples if s.at < starts['sustained']), default=0)}, "
          f"failed {len([a for a in burst if a.ttft is None])}")
    sustained = starts["sustained"]
    up = first_time(run.samples, sustained, lambda s: s.wanted >= 2)
    up_ready = first_time(run.samples, sustained, lambda s: s.ready >= 2)
    print(f"sustained load of {args.clients} clients from {sustained:.1f} s: 2 wanted after "
          f"{_s(up)}, 2 ready after {_s(up_ready)} (scale-up window 10 s, cooldown 5 s)")
    dips(run, sustained, None if up is None else sustained + up)
    two_at = None if up_ready is None else sustained + up_ready
    for label, chosen in (("1 ready", lambda a: two_at is None or a.sent < two_at),
                          ("2 ready", lambda a: two_at is not None and a.sent >= two_at)):
        ttfts = [a.ttft for a in run.answers if a.phase == "sustained" and a.ttft is not None and chosen(a)]
        print(f"  sent with {label}: {len(ttfts)} requests, TTFT p50 {_ms(percentile(ttfts, 0.5))} ms, "
              f"p90 {_ms(percentile(ttfts, 0.9))} ms")
    after = starts["after"]
    down = first_time(run.samples, after, lambda s: s.wanted <= 1)
    down_ready = first_time(run.samples, after, lambda s: s.ready <= 1)
    zero = first_time(run.samples, after, lambda s: s.wanted == 0)
    zero_ready = first_time(run.samples, after, lambda s: s.ready == 0)
    print(f"load stopped at {after:.1f} s (no request sent after it): 1 wanted after {_s(down)} (1 ready after {_s(down_ready)}), 0 wanted "
          f"after {_s(zero)} (0 ready after {_s(zero_ready)}) (scale-down window 10 s, idle 20 s)")
    print(f"requests: {len(run.answers)} answered or failed, {len(failed)} failed"
          + "".join(f"\n  failed: {a.phase} at {a.sent:.1f} s: {a.status} {a.error}" for a in failed[:5]))
    rows = []
    end = max((s.at for s in run.samples), default=0.0)
    print()
    print(f"{'t (s)':>7} {'phase':<20} {'wanted':>6} {'ready':>5} {'queue':>6} {'held':>5} {'answered':>8} "
          f"{'TTFT p90 ms':>11} {'failed':>6}")
    for number in range(math.ceil(end / args.bucket) + 1):
        low, high = number * args.bucket, (number + 1) * args.bucket
        inside = [s for s in run.samples if low <= s.at < high]
        answers = [a for a in run.answers if low <= a.sent < high]
        if not inside:
            continue
        phase = "/".join(name for number_, (name, start) in enumerate(run.phases)
                         if start < high and (number_ + 1 == len(run.phases) or run.phases[number_ + 1][1] > low))
        row = {"t": low, "phase": phase, "wanted": inside[-1].wanted, "ready": inside[-1].ready,
               "queue": max(s.queue for s in inside), "held": max(s.held for s in inside), "answered": len(answers),
               "ttft_p90": percentile([a.ttft for a in answers if a.ttft is not None], 0.9),
               "failed": len([a for a in answers if a.ttft is None])}
        rows.append(row)
        print(f"{low:>7.0f} {phase:<20} {row['wanted']:>6} {row['ready']:>5} {row['queue']:>6.0f} {row['held']:>5} "
              f"{row['answered']:>8} {_ms(row['ttft_p90']):>11} {row['failed']:>6}")
    return rows


def dips(run: Run, sustained: float, grown: float | None) -> None:
    """What the autoscaler wished between the sustained load's first wish for 2 and the count growing to 2, from
    the wishes it kept (each in force until the next): its dips to 1, and the longest stretch without one (the
    former rule, every pass of the window above the count, needed a stretch as long as the window)."""
    changes = sorted((at, wish) for at, wish in run.wishes.items() if at >= sustained and (grown is None or at < grown))
    first = next((at for at, wish in changes if wish >= 2), None)
    if first is None or grown is None:
        return
    stretches, dipped, start = [], 0.0, first
    low_since = None
    for at, wish in changes:
        if at < first:
            continue
        if wish < 2 and low_since is None:
            stretches.append(at - start)
            low_since = at
        elif wish >= 2 and low_since is not None:
            dipped += at - low_since
            start, low_since = at, None
    stretches.append((low_since if low_since is not None else grown) - start)
    print(f"  the autoscaler wished for 2 from {first - sustained:.1f} s; until the growth {grown - first:.1f} s later "
          f"it dipped to 1 {len(stretches) - 1} times ({dipped:.1f} s in all); longest stretch without a dip "
          f"{max(stretches):.1f} s")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s"


def chart(run: Run, rows: list[dict], bucket: float, path: Path) -> None:
    """Replicas (wanted, ready), the queue (running + waiting, held), each request's TTFT and the TTFT p90 of each
    row of the timeline over time, as PNG."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the chart needs matplotlib: install the bench extra (pip install -e '.[bench]')") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    times = [s.at for s in run.samples]
    figure, (replicas, queue, ttft) = pyplot.subplots(3, 1, sharex=True, figsize=(9, 7), constrained_layout=True)
    replicas.step(times, [s.wanted for s in run.samples], where="post", label="wanted")
    replicas.step(times, [s.ready for s in run.samples], where="post", label="ready", linestyle="--")
    wished = sorted(run.wishes.items())
    if wished:
        replicas.step([at for at, _ in wished] + [times[-1]], [w for _, w in wished] + [wished[-1][1]], where="post",
                      label="wished (autoscaler)", linestyle=":", color="C2")
    replicas.set_ylabel("replicas")
    replicas.set_yticks([0, 1, 2])
    replicas.legend(loc="upper right")
    queue.plot(times, [s.queue for s in run.samples], label="running + waiting on the engines")
    queue.plot(times, [s.held for s in run.samples], label="held by the gateway")
    queue.set_ylabel("requests")
    queue.legend(loc="upper right")
    answered = [a for a in run.answers if a.ttft is not None]
    ttft.scatter([a.sent for a in answered], [a.ttft for a in answered], s=8, label="each request")
    timed = [r for r in rows if r["ttft_p90"] is not None]
    ttft.step([r["t"] for r in timed], [r["ttft_p90"] for r in timed], where="post", color="C3",
              label=f"p90 per {bucket:g} s")
    ttft.set_yscale("log")
    ttft.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ttft.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ttft.yaxis.set_minor_formatter(NullFormatter())
    ttft.set_ylabel("TTFT (s), by send time")
    ttft.legend(loc="upper right")
    ttft.set_xlabel("seconds since the run began")
    for axes in (replicas, queue, ttft):
        for name, start in run.phases:
            axes.axvline(start, color="grey", linewidth=0.6)
    for name, start in run.phases:
        replicas.text(start + 0.5, 0.5, name, rotation=90, fontsize=8, color="grey", va="center")
    figure.suptitle(f"{MODEL} on llama-server, replicas min 0 max 2 (bench/autoscale.py)")
    figure.savefig(path, dpi=90)
    print(f"\nchart: {path}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-first", type=float, default=5.0, help="seconds at 0 replicas before the burst")
    parser.add_argument("--burst", type=int, default=4, help="requests sent at once after the idle time")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients of the sustained load")
    parser.add_argument("--sustain", type=float, default=45.0, help="seconds of sustained load")
    parser.add_argument("--after", type=float, default=40.0, help="seconds watched after the load stops")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--bucket", type=float, default=5.0, help="seconds per row of the timeline")
    parser.add_argument("--chart", type=Path, default=Path(tempfile.gettempdir()) / "llmgw-autoscale.png",
                        help="where the PNG chart goes")
    parser.add_argument("--json", type=Path, default=None, help="also write the samples and answers here")
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args()
    cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = await trio.to_thread.run_sync(demo.ensure_llama_server, cache)
    mirror = await trio.to_thread.run_sync(demo.ensure_gemma_mirror, cache)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        seed = settings_seed.write_seed(work / "seed", MODEL, MODEL_YAML, interval="1s")
        agents = seed / "agents" / "default.yaml"
        agents.write_text(agents.read_text() + "telemetry_interval: 500ms\n")
        init_repository(work / "settings.git", seed)
        async with trio.open_nursery() as nursery:
            plane = ControlPlane(ControlConfig(repo=str(work / "settings.git"), state_dir=work / "state"))
            await nursery.start(plane.run)
            agent = AgentConfig(node_id="bench", state_dir=work / "agent", mirrors=(str(mirror),),
                                heartbeat_interval=0.5, telemetry_interval=0.5,
                                engine_binaries={"llama.cpp@b11434": binary}, stop_shards_on_exit=True,
                                shard_stop_grace=2.0)
            await nursery.start(run_agent, agent, plane.local_connector())
            await wait_until(lambda: plane.is_connected("bench") and MODEL in plane.snapshot().scales, 60,
                             "the agent and the autoscaler")
            _record, key = plane.store.create_api_key("demo")
            run = Run()
            nursery.start_soon(sample, plane, run)
            async with httpx.AsyncClient(base_url=plane.gateway_url, timeout=180) as client:
                run.phase("idle")
                await trio.sleep(args.idle_first)
                run.phase("burst")
                async with trio.open_nursery() as clients:
                    for number in range(args.burst):
                        clients.start_soon(ask, client, key, run, "burst", args.max_tokens, number)
                run.phase("sustained")
                until = trio.current_time() + args.sustain
                async with trio.open_nursery() as clients:
                    for number in range(args.clients):
                        clients.start_soon(closed_loop, client, key, run, "sustained", args.max_tokens, until,
                                           100 + number)
                run.phase("after", at=until)  # no request sent since; the last ones ended meanwhile
                await trio.sleep(max(0.0, until + args.after - trio.current_time()))
            nursery.cancel_scope.cancel()
    rows = report(run, args)
    chart(run, rows, args.bucket, args.chart)
    if args.json:
        args.json.write_text(json.dumps({"phases": run.phases, "rows": rows,
                                         "samples": [vars(s) for s in run.samples],
                                         "wishes": sorted(run.wishes.items()),
                                         "answers": [vars(a) for a in run.answers]}, indent=1))


if __name__ == "__main__":
    trio.run(main)
