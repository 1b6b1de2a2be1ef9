"""The agent's configuration: where it keeps state, weights and engines, and how often it reports.

Defaults follow DESIGN.md: node id = host name; state under `$LLMGW_STATE` or `~/.local/state/llmgw/agent`;
weights and engines below the state directory unless set. The control plane may change most of it at run time
with AgentSettings (see `AgentConfig.with_settings`).
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from google.protobuf.message import DecodeError

from llmgw.engines import installed_binary
from llmgw.engines.python_env import PYTHON_ENGINES, installed_python, installed_versions
from llmgw.errors import UsageError
from llmgw.identity import engine_key
from llmgw.install.journal import JOURNAL_PATH
from llmgw.wire import pb

SETTINGS_FILE = "agent-settings.pb"
ENGINE_BINARIES_FILE = "engine-binaries.json"
"""Under the state directory: the `engine_binaries` the agent was last started with (`save_engine_binaries`)."""
OFFLINE_FILE = "offline-mirror.json"
"""Under the state directory: the mirrors an agent started with `offline` installs from only (`save_offline_record`)."""


def default_state_dir() -> Path:
    """`$LLMGW_STATE/agent` or `~/.local/state/llmgw/agent`."""
    base = os.environ.get("LLMGW_STATE")
    return Path(base) / "agent" if base else Path.home() / ".local" / "state" / "llmgw" / "agent"


@dataclass(frozen=True)
class AgentConfig:
    """Everything `run_agent` needs.

    `node_id` defaults to the host name. `state_dir` holds shard records and engine logs; `weights_dir`
    (default `<state_dir>/weights`) the content-addressed weights cache; `engines_dir` (default
    `<state_dir>/engines`) installed engines; `cache_dir` downloads and builds (None: the engines' default,
    `$LLMGW_CACHE` or `~/.cache/llmgw`). `mirrors` are offline weights (and engine) mirror directories searched
    first; `offline` (`llmgw agent --offline`) or `settings_offline` (agents/ `offline: true`): engines and weights
    come from them only, never from the network (`offline_only`; an imported bundle, `llmgw bundle import`; recorded
    for `llmgw node doctor` by `save_offline_record`). `heartbeat_interval` in seconds between heartbeats; `telemetry_interval` seconds between readings (GPU
    telemetry, node CPU and memory, each shard's cores and memory): a heartbeat carries the latest reading.
    `ignore_gpus` lists GPUs the agent leaves alone (index, card UUID or MIG UUID; see `llmgw.agent.ignoring`).
    `address` is this node's address as the gateway should reach its
    engines ("" = 127.0.0.1); engines listen on 127.0.0.1 only, and each one's relay (`llmgw.engines.relay`, which
    checks the replica key on every request) on `engine_host` ("" = `address` or 127.0.0.1).
    `engine_binaries` maps "engine@version" (e.g. "llama.cpp@b11434") to an executable used instead of an
    install (a cached build, or a stand-in in tests); those count as installed. `shard_stop_grace` seconds
    between SIGTERM and SIGKILL. `shard_drain_timeout` seconds a ready shard told to stop gets to finish its
    requests in flight before the SIGTERM when the StopShard names none (`llmgw.agent.draining`; 0: no drain). `restart_backoff_initial`/`_max` seconds bound engine restarts,
    `reconnect_backoff_max` seconds the longest wait between connection attempts to one control plane (small, so
    that a control plane started again has its fleet back within seconds; see `llmgw.agent.runtime`). `stop_shards_on_exit` stops every
    engine when `run_agent` ends (default: leave them running, to be adopted by the next agent).
    `engine_check_interval` seconds between re-verifications of installed engines (`llmgw.agent.engine_checks`).
    `control_planes`: the control planes' agents addresses ("host:port") the agent connects to (`llmgw agent
    --control-plane`, and those the settings name, added by AgentSettings: see `run_agent`'s `connect_to`).
    `otlp_endpoint`: an OTLP/HTTP collector ("http://host:4318") receiving the traces of shard starts and engine
    installs (`llmgw.agent.tracing`; None: off), from the command line: it overrides `settings_otlp_endpoint`,
    the endpoint of agents/ `tracing:` (AgentSettings; "" none). `trace_sample_ratio` (0..1): the share of the
    traces the agent begins itself that are recorded (agents/ `tracing.sample_ratio`). `build`: agents/ `build`
    (auto, cu13, cu129, cpu, none), which build of vLLM and SGLang the agent installs (`llmgw.engines.builds`).
    `tls_dir`: the directory of the node's certificate (`ca.crt`, `node.crt`, `node.key`) when the agent connects
    with mutual TLS (None: it does not, and renews nothing); `certificate_renew_fraction`: the share of that
    certificate's lifetime after which it is renewed over the stream (agents/ `certificate_renew_fraction`;
    `llmgw.agent.renewal`).
    `fixed_dirs`: of "weights_dir" and "engines_dir", those given on the command line (`llmgw agent --weights-dir`,
    `--engines-dir`, as the systemd unit does), which the settings' directories do not replace.
    `bandwidth_probe_seconds`: how long each phase (one core, all cores) of the node's memory-bandwidth probe runs,
    once per boot, its figures carried by every heartbeat (`llmgw.agent.bandwidth`; 0: no probe, as in the tests'
    agents; `llmgw agent` and `llmgw up` run it for 0.25 s). `slurm_users_prefix` and `slurm_programs` are the Slurm keeper's (`llmgw.agent.slurm`):
    shadow's `--prefix` for the Linux users of `users: llmgw` ("": the machine's own /etc/passwd) and executables used
    instead of munged, slurmd, scontrol... found on PATH (stand-ins, in tests); `slurm_check_interval` the seconds
    between the keeper's reads of the node in Slurm (state, drain, running job steps, ended jobs; default
    `llmgw.agent.slurm.CHECK_INTERVAL`, 10 s): how long a job's start or end may take to reach the control plane.
    `training_python`: the training venv's interpreter (`llmgw.training.environment`; None: the one installed under
    `engines_dir`, else under `<cache_dir>/engines`); `training_threads`: torch's threads in a training process
    (its `OMP_NUM_THREADS`; 2, as `llmgw.training.running.TRAINING_THREADS`).
    """

    node_id: str = field(default_factory=socket.gethostname)
    state_dir: Path = field(default_factory=default_state_dir)
    weights_dir: Path | None = None
    engines_dir: Path | None = None
    cache_dir: Path | None = None
    mirrors: tuple[str, ...] = ()
    offline: bool = False
    settings_offline: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    heartbeat_interval: float = 5.0
    telemetry_interval: float = 10.0
    ignore_gpus: tuple[str, ...] = ()
    address: str = ""
    engine_host: str = ""
    engine_binaries: Mapping[str, Path] = field(default_factory=dict)
    shard_stop_grace: float = 10.0
    shard_drain_timeout: float = 30.0
    restart_backoff_initial: float = 1.0
    restart_backoff_max: float = 60.0
    reconnect_backoff_max: float = 5.0
    stop_shards_on_exit: bool = False
    engine_check_interval: float = 600.0
    control_planes: tuple[str, ...] = ()
    otlp_endpoint: str | None = None
    settings_otlp_endpoint: str = ""
    trace_sample_ratio: float = 1.0
    build: str = "auto"
    tls_dir: Path | None = None
    certificate_renew_fraction: float = 0.6667
    bandwidth_probe_seconds: float = 0.0
    fixed_dirs: frozenset[str] = frozenset()
    slurm_users_prefix: str = ""
    slurm_programs: Mapping[str, str] = field(default_factory=dict)
    slurm_check_interval: float = 10.0
    install_journal: Path = JOURNAL_PATH  # the host's install journal, what WipeNode undoes (llmgw.agent.wiping)
    training_python: Path | None = None
    training_threads: int = 2

    @property
    def trace_target(self) -> tuple[str, float] | None:
        """(OTLP endpoint, sample ratio) the agent's spans go to: the command line's endpoint, else the settings';
        None when neither names one (tracing off)."""
        endpoint = self.otlp_endpoint or self.settings_otlp_endpoint
        return (endpoint, self.trace_sample_ratio) if endpoint else None

    @property
    def offline_only(self) -> bool:
        """Engines and weights from the mirrors only: the command line's --offline, or agents/ `offline: true`."""
        return self.offline or self.settings_offline

    @property
    def weights_path(self) -> Path:
        return Path(self.weights_dir) if self.weights_dir else Path(self.state_dir) / "weights"

    @property
    def engines_path(self) -> Path:
        return Path(self.engines_dir) if self.engines_dir else Path(self.state_dir) / "engines"

    @property
    def listen_host(self) -> str:
        """Where the engines' relays listen (the engines themselves: 127.0.0.1)."""
        return self.engine_host or self.address or "127.0.0.1"

    def with_settings(self, settings) -> AgentConfig:
        """A copy changed by a pb AgentSettings: only the fields it sets (non-empty, non-zero) change, but for
        `ignore_gpus`, which the message always states whole (empty: no GPU is ignored).

        Relative directories are taken below `state_dir` (agents/default.yaml: "Directories are absolute or
        relative to the agent's state directory"), never below the agent's working directory. A directory named in
        `fixed_dirs` (given on the agent's command line) is kept: the command line wins, as for the OTLP endpoint.
        """
        changes: dict = {}
        if settings.weights_dir and "weights_dir" not in self.fixed_dirs:
            changes["weights_dir"] = Path(self.state_dir) / settings.weights_dir  # a relative dir is under state_dir
        if settings.engines_dir and "engines_dir" not in self.fixed_dirs:
            changes["engines_dir"] = Path(self.state_dir) / settings.engines_dir
        if settings.heartbeat_interval > 0:
            changes["heartbeat_interval"] = bounded_interval(settings.heartbeat_interval)
        if settings.telemetry_interval > 0:
            changes["telemetry_interval"] = bounded_interval(settings.telemetry_interval)
        changes["ignore_gpus"] = tuple(settings.ignore_gpus)
        if settings.labels:
            changes["labels"] = dict(settings.labels)
        if settings.mirrors:
            changes["mirrors"] = tuple(settings.mirrors)
        changes["settings_offline"] = settings.offline  # stated whole (false from an older control plane)
        if settings.shard_stop_grace > 0:
            changes["shard_stop_grace"] = bounded_interval(settings.shard_stop_grace)
        if settings.HasField("tracing"):  # stated whole by the control plane (an empty endpoint: off)
            ratio = settings.tracing.sample_ratio
            changes["settings_otlp_endpoint"] = settings.tracing.endpoint
            changes["trace_sample_ratio"] = 1.0 if math.isnan(ratio) else min(max(ratio, 0.0), 1.0)
        changes["build"] = settings.build or "auto"  # stated whole; "" from an older control plane
        if 0.1 < settings.certificate_renew_fraction <= 0.95:  # 0 from an older control plane: kept as it was
            changes["certificate_renew_fraction"] = settings.certificate_renew_fraction
        if settings.control_planes:  # added to those the agent was started with, never removing one
            changes["control_planes"] = tuple(dict.fromkeys([*self.control_planes, *settings.control_planes]))
        return replace(self, **changes)


MIN_INTERVAL = 0.05  # seconds: a heartbeat or reading interval, or a stop grace, of the wire is at least this
MAX_INTERVAL = 86400.0  # seconds: and at most a day (NaN and infinity too)


def bounded_interval(seconds: float) -> float:
    """`seconds` from the wire held between MIN_INTERVAL and MAX_INTERVAL: a bad message (a tiny heartbeat interval
    would flood the stream, NaN would stop the timer) cannot make the agent spin or stall."""
    if math.isnan(seconds):
        return MAX_INTERVAL
    return min(max(float(seconds), MIN_INTERVAL), MAX_INTERVAL)


def engine_binary(config: AgentConfig, engine: str, version: str) -> Path | None:
    """The executable for `engine`@`version`: an `engine_binaries` override, else a verified install, else None."""
    override = config.engine_binaries.get(engine_key(engine, version))
    if override is not None:
        return Path(override)
    if engine == "llama.cpp":
        return installed_binary(config.engines_path, version)
    if engine in PYTHON_ENGINES:
        return installed_python(config.engines_path, engine, version)
    return None


def installed_engines(config: AgentConfig) -> list[str]:
    """"engine@version" keys this node can run now: the overrides plus verified llama.cpp installs and Python
    engine environments (vLLM, SGLang), sorted."""
    keys = set(config.engine_binaries)
    root = config.engines_path / "llama.cpp"
    if root.is_dir():
        for home in root.iterdir():
            if not home.name.startswith(".") and installed_binary(config.engines_path, home.name) is not None:
                keys.add(engine_key("llama.cpp", home.name))
    for engine in PYTHON_ENGINES:
        keys.update(engine_key(engine, version) for version in installed_versions(config.engines_path, engine))
    return sorted(keys)


def save_agent_settings(state_dir: Path, settings: pb.AgentSettings) -> Path:
    """Keep the control plane's last AgentSettings in `<state_dir>/agent-settings.pb` (protobuf bytes, written to a
    temporary file and renamed, so a crash leaves the old or the new one), for the next agent to apply at start.
    Blocking (one small write). Returns the file's path. Raises OSError when the state directory is not writable."""
    path = Path(state_dir) / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(SETTINGS_FILE + ".tmp")
    tmp.write_bytes(settings.SerializeToString())
    tmp.replace(path)
    return path


def load_agent_settings(state_dir: Path) -> pb.AgentSettings | None:
    """The AgentSettings saved by `save_agent_settings`, or None when there are none yet.

    Raises UsageError naming the file when it cannot be read or parsed (the caller logs it and goes on with its
    own configuration; the control plane sends the settings again when the agent registers)."""
    path = Path(state_dir) / SETTINGS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the saved agent settings {path}: {exc}") from exc
    settings = pb.AgentSettings()
    try:
        settings.ParseFromString(data)
    except DecodeError as exc:
        raise UsageError(f"the saved agent settings {path} are damaged ({exc}); delete the file, the control "
                         "plane sends them again") from exc
    return settings


def save_engine_binaries(state_dir: Path, binaries: Mapping[str, Path]) -> Path:
    """Record the `engine_binaries` an agent starts with in `<state_dir>/engine-binaries.json` (a JSON object,
    "engine@version" to an absolute path; the file is removed when there are none), so that `llmgw node doctor`
    reports the engines this agent runs that live outside its engines directory (`llmgw up`'s cached llama-server,
    `llmgw agent --engine-binary`). Blocking (one small write, renamed into place). Returns the file's path.
    Raises OSError when the state directory is not writable."""
    path = Path(state_dir) / ENGINE_BINARIES_FILE
    if not binaries:
        path.unlink(missing_ok=True)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(ENGINE_BINARIES_FILE + ".tmp")
    tmp.write_text(json.dumps({key: str(Path(value).absolute()) for key, value in sorted(binaries.items())},
                              indent=2) + "\n")
    tmp.replace(path)
    return path


def save_offline_record(state_dir: Path, mirrors: Sequence[str] | None) -> Path:
    """Record in `<state_dir>/offline-mirror.json` that this node installs from `mirrors` only (`{"mirrors": [...]}`;
    None: it does not, and the file is removed), for `llmgw node doctor`. Blocking. Returns the file's path."""
    path = Path(state_dir) / OFFLINE_FILE
    if mirrors is None:
        path.unlink(missing_ok=True)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(OFFLINE_FILE + ".tmp")
    tmp.write_text(json.dumps({"mirrors": [str(Path(m).absolute()) for m in mirrors]}, indent=2) + "\n")
    tmp.replace(path)
    return path


def load_offline_record(state_dir: Path) -> list[Path] | None:
    """The mirrors `save_offline_record` recorded, or None when the node is not offline (no file, or not readable
    as that record)."""
    try:
        return [Path(m) for m in json.loads((Path(state_dir) / OFFLINE_FILE).read_text())["mirrors"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_engine_binaries(state_dir: Path) -> dict[str, Path]:
    """The `engine_binaries` recorded by `save_engine_binaries`; {} when none were (no file).

    Raises UsageError naming the file when it cannot be read or is not such a JSON object."""
    path = Path(state_dir) / ENGINE_BINARIES_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path} ({exc}): the agent writes it again when it starts") from exc
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise UsageError(f"{path} is not a JSON object of engine@version to a path: the agent writes it again "
                         "when it starts")
    return {key: Path(value) for key, value in doc.items()}
