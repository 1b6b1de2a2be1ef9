"""The words every layer shares, defined once: a shard's lifecycle, an engine install's states, engine keys,
replica and shard ids, aliases.

Pure and at the bottom: it imports nothing of llmgw, so every package (wire, agent, plan, control, gateway,
settings) may import it, like `llmgw.units`.

Engine keys: "llama.cpp@b11434" names an engine at a version ("llama.cpp@" when the version is unknown). Agents
report installed engines by it, so it is read back from the wire with `split_engine_key`. The per-replica HMAC
bearer key the gateway sends to an engine is a different word: the *replica key* (`llmgw.control.replica_key`).

Ids are built here and never parsed (what a shard runs is carried in its messages: `replica_id`, `model`,
`fingerprint`):

- a replica id is "<model>-<n>", n from 0 to `replicas - 1`;
- a shard id is "<replica>/0" for a replica on one node (tensor parallel stays within the node), and
  "<replica>/<rank>" for each shard of a replica spread over several nodes (`llmgw.plan.spanning`); the rank
  itself travels in StartShard/ShardStatus (`rank`), so it is never read back from the id;
- while a replica rolls to a new fingerprint, its old shard keeps its id until it is stopped, so the new
  generation takes "<replica>/0@<fingerprint[:8]>" when "<replica>/0" is still held by an older shard
  (and "<replica>/0" again on the roll after that, once the plain id is free). Which shard belongs to which
  generation is told by the shard's fingerprint, never by parsing the id.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar


class ShardState(str, enum.Enum):
    """Lifecycle of one shard as its agent reports it. The wire (`ShardStatus.state`) carries `.value`."""

    PENDING = "pending"          # asked to start; weights or engine not there yet
    FETCHING = "fetching"        # downloading / verifying weights
    STARTING = "starting"        # process running, not ready (health not 200 yet)
    READY = "ready"              # health 200
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"            # exited or could not start; `error` says why; restarted with backoff


class EngineState(str, enum.Enum):
    """An engine install on one node as its agent reports it. The wire (`EngineStatus.state`) carries `.value`."""

    INSTALLING = "installing"    # under way; `progress` and `progress_text` say how far
    INSTALLED = "installed"      # verified: shards may use it
    FAILED = "failed"            # the install failed, or a periodic check found it broken; `error` says why


def engine_key(engine: str, version: str | None) -> str:
    """The key agents report installed engines by: "llama.cpp@b11434" ("llama.cpp@" when the version is unknown)."""
    return f"{engine}@{version or ''}"


def split_engine_key(key: str) -> tuple[str, str]:
    """"llama.cpp@b11434" -> ("llama.cpp", "b11434"); the version is "" when the key has none.

    The one reader of engine keys: they arrive as strings from agents (`engines_installed`, `EngineStatus.engine`).
    """
    engine, _, version = key.partition("@")
    return engine, version


def describe_engine(key: str) -> str:
    """"llama.cpp@b11434" -> "llama.cpp b11434", for messages."""
    engine, version = split_engine_key(key)
    return f"{engine} {version}".strip()


def replica_id(model_name: str, n: int) -> str:
    """The id of replica `n` (from 0) of the model called `model_name`: "<model>-<n>"."""
    return f"{model_name}-{n}"


def replica_index(replica: str) -> int:
    """n of "<model>-<n>"; -1 when the id does not end in "-<digits>".

    A sort key only (replicas in numeric order in plans and listings): never used to tell which model or
    replica something belongs to.
    """
    _, _, tail = replica.rpartition("-")
    return int(tail) if tail.isdigit() else -1


def base_shard_id(replica: str) -> str:
    """The plain shard id of a replica: "<replica>/0"."""
    return f"{replica}/0"


def new_shard_id(replica: str, fingerprint_hex: str, taken: set[str] | frozenset[str], rank: int = 0) -> str:
    """The id for a new shard of `replica` (its `rank`, 0 on one node) running `fingerprint_hex`, avoiding `taken`.

    "<replica>/<rank>" when free, else "<replica>/<rank>@<fingerprint[:8]>", else that with ".<k>" (k from 1).
    """
    plain = f"{replica}/{rank}"
    if plain not in taken:
        return plain
    candidate = f"{plain}@{fingerprint_hex[:8]}"
    k = 1
    while candidate in taken:
        candidate = f"{plain}@{fingerprint_hex[:8]}.{k}"
        k += 1
    return candidate


class Routing(str, enum.Enum):
    """A model's routing policy (catalog `routing`): how the gateway picks one of its replicas for a request.

    PREFIX: the replica holding the prompt's prefix in cache (`llmgw.gateway.routing_prefix` when replicas send
    KV blocks, else prompt-prefix affinity) until saturated, else the least loaded. LEAST_LOADED: the fewest
    requests in flight. ROUND_ROBIN: each replica in turn, ignoring load and prefixes (a baseline to measure the
    others against: bench/prefix_routing.py). EXPECTED_TIME: the replica expected to finish the request first, from
    its requests in flight, its measured speed and the prompt's prefix hits (`llmgw.gateway.routing_expected`).
    """

    PREFIX = "prefix"
    LEAST_LOADED = "least-loaded"
    ROUND_ROBIN = "round-robin"
    EXPECTED_TIME = "expected-time"


class HasAliases(Protocol):
    """Anything named in a catalog with aliases: a settings `Model`, a gateway `ModelRoute`."""

    @property
    def aliases(self) -> Iterable[str]: ...


M = TypeVar("M", bound=HasAliases)


def resolve_model(models: Mapping[str, M], name: str) -> M | None:
    """The model of `models` (by catalog name) called `name` or having `name` as an alias; None for anything else.

    The one alias resolution of llmgw: the gateway's routing (`RouteTable.resolve`) and the settings
    (`Settings.resolve_model`, projects' model lists) both use it. An engine's own served name is not an alias.
    """
    model = models.get(name)
    if model is not None:
        return model
    for candidate in models.values():
        if name in candidate.aliases:
            return candidate
    return None


@dataclass(frozen=True)
class Quota:
    """The limits of one quota scope (a project, team or organisation); None means no limit of that kind.

    `requests_per_minute` and `tokens_per_minute` count in fixed minute windows, `tokens_per_day` in calendar days
    (UTC), `concurrent_requests` requests in flight at once, `budget` the cluster's currency per calendar month.
    Read from projects.yaml by llmgw.settings, carried to the gateway in the routing table (llmgw.routes) and
    enforced by the store's quota rules (llmgw.store.quotas).
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    concurrent_requests: int | None = None
    budget: float | None = None
