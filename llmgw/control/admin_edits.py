"""The admin API's settings edits: the routes whose request is a commit to the settings branch, authored by the
caller (`llmgw.control.admin.Caller.author`), written by the one writer (`llmgw.settings.edit_commits.commit_edit`,
through `ControlView.edit_settings`). The CLI and the console call these same routes.

    POST /api/v1/stop | /api/v1/start                      serving.stopped in llmgw.yaml
    POST /api/v1/nodes/{node}/{verb}                       verb: cordon|uncordon|drain (llmgw.yaml) | lend|reclaim
    POST /api/v1/slurm/users/keys {"action", "email", "keys"}         ssh_keys in slurm.yaml
    POST /api/v1/models/{model}/replicas {"replicas": N} | {"min": A, "max": B}      the model's catalog file
    POST /api/v1/models/{model}/adapters {"action": "add"|"remove", "name", "weights": [{"source", "sha256"}]}
    POST /api/v1/models/{model}/serve {"engine", "weights": [{"source", "sha256"}], "replicas",
                                       "gpus", "gpu_class", "tensor_parallel" | "cpu_cores", "memory_bytes"}
                                                            a new catalog file (the model explorer's serve form)

Every one also takes `"preview": true` (nothing is committed: the answer's `diff` is what would be, `commit` the head
it was made against) and `"expect": "<40 hex>"` (commit only onto that head: the one a preview showed; another head
is 409, nothing committed), besides `author_name`/`author_email` (nobody's tokens only). Pure: a path and a JSON body
in, a `SettingsEdit` and the answer's fields out.
"""

from __future__ import annotations

import re
from typing import Any

from llmgw.control.admin_inputs import AdminInputError, body_text
from llmgw.control.effects import (
    ModelAdapter, ModelReplicas, ModelServe, NodeVerb, ServingStopped, SettingsEdit, SshKeys,
)
from llmgw.settings.model import ENGINES
from llmgw.settings.model_commits import ModelServing

NODE_ROUTE_VERBS = ("cordon", "uncordon", "drain", "lend", "reclaim")
MAX_REPLICAS = 10_000
"""The most replicas a request may ask for (a typo's guard; the settings' own bounds are checked by validate)."""
MAX_ADAPTER_FILES = 16
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def serves(method: str, path: str) -> bool:
    """Whether `method path` is one of the edit routes (an unknown node verb or model action included: 404 there)."""
    if method != "POST":
        return False
    parts = path.split("/")
    return path in ("/api/v1/stop", "/api/v1/start", "/api/v1/slurm/users/keys") or (
        len(parts) == 6 and parts[:4] == ["", "api", "v1", "nodes"]) or (
        len(parts) == 6 and parts[:4] == ["", "api", "v1", "models"])


def body_expect(body: dict[str, Any]) -> str:
    """The body's `expect` (a commit id, 40 lower-case hex; "" when absent). Raises AdminInputError otherwise."""
    expect = body_text(body, "expect", "", 64)
    if expect and not _COMMIT.fullmatch(expect):
        raise AdminInputError("expect", f"expect must be the commit id (40 hex) a preview answered, not {expect[:64]!r}")
    return expect


def _count(body: dict[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPLICAS:
        raise AdminInputError(field, f"{field} must be a whole number from 0 to {MAX_REPLICAS}, not {str(value)[:40]!r}")
    return value


def _replicas(model: str, body: dict[str, Any]) -> ModelReplicas:
    count, low, high = _count(body, "replicas"), _count(body, "min"), _count(body, "max")
    if count is not None and low is None and high is None:
        return ModelReplicas(model, count=count)
    if count is None and low is not None and high is not None:
        return ModelReplicas(model, low=low, high=high)
    raise AdminInputError("replicas", "say {\"replicas\": N} for a fixed count, or {\"min\": A, \"max\": B} for the "
                                      "range the autoscaler keeps the count in")


def _adapter(model: str, body: dict[str, Any]) -> ModelAdapter:
    action, name = body_text(body, "action", ""), body_text(body, "name", "", 63)
    if action not in ("add", "remove") or not name:
        raise AdminInputError("action", "say {\"action\": \"add\" or \"remove\", \"name\": ADAPTER} (add also "
                                        "\"weights\": [{\"source\", \"sha256\"}, ...])")
    if action == "remove":
        return ModelAdapter("remove", model, name)
    weights = body.get("weights")
    if not isinstance(weights, list) or not 1 <= len(weights) <= MAX_ADAPTER_FILES or not all(
            isinstance(w, dict) and isinstance(w.get("source"), str) and 0 < len(w["source"]) <= 1000
            and isinstance(w.get("sha256"), str) and _SHA256.fullmatch(w["sha256"]) for w in weights):
        raise AdminInputError("weights", f"weights must list 1 to {MAX_ADAPTER_FILES} files, each {{\"source\": URL, "
                                         "\"sha256\": 64 lower-case hex}")
    return ModelAdapter("add", model, name, tuple((w["source"], w["sha256"]) for w in weights))


def _whole(body: dict[str, Any], field: str, default: int, high: int) -> int:
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise AdminInputError(field, f"{field} must be a whole number from 0 to {high}, not {str(value)[:40]!r}")
    return value


def _serve(model: str, body: dict[str, Any]) -> ModelServe:
    engine = body_text(body, "engine", "")
    if engine not in ENGINES:
        raise AdminInputError("engine", f"engine must be one of {', '.join(ENGINES)}, not {engine[:40]!r}")
    weights = body.get("weights")
    if not isinstance(weights, list) or not 1 <= len(weights) <= MAX_ADAPTER_FILES or not all(
            isinstance(w, dict) and isinstance(w.get("source"), str) and 0 < len(w["source"]) <= 1000
            and isinstance(w.get("sha256", ""), str) and (w.get("sha256", "") == "" or _SHA256.fullmatch(w["sha256"]))
            for w in weights):
        raise AdminInputError("weights", f"weights must list 1 to {MAX_ADAPTER_FILES} files, each {{\"source\": URL, "
                                         "\"sha256\": 64 lower-case hex}} (a directory source ending in / may omit "
                                         "its sha256)")
    cores = body.get("cpu_cores", 0)
    if isinstance(cores, bool) or not isinstance(cores, (int, float)) or not 0 <= cores <= 4096:
        raise AdminInputError("cpu_cores", f"cpu_cores must be a number from 0 to 4096, not {str(cores)[:40]!r}")
    serving = ModelServing(engine, tuple((w["source"], w.get("sha256", "")) for w in weights),
                           _whole(body, "replicas", 1, MAX_REPLICAS), _whole(body, "gpus", 0, 64),
                           body_text(body, "gpu_class", "", 100), _whole(body, "tensor_parallel", 1, 64) or 1,
                           float(cores), _whole(body, "memory_bytes", 0, 1 << 50))
    return ModelServe(model, serving)


def _ssh_keys(body: dict[str, Any]) -> SshKeys:
    action, email = body_text(body, "action", ""), body_text(body, "email", "")
    keys = body.get("keys", [])
    if action not in ("add", "remove") or not email or not isinstance(keys, list) \
            or not all(isinstance(key, str) for key in keys) or (action == "add" and not keys):
        raise AdminInputError("action", "say {\"action\": \"add\" or \"remove\", \"email\": ..., \"keys\": [public key "
                                        "lines]} (add needs at least one key)")
    return SshKeys(action, email, tuple(keys))


def edit_of(path: str, body: dict[str, Any]) -> tuple[SettingsEdit, dict[str, Any]] | None:
    """The edit an edit route's request asks for, and the fields its answer repeats (`node`, `verb`, `model`, ...);
    None for a path under an edit route that names no action (an unknown verb: 404).
    Raises AdminInputError naming the body field that is wrong."""
    if path in ("/api/v1/stop", "/api/v1/start"):
        stopped = path.endswith("stop")
        return ServingStopped(stopped), {"stopped": stopped}
    if path == "/api/v1/slurm/users/keys":
        edit = _ssh_keys(body)
        return edit, {"email": edit.email, "action": edit.action}
    _, _, _, kind, subject, verb = path.split("/")
    if kind == "nodes" and verb in NODE_ROUTE_VERBS:
        return NodeVerb(verb, subject), {"node": subject, "verb": verb}
    if kind == "models" and verb == "replicas":
        edit = _replicas(subject, body)
        return edit, {"model": subject, **({"replicas": edit.count} if edit.count is not None else
                                           {"min": edit.low, "max": edit.high})}
    if kind == "models" and verb == "serve":
        serve = _serve(subject, body)
        return serve, {"model": subject, "engine": serve.serving.engine}
    if kind == "models" and verb == "adapters":
        adapter = _adapter(subject, body)
        return adapter, {"model": subject, "action": adapter.action, "name": adapter.name}
    return None
