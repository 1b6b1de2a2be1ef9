"""`llmgw restart`: every agent restarts over its stream, engines serving throughout, then the control plane.

`restart_fleet(plane, emit)` asks each connected agent that can (its Register lists the "restart" feature) to
restart, all at once, and waits for each to register again; its engines keep running and are adopted, so their
pids do not change. An agent too old for it is refused at once with a sentence naming the node and its version.
Progress goes to `emit` as dicts: {"event": "node", "node", "ok", "message", "pids_before", "pids_after"}, then
{"event": "control_plane", ...} when the control plane is to restart next: the caller then calls
`request_restart()` once its answer is out (`llmgw server` re-executes itself; see `ControlPlane.restart_requested`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from llmgw.control.state import ControlState
from llmgw.control.view import ControlView
from llmgw.errors import LlmgwError
from llmgw.wire import pb
from llmgw.wire.features import RESTART

REREGISTER_TIMEOUT = 60.0
"""Seconds an agent has to come back after it answered Restart."""


def engine_pids(state: ControlState, node_id: str) -> dict[str, int]:
    """{shard id: engine pid} of the shards `node_id` reported (pid 0 when unknown)."""
    record = state.fleet.get(node_id)
    return {shard_id: detail.pid for shard_id, detail in record.details.items()} if record else {}


def restart_refusal(state: ControlState, node_id: str) -> str | None:
    """Why `node_id` cannot restart over its stream, naming it and its agent version; None when it can."""
    record = state.fleet.get(node_id)
    if record is None or not record.connected:
        return f"node {node_id} is not connected"
    if RESTART not in record.features:
        return (f"node {node_id} runs llmgw agent {record.agent_version or '(unknown version)'}, which cannot "
                "restart over its stream; restart it on the node (or upgrade its agent)")
    return None


def _registered_again(state: ControlState, node_id: str, before) -> bool:
    record = state.fleet.get(node_id)
    return record is not None and record.connected and record.registered_at > before.registered_at


async def restart_fleet(plane: ControlView, emit: Callable[[dict[str, Any]], Awaitable[None]], *, timeout: float = 30.0,
                        control_plane: bool = True) -> bool:
    """Restart every connected agent over its stream, then (with `control_plane`) ask the control plane to.

    Returns True when every agent restarted and came back. A checkpoint; cancellable.
    """
    state = plane.snapshot()
    nodes = sorted(n for n, r in ((r.node_id, r) for r in state.fleet.records()) if r.connected)
    results: dict[str, bool] = {}

    async def one(node_id: str) -> None:
        before = engine_pids(plane.snapshot(), node_id)
        refusal = restart_refusal(plane.snapshot(), node_id)
        if refusal is not None:
            results[node_id] = False
            await emit({"event": "node", "node": node_id, "ok": False, "message": refusal})
            return
        registered_before = plane.snapshot().fleet.get(node_id)
        try:
            outcome = await plane.command(node_id, timeout, restart=pb.Restart())
        except LlmgwError as exc:
            results[node_id] = False
            await emit({"event": "node", "node": node_id, "ok": False, "message": str(exc)})
            return
        if not outcome.ok:
            results[node_id] = False
            await emit({"event": "node", "node": node_id, "ok": False, "message": outcome.error})
            return
        with trio.move_on_after(REREGISTER_TIMEOUT) as waited:  # back: a new Register after the old stream ended
            while not _registered_again(plane.snapshot(), node_id, registered_before) or not plane.is_connected(node_id):
                await trio.sleep(0.05)
        if waited.cancelled_caught:
            results[node_id] = False
            await emit({"event": "node", "node": node_id, "ok": False,
                        "message": f"node {node_id} did not come back within {REREGISTER_TIMEOUT:g} s"})
            return
        after = engine_pids(plane.snapshot(), node_id)
        results[node_id] = True
        await emit({"event": "node", "node": node_id, "ok": True, "message": f"node {node_id} restarted",
                    "pids_before": before, "pids_after": after})

    async with trio.open_nursery() as nursery:
        for node_id in nodes:
            nursery.start_soon(one, node_id)
    ok = all(results.values())
    if control_plane:  # the caller asks for it once its answer is out (`ControlView.request_restart`)
        await emit({"event": "control_plane", "ok": True,
                    "message": "the control plane restarts now (llmgw server or llmgw up re-executes itself)"})
    return ok
