"""What identifies a replica's running generation: fingerprints, engine keys, replica and shard ids.

Ids (the contract of llmgw/plan/types.py):

- a replica id is "<model>-<n>", n from 0 to `replicas - 1`;
- a shard id is "<replica>/0" (one shard per replica: tensor parallel stays within one node);
- while a replica rolls to a new fingerprint, its old shard keeps its id until it is stopped, so the new
  generation takes "<replica>/0@<fingerprint[:8]>" when "<replica>/0" is still held by an older shard
  (and "<replica>/0" again on the roll after that, once the plain id is free). Which shard belongs to which
  generation is told by `ObservedShard.fingerprint`, never by parsing the id.
"""

from __future__ import annotations

import hashlib
import json

from llmgw.settings.model import Model, Settings

_FINGERPRINT_CACHE: dict[tuple[int, str], tuple[Model, str]] = {}
_CACHE_LIMIT = 8192


def fingerprint(model: Model, engine_version: str | None) -> str:
    """Return the fingerprint of what a replica of `model` runs: 64 lowercase hex digits (sha256).

    It covers everything whose change needs the engine process restarted: the engine and `engine_version`
    (the resolved version string, e.g. "b11434"; None when unknown), the weights (source, sha256, revision),
    LoRA adapters, context size, engine arguments, `allow_pickle`, and the resources the command line is
    built from (GPU count and class, tensor and pipeline parallel, CPU cores). It leaves out what a running
    replica does not see: replica count, aliases, prices, node selector, memory reservation, endpoints.
    Stable across processes and Python versions (canonical JSON, no hash randomness).
    """
    key = (id(model), engine_version or "")
    cached = _FINGERPRINT_CACHE.get(key)
    if cached is not None and cached[0] is model:
        return cached[1]
    res = model.resources
    document = {
        "engine": model.engine,
        "engine_version": engine_version or "",
        "weights": [[w.source, w.sha256, w.revision or ""] for w in model.weights],
        "adapters": [[a.name, a.weights.source, a.weights.sha256, a.weights.revision or ""]
                     for a in model.adapters],
        "context_size": model.context_size,
        "engine_args": list(model.engine_args),
        "allow_pickle": model.allow_pickle,
        "gpus": res.gpus,
        "gpu_class": res.gpu_class or "",
        "tensor_parallel": res.tensor_parallel,
        "pipeline_parallel": res.pipeline_parallel,
        "cpu_cores": float(res.cpu_cores),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    if len(_FINGERPRINT_CACHE) >= _CACHE_LIMIT:
        _FINGERPRINT_CACHE.clear()
    _FINGERPRINT_CACHE[key] = (model, digest)
    return digest


def engine_version_of(settings: Settings, model: Model) -> str | None:
    """The engine version `model` runs: its `engine_version`, else engines.yaml's default for its engine.

    None when neither names one (then any installed version of the engine is accepted and none is installed).
    """
    if model.engine_version is not None:
        return model.engine_version
    entry = settings.engine_version(model.engine, None)
    return entry.version if entry is not None else None


def engine_key(engine: str, version: str | None) -> str:
    """The key agents report installed engines by: "llama.cpp@b11434" ("llama.cpp@" when the version is unknown)."""
    return f"{engine}@{version or ''}"


def describe_engine(key: str) -> str:
    """"llama.cpp@b11434" -> "llama.cpp b11434", for messages."""
    engine, _, version = key.partition("@")
    return f"{engine} {version}".strip()


def replica_ids(model: Model) -> list[str]:
    """The replica ids `model` wants, in order: "<name>-0" ... (none for endpoint models or replicas 0)."""
    if model.endpoints:
        return []
    return [f"{model.name}-{n}" for n in range(max(model.replicas, 0))]


def replica_index(replica_id: str) -> int:
    """n of "<model>-<n>"; -1 when the id does not end in "-<digits>"."""
    _, _, tail = replica_id.rpartition("-")
    return int(tail) if tail.isdigit() else -1


def base_shard_id(replica_id: str) -> str:
    """The plain shard id of a replica: "<replica>/0"."""
    return f"{replica_id}/0"


def new_shard_id(replica_id: str, fingerprint_hex: str, taken: set[str] | frozenset[str]) -> str:
    """The id for a new shard of `replica_id` running `fingerprint_hex`, avoiding the ids in `taken`.

    "<replica>/0" when free, else "<replica>/0@<fingerprint[:8]>", else that with ".<k>" (k from 1).
    """
    plain = base_shard_id(replica_id)
    if plain not in taken:
        return plain
    candidate = f"{plain}@{fingerprint_hex[:8]}"
    k = 1
    while candidate in taken:
        candidate = f"{plain}@{fingerprint_hex[:8]}.{k}"
        k += 1
    return candidate
