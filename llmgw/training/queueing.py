"""The control plane's rule for training jobs. Pure: the book and the nodes in, the next book and what to send out.

`schedule(book, nodes, now_unix)` goes over the jobs in the order they were submitted:
- a job whose node went (lost, or no longer in the fleet) while it held it fails, its `error` naming the node and
  why (`NodeRoom.gone`);
- a job asked to be cancelled is cancelled; when it held a node, a `Cancel` for that node goes out;
- a queued job starts on the first node (by id) that it may use (its `node`, or a node of its `node_class`, or
  any), that is connected, has `memory_bytes` free (the node's memory less what its shards reserve) and on which
  nothing else trains (a job holding it, or one starting there in this pass); the others keep waiting, their
  `waiting` saying why. One job per node at a time.

The control plane (`llmgw.control.training`) builds `NodeRoom`s from its fleet and turns `Start` / `Cancel` into
effects. Times are unix seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from llmgw.training.jobs import ENDED, ON_NODE, JobState, JobStatus, TrainingBook
from llmgw.units import format_size


@dataclass(frozen=True)
class NodeRoom:
    """What the rule needs of one node: its id, its `classes` (its label `class` and its GPUs' classes),
    `free_memory_bytes` (memory less what its shards reserve), whether its agent is `connected`, and `gone`: why
    a job there cannot go on ("" when it can: e.g. "node n1 was lost: no heartbeat for 30 s")."""

    node_id: str
    classes: frozenset[str] = frozenset()
    free_memory_bytes: int = 0
    connected: bool = True
    gone: str = ""


@dataclass(frozen=True)
class Start:
    """Send `job` (its status as started) to `node_id`."""

    status: JobStatus
    node_id: str


@dataclass(frozen=True)
class Cancel:
    """Tell `node_id` to stop job `job_id` (`reason`: who asked)."""

    job_id: str
    node_id: str
    reason: str


def _may_use(status: JobStatus, room: NodeRoom) -> bool:
    job = status.job
    if job.node:
        return room.node_id == job.node
    return not job.node_class or job.node_class in room.classes


def _why_waiting(status: JobStatus, rooms: list[NodeRoom], busy: dict[str, str]) -> str:
    """Why a queued job found no node, in one sentence."""
    job = status.job
    allowed = [r for r in rooms if _may_use(status, r)]
    if not allowed:
        where = (f"node {job.node}" if job.node else f"a node of class {job.node_class}" if job.node_class
                 else "a node")
        return f"waiting for {where} to connect"
    reasons = []
    for room in allowed:
        if room.gone or not room.connected:
            reasons.append(f"{room.node_id}: not connected")
        elif room.node_id in busy:
            reasons.append(f"{room.node_id}: job {busy[room.node_id]} trains there")
        else:
            reasons.append(f"{room.node_id}: {format_size(room.free_memory_bytes)} free of the "
                           f"{format_size(job.memory_bytes)} needed")
    return "waiting for room (" + "; ".join(reasons) + ")"


def schedule(book: TrainingBook, nodes: Iterable[NodeRoom], now_unix: float,
             ) -> tuple[TrainingBook, tuple[Start, ...], tuple[Cancel, ...]]:
    """The next book, the jobs to start and the cancels to send (see the module's docstring). Returns `book`
    itself when nothing changed."""
    rooms = sorted(nodes, key=lambda r: r.node_id)
    by_id = {r.node_id: r for r in rooms}
    busy = {s.node_id: s.job_id for s in book.jobs if s.state in ON_NODE}
    starts: list[Start] = []
    cancels: list[Cancel] = []
    following = book
    for status in book.jobs:
        if status.state in ENDED:
            continue
        new = status
        if status.cancel:
            new = replace(status, state=JobState.CANCELLED, cancel=False, ended_unix=now_unix,
                          error=status.error or "cancelled")
            if status.state in ON_NODE:
                cancels.append(Cancel(status.job_id, status.node_id, new.error))
                busy.pop(status.node_id, None)
        elif status.state in ON_NODE:
            room = by_id.get(status.node_id)
            gone = room.gone if room is not None else f"node {status.node_id} left the fleet"
            if gone:
                new = replace(status, state=JobState.FAILED, ended_unix=now_unix,
                              error=f"{gone}; the job's training there is lost (submit it again)")
                busy.pop(status.node_id, None)
        else:  # queued
            for room in rooms:
                if (_may_use(status, room) and room.connected and not room.gone and room.node_id not in busy
                        and room.free_memory_bytes >= status.job.memory_bytes):
                    new = replace(status, state=JobState.STARTING, node_id=room.node_id, waiting="",
                                  started_unix=now_unix, steps=status.job.hyper.steps)
                    busy[room.node_id] = status.job_id
                    starts.append(Start(new, room.node_id))
                    break
            else:
                new = replace(status, waiting=_why_waiting(status, rooms, busy))
        if new != status:
            following = following.put(new)
    return following, tuple(starts), tuple(cancels)
