"""A gateway worker process: `python -m llmgw.gateway.worker --feed-fd N`, started by the control plane
(`llmgw.gateway.workers`) when `listeners.gateway.workers` is more than 1. Not a command for people.

It reads its `start` message and the routing table from the inherited socketpair end `N` (`llmgw.gateway.feed`),
opens the store (the control plane's: quotas stay exact across workers), binds its own listening socket with
SO_REUSEPORT on the gateway address (the kernel spreads connections over the workers' sockets), serves the
gateway there with its own upstream pool, usage spool (`spool_dir`, one per worker index) and journal of requests
in flight (`Gateway(journal=True)`), says `ready`, then applies each message as it comes and reports its requests
in flight per replica (at most every LOAD_REPORT_SECONDS, when they changed). It exits when the pair ends (its
control plane is gone) or on SIGTERM/SIGINT, after draining (`llmgw.gateway.draining`: the start message's
`drain_timeout`). Metrics go to `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's
multiprocess mode), which the control plane reads at its admin listener's /metrics.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

import trio

from llmgw.errors import LlmgwError
from llmgw.gateway.app import Gateway
from llmgw.gateway.draining import DRAIN_TIMEOUT
from llmgw.gateway.feed import FeedError, MessageStream, apply_blocks_message, table_from_json
from llmgw.gateway.restarts import only_error
from llmgw.gateway.tcp import reuseport_socket
from llmgw.gateway.tracing import open_gateway_tracing
from llmgw.routes import BlockSnapshot, RouteTable

LOAD_REPORT_SECONDS = 0.1
log = logging.getLogger("llmgw.gateway")


def apply_message(gateway: Gateway, message: dict) -> None:
    """Apply one control-plane message (`table`, `kv_blocks`, `load`, `health`) to `gateway`; others are ignored
    (a newer control plane's). Raises FeedError for a malformed one."""
    kind = message.get("type")
    if kind == "table":
        gateway.set_table(table_from_json(message["table"]))
    elif kind == "kv_blocks":
        gateway.set_blocks(apply_blocks_message(gateway.blocks, message))
    elif kind == "load":
        gateway.balancer.set_elsewhere({str(k): int(v) for k, v in dict(message["outstanding"]).items()})
    elif kind == "health":
        details = dict(message["details"])
        gateway.health_details = lambda: details


async def _report_load(gateway: Gateway, feed: MessageStream) -> None:
    sent: dict[str, int] = {}
    while True:
        await trio.sleep(LOAD_REPORT_SECONDS)
        if gateway.balancer.outstanding != sent:
            sent = dict(gateway.balancer.outstanding)
            try:
                await feed.send({"type": "load", "outstanding": sent})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the control plane is gone: the feed's end stops this worker


async def _report_held(gateway: Gateway, feed: MessageStream) -> None:
    """Send the control plane the requests this worker holds per model (`llmgw.gateway.holding`) on every change."""
    changed = trio.Event()

    def note(_model: str, _count: int) -> None:
        changed.set()

    gateway.holding.on_change = note
    while True:
        await changed.wait()
        changed = trio.Event()
        try:
            await feed.send({"type": "held", "held": dict(gateway.holding.held)})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the control plane is gone: the feed's end stops this worker


async def run_worker(feed_socket: socket.socket) -> None:
    """Serve as a gateway worker fed over `feed_socket` until the feed ends (see the module docstring).
    Raises FeedError when the first message is not `start`, StoreError when the store cannot be opened, OSError
    when the address cannot be bound."""
    from llmgw.store import open_store

    feed = MessageStream(trio.SocketStream(trio.socket.from_stdlib_socket(feed_socket)))
    start = await feed.receive()
    if start is None:
        return  # the control plane stopped before this worker started
    if start.get("type") != "start":
        raise FeedError(f"a gateway worker's first message must be start, not {start!r:.80}")
    store = await trio.to_thread.run_sync(lambda: open_store(start["store"], migrate=False))
    gateway = Gateway(store, RouteTable(), spool_dir=start["spool_dir"], journal=True,
                      drain_timeout=float(start.get("drain_timeout", DRAIN_TIMEOUT)),
                      tracing=open_gateway_tracing(start.get("otlp_endpoint"), start.get("request_sample_ratio", 0.0)))
    gateway.balancer.rendezvous = True
    gateway.blocks = BlockSnapshot()
    while True:  # serve nothing before the first routing table (a request would find no model)
        message = await feed.receive()
        if message is None:
            return
        apply_message(gateway, message)
        if message.get("type") == "table":
            break
    listening = reuseport_socket(start["host"], int(start["port"]))
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(lambda task_status: gateway.serve(
                start["host"], int(start["port"]), fd=listening.detach(), task_status=task_status))
            try:
                await feed.send({"type": "ready", "port": port, "pid": os.getpid()})
                nursery.start_soon(_report_load, gateway, feed)
                nursery.start_soon(_report_held, gateway, feed)
                while (message := await feed.receive()) is not None:
                    apply_message(gateway, message)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the control plane closed the feed (it is stopping): end quietly
            nursery.cancel_scope.cancel()  # the control plane is gone
    finally:
        listening.close()
        store.close()


def main(argv: list[str] | None = None) -> None:
    """Entry point: `--feed-fd N` names the inherited socketpair end."""
    parser = argparse.ArgumentParser(prog="python -m llmgw.gateway.worker")
    parser.add_argument("--feed-fd", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"gateway worker {os.getpid()}: %(levelname)s %(message)s",
                        stream=sys.stderr)
    feed_socket = socket.socket(fileno=args.feed_fd)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
            nursery.start_soon(stop_on_signal)
            await run_worker(feed_socket)
            nursery.cancel_scope.cancel()

    try:
        trio.run(serve)
    except BaseExceptionGroup as group:  # a store or address failure is a sentence in the control plane's log
        error = only_error(group, (LlmgwError, OSError))
        if error is None:
            raise
        print(f"gateway worker {os.getpid()}: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
