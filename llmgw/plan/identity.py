"""What identifies a replica's running generation from the settings: fingerprints, engine versions, replica ids.

Engine keys, replica and shard id builders live in `llmgw.identity` (the bottom module every layer shares); this
module adds what needs the settings' `Model`.
"""

from __future__ import annotations

import hashlib
import json

from llmgw.identity import replica_id
from llmgw.settings.model import Model, Settings

_FINGERPRINT_CACHE: dict[tuple[int, str], tuple[Model, str]] = {}
_CACHE_LIMIT = 8192


def fingerprint(model: Model, engine_version: str | None) -> str:
    """Return the fingerprint of what a replica of `model` runs: 64 lowercase hex digits (sha256).

    It covers everything whose change needs the engine process restarted: the engine and `engine_version`
    (the resolved version string, e.g. "b11434"; None when unknown), the weights (source, sha256, revision),
    LoRA adapters (names, files and order: llama.cpp numbers them by position), context size, engine arguments,
    `allow_pickle`, and the resources the command line is built from (GPU count and class, tensor and pipeline
    parallel, CPU cores). It leaves out what a running
    replica does not see: replica count, aliases, prices, node selector, memory reservation, endpoints, routing.
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
        "adapters": [[a.name, [[w.source, w.sha256, w.revision or ""] for w in a.weights]] for a in model.adapters],
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


def replica_ids(model: Model) -> list[str]:
    """The replica ids `model` wants, in order: "<name>-0" ... (none for endpoint models or replicas 0)."""
    if model.endpoints:
        return []
    return [replica_id(model.name, n) for n in range(max(model.replicas, 0))]
