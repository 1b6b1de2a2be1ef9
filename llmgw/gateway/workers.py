"""`GatewayWorkers`: the control plane's side of gateway worker processes (`listeners.gateway.workers` > 1).

    workers = GatewayWorkers(2, "127.0.0.1", 8080, store_url=..., spool_root=state / "usage-spool",
                             metrics_dir=state / "gateway-metrics")
    port = await nursery.start(workers.serve)     # returns once every worker serves the port
    workers.set_table(table); workers.set_blocks(snapshot)      # as Gateway's; fed to every worker
    registry = workers.registry                   # every worker's counters, for the admin /metrics

Each worker K (0..N-1) is `python -m llmgw.gateway.worker` with one end of its own socketpair (`llmgw.gateway.feed`
says what travels on it: the start message, the routing table, KV blocks, the other workers' load, /health's
details). It serves the gateway address with a SO_REUSEPORT socket of its own; this process holds one more socket
bound to the address (not listening) so that port 0 is resolved once and the port stays this control plane's
while a worker restarts. Workers run in process groups of their own, so a terminal's Ctrl-C (SIGINT to the
foreground group) reaches only this process, which stops them by closing their feeds (a worker still importing
would otherwise die with a KeyboardInterrupt traceback). A worker that ends is started again with the same K (`restarts.keep_running`: 1 s, doubling
to 30 s while it keeps dying), so it reopens its spool `spool_root/worker-K` and writes what the dead one left:
completed requests' usage and, from its journal, what the requests it had in flight reserved.

Metrics: every worker runs prometheus_client in multiprocess mode (`PROMETHEUS_MULTIPROC_DIR` = `metrics_dir`,
emptied at start); `registry` collects them all (`MultiProcessCollector`): counters and histograms summed over the
workers, dead ones included (their counts stay counted), `requests_in_flight` summed over the live ones, and
`ready_replicas` the live workers' maximum. A dead worker's live gauges are dropped (`mark_process_dead`).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from llmgw.gateway.draining import CUT_GRACE, DRAIN_TIMEOUT
from llmgw.gateway.feed import FeedError, MessageStream, blocks_message, table_to_json
from llmgw.gateway.restarts import WorkerStartError, keep_running, only_error
from llmgw.gateway.tcp import reuseport_socket
from llmgw.routes import BlockSnapshot, RouteTable

READY_TIMEOUT = 60.0
"""Seconds a worker may take from its start to serving (imports, store, bind)."""
FEED_GAP = 0.02
"""Seconds between two rounds of messages to one worker: changes meanwhile go as one (the latest table, blocks)."""
HEALTH_EVERY = 1.0
"""Seconds between two looks at /health's details (they change with time: recovering)."""
STOP_GRACE = 5.0
"""Seconds a worker has to end after its feed closes and its drain (`drain_timeout` + CUT_GRACE + hypercorn's
graceful close, 5 s) before it is killed."""

log = logging.getLogger("llmgw.gateway")


def worker_count(workers: int | str) -> int:
    """`listeners.gateway.workers` as a number: "auto" is os.cpu_count() (at least 1)."""
    return max(1, os.cpu_count() or 1) if workers == "auto" else int(workers)


def worker_spools(spool_root: Path, count: int) -> list[Path]:
    """The spool directories `spool_root/worker-K` on disk with K >= `count`: left by more workers than run now."""
    found = []
    for path in sorted(Path(spool_root).glob("worker-*")):
        suffix = path.name[len("worker-"):]
        if suffix.isdigit() and int(suffix) >= count and path.is_dir():
            found.append(path)
    return found


async def drain_spools(store, directories: list[Path]) -> None:
    """Write to `store` what the usage spools in `directories` hold (each `llmgw.store.UsageSpool`, one at a time,
    in worker threads), so no gateway setting leaves usage behind. A spool another process holds, or a store that
    fails, is logged and left for the next start. A checkpoint."""
    from llmgw.errors import StoreError
    from llmgw.store import UsageSpool
    from llmgw.store.boundary import StoreBoundary
    from llmgw.store.spool import SPOOL_FILE_NAME

    for directory in directories:
        if not (Path(directory) / SPOOL_FILE_NAME).is_file():
            continue
        try:
            spool = await trio.to_thread.run_sync(UsageSpool, directory)
        except StoreError as exc:
            log.warning("%s", exc)
            continue
        try:
            if not await StoreBoundary(store, spool).drain():
                log.warning("the usage spool %s could not all be written to the store; the next start tries again",
                            spool.path)
        finally:
            spool.close()


class GatewayWorkers:
    """N gateway worker processes serving `host`:`port` together (see the module docstring).

    `store_url`: the store every worker opens (a SQLite path or a PostgreSQL URL with its password: it travels in
    the start message over the pair, never on a command line). `spool_root`: each worker's spool is
    `spool_root/worker-K`. `metrics_dir`: prometheus_client's multiprocess directory (emptied). `otlp_endpoint`,
    `request_sample_ratio`: request tracing, as the in-process gateway's. `health_details`: what /health adds.
    `drain_timeout`: seconds a stopping worker's requests in flight get (`llmgw.gateway.draining`).
    """

    def __init__(self, count: int, host: str, port: int, *, store_url: str, spool_root: Path, metrics_dir: Path,
                 otlp_endpoint: str | None = None, request_sample_ratio: float = 0.0,
                 drain_timeout: float = DRAIN_TIMEOUT):
        self.count = count
        self.drain_timeout = drain_timeout
        self.host = host
        self.port = port
        self.store_url = store_url
        self.spool_root = Path(spool_root)
        self.metrics_dir = Path(metrics_dir)
        self.otlp_endpoint = otlp_endpoint
        self.request_sample_ratio = request_sample_ratio
        self.health_details: Callable[[], dict[str, Any]] = dict
        self.table = RouteTable()
        self.blocks = BlockSnapshot()
        self.pids: dict[int, int] = {}  # worker index -> pid of its process now
        self.starts: dict[int, int] = {}  # worker index -> times started
        self._loads: dict[int, dict[str, int]] = {}
        self._held: dict[int, dict[str, int]] = {}  # worker index -> model -> requests it holds
        self.on_held: Callable[[str, int], None] = lambda model, count: None
        """Told each change of the requests all workers hold for a model waking from zero (as `Holding.on_change`)."""
        self._wake: dict[int, trio.Event] = {}
        self.registry = None

    # -- what the control plane calls, as on a Gateway --------------------------------------------------------
    def set_table(self, table: RouteTable) -> None:
        """Every worker routes by `table` from its next round of messages on (within about FEED_GAP)."""
        self.table = table
        self._wake_all()

    def set_blocks(self, blocks: BlockSnapshot) -> None:
        """Every worker routes by `blocks` soon (only the replicas that changed travel)."""
        self.blocks = blocks
        self._wake_all()

    def _wake_all(self, but: int | None = None) -> None:
        for index, event in self._wake.items():
            if index != but:
                event.set()

    def statistics(self) -> dict[str, Any]:
        """{"workers": N, "pids": {K: pid now}, "restarts": {K: times started again}} (the status document's
        `control_plane.gateway_workers`)."""
        return {"workers": self.count, "pids": {str(k): pid for k, pid in sorted(self.pids.items())},
                "restarts": {str(k): n - 1 for k, n in sorted(self.starts.items())}}

    # -- running ------------------------------------------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the workers, keep them running until cancelled, then stop them (feed closed: each drains; SIGKILL
        after its drain and STOP_GRACE). `task_status.started(port)` once every worker serves. Raises OSError when the address cannot
        be bound, WorkerStartError when a worker's first start fails."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir(parents=True)
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(self.metrics_dir))
        holder = reuseport_socket(self.host, self.port)  # resolves port 0, keeps the port while workers restart
        try:
            self.port = holder.getsockname()[1]
            async with trio.open_nursery() as nursery:
                for index in range(self.count):
                    await nursery.start(keep_running, lambda task_status, k=index: self._run_one(
                        k, task_status=task_status), f"worker {index}")
                nursery.start_soon(self._watch_health)
                task_status.started(self.port)
        except BaseExceptionGroup as group:  # a worker's failed first start alone: raised as itself, a sentence
            failed = only_error(group, WorkerStartError)
            if failed is None:
                raise
            raise failed from None
        finally:
            holder.close()

    async def _watch_health(self) -> None:
        last: dict[str, Any] | None = None
        while True:
            details = self.health_details()
            if details != last:
                last = details
                self._wake_all()
            await trio.sleep(HEALTH_EVERY)

    async def _run_one(self, index: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run worker `index` once: start it, feed it until its process ends, clean up after it."""
        from prometheus_client import multiprocess

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(self.metrics_dir))
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-P", "-m", "llmgw.gateway.worker", "--feed-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, process_group=0)
        finally:
            theirs.close()
        self.pids[index] = process.pid
        self.starts[index] = self.starts.get(index, 0) + 1
        feed = MessageStream(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
        ready = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._feed, index, feed, nursery.cancel_scope)
                nursery.start_soon(self._listen, index, feed, ready, process)
                nursery.start_soon(_cancel_on_exit, process, nursery.cancel_scope)
                with trio.move_on_after(READY_TIMEOUT):
                    await ready.wait()
                if ready.is_set():
                    task_status.started()
                else:
                    log.warning("gateway worker %d did not serve within %.0f s; it is stopped", index, READY_TIMEOUT)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await feed.aclose()  # the worker sees its feed end and stops
                with trio.move_on_after(self.drain_timeout + CUT_GRACE + 5 + STOP_GRACE):  # it drains first
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            self._loads.pop(index, None)
            self._set_held(index, {})  # its held requests ended with it
            self._held.pop(index, None)
            self._wake_all()
            multiprocess.mark_process_dead(process.pid, str(self.metrics_dir))
            if process.returncode:
                log.warning("gateway worker %d (pid %d) ended with status %d", index, process.pid,
                            process.returncode)

    async def _listen(self, index: int, feed: MessageStream, ready: trio.Event, process: trio.Process) -> None:
        """Read worker `index`'s messages until its feed ends: `ready` sets `ready`, `load` is shared with the
        other workers. A malformed message kills `process` (the restart policy starts it again)."""
        try:
            await self._read_reports(index, feed, ready)
        except FeedError as exc:  # a bug of the worker's: it is stopped, and started again
            log.error("gateway worker %d sent something that is not a message (%s); it is stopped", index, exc)
            process.kill()

    async def _read_reports(self, index: int, feed: MessageStream, ready: trio.Event) -> None:
        while (message := await feed.receive()) is not None:
            if message.get("type") == "ready":
                ready.set()
            elif message.get("type") == "load":
                try:
                    self._loads[index] = {str(k): int(v) for k, v in dict(message["outstanding"]).items()}
                except (KeyError, TypeError, ValueError) as exc:
                    raise FeedError(f"a load report is not well formed ({exc!r})") from exc
                self._wake_all(but=index)
            elif message.get("type") == "held":
                try:
                    held = {str(k): int(v) for k, v in dict(message["held"]).items()}
                except (KeyError, TypeError, ValueError) as exc:
                    raise FeedError(f"a held report is not well formed ({exc!r})") from exc
                self._set_held(index, held)

    def _set_held(self, index: int, held: dict[str, int]) -> None:
        """Worker `index` holds `held` now (empty: none, as when it ends): `on_held` hears every model whose total
        over the workers changed."""
        before = self.held()
        self._held[index] = held
        after = self.held()
        for model in sorted(set(before) | set(after)):
            if before.get(model, 0) != after.get(model, 0):
                self.on_held(model, after.get(model, 0))

    def held(self) -> dict[str, int]:
        """model -> requests held for it, summed over the workers."""
        total: dict[str, int] = {}
        for held in self._held.values():
            for model, count in held.items():
                total[model] = total.get(model, 0) + count
        return total

    def outstanding(self) -> dict[str, int]:
        """Requests in flight per replica id through all the workers, as they last reported."""
        return self._elsewhere(-1)

    def _elsewhere(self, index: int) -> dict[str, int]:
        total: dict[str, int] = {}
        for other, loads in self._loads.items():
            if other != index:
                for replica_id, count in loads.items():
                    total[replica_id] = total.get(replica_id, 0) + count
        return total

    async def _feed(self, index: int, feed: MessageStream, scope: trio.CancelScope) -> None:
        """Send worker `index` its start message, then what changed, in rounds at most every FEED_GAP seconds."""
        await feed.send({"type": "start", "store": self.store_url, "spool_dir": str(self.spool_root / f"worker-{index}"),
                         "host": self.host, "port": self.port, "index": index, "otlp_endpoint": self.otlp_endpoint,
                         "request_sample_ratio": self.request_sample_ratio, "drain_timeout": self.drain_timeout})
        table: RouteTable | None = None
        blocks: BlockSnapshot | None = None
        load: dict[str, int] = {}
        health: dict[str, Any] | None = None
        try:
            while True:
                self._wake[index] = wake = trio.Event()
                if self.table is not table:
                    table = self.table
                    await feed.send({"type": "table", "table": table_to_json(table)})
                message = blocks_message(self.blocks, blocks)
                blocks = self.blocks
                if message is not None:
                    await feed.send(message)
                if (elsewhere := self._elsewhere(index)) != load:
                    load = elsewhere
                    await feed.send({"type": "load", "outstanding": load})
                if (details := self.health_details()) != health:
                    health = details
                    await feed.send({"type": "health", "details": details})
                await wake.wait()
                await trio.sleep(FEED_GAP)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()  # the worker is gone: its process ends (or is awaited) in _run_one
        finally:
            self._wake.pop(index, None)


async def _cancel_on_exit(process: trio.Process, scope: trio.CancelScope) -> None:
    await process.wait()
    scope.cancel()
