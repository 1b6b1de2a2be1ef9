"""The supervisor: runs each shard's engine as its own process group, watches it, restarts it, adopts it.

Each engine gets its own session and process group (`start_new_session`), port, environment and thread count;
its stdout and stderr go to `<state_dir>/shards/<id>.log`, followed into a 2,000-line ring. Readiness is the
engine's health path answering 200. An unexpected exit is reported (state "failed", the exit status and the last
log lines), what is left of its process group is killed (an engine's own children, such as vLLM's EngineCore,
would hold memory, and its KV-event connection, beside the restarted engine) and it is restarted after 1 s,
doubling to 60 s (reset once the engine was ready for `stable_after` seconds).
Stop sends SIGTERM to the group, then SIGKILL after the grace period. Leaving the supervisor's `async with`
leaves engines running: a restarted agent adopts them from their records (pid and start time must match).
A shard whose engine runs behind its relay (`llmgw.engines.relay`) has the relay as its process, the engine as the
relay's child in the same group: all of the above holds for both.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import trio

from llmgw.agent import procfs
from llmgw.agent.logs import LogRing, open_log_file, tail_into
from llmgw.agent.shards import (
    ShardRecord, ShardSpec, ShardView, delete_record, is_same_process, load_records, local_url, log_path,
    next_backoff, save_record,
)
from llmgw.errors import EngineError, UsageError
from llmgw.identity import ShardState

log = logging.getLogger("llmgw.agent.supervisor")

# Environment names never passed from the agent to an engine (secrets of the agent's own).
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "CREDENTIAL")
# Process names of engines, to report engine processes llmgw did not start.
ENGINE_PROCESS_MARKERS = ("llama-server", "vllm.entrypoints", "vllm serve", "sglang.launch_server")
FAILED_LOG_LINES = 20


@dataclass(frozen=True)
class ForeignEngine:
    """An engine process running on this node that no shard of this agent owns."""

    pid: int
    argv: tuple[str, ...]


def find_foreign_engines(
    stats: list[procfs.ProcStat], cmdlines: dict[int, list[str]], managed_groups: set[int], own_pid: int
) -> list[ForeignEngine]:
    """Pure: the engine processes among `stats` outside `managed_groups`, one per process group, by pid.

    An engine is a process whose argv[0] is named llama-server, or whose command line runs vLLM's or SGLang's
    server (`cmdlines` maps pid to argv; a pid without an entry is not an engine).
    """
    found: dict[int, ForeignEngine] = {}
    for stat in sorted(stats, key=lambda s: s.pid):
        if stat.pgrp in managed_groups or stat.pid == own_pid or stat.pgrp in found:
            continue
        argv = cmdlines.get(stat.pid, [])
        line = " ".join(argv)
        if argv and (os.path.basename(argv[0]) == "llama-server" or any(m in line for m in ENGINE_PROCESS_MARKERS[1:])):
            found[stat.pgrp] = ForeignEngine(stat.pid, tuple(argv))
    return list(found.values())


def engine_environment(spec: ShardSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: the agent's own minus secret-looking names, then `spec.env`, OMP_NUM_THREADS."""
    source = dict(os.environ if base is None else base)
    env = {k: v for k, v in source.items() if not any(m in k.upper() for m in _SECRET_MARKERS)}
    if spec.threads:
        env["OMP_NUM_THREADS"] = str(spec.threads)
    env.update(spec.env)
    return env


def pick_free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    """A TCP port nothing listens on at `host` now (the kernel's choice), not in `avoid`."""
    for _ in range(20):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host if host not in ("0.0.0.0", "::") else "", 0))
            port = probe.getsockname()[1]
        if not avoid or port not in avoid:
            return port
    raise EngineError(f"no free TCP port found on {host}; free some ports and retry")


class _Shard:
    """The supervisor's mutable bookkeeping for one shard (owned by the supervisor's trio tasks only)."""

    def __init__(self, spec: ShardSpec, ring: LogRing):
        self.spec = spec
        self.ring = ring
        self.view = ShardView(shard_id=spec.shard_id, state=ShardState.STARTING, spec=spec)
        self.process: trio.Process | None = None
        self.pid = 0
        self.start_time = 0
        self.stopping = False
        self.stop_under_way: trio.Event | None = None  # set once the stop under way ended (or was cancelled)
        self.scope = trio.CancelScope()
        self.exited = trio.Event()
        self.ready_since = math.inf


class Supervisor:
    """Runs engines for shards. Use as `async with Supervisor(state_dir) as supervisor:`, then `await adopt()`.

    `on_change(view)` is called (synchronously, from a trio task) whenever a shard's state changes.
    `backoff_initial`/`backoff_max` seconds bound the restart delay; `health_interval` seconds between readiness
    polls while starting; `ready_check_interval` seconds between checks once ready (a failing check turns the
    shard back to "starting" with the reason; the process is left alone).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        on_change: Callable[[ShardView], None] | None = None,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        health_interval: float = 0.5,
        ready_check_interval: float = 15.0,
        stable_after: float = 60.0,
        ring_lines: int = 2000,
    ):
        self.state_dir = Path(state_dir)
        self.on_change = on_change
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.health_interval = health_interval
        self.ready_check_interval = ready_check_interval
        self.stable_after = stable_after
        self.ring_lines = ring_lines
        self.warnings: list[str] = []
        self._shards: dict[str, _Shard] = {}
        self._nursery: trio.Nursery | None = None
        self._nursery_manager = None
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Supervisor:
        (self.state_dir / "shards").mkdir(parents=True, exist_ok=True)
        # Health checks are plain HTTP to the engines: no TLS context (loading the CA bundle costs ~9 MB resident).
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(3.0), trust_env=False, verify=False)
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> bool | None:
        assert self._nursery is not None and self._nursery_manager is not None
        self._nursery.cancel_scope.cancel()  # engines keep running; only watching stops
        try:
            return await self._nursery_manager.__aexit__(*exc_info)
        finally:
            with trio.move_on_after(2, shield=True):
                await self._http.aclose()

    # --- queries -------------------------------------------------------------------------------------------

    def shards(self) -> list[ShardView]:
        """The current view of every shard this supervisor runs or adopted, sorted by shard id."""
        return [self._shards[k].view for k in sorted(self._shards)]

    def get(self, shard_id: str) -> ShardView | None:
        shard = self._shards.get(shard_id)
        return shard.view if shard else None

    def logs(self, shard_id: str, count: int | None = None) -> list[str]:
        """The last `count` lines (all kept when None) of a shard's engine. Raises UsageError for an unknown shard."""
        shard = self._shards.get(shard_id)
        if shard is None:
            raise UsageError(f"no shard {shard_id!r} on this node; `llmgw replicas` lists the shards")
        return shard.ring.tail(count)

    def used_ports(self) -> set[int]:
        """The ports this supervisor's shards hold: their engines', relays' and KV-event listeners'."""
        return {p for s in self._shards.values() for p in (s.spec.port, s.spec.kv_events_port, s.spec.relay_port) if p}

    def free_port(self, host: str = "127.0.0.1", avoid: set[int] = frozenset()) -> int:
        """A free port for a new shard, not one of this supervisor's shards' ports nor in `avoid`."""
        return pick_free_port(host, self.used_ports() | set(avoid))

    def process_groups(self) -> dict[str, int]:
        """{shard id: process group id} of shards whose engine runs now (pgid == the engine's pid)."""
        return {k: s.pid for k, s in self._shards.items() if s.pid}

    def managed_pids(self) -> set[int]:
        """Every live process in the shards' process groups (engine workers included). Reads /proc."""
        groups = set(self.process_groups().values())
        return {s.pid for s in procfs.iter_proc_stats() if s.pgrp in groups} if groups else set()

    def foreign_engines(self) -> list[ForeignEngine]:
        """Engine processes on this node that no shard owns (reported, never killed). Reads /proc."""
        stats = list(procfs.iter_proc_stats())
        names = {"llama-server", "python", "python3", "vllm", "sglang"}
        cmdlines = {s.pid: procfs.read_cmdline(s.pid) for s in stats if s.comm in names or s.comm.startswith("python")}
        return find_foreign_engines(stats, cmdlines, set(self.process_groups().values()), os.getpid())

    # --- commands ------------------------------------------------------------------------------------------

    async def adopt(self) -> list[ShardView]:
        """Take over the shards recorded on disk: a live process with the recorded pid and start time is adopted
        (watched, not restarted); a dead one is started again from its spec. Returns the resulting views.
        Unreadable records are skipped with a warning in `self.warnings`.
        """
        records, warnings = load_records(self.state_dir)
        self.warnings.extend(warnings)
        for warning in warnings:
            log.warning(warning)
        for record in records:
            if record.spec.shard_id in self._shards:
                continue
            shard = _Shard(record.spec, LogRing(self.ring_lines))
            shard.view = replace(shard.view, restarts=record.restarts)
            self._shards[record.spec.shard_id] = shard
            if is_same_process(record, procfs.process_start_time(record.pid)):
                shard.pid, shard.start_time = record.pid, record.start_time
                shard.view = replace(shard.view, pid=record.pid, adopted=True)
                if not shard.spec.health_path or await self._probe(_health_url(shard)) is None:  # serving now
                    shard.ready_since = trio.current_time()
                    shard.view = shard.view.with_state(ShardState.READY, error="")
                log.info("adopted shard %s: engine pid %d still running", record.spec.shard_id, record.pid)
            else:
                log.info("shard %s: recorded engine pid %d is gone; starting it again", record.spec.shard_id, record.pid)
                try:
                    await self._spawn(shard)
                except EngineError as exc:  # retried with backoff by _run_shard
                    self._set(shard, shard.view.with_state(ShardState.FAILED, error=str(exc)))
            await self._nursery.start(self._run_shard, shard)
        return self.shards()

    async def start(self, spec: ShardSpec) -> ShardView:
        """Start an engine for `spec` (its process is spawned before this returns; readiness comes later).

        Raises UsageError when a shard with that id already runs (stop it first), EngineError when the
        engine cannot be spawned (the binary is missing or not executable).
        """
        if spec.shard_id in self._shards:
            raise UsageError(f"shard {spec.shard_id} already runs on this node; stop it before starting it again")
        shard = _Shard(spec, LogRing(self.ring_lines))
        self._shards[spec.shard_id] = shard
        try:
            await self._spawn(shard)
        except EngineError:
            del self._shards[spec.shard_id]
            delete_record(self.state_dir, spec.shard_id)
            raise
        await self._nursery.start(self._run_shard, shard)
        return shard.view

    async def stop(self, shard_id: str, grace: float | None = None,
                   drain: Callable[[ShardSpec], Awaitable[object]] | None = None) -> ShardView:
        """Stop a shard: SIGTERM to its process group, SIGKILL after `grace` seconds (default: the spec's).

        The shard is reported STOPPING first; when it was READY and `drain` is given, `await drain(spec)` (its
        requests in flight finish: `llmgw.agent.draining.drain_engine`) comes before the SIGTERM. A stop of a shard
        being stopped (drained) waits for that stop first (a StopShard sent again, a start replacing it).
        Forgets the shard (its record is deleted). Returns its final view (state "stopped"). A checkpoint.
        Raises UsageError for an unknown shard.
        """
        shard = self._shards.get(shard_id)
        if shard is None:
            raise UsageError(f"no shard {shard_id!r} on this node")
        if shard.stop_under_way is not None:  # e.g. draining: the engine's requests finish first
            await shard.stop_under_way.wait()
            if self._shards.get(shard_id) is not shard:
                return shard.view
        under_way = shard.stop_under_way = trio.Event()
        try:
            return await self._stop(shard, grace, drain)
        finally:
            under_way.set()
            shard.stop_under_way = None

    async def _stop(self, shard: _Shard, grace: float | None,
                    drain: Callable[[ShardSpec], Awaitable[object]] | None) -> ShardView:
        shard_id = shard.spec.shard_id
        was_ready = shard.view.state is ShardState.READY and not shard.stopping
        shard.stopping = True
        self._set(shard, shard.view.with_state(ShardState.STOPPING))
        if drain is not None and was_ready and shard.pid:
            await drain(shard.spec)
        grace = shard.spec.grace_seconds if grace is None else grace
        if shard.pid:
            await self._terminate_group(shard, grace)
        shard.scope.cancel()
        delete_record(self.state_dir, shard_id)
        del self._shards[shard_id]
        final = shard.view.with_state(ShardState.STOPPED, pid=0, error="")
        self._set(shard, final)
        return final

    async def stop_all(self, grace: float | None = None) -> None:
        """Stop every shard (used when the agent is told to leave nothing running)."""
        for shard_id in list(self._shards):
            await self.stop(shard_id, grace)

    # --- internals -----------------------------------------------------------------------------------------

    def _set(self, shard: _Shard, view: ShardView) -> None:
        changed = view != shard.view
        shard.view = view
        if changed and self.on_change is not None:
            self.on_change(view)

    async def _spawn(self, shard: _Shard) -> None:
        spec = shard.spec
        fd = open_log_file(log_path(self.state_dir, spec.shard_id))
        try:
            process = await trio.lowlevel.open_process(
                list(spec.argv), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                env=engine_environment(spec), start_new_session=True,
            )
        except OSError as exc:
            raise EngineError(f"cannot start the engine of shard {spec.shard_id} ({spec.argv[0]}): {exc}") from exc
        finally:
            os.close(fd)
        start_time = procfs.process_start_time(process.pid) or 0
        shard.process, shard.pid, shard.start_time = process, process.pid, start_time
        shard.exited = trio.Event()
        save_record(self.state_dir, ShardRecord(spec, process.pid, start_time, shard.view.restarts))
        self._set(shard, shard.view.with_state(ShardState.STARTING, pid=process.pid, error="", last_log_lines=()))
        log.info("shard %s: engine started, pid %d, port %d", spec.shard_id, process.pid, spec.port)

    async def _wait_exit(self, shard: _Shard) -> int | None:
        """Wait until the engine's process ends: its exit status, or None for an adopted process (not our child)."""
        if shard.process is not None:
            return await shard.process.wait()
        while procfs.process_start_time(shard.pid) == shard.start_time:
            await trio.sleep(1.0)
        _reap(shard.pid)
        return None

    async def _run_shard(self, shard: _Shard, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with shard.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tail_into, log_path(self.state_dir, shard.spec.shard_id), shard.ring)
                task_status.started()
                delay = 0.0
                while True:
                    if not shard.pid:
                        try:
                            await self._spawn(shard)
                        except EngineError as exc:
                            self._set(shard, shard.view.with_state(ShardState.FAILED, error=str(exc)))
                            delay = next_backoff(delay, self.backoff_initial, self.backoff_max)
                            await trio.sleep(delay)
                            continue
                    health_scope = trio.CancelScope()
                    nursery.start_soon(self._watch_health, shard, health_scope)
                    pgid = shard.pid
                    status = await self._wait_exit(shard)
                    health_scope.cancel()
                    ready_for = trio.current_time() - shard.ready_since
                    shard.ready_since = math.inf
                    shard.process, shard.pid = None, 0
                    shard.exited.set()
                    if shard.stopping:
                        nursery.cancel_scope.cancel()
                        return
                    if _group_alive(pgid):  # the engine's own children (vLLM's EngineCore) outlived it
                        log.warning("shard %s: killing what is left of the engine's process group %d",
                                    shard.spec.shard_id, pgid)
                        _signal_group(pgid, signal.SIGKILL)
                    if ready_for >= self.stable_after:
                        delay = 0.0
                    delay = next_backoff(delay, self.backoff_initial, self.backoff_max)
                    how = "exited" if status is None else _describe_status(status)
                    await trio.sleep(0.3)  # let the tail pick up the engine's last words
                    self._set(shard, shard.view.with_state(ShardState.FAILED, pid=0, restarts=shard.view.restarts + 1,
                        error=f"the engine {how}; restarting in {delay:g} s",
                        last_log_lines=tuple(shard.ring.tail(FAILED_LOG_LINES)),
                    ))
                    log.warning("shard %s: engine %s; restarting in %g s", shard.spec.shard_id, how, delay)
                    await trio.sleep(delay)

    async def _watch_health(self, shard: _Shard, scope: trio.CancelScope) -> None:
        with scope:
            if not shard.spec.health_path:  # no HTTP to ask (a headless rank): ready while its process runs
                shard.ready_since = trio.current_time()
                self._set(shard, shard.view.with_state(ShardState.READY, error=""))
                return
            url = _health_url(shard)
            ready = shard.view.state is ShardState.READY
            failures = 0
            while True:
                await trio.sleep(self.ready_check_interval if ready else self.health_interval)
                reason = await self._probe(url)
                if shard.stopping:  # STOPPING (draining) stays so: back to READY would route to it again
                    continue
                if reason is None:
                    failures = 0
                    if not ready:
                        ready = True
                        shard.ready_since = trio.current_time()
                        self._set(shard, shard.view.with_state(ShardState.READY, error=""))
                        log.info("shard %s: ready on port %d", shard.spec.shard_id, shard.spec.port)
                    elif shard.view.state is not ShardState.READY:
                        self._set(shard, shard.view.with_state(ShardState.READY, error=""))
                elif ready:
                    failures += 1
                    if failures >= 2:
                        self._set(shard, shard.view.with_state(ShardState.STARTING, error=f"health check failing: {reason}"))

    async def _probe(self, url: str) -> str | None:
        """None when `url` answers 200, else why not."""
        try:
            response = await self._http.get(url)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.status_code == 200 else f"{url} answered {response.status_code}"

    async def _terminate_group(self, shard: _Shard, grace: float) -> None:
        pgid = shard.pid
        exited = shard.exited
        _signal_group(pgid, signal.SIGTERM)
        with trio.move_on_after(grace):
            await exited.wait()
        if _group_alive(pgid):
            log.warning("shard %s: engine did not stop within %g s; killing it", shard.spec.shard_id, grace)
            _signal_group(pgid, signal.SIGKILL)
            with trio.move_on_after(5):
                await exited.wait()


def _reap(pid: int) -> None:
    """Reap `pid` when it is an ended child of this process: an engine adopted by the agent of a process that
    re-executed itself (`llmgw up` after `llmgw restart`) is still its child, though no trio Process of this image,
    and would stay a zombie until the process exits. Any other process: nothing to do."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (adopted from a separate agent that ended): its parent or init reaps it


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    return any(s.pgrp == pgid and s.state not in ("Z", "X") for s in procfs.iter_proc_stats())


def _describe_status(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def _health_url(shard: _Shard) -> str:
    """The engine's health URL on this node (a wildcard listen address is probed on loopback)."""
    return local_url(shard.spec, shard.spec.health_path)
