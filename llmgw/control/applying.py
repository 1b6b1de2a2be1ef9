"""`llmgw apply`: converge to the settings branch head now, with progress, one apply at a time.

`apply(plane, emit, ...)` polls the branch (forcing a reload), runs passes until the fleet converged to the head
(or `timeout` seconds pass; with `expect`, only when the head is that revision) and sends each step to `emit` as a dict: {"event": "waiting" | "settings" | "pass" |
"done", ...}. A second apply while one runs first emits "waiting" (naming the one running), then waits its turn.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from llmgw.control.expecting import expect_refusal
from llmgw.control.state import ControlState, PassRecord
from llmgw.plan.reviewed import ReviewedPlan, review_differences
from llmgw.control.view import ControlView


async def apply(
    plane: ControlView, emit: Callable[[dict[str, Any]], Awaitable[None]], *, wait: bool = True,
    allow_empty: bool = False, timeout: float = 600.0, who: str = "admin API", expect: str = "",
    reviewed: ReviewedPlan | None = None,
) -> bool:
    """Converge `plane` (a running ControlPlane) to the branch head now: poll, run a pass, and (when `wait`) run
    passes until converged.

    Progress goes to `emit` as dicts with "event": "waiting" | "settings" | "pass" | "done". Only one apply
    runs at a time; a second emits "waiting" and waits its turn. Returns True when converged (or, without
    `wait`, when the first pass ran); False on a bad commit, a held commit or the timeout.

    `expect` (`llmgw apply --expect REV`; "" none): the revision that was reviewed. When the branch head just read
    is another commit, nothing is applied: a "settings" event with "ok": false says what changed since
    (`llmgw.control.expecting`), and the result is False.

    `reviewed` (`llmgw apply --review REVIEW.json`): the plan a review showed for its head commit (which `expect`
    then defaults to). Once the head is that commit, every pass planning it compares its placements with the
    review's and its audit commit records where they differ and why (`llmgw.plan.reviewed`); the apply emits
    {"event": "reviewed", "differences": [...]} after its first pass of that commit.
    """
    if plane.apply_lock.locked():
        await emit({"event": "waiting", "message": f"another apply ({plane.apply_holder}) is running; waiting for it"})
    async with plane.apply_lock:
        plane.apply_holder = f"{who} since {time.strftime('%H:%M:%S')}"
        try:
            return await _apply(plane, emit, wait=wait, allow_empty=allow_empty, timeout=timeout,
                                expect=expect or (reviewed.commit if reviewed is not None else ""), reviewed=reviewed)
        finally:
            plane.apply_holder = None


async def _apply(plane: ControlView, emit, *, wait: bool, allow_empty: bool, timeout: float, expect: str,
                 reviewed: ReviewedPlan | None) -> bool:
    state = await plane.reload(force=True, allow_empty=allow_empty)
    if expect:
        refusal = await trio.to_thread.run_sync(expect_refusal, plane.watcher_repo_path, expect, state.head)
        if refusal is not None:
            await emit(refusal)
            return False
    if reviewed is not None:
        plane.set_reviewed(reviewed)
    for name, rejected in (("bad", state.bad), ("held", state.held)):
        if rejected is not None:
            await emit({"event": "settings", "ok": False, "commit": rejected.commit,
                        "message": rejected.describe(), "issues": [str(i) for i in rejected.issues]})
            return False
    if state.remote_error:
        await emit({"event": "settings", "ok": False, "message": state.remote_error})
    settings = state.settings
    if settings is None:
        await emit({"event": "settings", "ok": False, "message": "no settings commit validates yet"})
        return False
    if allow_empty:
        plane.allow_empty(settings.commit)
    await emit({"event": "settings", "ok": True, "commit": settings.commit})
    deadline = trio.current_time() + timeout
    last_summary = None
    with trio.move_on_at(deadline):
        while True:
            plane.kick("apply")
            record = await plane.wait_pass()
            summary = pass_summary(record, plane.status())
            if summary != last_summary:
                last_summary = summary
                await emit({"event": "pass", **summary})
            if reviewed is not None and record.settings_commit == reviewed.commit:
                await emit(_reviewed_event(plane.snapshot(), reviewed))
                reviewed = None  # once: the audit commits record every pass
            if record.converged and record.settings_commit == settings.commit:
                await emit({"event": "done", "converged": True, "commit": settings.commit})
                return True
            if not wait:
                await emit({"event": "done", "converged": False, "commit": settings.commit})
                return True
            with trio.move_on_after(1.0):
                await plane.wait_pass()
    await emit({"event": "done", "converged": False, "commit": settings.commit,
                "message": f"not converged within {timeout:g} s"})
    return False


def _reviewed_event(state: ControlState, reviewed: ReviewedPlan) -> dict[str, Any]:
    """{"event": "reviewed", "commit", "differences": [{"replica_id", "reviewed", "now", "why"}]} of the pass
    `state` holds the plan of, against the plan `reviewed` showed."""
    basis, plan = state.plan_basis, state.last_plan
    differences = review_differences(reviewed, plan, basis.fleet) if basis is not None and plan is not None else []
    return {"event": "reviewed", "commit": reviewed.commit, "differences": [d.to_json() for d in differences],
            "lines": [str(d) for d in differences]}


def pass_summary(record: PassRecord, status: dict[str, Any]) -> dict[str, Any]:
    """What an apply shows of a pass: number, converged, commands sent, failures, unplaced, replica states."""
    return {
        "pass": record.number,
        "converged": record.converged,
        "sent": [f"{a.kind} {a.subject} on {a.node_id}" for a in record.sent],
        "failed": [f"{a.kind} {a.subject} on {a.node_id}: {a.error}" for a in record.actions if a.error],
        "unplaced": [str(u) for u in record.unplaced],
        "replicas": {rid: r.get("state") for rid, r in status.get("replicas", {}).items()},
    }
