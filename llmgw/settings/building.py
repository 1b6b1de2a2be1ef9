"""Turning schema-valid data into the typed `Settings`, with units normalised, and the cross-file checks.

Every check reports through `Found`, which places each Issue at the file, line and column of the value it is
about. Checks made here (beyond the schemas): a model's `name` differs from its file name; a name, alias or
adapter name used twice (one namespace); an engine version engines.yaml does not list; tensor parallel x pipeline
parallel different from the GPUs asked for; a GPU model without a GPU class; a CPU model without memory; pickle
weights without `allow_pickle`; adapters the model's engine cannot load (`llmgw.settings.adapters`); several
default versions of one engine; a project naming an unknown model; a project or team name used twice; an empty
catalog without `serving.allow_empty`. Warning: a hf:// source pinned by sha256 alone (no `@<revision>`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from llmgw.errors import Issue
from llmgw.identity import Routing
from llmgw.settings.model import (
    Adapter, AgentSettings, ClusterSettings, ConsoleOidc, Endpoint, EngineVersion, Listener, Model, Organisation,
    Prices, Project, Quota, Resources, Rollout, Scaling, Settings, StoreSettings, Team, Tracing, WeightsFile,
)
from llmgw.settings.adapters import adapter_problems
from llmgw.settings.parsing import Parsed
from llmgw.settings.schemas import format_path
from llmgw.units import parse_duration, parse_size

_HF = re.compile(r"^hf://([^/@]+)/([^/@]+)(?:@([0-9a-f]{40}))?/(.*)$")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass
class Found:
    """Issues found so far, the parsed files to place new ones in, and the file being worked on (for a message
    about a failure that names no file)."""

    files: dict[str, Parsed]
    issues: list[Issue] = field(default_factory=list)
    current: str = ""

    def add(self, file: str, path: tuple[str | int, ...], message: str, *, of_key: bool = False,
            severity: str = "error") -> None:
        parsed = self.files.get(file)
        line, column = parsed.position(path, of_key=of_key) if parsed else (0, 0)
        self.issues.append(Issue(file, line, column, format_path(path), message, severity))


def deep_freeze(value: Any) -> Any:
    """Dicts become read-only mappings and lists tuples, recursively."""
    if isinstance(value, dict):
        return MappingProxyType({k: deep_freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(deep_freeze(v) for v in value)
    return value


def _size(value: Any) -> int | None:
    return None if value is None else parse_size(value)


def _duration(data: Mapping[str, Any], key: str, default: float) -> float:
    return parse_duration(data[key]) if key in data else default


def build_cluster(data: Mapping[str, Any]) -> ClusterSettings:
    """`llmgw.yaml` data (schema-valid) -> ClusterSettings."""
    listeners = data.get("listeners", {})
    defaults = ClusterSettings(name="x")

    def listener(key: str, default: Listener) -> Listener:
        raw = listeners.get(key)
        if raw is None:
            return default
        return Listener(raw.get("host", default.host), raw.get("port", default.port), raw.get("workers", 1),
                        _duration(raw, "drain_timeout", default.drain_timeout))

    store = data.get("store", {})
    reconcile = data.get("reconcile", {})
    serving = data.get("serving", {})
    prices = data.get("prices", {})
    return ClusterSettings(
        name=data["name"],
        gateway=listener("gateway", defaults.gateway),
        admin=listener("admin", defaults.admin),
        agents=listener("agents", defaults.agents),
        store=StoreSettings(kind=store.get("kind", "sqlite"), path=store.get("path", "llmgw.sqlite3"), url=store.get("url"),
                            password_secret=store.get("password_secret"),
                            responses_retention=_duration(store, "responses_retention",
                                                          StoreSettings.responses_retention),
                            files_retention=_duration(store, "files_retention", StoreSettings.files_retention)),
        poll_interval=_duration(reconcile, "poll_interval", defaults.poll_interval),
        reconcile_interval=_duration(reconcile, "interval", defaults.reconcile_interval),
        node_lost_after=_duration(reconcile, "node_lost_after", defaults.node_lost_after),
        action_timeout=_duration(reconcile, "action_timeout", defaults.action_timeout),
        max_surge=int(reconcile.get("max_surge", defaults.max_surge)),
        forecast_check_after=_duration(reconcile, "forecast_check_after", defaults.forecast_check_after),
        serving_stopped=bool(serving.get("stopped", False)),
        allow_empty=bool(serving.get("allow_empty", False)),
        cordoned=tuple(sorted(set(serving.get("cordoned", ())))),
        drained=tuple(sorted(set(serving.get("drained", ())))),
        max_inlet_celsius=(float(serving["max_inlet_celsius"]) if serving.get("max_inlet_celsius") is not None
                           else None),
        currency=prices.get("currency", "USD"),
        gpu_hour_cost=MappingProxyType({k: float(v) for k, v in prices.get("gpu_hour_cost", {}).items()}),
        max_request_body_bytes=parse_size(data.get("limits", {}).get("max_request_body", defaults.max_request_body_bytes)),
        max_file_bytes=parse_size(data.get("limits", {}).get("max_file_size", defaults.max_file_bytes)),
        batch_slot_share=float(data.get("limits", {}).get("batch_slot_share", defaults.batch_slot_share)),
        kv_blocks_per_replica=int(data.get("limits", {}).get("kv_blocks_per_replica", defaults.kv_blocks_per_replica)),
        control_planes=tuple(dict.fromkeys(data.get("control_planes", ()))),
        tracing=build_tracing(data.get("tracing", {})),
        trace_requests=float(data.get("tracing", {}).get("sample_requests", defaults.trace_requests)),
        trusted_release_keys=tuple(data.get("releases", {}).get("trusted_keys", ())),
        console_oidc=ConsoleOidc(**data["console"]["oidc"]) if "oidc" in data.get("console", {}) else None,
    )


def build_tracing(data: Mapping[str, Any], base: Tracing = Tracing()) -> Tracing:
    """`tracing:` data (schema-valid: an http(s) URL, ratios 0..1) -> Tracing; keys absent keep `base`'s."""
    return Tracing(endpoint=data.get("endpoint", base.endpoint),
                   sample_ratio=float(data.get("sample_ratio", base.sample_ratio)))


def _weights(raw: Mapping[str, Any]) -> WeightsFile:
    match = _HF.match(raw["source"])
    return WeightsFile(source=raw["source"], sha256=raw.get("sha256", ""), revision=match.group(3) if match else None,
                       secret=raw.get("secret"), size_bytes=_size(raw.get("size")))


def build_model(stem: str, file: str, data: Mapping[str, Any]) -> Model:
    """`catalog/<stem>.yaml` data (schema-valid) -> Model."""
    res = data.get("resources", {})
    prices = data.get("prices", {})
    return Model(
        name=data.get("name", stem),
        engine=data["engine"],
        weights=tuple(_weights(w) for w in data.get("weights", [])),
        engine_version=data.get("engine_version"),
        replicas=_replicas(data.get("replicas", 1)),
        resources=Resources(
            gpus=res.get("gpus", 0), gpu_class=res.get("gpu_class"), gpu_memory_bytes=_size(res.get("gpu_memory")),
            tensor_parallel=res.get("tensor_parallel", 1), pipeline_parallel=res.get("pipeline_parallel", 1),
            cpu_cores=float(res.get("cpu_cores", 1.0)), memory_bytes=_size(res.get("memory")),
        ),
        context_size=data.get("context_size"),
        engine_args=tuple(data.get("engine_args", ())),
        aliases=tuple(data.get("aliases", ())),
        adapters=tuple(Adapter(a["name"], tuple(_weights(w) for w in a["weights"])) for a in data.get("adapters", ())),
        allow_pickle=bool(data.get("allow_pickle", False)),
        endpoints=tuple(Endpoint(e["url"], e.get("secret"), e.get("model")) for e in data.get("endpoints", ())),
        prices=Prices(
            None if prices.get("prompt_per_million") is None else float(prices["prompt_per_million"]),
            None if prices.get("completion_per_million") is None else float(prices["completion_per_million"]),
            None if prices.get("batch_prompt_per_million") is None else float(prices["batch_prompt_per_million"]),
            None if prices.get("batch_completion_per_million") is None
            else float(prices["batch_completion_per_million"]),
        ),
        node_selector=MappingProxyType(dict(data.get("node_selector", {}))),
        routing=Routing(data.get("routing", Routing.PREFIX.value)),
        rerank=bool(data.get("rerank", False)),
        rollout=build_rollout(data.get("rollout", {})),
        scaling=build_scaling(data["replicas"]) if isinstance(data.get("replicas"), Mapping) else None,
        source_file=file,
    )


def _replicas(value: int | Mapping[str, Any]) -> int:
    return int(value["min"]) if isinstance(value, Mapping) else int(value)


def build_scaling(data: Mapping[str, Any]) -> Scaling:
    """A catalog model's `replicas: {min, max, ...}` data (schema-valid) -> Scaling (durations in seconds)."""
    return Scaling(
        min=int(data["min"]), max=int(data["max"]),
        queue_per_replica=float(data.get("queue_per_replica", Scaling.queue_per_replica)),
        kv_cache_usage=float(data.get("kv_cache_usage", Scaling.kv_cache_usage)),
        ttft_p90=None if data.get("ttft_p90") is None else parse_duration(data["ttft_p90"]),
        scale_up_window=_duration(data, "scale_up_window", Scaling.scale_up_window),
        scale_down_window=_duration(data, "scale_down_window", Scaling.scale_down_window),
        cooldown=_duration(data, "cooldown", Scaling.cooldown), idle=_duration(data, "idle", Scaling.idle),
    )


def build_rollout(data: Mapping[str, Any]) -> Rollout:
    """A catalog model's `rollout:` data (schema-valid) -> Rollout (durations in seconds)."""
    slo = data.get("slo", {})
    return Rollout(
        strategy=data.get("strategy", Rollout.strategy), share=float(data.get("share", Rollout.share)),
        window=_duration(data, "window", Rollout.window),
        min_requests=int(data.get("min_requests", Rollout.min_requests)),
        max_error_rate=None if slo.get("error_rate") is None else float(slo["error_rate"]),
        max_ttft_p90=None if slo.get("ttft_p90") is None else parse_duration(slo["ttft_p90"]),
    )


def check_model(found: Found, file: str, stem: str, data: Mapping[str, Any], model: Model) -> None:
    """Checks of one model on its own (name, parallelism, memory, pickle, pins)."""
    if "name" in data and data["name"] != stem:
        found.add(file, ("name",), f"name {data['name']!r} differs from the file name {stem!r}; "
                                   f"rename the file to {data['name']}.yaml or drop the key")
    res = model.resources
    width = res.tensor_parallel * res.pipeline_parallel
    if not model.endpoints:
        if res.gpus == 0 and width > 1:
            key = "tensor_parallel" if res.tensor_parallel > 1 else "pipeline_parallel"
            found.add(file, ("resources", key), f"tensor parallel {res.tensor_parallel} x pipeline parallel "
                      f"{res.pipeline_parallel} needs {width} GPUs but the model asks for none; set resources.gpus")
        elif res.gpus and width != res.gpus:
            key = "tensor_parallel" if "tensor_parallel" in data.get("resources", {}) else "gpus"
            verb = "larger than" if width > res.gpus else "different from"
            found.add(file, ("resources", key), f"tensor parallel {res.tensor_parallel} x pipeline parallel "
                      f"{res.pipeline_parallel} = {width} is {verb} the {res.gpus} GPUs asked for")
        if res.gpus and res.gpu_class is None:
            found.add(file, ("resources", "gpus"), "a GPU model must name its resources.gpu_class (e.g. h100-80g)")
        if res.gpus == 0 and res.memory_bytes is None:
            found.add(file, ("resources",) if "resources" in data else (),
                      "a CPU model must reserve memory: set resources.memory (e.g. 1Gi)")
        if not model.weights:
            found.add(file, (), "a model run by llmgw needs weights (or endpoints to route to)")
        if model.rerank and model.engine == "llama.cpp" and "--reranking" not in model.engine_args:
            found.add(file, ("rerank",), "llama-server reranks only when started with --reranking: add it to "
                                         "engine_args (with a reranking GGUF)")
    check_files(found, file, ("weights",), model.weights, model.allow_pickle)
    for index, adapter in enumerate(model.adapters):
        check_files(found, file, ("adapters", index, "weights"), adapter.weights, model.allow_pickle)
        for number, weights in enumerate(adapter.weights):
            if weights.is_directory:
                found.add(file, ("adapters", index, "weights", number, "source"), "an adapter lists its files one "
                          "by one, each with its sha256; a directory source is for the model's weights")
    scaling = model.scaling
    if scaling is not None:
        if scaling.min > scaling.max:
            found.add(file, ("replicas", "min"), f"min {scaling.min} is above max {scaling.max}: the autoscaler "
                                                 f"keeps the count between them; lower min or raise max")
        if scaling.min > 0 and "idle" in data["replicas"]:
            found.add(file, ("replicas", "idle"), "idle is read only when min is 0 (scale to zero): drop it or "
                                                  "set min: 0")
        if model.endpoints:
            found.add(file, ("replicas",), "a model served by endpoints runs no replicas to scale: write no "
                                           "replicas range")
    rollout = data.get("rollout", {})
    if rollout.get("strategy") != "canary" and set(rollout) - {"strategy"}:
        key = next(k for k in ("share", "window", "min_requests", "slo") if k in rollout)
        found.add(file, ("rollout", key), "read only by a canary: add strategy: canary to rollout "
                                          "or drop this key")
    elif model.rollout.canary and model.rollout.max_error_rate is None and model.rollout.max_ttft_p90 is None:
        found.add(file, ("rollout", "strategy"), "a canary needs an SLO to judge it by: add rollout.slo.error_rate "
                                                 "and/or rollout.slo.ttft_p90 (e.g. ttft_p90: 2s)")
    for where, message in adapter_problems(model):
        found.add(file, where, message, of_key=where == ("adapters",))


def check_files(found: Found, file: str, where: tuple[str | int, ...], files: tuple[WeightsFile, ...],
                allow_pickle: bool) -> None:
    """Checks of a list of weights files at `where` (a model's `weights`, an adapter's): pickle formats without
    `allow_pickle` (error), a file without its sha256 (error), a directory source (ending in "/") not on the Hub or
    not pinned to a 40-hex revision (error), hf:// files without a pinned revision (warning)."""
    for index, weights in enumerate(files):
        at = (*where, index, "source")
        if weights.is_directory:
            if not weights.source.startswith("hf://") or weights.revision is None:
                found.add(file, at, "a directory source is a Hugging Face repository directory pinned to a commit: "
                                    "write hf://org/repo@<40-hex revision>/ or hf://org/repo@<40-hex revision>/dir/")
            continue
        if not weights.sha256:
            found.add(file, at, "a weights file needs its sha256 (only a directory source, ending in /, may omit "
                                "it); add sha256: <64 hex digits>")
        if weights.source.endswith(_PICKLE_SUFFIXES) and not allow_pickle:
            found.add(file, at, "weights in a pickle format can run code when loaded; "
                                "use safetensors/GGUF or set allow_pickle: true")
        if weights.source.startswith("hf://") and weights.revision is None:
            found.add(file, at, "pinned by sha256 alone; add @<40-hex revision> after the repository name "
                                "so the source is reproducible", severity="warning")


def build_engines(data: Mapping[str, Any], found: Found, file: str) -> dict[tuple[str, str], EngineVersion]:
    """`engines.yaml` data -> EngineVersion by (engine, version), reporting duplicates and several defaults."""
    result: dict[tuple[str, str], EngineVersion] = {}
    for engine, entries in data.items():
        defaults = 0
        for index, raw in enumerate(entries):
            where = (engine, index, "version")
            key = (engine, raw["version"])
            if key in result:
                found.add(file, where, f"version {raw['version']!r} of {engine} is listed twice")
                continue
            if raw.get("default"):
                defaults += 1
                if defaults > 1:
                    found.add(file, (engine, index, "default"), f"{engine} has several default versions; keep one")
            sdist = raw.get("sdist") or {}
            if engine == "llama.cpp" and not (raw.get("archives") or sdist or raw.get("mirror")):
                found.add(file, where, "a llama.cpp version needs archives, an sdist or a mirror to install from")
            result[key] = EngineVersion(
                engine=engine, version=raw["version"], default=bool(raw.get("default", False)),
                archives=MappingProxyType({p: (a["url"], a["sha256"]) for p, a in raw.get("archives", {}).items()}),
                sdist_package=sdist.get("package"), sdist_version=sdist.get("version"), sdist_sha256=sdist.get("sha256"),
                mirror=raw.get("mirror"), build_args=tuple(raw.get("build_args", ())),
                python_packages=tuple(raw.get("python_packages", ())),
            )
    return result


def build_agent(data: Mapping[str, Any], base: AgentSettings | None = None) -> AgentSettings:
    """Agent data -> AgentSettings; with `base`, keys present override it and labels are merged over its labels."""
    base = base or AgentSettings()
    labels = dict(base.labels)
    labels.update(data.get("labels", {}))
    return AgentSettings(
        weights_dir=data.get("weights_dir", base.weights_dir),
        engines_dir=data.get("engines_dir", base.engines_dir),
        heartbeat_interval=_duration(data, "heartbeat_interval", base.heartbeat_interval),
        telemetry_interval=_duration(data, "telemetry_interval", base.telemetry_interval),
        labels=MappingProxyType(labels),
        ignore_gpus=tuple(data.get("ignore_gpus", base.ignore_gpus)),
        mirrors=tuple(data.get("mirrors", base.mirrors)),
        offline=bool(data.get("offline", base.offline)),
        cpu_cores_reserved=float(data.get("cpu_cores_reserved", base.cpu_cores_reserved)),
        memory_reserved_bytes=parse_size(data["memory_reserved"]) if "memory_reserved" in data else base.memory_reserved_bytes,
        shard_stop_grace=_duration(data, "shard_stop_grace", base.shard_stop_grace),
        fabrics=tuple(data.get("fabrics", base.fabrics)),
        tracing=build_tracing(data.get("tracing", {}), base.tracing),
        build=data.get("build", base.build),
        certificate_renew_fraction=float(data.get("certificate_renew_fraction", base.certificate_renew_fraction)),
    )


def _quota(raw: Mapping[str, Any] | None) -> Quota:
    raw = raw or {}
    return Quota(raw.get("requests_per_minute"), raw.get("tokens_per_minute"), raw.get("tokens_per_day"),
                 raw.get("concurrent_requests"), None if raw.get("budget") is None else float(raw["budget"]))


def build_projects(data: Mapping[str, Any], found: Found, file: str, known_models: set[str] | None
                   ) -> tuple[dict[str, Organisation], dict[str, Team], dict[str, Project]]:
    """`projects.yaml` data -> organisations, teams and projects by name; reports reused names, unknown models.

    `known_models` holds every catalog name and alias; None when some catalog file did not load (then a model
    name cannot be judged unknown, and none is reported).
    """
    orgs: dict[str, Organisation] = {}
    teams: dict[str, Team] = {}
    projects: dict[str, Project] = {}
    for org_name, org in data.get("organisations", {}).items():
        orgs[org_name] = Organisation(org_name, _quota(org.get("quota")))
        for team_name, team in org.get("teams", {}).items():
            team_path = ("organisations", org_name, "teams", team_name)
            if team_name in teams:
                found.add(file, team_path, f"team {team_name!r} is also in organisation {teams[team_name].organisation!r}; "
                                           "team names are unique", of_key=True)
                continue
            teams[team_name] = Team(team_name, org_name, _quota(team.get("quota")))
            for project_name, project in team.get("projects", {}).items():
                path = team_path + ("projects", project_name)
                if project_name in projects:
                    found.add(file, path, f"project {project_name!r} is also in team {projects[project_name].team!r}; "
                                          "project names are unique", of_key=True)
                    continue
                models = tuple(project.get("models", ("*",)))
                for index, model in enumerate(models):
                    if known_models is not None and model != "*" and model not in known_models:
                        found.add(file, path + ("models", index), f"unknown model {model!r}: no catalog file "
                                  "has this name or alias")
                projects[project_name] = Project(project_name, team_name, org_name, tuple(project.get("members", ())),
                                                 models, _quota(project.get("quota")))
    return orgs, teams, projects


def check_names(found: Found, models: Mapping[str, Model]) -> set[str]:
    """Report names, aliases and adapter names used twice across the catalog (they share one namespace: what a
    client writes as `model`); return every name, alias and adapter name."""
    owner: dict[str, str] = {}
    for model in models.values():
        owner[model.name] = f"the name or an alias of model {model.name!r}"
    for model in models.values():
        for index, alias in enumerate(model.aliases):
            if alias in owner:
                found.add(model.source_file, ("aliases", index), f"alias {alias!r} is already {owner[alias]}")
            else:
                owner[alias] = f"the name or an alias of model {model.name!r}"
    for model in models.values():
        for index, adapter in enumerate(model.adapters):
            if adapter.name in owner:
                found.add(model.source_file, ("adapters", index, "name"),
                          f"adapter {adapter.name!r} is already {owner[adapter.name]}; model names, aliases and "
                          "adapter names share one namespace (what clients send as `model`): rename the adapter")
            else:
                owner[adapter.name] = f"an adapter of model {model.name!r}"
    return set(owner)


def build_settings(cluster: ClusterSettings, **parts: Any) -> Settings:
    """Assemble Settings, freezing every mapping."""
    frozen = {k: MappingProxyType(dict(v)) if isinstance(v, dict) else v for k, v in parts.items()}
    return Settings(cluster=cluster, **frozen)
