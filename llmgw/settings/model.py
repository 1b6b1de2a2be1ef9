"""The typed, immutable settings of one cluster, as loaded from one settings tree or commit.

Every value is normalised: sizes in bytes (int), durations in seconds (float), defaults filled in, so two
`Settings` built from texts that mean the same thing compare equal (`16Gi` == `16384Mi`, `0.90` == `0.9`,
a value written at its default == its absence). Mappings are `types.MappingProxyType` and sequences tuples.

The YAML files and their keys are described in schema/*.json and docs/settings.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from llmgw.identity import Quota, Routing, resolve_model
from llmgw.settings.firewall import FirewallSettings
from llmgw.settings.people import Access, People, access_of
from llmgw.settings.slurm import SlurmSettings

ENGINES = ("llama.cpp", "vllm", "sglang")


def frozen_map(data: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """Return a read-only copy of `data` (empty when None)."""
    return MappingProxyType(dict(data or {}))


@dataclass(frozen=True)
class Listener:
    """An address to listen on. `port` 0 means any free port. `workers` (the gateway's only): how many processes
    serve it, an int >= 1 or "auto" (one per CPU core, resolved where it runs: `llmgw.gateway.worker_count`).
    `drain_timeout` (the gateway's only): seconds the requests in flight get to finish when the gateway stops
    (`llmgw.gateway.draining`)."""

    host: str = "127.0.0.1"
    port: int = 0
    workers: int | str = 1
    drain_timeout: float = 30.0


@dataclass(frozen=True)
class StoreSettings:
    """Where runtime state lives: kind "sqlite" (`path`, relative to the state directory) or "postgresql" (`url`,
    without a password: `password_secret` names the secret holding it).
    `responses_retention`: seconds a response served on /v1/responses is kept for later turns (default 30 days;
    `llmgw.store.responses`). `files_retention`: seconds a file of /v1/files and a batch of /v1/batches are kept
    (default 30 days; `llmgw.store.files`, `llmgw.store.batches`)."""

    kind: str = "sqlite"
    path: str = "llmgw.sqlite3"
    url: str | None = None
    password_secret: str | None = None
    responses_retention: float = 30 * 86400.0
    files_retention: float = 30 * 86400.0


@dataclass(frozen=True)
class Tracing:
    """Where OpenTelemetry traces go (`tracing:` of llmgw.yaml and agents/): `endpoint` is an OTLP/HTTP collector's
    base URL ("http://collector:4318"; None: no traces); `sample_ratio` the share (0..1) of the traces the process
    begins itself that are recorded."""

    endpoint: str | None = None
    sample_ratio: float = 1.0


@dataclass(frozen=True)
class ConsoleOidc:
    """llmgw.yaml `console.oidc`: the OpenID provider the console logs people in through (`issuer`), the console as
    its client (`client_id`, `client_secret`: the NAME of the secret holding it) and the `redirect_uri` registered
    there."""

    issuer: str
    client_id: str
    client_secret: str
    redirect_uri: str


@dataclass(frozen=True)
class ClusterSettings:
    """`llmgw.yaml`: the cluster as a whole.

    Durations in seconds. `gpu_hour_cost` maps a GPU class (or "default") to the cost of one GPU for one hour, and
    "cpu" to one CPU core's, in `currency`; it prices Slurm jobs (llmgw.control.slurm_usage) and replicas'
    GPU-hours and core-hours per project (llmgw.store.gpu_hours); a model's requests are priced by its own `prices`.
    `store` is the runtime store the control plane opens (`llmgw server --store URL` overrides it).
    `cordoned`: node ids that get no new replica; `drained`: node ids whose replicas are placed elsewhere first,
    then stopped (`llmgw node cordon|uncordon|drain`), both sorted. `max_inlet_celsius` (`serving.max_inlet_celsius`,
    degrees C; None: no limit): a node whose board inlet reads above it gets no new replica (llmgw.plan.cordons).
    `control_planes`: every control plane's agents address ("host:port"), told to every agent (which connects to
    each: see docs/ha.md); empty with one control plane.
    `max_surge`: per model, how many replaced replicas may run their new shard beside the old one at once.
    `forecast_check_after` (`reconcile.forecast_check_after`): how long after a reviewed change with a forecast
    converged its load is measured and the forecast's error audited (llmgw.control.forecast_audit).
    `tracing`: the control plane's traces; `trace_requests` the share (0..1) of the gateway's requests traced
    (`llmgw server --otlp-endpoint` / `--trace-requests` override both).
    `max_file_bytes`: the largest upload on /v1/files; `batch_slot_share`: the share of a replica's slots that
    requests of /v1/batches may take (`llmgw.gateway.batch_room`).
    `kv_blocks_per_replica`: the most prefix-cache block hashes kept per vLLM replica (llmgw.control.kv_blocks).
    `trusted_release_keys`: `releases.trusted_keys`, the key lines of the minisign public keys whose releases nodes
    may install (llmgw.release.verify_release takes them), in file order without repeats.
    `console_oidc`: `console.oidc`, the console's OpenID Connect login (None: none).
    """

    name: str
    gateway: Listener = Listener(port=8080)
    admin: Listener = Listener(port=8081)
    agents: Listener = Listener(port=8082)
    store: StoreSettings = StoreSettings()
    poll_interval: float = 2.0
    reconcile_interval: float = 10.0
    node_lost_after: float = 30.0
    action_timeout: float = 600.0
    max_surge: int = 1
    forecast_check_after: float = 3600.0
    serving_stopped: bool = False
    allow_empty: bool = False
    cordoned: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    max_inlet_celsius: float | None = None
    currency: str = "USD"
    gpu_hour_cost: Mapping[str, float] = field(default_factory=frozen_map)
    max_request_body_bytes: int = 10 * 1024 * 1024
    max_file_bytes: int = 100 * 1024 * 1024
    batch_slot_share: float = 0.5
    kv_blocks_per_replica: int = 1_000_000
    control_planes: tuple[str, ...] = ()
    tracing: Tracing = Tracing()
    trace_requests: float = 0.0
    trusted_release_keys: tuple[str, ...] = ()
    console_oidc: ConsoleOidc | None = None


@dataclass(frozen=True)
class WeightsFile:
    """One file of a model's weights.

    `source` is `hf://org/repo[@<40-hex revision>]/path`, `https://...` or `file://...`; `sha256` is the
    hex digest of the file's content; `revision` is the pinned revision of an hf:// source (None if unpinned).
    A source ending in "/" (`is_directory`, `hf://org/repo@<revision>/[dir/]`) names every file under that directory
    of the repository, each checked against the sha256 the Hub publishes; its `sha256` is then the digest of the
    whole set, or "" when the operator gives none (docs/engines.md, `llmgw.agent.weights_tree`). `size_bytes` the
    file's size as the operator wrote it (None: not given), what a CPU replica's speed is estimated from.
    """

    source: str
    sha256: str
    revision: str | None = None
    secret: str | None = None
    size_bytes: int | None = None

    @property
    def is_directory(self) -> bool:
        """Whether the source names a repository directory (it ends in "/")."""
        return self.source.endswith("/")

    @property
    def filename(self) -> str:
        """The last path component of the source ("gemma-3-270m-q4_k_m.gguf")."""
        return self.source.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Resources:
    """What one replica needs.

    GPU replicas: `gpus` devices of `gpu_class` (e.g. "h100-80g", "a100-80g-mig-3g.40gb"), each with at least
    `gpu_memory_bytes` free when set; `tensor_parallel` * `pipeline_parallel` == `gpus`. CPU replicas: `gpus` 0,
    `cpu_cores` (may be fractional) and `memory_bytes` reserved on the node.
    """

    gpus: int = 0
    gpu_class: str | None = None
    gpu_memory_bytes: int | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    cpu_cores: float = 1.0
    memory_bytes: int | None = None


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server run outside llmgw: base `url` (ending before `/v1`) and the secret holding its key."""

    url: str
    secret: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter served on top of a model's weights: `name` is what clients ask for (in the namespace of model
    names and aliases), `weights` its files (one GGUF LoRA for llama.cpp; a PEFT adapter's `adapter_config.json`
    and `adapter_model.safetensors` for vLLM), each pinned by sha256."""

    name: str
    weights: tuple[WeightsFile, ...]


@dataclass(frozen=True)
class Prices:
    """Price of a model's tokens in the cluster's currency per million tokens (None: free); the batch prices are
    those of a request run as a line of /v1/batches (None: the model's own price)."""

    prompt_per_million: float | None = None
    completion_per_million: float | None = None
    batch_prompt_per_million: float | None = None
    batch_completion_per_million: float | None = None


@dataclass(frozen=True)
class Rollout:
    """A model's `rollout:`: how a change that restarts its replicas reaches them.

    `strategy`: "rolling" (each replica's new generation beside its old one, `reconcile.max_surge` at once) or
    "canary": one replica of the new revision takes `share` (0 < share <= 1) of the model's requests for `window`
    seconds from when it is ready; it holds when, over at least `min_requests` requests, the share answered with a
    status of 500 or above is at most `max_error_rate` (None: not checked) and the 90th percentile of time to
    first token is at most `max_ttft_p90` seconds (None: not checked). Judged by `llmgw.plan.canary`.
    """

    strategy: str = "rolling"
    share: float = 0.1
    window: float = 600.0
    min_requests: int = 10
    max_error_rate: float | None = None
    max_ttft_p90: float | None = None

    @property
    def canary(self) -> bool:
        return self.strategy == "canary"


@dataclass(frozen=True)
class Scaling:
    """A model's `replicas: {min, max, ...}`: the range the autoscaler keeps its replica count in, and its targets.

    `min` / `max` replicas (0 <= min <= max, max >= 1). Targets: `queue_per_replica` (requests running and waiting
    on the model's engines plus those the gateway holds, per ready replica) and `kv_cache_usage` (0..1, the mean over
    ready replicas); `ttft_p90` (seconds; None: no such target): the 90th percentile of the time to first token of the
    model's requests, as the gateway measured them over the last `TTFT_SPAN` seconds (`llmgw.plan.autoscaling`).
    `scale_up_window` (seconds): the window in which the wishes must be above the count for three quarters of
    the time before it grows; `scale_down_window` (seconds): how long every wish must be below it before it shrinks;
    `cooldown` (seconds): the least time between two changes; `idle` (seconds): with `min` 0, how long without any
    request before the last replica stops. Judged by `llmgw.plan.autoscaling`.
    """

    min: int
    max: int
    queue_per_replica: float = 4.0
    kv_cache_usage: float = 0.8
    ttft_p90: float | None = None
    scale_up_window: float = 30.0
    scale_down_window: float = 300.0
    cooldown: float = 60.0
    idle: float = 600.0


@dataclass(frozen=True)
class Model:
    """`catalog/<name>.yaml`: one model and how to run it.

    `engine` is one of ENGINES; `engine_version` names a version from engines.yaml (None: that engine's
    default). `replicas` is how many copies run; 0 places none. `endpoints` non-empty means llmgw runs no
    engine for it and routes to those servers instead. `node_selector` must match a node's labels.
    `engine_args` are passed to the engine's command line after llmgw's own arguments. `routing` is the gateway's
    policy for choosing among its replicas (`llmgw.identity.Routing`). `rerank`: the model reranks; the gateway
    serves it on `/v1/rerank` (and `/v1/score` on vLLM); a llama.cpp model needs `--reranking` in `engine_args`.
    `rollout`: how a change that restarts its replicas is rolled out (`Rollout`; not part of the fingerprint).
    `scaling`: the range and targets of an autoscaled model (`replicas: {min, max}`; None: a fixed count); then
    `replicas` is its `min`, and the count in force is the control plane's runtime state (`llmgw.plan.autoscaling`).
    """

    name: str
    engine: str
    weights: tuple[WeightsFile, ...] = ()
    engine_version: str | None = None
    replicas: int = 1
    resources: Resources = Resources()
    context_size: int | None = None
    engine_args: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    adapters: tuple[Adapter, ...] = ()
    allow_pickle: bool = False
    endpoints: tuple[Endpoint, ...] = ()
    prices: Prices = Prices()
    node_selector: Mapping[str, str] = field(default_factory=frozen_map)
    routing: Routing = Routing.PREFIX
    rerank: bool = False
    rollout: Rollout = Rollout()
    scaling: Scaling | None = None
    source_file: str = field(default="", compare=False)


@dataclass(frozen=True)
class EngineVersion:
    """One version of an engine from `engines.yaml`.

    llama.cpp: `archives` maps a platform ("linux-x86_64", "linux-aarch64") to (url, sha256); `sdist` is the PyPI
    sdist carrying the source tree (package, version, sha256) to build from; `mirror` a local directory holding
    archives. vLLM / SGLang: `python_packages` are pip requirement strings installed into the engine's own venv.
    """

    engine: str
    version: str
    default: bool = False
    archives: Mapping[str, tuple[str, str]] = field(default_factory=frozen_map)
    sdist_package: str | None = None
    sdist_version: str | None = None
    sdist_sha256: str | None = None
    mirror: str | None = None
    build_args: tuple[str, ...] = ()
    python_packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentSettings:
    """`agents/default.yaml`, with `agents/nodes/<node>.yaml` applied on top for one node.

    Directories are absolute or relative to the agent's state directory. Durations in seconds.
    `ignore_gpus` lists GPU indices or UUIDs the agent must leave alone. `mirrors` are directories searched
    for weights by sha256 before any download; `offline`: the node installs engines and weights from them only,
    never from the network (an imported offline bundle, `llmgw bundle import`). `tracing`: the node's spans of replica starts and engine
    installs (`llmgw agent --otlp-endpoint` overrides the endpoint). `build`: which build of the Python engines
    the node installs (`llmgw.engines.builds`; "auto" decides from its GPUs and driver).
    `certificate_renew_fraction`: the share of its node certificate's lifetime after which the agent renews it over
    its stream (`llmgw.agent.renewal`).
    """

    weights_dir: str = "weights"
    engines_dir: str = "engines"
    heartbeat_interval: float = 5.0
    telemetry_interval: float = 10.0
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    ignore_gpus: tuple[str, ...] = ()
    mirrors: tuple[str, ...] = ()
    offline: bool = False
    cpu_cores_reserved: float = 0.0
    memory_reserved_bytes: int = 0
    shard_stop_grace: float = 10.0
    fabrics: tuple[str, ...] = ()
    tracing: Tracing = Tracing()
    build: str = "auto"
    certificate_renew_fraction: float = 0.6667


@dataclass(frozen=True)
class Organisation:
    name: str
    quota: Quota = Quota()


@dataclass(frozen=True)
class Team:
    name: str
    organisation: str
    quota: Quota = Quota()


@dataclass(frozen=True)
class Project:
    """A project of `projects.yaml`: API keys belong to projects.

    `models` lists catalog names or aliases the project may use; `("*",)` allows every model.
    """

    name: str
    team: str
    organisation: str
    members: tuple[str, ...] = ()
    models: tuple[str, ...] = ("*",)
    quota: Quota = Quota()


@dataclass(frozen=True)
class Settings:
    """One whole settings tree.

    `models` by name; `engines` by (engine, version); `node_overrides` maps a node id to the raw (validated)
    mapping of `agents/nodes/<node>.yaml`, applied with `agent_settings_for`. `firewall` is the
    typed `firewall.yaml` (llmgw.settings.firewall), `slurm` the typed `slurm.yaml` (llmgw.settings.slurm). `commit` is the
    settings commit id it was loaded from (None for a
    directory).
    """

    cluster: ClusterSettings
    models: Mapping[str, Model] = field(default_factory=frozen_map)
    engines: Mapping[tuple[str, str], EngineVersion] = field(default_factory=frozen_map)
    agent_defaults: AgentSettings = AgentSettings()
    node_agents: Mapping[str, AgentSettings] = field(default_factory=frozen_map)
    organisations: Mapping[str, Organisation] = field(default_factory=frozen_map)
    teams: Mapping[str, Team] = field(default_factory=frozen_map)
    projects: Mapping[str, Project] = field(default_factory=frozen_map)
    firewall: FirewallSettings = FirewallSettings()
    slurm: SlurmSettings = SlurmSettings()
    people: People = People()
    commit: str | None = field(default=None, compare=False)
    # Added by the settings loader: warnings found while loading (e.g. weights pinned by sha256 alone), as
    # llmgw.errors.Issue with severity "warning". Not part of the settings' meaning, so not compared.
    warnings: tuple[Any, ...] = field(default=(), compare=False)

    def access_of(self, email: str) -> Access:
        """What the person `email` may do under these settings (projects.yaml `people` and project `members`;
        `llmgw.settings.people`)."""
        return access_of(email, self.people, self.projects)

    def quota_scopes(self, project: str) -> tuple[tuple[str, Quota], ...]:
        """The quota scopes a request of `project` must fit, narrowest first, as the gateway enforces them
        (`llmgw.routes.ProjectPolicy.quotas`): ("project:<name>", its quota), ("team:<name>", ...),
        ("org:<name>", ...); a team or organisation projects.yaml does not define, and a scope without any limit,
        are left out. () for a project these settings lack."""
        found = self.projects.get(project)
        if found is None:
            return ()
        scopes = [(f"project:{found.name}", found.quota)]
        if (team := self.teams.get(found.team)) is not None:
            scopes.append((f"team:{team.name}", team.quota))
        if (organisation := self.organisations.get(found.organisation)) is not None:
            scopes.append((f"org:{organisation.name}", organisation.quota))
        return tuple((key, quota) for key, quota in scopes if quota != Quota())

    def agent_settings_for(self, node_id: str) -> AgentSettings:
        """The agent settings of `node_id`: its override file merged over the defaults, or the defaults."""
        return self.node_agents.get(node_id, self.agent_defaults)

    def resolve_model(self, name: str) -> Model | None:
        """The model called `name` or having `name` as an alias; None when there is none.

        `llmgw.identity.resolve_model` over the catalog (the same resolution as the gateway's)."""
        return resolve_model(self.models, name)

    def engine_version(self, engine: str, version: str | None) -> EngineVersion | None:
        """The engines.yaml entry for `engine` at `version` (None: the engine's default); None when absent."""
        if version is not None:
            return self.engines.get((engine, version))
        for entry in self.engines.values():
            if entry.engine == engine and entry.default:
                return entry
        return None
