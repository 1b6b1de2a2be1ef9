"""Precise prefix routing: the replica whose engine holds the most leading blocks of the prompt (pure).

The inputs are plain data: the prompt's block hashes in order (`llmgw.tools.vllm_hashing.block_hashes` of its
token ids, as vLLM hashes them), and per replica the hashes its engine holds (`KvBlocks.held()` mirrored from the
engine's KV events, `llmgw.tools.vllm_kv_events`), or None for a replica that sends no events.

`choose_by_blocks` scores each eligible replica by its run of leading blocks held (block 0, 1, ... up to the first
missing one: vLLM reuses a prefix only from the start). Among replicas that are not saturated (the same rule as
`choose_replica`'s affinity: fewer than `saturation` requests in flight, and fewer than `saturation` above the least
loaded), the best score wins; ties go to the least loaded, then by `rotation`. When nothing scores (no replica
holds the first block, or every holder is saturated), the decision falls back: to the approximate policy
(`choose_replica` with the remembered `affinity`) when some eligible replica sends no events, else least loaded.
Every decision (a `routing.RoutingChoice`) says its kind, for the counters: "precise", "approximate" or "least-loaded".

The prompt's tokens come from the engine itself (`tokenize_body`: what to POST to vLLM's `/tokenize` so it applies
its own chat template, exactly as for the request), and are hashed with the scheme its replicas report
(`hashing_scheme`, `prompt_blocks`): only vLLM's "sha256_cbor" with a known seed is reproduced. Replicas of one
model reporting another block size or hashing are treated as sending no events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.gateway.routing import (
    APPROXIMATE, LEAST_LOADED, NO_FACTS, PRECISE, RoutingChoice, RoutingFacts, eligible, pick_from, under_saturation,
)
from llmgw.routes import BlockSnapshot, ReplicaBlocks, ReplicaRoute
from llmgw.tools.vllm_hashing import ALGORITHM, block_hashes


def leading_blocks_held(prompt_blocks: Sequence[int], held: frozenset[int] | None) -> int:
    """How many of `prompt_blocks`, from the first on, are in `held` (0 for None)."""
    if not held:
        return 0
    count = 0
    for block in prompt_blocks:
        if block not in held:
            break
        count += 1
    return count


def choose_by_blocks(replicas: Sequence[ReplicaRoute], outstanding: Mapping[str, int],
                     held: Mapping[str, frozenset[int] | None], prompt_blocks: Sequence[int],
                     facts: RoutingFacts = NO_FACTS) -> RoutingChoice:
    """Pick the replica for one request by the prompt's leading blocks each replica's engine holds.

    `held`: replica id -> the block hashes its engine holds, None (or missing) when it sends no events.
    `prompt_blocks`: the prompt's full-block hashes in order (empty: a prompt shorter than one block).
    `outstanding` and `facts` are `choose_replica`'s (`facts.affinity` is used by the approximate fallback only).
    Returns a RoutingChoice (replica None only when `replicas` minus `facts.exclude` is empty). Pure; never raises.
    """
    pool = eligible(replicas, facts)
    if not pool:
        return RoutingChoice(None, LEAST_LOADED)
    least = min(outstanding.get(r.replica_id, 0) for r in pool)

    def load(replica: ReplicaRoute) -> int:
        return outstanding.get(replica.replica_id, 0)

    open_ = [r for r in pool if under_saturation(load(r), least, facts.saturation)]
    scored = [(leading_blocks_held(prompt_blocks, held.get(r.replica_id)), r) for r in open_]
    best = max((score for score, _ in scored), default=0)
    if best > 0:
        top = [r for score, r in scored if score == best]
        fewest = min(load(r) for r in top)
        tied = [r for r in top if load(r) == fewest]
        return RoutingChoice(tied[facts.rotation % len(tied)], PRECISE, best)
    if any(held.get(r.replica_id) is None for r in pool):
        return RoutingChoice(pick_from(pool, outstanding, facts.affinity, facts), APPROXIMATE)
    return RoutingChoice(pick_from(pool, outstanding, None, facts), LEAST_LOADED)


# The fields of a chat request that change what vLLM's chat template renders (vLLM's TokenizeChatRequest).
_CHAT_FIELDS = ("messages", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
                "chat_template_kwargs", "tools")


def tokenize_body(path: str, body: Mapping[str, Any], model: str | None) -> dict[str, Any] | list[int] | None:
    """What to POST to vLLM's `/tokenize` for a request to `path` ("/v1/chat/completions", "/v1/completions") so
    the engine returns the prompt's token ids as it will see them: for chat, the messages and the fields that
    change its chat template's output; for completions, the prompt. A prompt given as token ids is returned as
    they are (a list: nothing to ask). None when there is no one prompt (embeddings, a batch of prompts).
    `model`: the engine's name of the model (None: the body's). Format: vLLM's `/tokenize` (fixtures'
    tokenize.json). Pure; never raises."""
    name = model or body.get("model")
    if path.endswith("chat/completions"):
        if not isinstance(body.get("messages"), list):
            return None
        return {"model": name, **{k: body[k] for k in _CHAT_FIELDS if k in body}}
    if path.endswith("/completions"):
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return {"model": name, "prompt": prompt}
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            return list(prompt)
    return None


def hashing_scheme(replicas: Sequence[ReplicaRoute], snapshot: BlockSnapshot) -> ReplicaBlocks | None:
    """The block scheme to hash a prompt with: that of the first of `replicas` (table order) whose blocks are
    known, with a block size, "sha256_cbor" and a seed. None when no replica has such (precise routing is off)."""
    for replica in replicas:
        blocks = snapshot.replicas.get(replica.replica_id)
        if blocks is not None and blocks.block_size > 0 and blocks.hash_algorithm == ALGORITHM and blocks.hash_seed:
            return blocks
    return None


def held_by_replica(replicas: Sequence[ReplicaRoute], snapshot: BlockSnapshot,
                    scheme: ReplicaBlocks) -> dict[str, frozenset[int] | None]:
    """`choose_by_blocks`'s `held`: each replica's held blocks when it reports with `scheme`'s block size and
    hashing, else None (treated as sending no events). Pure."""
    out: dict[str, frozenset[int] | None] = {}
    for replica in replicas:
        blocks = snapshot.replicas.get(replica.replica_id)
        same = blocks is not None and (blocks.block_size, blocks.hash_algorithm, blocks.hash_seed) == (
            scheme.block_size, scheme.hash_algorithm, scheme.hash_seed)
        out[replica.replica_id] = blocks.blocks if same else None
    return out


def prompt_blocks(tokens: Sequence[int], scheme: ReplicaBlocks) -> list[int]:
    """The prompt's full-block hashes as the engines of `scheme` compute them (empty: shorter than one block).

    Plain prompts only: vLLM 0.32 hashes a LoRA adapter's blocks with `("lora", name, path)` as extra keys
    (`kv_cache_utils._gen_lora_extra_hash_keys`), the path being the adapter's directory on the node, which the
    gateway does not know; requests for an adapter are not routed precisely (`Gateway._prompt_blocks`)."""
    return block_hashes(tokens, scheme.block_size, seed=scheme.hash_seed)
