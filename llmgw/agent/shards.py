"""What a shard is to the supervisor: its launch spec, its reported view, and its record on disk.

A record lives at `<state_dir>/shards/<file name>.json` (mode 0600: the replica key is in the spec's environment)
and holds the spec, the engine's pid and its start time (field 22 of /proc/<pid>/stat). A restarted agent adopts
the engine when a live process has that pid *and* that start time; a pid alone could have been reused.
Shard ids contain "/" ("gemma-0/0"), so file names quote it ("gemma-0%2F0.json").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from urllib.parse import quote, unquote

from llmgw.identity import ShardState

RECORD_VERSION = 1


@dataclass(frozen=True)
class ShardSpec:
    """How to run one engine process.

    `argv` and `env` come from the engine module's `command_line` (the replica key only in `env`); `port` is the
    one already written into `argv`; `host` where the engine listens (health is polled there, "0.0.0.0" and
    "::" polled on loopback); `health_path` the engine's readiness path (200 = ready); `threads` its thread
    count (also exported as OMP_NUM_THREADS). The rest is carried for reporting: `engine` is
    "llama.cpp@b11434", `cpu_cores` cores, `memory_bytes` bytes, `rank` and `group` its place in a replica spread
    over several nodes (echoed in ShardStatus). `health_path` "" for an engine process that serves no HTTP (a rank
    above 0 of a spread vLLM replica, `--headless`): it counts as ready while it runs. `kv_events_port`: the
    loopback port the engine publishes its KV-cache events to (vLLM; the agent's listener binds it), 0 for none:
    the form of agents before IPC sockets, kept for the engines they left running. `kv_events_endpoint`: the IPC
    socket the engine binds for its events ("ipc://...", in the agent's 0700 directory, `llmgw.agent.kv_sockets`;
    the agent's listener connects to it), "" for none.
    `relay_host`/`relay_port`: where this engine's relay listens (`llmgw.engines.relay`, whose process `argv`
    starts, the engine its child: the node's address and the port the shard advertises, the engine itself then
    listening on `host` 127.0.0.1:`port`); `relay_port` 0 for no relay (a headless rank, or a record of an agent
    from before relays: its engine listens on the node's address itself). `key_env`: the name of the variable of
    `env` holding the replica key, which the engine and its relay read.
    """

    shard_id: str
    argv: tuple[str, ...]
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    health_path: str = "/health"
    threads: int = 0
    engine: str = ""
    replica_id: str = ""
    model: str = ""
    fingerprint: str = ""
    settings_commit: str = ""
    devices: tuple[str, ...] = ()
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    grace_seconds: float = 10.0
    rank: int = 0
    group: str = ""
    kv_events_port: int = 0
    kv_events_endpoint: str = ""
    relay_host: str = ""
    relay_port: int = 0
    key_env: str = ""

    @property
    def advertised_port(self) -> int:
        """The port the gateway reaches this shard on: the relay's, else (no relay) the engine's."""
        return self.relay_port or self.port

    def to_json(self) -> dict:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["devices"] = list(self.devices)
        data["env"] = dict(self.env)
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> ShardSpec:
        """Rebuild a spec written by `to_json`; unknown keys (from a newer agent) are ignored."""
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known}
        values["argv"] = tuple(values.get("argv", ()))
        values["devices"] = tuple(values.get("devices", ()))
        values["env"] = dict(values.get("env", {}))
        return cls(**values)


@dataclass(frozen=True)
class ShardView:
    """A shard as reported: `state` its lifecycle (`llmgw.identity.ShardState`; the wire carries `.value`).

    `pid` 0 when no process runs; `error` why it failed (with `last_log_lines` of the engine); `restarts`
    how many times the supervisor restarted it; `adopted` True when this agent found it running from an earlier
    agent; `foreign` True for an engine process llmgw did not start (reported, never killed); `progress` 0..1
    while fetching (None when not measured).
    """

    shard_id: str
    state: ShardState
    spec: ShardSpec | None = None
    pid: int = 0
    restarts: int = 0
    error: str = ""
    last_log_lines: tuple[str, ...] = ()
    adopted: bool = False
    foreign: bool = False
    progress: float | None = None
    progress_text: str = ""

    def with_state(self, state: ShardState, **changes) -> ShardView:
        return replace(self, state=state, **changes)


@dataclass(frozen=True)
class ShardRecord:
    """What survives an agent restart: the spec, the process (pid, start time in clock ticks), restarts so far."""

    spec: ShardSpec
    pid: int
    start_time: int
    restarts: int = 0


def local_url(spec: ShardSpec, path: str) -> str:
    """The URL of `path` on the shard's engine from this node ("http://127.0.0.1:8080/health"): a wildcard listen
    address ("0.0.0.0", "::") is reached on loopback."""
    host = spec.host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{spec.port}{path}"


def record_path(state_dir: Path, shard_id: str) -> Path:
    """Where the record of `shard_id` lives: `<state_dir>/shards/<quoted id>.json`."""
    return state_dir / "shards" / f"{quote(shard_id, safe='')}.json"


def log_path(state_dir: Path, shard_id: str) -> Path:
    """Where the engine of `shard_id` writes its stdout and stderr."""
    return state_dir / "shards" / f"{quote(shard_id, safe='')}.log"


def save_record(state_dir: Path, record: ShardRecord) -> None:
    """Write the record atomically (temporary file, fsync, rename), readable by the owner only."""
    path = record_path(state_dir, record.spec.shard_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": RECORD_VERSION,
        "spec": record.spec.to_json(),
        "pid": record.pid,
        "start_time": record.start_time,
        "restarts": record.restarts,
    }
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def delete_record(state_dir: Path, shard_id: str) -> None:
    """Forget a shard (its record; its log file is kept for inspection)."""
    record_path(state_dir, shard_id).unlink(missing_ok=True)


def parse_record(text: str) -> ShardRecord | None:
    """Parse a record file; None when it is not valid JSON of that shape (a torn or foreign file)."""
    try:
        data = json.loads(text)
        return ShardRecord(
            spec=ShardSpec.from_json(data["spec"]),
            pid=int(data["pid"]),
            start_time=int(data["start_time"]),
            restarts=int(data.get("restarts", 0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


def load_records(state_dir: Path) -> tuple[list[ShardRecord], list[str]]:
    """Every readable record under `<state_dir>/shards`, and a warning per file that could not be read."""
    records: list[ShardRecord] = []
    warnings: list[str] = []
    directory = state_dir / "shards"
    if not directory.is_dir():
        return records, warnings
    for path in sorted(directory.glob("*.json")):
        try:
            record = parse_record(path.read_text())
        except OSError as exc:
            record = None
            warnings.append(f"cannot read shard record {path}: {exc}")
        if record is None:
            warnings.append(f"shard record {path} is not valid; ignoring it ({unquote(path.stem)})")
        else:
            records.append(record)
    return records, warnings


def is_same_process(record: ShardRecord, live_start_time: int | None) -> bool:
    """True when the live process at the record's pid is the one the record names (same start time)."""
    return record.pid > 0 and live_start_time is not None and live_start_time == record.start_time


def next_backoff(current: float, initial: float = 1.0, maximum: float = 60.0) -> float:
    """The delay before the next restart: `initial` first, then doubling, never above `maximum` (seconds)."""
    if current <= 0:
        return initial
    return min(current * 2, maximum)
