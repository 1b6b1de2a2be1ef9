"""What was done, as commits: the status snapshot of each pass that changed something, on `refs/llmgw/audit`.

`status_document` builds the snapshot (plain data, no secrets: replica keys and weight tokens are never in it);
`audit_message` the commit message; `Planning` what the pass planned from, recorded beside status.yaml under plan/
so `llmgw plan --at` can make the plan again (`llmgw.plan.recorded`); `AuditWriter` writes commits off the reconcile pass's critical path: a pass
only queues, and a failed write (a locked ref, a full disk) is retried later with backoff, never failing a pass.
`refs/llmgw/applied` is moved with `llmgw.settings.set_ref` when a pass finds the fleet converged to a commit.

Fenced: only the leader lease's holder writes. Each queued write carries the fencing token of the term that queued
it, and before every write the `AuditWriter` asks its `fence` for the token this control plane holds now (checked
against the store); when they differ (another control plane took the lease), every write queued in an older term is
dropped and the log says so, so a deposed leader that wakes up late writes nothing. While nobody holds the lease
(this control plane's own lease lapsed) the writes wait: taken again by the same control plane, the lease keeps its
token, and they are written.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from llmgw.control.audit_yaml import StatusYaml, dump_yaml
from llmgw.control.registry import NodeRecord
from llmgw.control.state import Outcome, PassRecord, WatchState
from llmgw.errors import LlmgwError
from llmgw.plan import FLEET_FILE, PASS_FILE, fleet_record, recorded_files
from llmgw.plan.canary import CanaryHold
from llmgw.plan.reviewed import Difference, ReviewedPlan
from llmgw.plan.types import Fleet, Plan
from llmgw.settings.model import Settings
from llmgw.tools.fabric_groups import group_fabrics
from llmgw.wire.features import ALL as FEATURES
from llmgw.settings import APPLIED_REF, append_audit, set_ref

log = logging.getLogger("llmgw.control.audit")
MAX_QUEUED = 200
"""Queued writes before the queue is compacted (`compacted`)."""
MAX_MESSAGE = 256 * 1024
"""Characters of pass messages one coalesced audit commit keeps, newest first."""

Fence = Callable[[], Awaitable[int | None]]
"""The fencing token of the leader lease this control plane holds now, as the store says; 0 when another control
plane holds it (writes of this one's terms are dropped); None when nobody holds it now (this one's own lease lapsed,
say while it was too busy to renew: its writes wait, and go once it takes the lease again, with the same token as
nobody else held it in between). May raise (StoreError, TemporaryError): the write then waits and asks again, like
a failed write."""
LAPSE_RETRY_MAX = 10.0
"""Seconds, at most, between two looks at a lapsed lease while writes wait (from 1 s, doubling)."""


REVIEWED_FILE = "plan/reviewed.json"
"""In an audit commit of a pass planning a commit `llmgw apply --review` was given: {"commit", "fleet" (the
review's fleet revision), "differences": [{"replica_id", "reviewed", "now", "why"}]} (empty: as reviewed)."""


KEPT_OFF = ("cordoned", "drained", "lent")
"""The status document's `settings` keys naming nodes the settings keep replicas off (llmgw.plan.cordons):
cordoned (no new replica), drained (replicas placed elsewhere, then stopped), lent to Slurm."""


def node_documents(records: tuple[NodeRecord, ...]) -> dict[str, Any]:
    """Per node (by node id): `node_document` of each record."""
    return {record.node_id: node_document(record) for record in records}


def node_document(record: NodeRecord) -> dict[str, Any]:
    """One node: connection state, address, GPUs (count, and GPU class by device id), engines, and its shards with
    state, settings commit and errors; `lacks`, the features this control plane knows (`llmgw.wire.features.ALL`)
    that an agent listing features did not list (an older agent during an upgrade).

    Reads only the fields `node_document_key` names (`llmgw.control.documents` reuses a document while they are
    equal)."""
    node = record.state
    state = "lost" if record.lost else ("connected" if record.connected else "disconnected")
    shards = {}
    for shard in node.shards:
        entry: dict[str, Any] = {
            "replica": shard.replica_id,
            "model": shard.model,
            "state": shard.state.value,
            "settings_commit": shard.settings_commit,
            "port": shard.port,
        }
        detail = record.details.get(shard.shard_id)
        if detail is not None and detail.pid:
            entry["pid"] = detail.pid
        if shard.devices:
            entry["devices"] = list(shard.devices)
        if shard.error:
            entry["error"] = shard.error
        if shard.restarts:
            entry["restarts"] = shard.restarts
        if shard.adopted_foreign:
            entry["foreign"] = True
        shards[shard.shard_id] = entry
    doc: dict[str, Any] = {
        "state": state,
        "address": node.address,
        "gpus": len(node.gpus),
        "gpu_classes": {gpu.device_id: gpu.gpu_class for gpu in node.gpus},
        "cpu_cores": node.cpu_cores,
        "engines": sorted(node.engines_installed),
        "shards": shards,
    }
    if record.agent_version:
        doc["agent_version"] = record.agent_version
    if record.release_key:
        doc["release_key"] = record.release_key
    lacks = [name for name in FEATURES if name not in record.features] if record.features else []
    if lacks:  # an older agent: nothing needing these is sent to it (llmgw.control.capabilities)
        doc["lacks"] = lacks
    if node.engines_installing:
        doc["engines_installing"] = sorted(node.engines_installing)
    if record.engine_errors:
        doc["engine_errors"] = dict(record.engine_errors)
    if record.warnings:
        doc["warnings"] = list(record.warnings)
    if record.health is not None:
        doc["health"] = record.health.to_json()
    if record.slurm is not None:
        doc["slurm"] = dict(record.slurm)
    if record.firewall is not None:
        doc["firewall"] = {k: v for k, v in record.firewall.items() if v}
    return doc


def node_document_key(record: NodeRecord) -> tuple:
    """Everything `node_document(record)` reads: two records with equal keys have equal documents."""
    node = record.state
    return (record.lost, record.connected, node.address, tuple((g.device_id, g.gpu_class) for g in node.gpus),
            node.cpu_cores, node.engines_installed,
            node.engines_installing, node.shards, {s: d.pid for s, d in record.details.items()},
            record.engine_errors, record.warnings, record.health, record.slurm, record.firewall, record.agent_version,
            record.release_key, record.features)


def replica_documents(records: tuple[NodeRecord, ...], plan: Plan | None) -> dict[str, Any]:
    """Per replica: its model, where it runs (or should), state, settings commit and error."""
    replicas: dict[str, Any] = {}
    for record in records:
        if record.lost:
            continue
        for shard in record.state.shards:
            if shard.adopted_foreign or not shard.replica_id:
                continue
            entry = replicas.setdefault(shard.replica_id, {"model": shard.model, "shards": {}})
            entry["shards"][shard.shard_id] = {
                "node": record.node_id, "state": shard.state.value, "settings_commit": shard.settings_commit,
                **({"error": shard.error} if shard.error else {}),
            }
    if plan is not None:
        for assignment in plan.assignments:
            entry = replicas.setdefault(assignment.replica_id, {"model": assignment.model, "shards": {}})
            entry["node"] = assignment.node_id
        for unplaced in plan.unplaced:
            entry = replicas.setdefault(unplaced.replica_id, {"model": unplaced.model, "shards": {}})
            entry["unplaced"] = {node: why for node, why in unplaced.reasons} or {"": "no nodes"}
    for entry in replicas.values():
        states = [s["state"] for s in entry["shards"].values()]
        if "unplaced" in entry:
            entry["state"] = "unplaced"
        elif "node" not in entry:
            entry["state"] = "stopping" if any(s != "stopped" for s in states) else "stopped"
        elif states and all(s == "ready" for s in states):
            entry["state"] = "ready"
        else:
            entry["state"] = next((s for s in states if s != "ready"), "pending")
    return dict(sorted(replicas.items()))


def status_document(
    watch: WatchState,
    records: tuple[NodeRecord, ...],
    last_pass: PassRecord | None,
    plan: Plan | None,
    failures: list[dict[str, Any]] = (),  # type: ignore[assignment]
    *,
    nodes: dict[str, Any] | None = None,
    replicas: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole status as plain data: settings (in force, head, rejected), nodes, replicas, failures, last pass (and
    the actions it refused, `refused`: not sent, each with why).

    `nodes` / `replicas`: those sections already built from `records` (`llmgw.control.documents` keeps them);
    None builds them here.

    This is what `GET /api/v1/status` returns and (without times) what each audit commit's status.yaml holds.
    `fabrics` (only when a node reports one): nodes grouped by NVLink domain and InfiniBand fabric, and what is
    outside them (`llmgw.tools.fabric_groups`).
    """
    settings = watch.settings
    doc: dict[str, Any] = {
        "settings": {
            "commit": settings.commit if settings else None,
            "head": watch.head,
            "serving_stopped": settings.cluster.serving_stopped if settings else False,
        },
        "nodes": node_documents(records) if nodes is None else nodes,
        "replicas": replica_documents(records, plan) if replicas is None else replicas,
    }
    if settings is not None:  # nodes kept off by settings (llmgw.plan.cordons); the keys only when not empty
        for key, ids in (("cordoned", settings.cluster.cordoned), ("drained", settings.cluster.drained),
                         ("lent", tuple(sorted(settings.slurm.lent)))):
            if ids:
                doc["settings"][key] = list(ids)
    fabrics = group_fabrics({r.node_id: r.health for r in records if r.health is not None and not r.lost})
    if fabrics.groups or fabrics.outside:
        doc["fabrics"] = fabrics.to_json()
    for name, rejected in (("bad", watch.bad), ("held", watch.held)):
        if rejected is not None:
            doc["settings"][name] = {
                "commit": rejected.commit,
                "issues": [
                    {"file": i.file, "line": i.line, "column": i.column, "key": i.key_path, "reason": i.message,
                     "text": str(i)}
                    for i in rejected.issues
                ],
            }
    if watch.remote_error:
        doc["settings"]["remote_error"] = watch.remote_error
    if failures:
        doc["failures"] = list(failures)
    if last_pass is not None:
        doc["pass"] = {
            "number": last_pass.number,
            "trigger": last_pass.trigger,
            "settings_commit": last_pass.settings_commit,
            "converged": last_pass.converged,
            "started_at": last_pass.started_at,
            "duration": last_pass.duration,
        }
        refused = [{"kind": a.kind, "node": a.node_id, "subject": a.subject, "error": a.error}
                   for a in last_pass.actions if a.outcome == Outcome.REFUSED]
        if refused:  # the node cannot do it (an older agent lacking a feature): not sent, and why
            doc["pass"]["refused"] = refused
    return doc


def audit_snapshot(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a status document whose change is worth a commit (no times, pass numbers or triggers)."""
    snap = {k: v for k, v in doc.items() if k not in ("pass", "failures", "nodes")}
    if "nodes" in doc:  # a node's Slurm report changes with every job: written with the next commit, never one itself
        snap["nodes"] = {name: {k: v for k, v in node.items() if k != "slurm"} if "slurm" in node else node
                         for name, node in doc["nodes"].items()}  # shared, not copied: unchanged entries compare at once
    if "failures" in doc:
        snap["failures"] = [{k: v for k, v in f.items() if k != "retry_at"} for f in doc["failures"]]
    if "pass" in doc:
        snap["converged"] = doc["pass"]["converged"]
    if "control_plane" in doc:  # the audit's own queue, a running apply and the recovery countdown are not changes
        snap["control_plane"] = {k: v for k, v in doc["control_plane"].items() if k not in _PASSING}
    return snap


_PASSING = ("audit_pending", "audit_error", "apply_running", "fleet", "load", "ca")
"""Keys of the status document's `control_plane` that change on their own between passes (audit_snapshot)."""


def state_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What changed between two status snapshots, for people: replica states, nodes, rejected commits.

    E.g. ["tiny-0 ready on n1", "node n2 lost", "settings e30341116468 not applied"].
    """
    before = before or {}
    changes = []
    old_replicas, new_replicas = before.get("replicas", {}), after.get("replicas", {})
    if new_replicas is not old_replicas:  # a section kept from the last document (llmgw.control.documents)
        for rid, replica in new_replicas.items():
            old = old_replicas.get(rid, {})
            if replica.get("state") != old.get("state"):
                where = f" on {replica['node']}" if replica.get("node") else ""
                changes.append(f"{rid} {replica.get('state')}{where}")
        changes += [f"{rid} gone" for rid in old_replicas if rid not in new_replicas]
    old_nodes, new_nodes = before.get("nodes", {}), after.get("nodes", {})
    for node_id, node in new_nodes.items():
        if node is not old_nodes.get(node_id) and node.get("state") != old_nodes.get(node_id, {}).get("state"):
            changes.append(f"node {node_id} {node.get('state')}")
    for name, words in (("bad", "does not validate"), ("held", "held back")):
        rejected = after.get("settings", {}).get(name)
        if rejected and rejected != before.get("settings", {}).get(name):
            changes.append(f"settings {rejected['commit'][:12]} {words}")
    return changes


def audit_message(record: PassRecord, changes: list[str] | None = None) -> str:
    """The commit message of a pass: a subject saying what was done (or, when no command was sent, what
    changed: `changes`) for which settings commit, then details."""
    commit = (record.settings_commit or "none")[:12]
    sent = record.sent
    parts = [f"agent settings {a.subject} to {a.node_id}" if a.kind == "configure" else f"{a.kind} {a.subject} on {a.node_id}"
             for a in sent]
    if parts:
        subject = f"pass {record.number} for settings {commit}: " + "; ".join(parts[:4])
        if len(parts) > 4:
            subject += f"; and {len(parts) - 4} more"
    else:
        subject = f"pass {record.number} for settings {commit}: " + (
            "; ".join((changes or [])[:4]) or ("converged" if record.converged else "state changed")
        )
    lines = [subject, "", f"Trigger: {record.trigger}", f"Settings-Commit: {record.settings_commit or 'none'}",
             f"Converged: {'yes' if record.converged else 'no'}"]
    for action in record.actions:
        line = f"- {action.kind} {action.subject} on {action.node_id}: {action.outcome}"
        if action.reason:
            line += f" ({action.reason})"
        if action.error:
            line += f": {action.error}"
        lines.append(line)
    for unplaced in record.unplaced:
        lines.append(f"- unplaced: {unplaced}")
    for change in changes or ():
        lines.append(f"- now: {change}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Planning:
    """What pass `number` planned from and what it made: `settings` (None: no settings in force), `allow_empty`,
    the very `fleet` given to the planner and the `plan` (recorded as `llmgw.plan.recorded` says). A pass whose plan
    the empty-catalog guard refused, or that had no settings, has none."""

    number: int
    settings: Settings
    allow_empty: bool
    fleet: Fleet
    plan: Plan
    review: tuple[ReviewedPlan, tuple[Difference, ...]] | None = None
    """The plan `llmgw apply --review` showed for this settings commit and where this pass's differs from it
    (`llmgw.plan.reviewed`); None when no review of this commit was handed to an apply."""
    canaries: Mapping[str, CanaryHold] = field(default_factory=dict)
    """The canaries the planner was told of (`llmgw.plan.canary`), recorded in plan/pass.json."""
    replicas: Mapping[str, int] = field(default_factory=dict)
    """The autoscaler's wanted counts the planner was told (`llmgw.plan.autoscaling`), recorded in plan/pass.json."""


class _FleetBytes:
    """`fleet_record` of the last fleet asked for, kept while the same fleet object comes again (a reused plan), and
    each node's JSON, reused for the nodes that did not change (250 nodes of 8 GPUs: 0.1 s to encode whole, 7 ms
    when one node changed)."""

    def __init__(self) -> None:
        self._last: tuple[Fleet, bytes] | None = None
        self._nodes: dict = {}

    def of(self, fleet: Fleet) -> bytes:
        if self._last is None or self._last[0] is not fleet:
            self._last = (fleet, fleet_record(fleet, self._nodes))
        return self._last[1]


@dataclass(frozen=True)
class _Write:
    status: Mapping[str, Any] | None
    message: str
    applied: str | None = None
    token: int = 0  # the fencing token of the leader term that queued it
    planning: Planning | None = None

    def files(self, dumper: StatusYaml | None = None, fleets: _FleetBytes | None = None) -> dict[str, bytes | None]:
        """status.yaml, and the pass's planning record (`llmgw.plan.recorded`; removed when the pass has none)."""
        assert self.status is not None
        files: dict[str, bytes | None] = {
            "status.yaml": dumper.dump(self.status) if dumper is not None else dump_yaml(self.status)}
        planning = self.planning
        if planning is None:
            return {**files, FLEET_FILE: None, PASS_FILE: None, REVIEWED_FILE: None}
        fleet_bytes = (fleets or _FleetBytes()).of(planning.fleet)
        files[REVIEWED_FILE] = None
        if planning.review is not None:
            reviewed, differences = planning.review
            files[REVIEWED_FILE] = json.dumps(
                {"commit": reviewed.commit, "fleet": reviewed.fleet_revision,
                 "differences": [d.to_json() for d in differences]}, indent=1).encode() + b"\n"
        return {**files, **recorded_files(planning.number, planning.settings, planning.allow_empty, planning.fleet,
                                          planning.plan, fleet_bytes, planning.canaries, planning.replicas)}


def coalesced(queue: deque[_Write]) -> tuple[_Write, int]:
    """The next write of `queue` (not empty) and how many queued items it stands for: audit commits waiting one
    behind the other become one commit of the newest status.yaml whose message holds every pass's message, newest
    first (each is a full status dump: a backlog of them cost the control plane most of a core at 50 nodes)."""
    first = queue[0]
    if first.status is None:
        return first, 1
    run = [first]
    for later in itertools.islice(queue, 1, None):
        if later.status is None or later.token != first.token:
            break
        run.append(later)
    if len(run) == 1:
        return first, 1
    subjects = [w.message.split("\n", 1)[0] for w in run]
    head, _, newest = subjects[-1].partition(": ")
    done = []  # what each pass did, oldest first, so `llmgw history` still names every command
    for line in subjects:
        what = line.partition(": ")[2]
        if what and what not in ("converged", "state changed") and what not in done:
            done.append(what)
    said = "; ".join(done) or newest
    if newest and newest not in done:
        said += f"; {newest}"
    subject = f"{head} (and {len(run) - 1} earlier passes): {said[:400]}"
    kept: list[str] = []
    size = 0
    for write in reversed(run):  # newest first, up to MAX_MESSAGE characters
        if size + len(write.message) > MAX_MESSAGE and kept:
            kept.append(f"({len(run) - len(kept)} older pass messages left out: over {MAX_MESSAGE} characters)\n")
            break
        kept.append(write.message)
        size += len(write.message)
    return (_Write(run[-1].status, f"{subject}\n\n" + "\n".join(kept), token=first.token, planning=run[-1].planning),
            len(run))


def compacted(queue: deque[_Write]) -> deque[_Write]:
    """`queue` with each run of audit commits coalesced into one (`coalesced`), applied-ref moves kept in order."""
    rest = deque(queue)
    out: deque[_Write] = deque()
    while rest:
        item, taken = coalesced(rest)
        for _ in range(taken):
            rest.popleft()
        out.append(item)
    return out


class AuditWriter:
    """Writes queued audit commits and applied-ref moves to the repository at `repo_path`, in order.

    `queue_*` never blocks or raises. `errors` counts failed writes; `last_error` is the latest sentence.
    `fence` (None: unfenced, one control plane alone): see the module docstring; `dropped` counts the queued writes
    it threw away.
    """

    def __init__(self, repo_path: Path, min_gap: float = 0.0, fence: Fence | None = None):
        self.repo_path = repo_path
        self.min_gap = min_gap
        """Seconds after an audit commit before the next write: passes queued meanwhile become one commit (each
        commit dumps status.yaml in a thread that holds the GIL: before `StatusYaml` kept unchanged entries, half the
        control plane's CPU during a 250-node roll-out). Moving the applied ref is one ref update: the write after it
        does not wait (two audit commits are still `min_gap` apart)."""
        self.yaml = StatusYaml()
        """Dumps status.yaml in proportion to the change since the previous write (`yaml.dumped`, `yaml.reused`)."""
        self.fence = fence
        self.fleets = _FleetBytes()
        self.dropped = 0
        self._queue: deque[_Write] = deque()
        self._writing = 0  # how many writes at the queue's head the write in progress stands for
        self._wake = trio.Event()
        self.written = 0
        self.errors = 0
        self.last_error: str | None = None
        self.applied: str | None = None

    def queue_audit(self, status: Mapping[str, Any], message: str, token: int = 0,
                    planning: Planning | None = None) -> None:
        """Queue one audit commit holding status.yaml and the pass's `planning` (under plan/, as
        `llmgw.plan.recorded` says; written in the writer's thread), for the leader term of fencing token `token`.
        A queue of MAX_QUEUED writes (the repository has been failing for a while) is compacted: waiting commits of
        one term merge into one (holding the newest pass's status and planning), so no pass's message is dropped."""
        if len(self._queue) >= MAX_QUEUED:  # the writes being written now stay as they are
            writing = list(itertools.islice(self._queue, 0, self._writing))
            self._queue = deque([*writing, *compacted(deque(itertools.islice(self._queue, self._writing, None)))])
        self._queue.append(_Write(status, message, token=token, planning=planning))
        self._wake.set()

    def queue_applied(self, commit: str, token: int = 0) -> None:
        """Queue moving refs/llmgw/applied to `commit` (after the audit commits queued before it), for the leader
        term of fencing token `token`."""
        if commit == self.applied:
            return
        self.applied = commit
        self._queue.append(_Write(None, "", applied=commit, token=token))
        self._wake.set()

    def pending(self) -> int:
        return len(self._queue)

    async def _fenced(self, item: _Write) -> bool | None:
        """True when `item` may be written: no fence, or the fence's token now (not 0) is the one `item` was queued
        under. None while nobody holds the lease (the writes wait). Otherwise drops every queued write of another
        term, or all of them when another control plane leads (logged), and returns False."""
        if self.fence is None:
            return True
        current = await self.fence()
        if current is None:
            return None
        if current and current == item.token:
            return True
        stale = [w for w in self._queue if not current or w.token != current]
        self._queue = deque(w for w in self._queue if current and w.token == current)
        if any(w.applied is not None for w in stale):
            self.applied = None  # a later term queues its applied-ref move again
        self.dropped += len(stale)
        log.warning("dropped %d queued audit write(s) of leader term %d: this control plane %s, so it writes no "
                    "audit commit; the leader does", len(stale), item.token,
                    f"leads now with token {current}" if current else "no longer holds the leader lease")
        return False

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Write what is queued, forever; a failure waits (1 s doubling to 60 s) and tries the same write again."""
        task_status.started()
        delay = lapse_delay = 1.0
        while True:
            if not self._queue:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            item, taken = coalesced(self._queue)
            self._writing = taken
            try:
                fenced = await self._fenced(item)
                if not fenced:
                    self._writing = 0
                    if fenced is None:  # the lease lapsed: look again later
                        await trio.sleep(lapse_delay)
                        lapse_delay = min(LAPSE_RETRY_MAX, lapse_delay * 2)
                    continue
                lapse_delay = 1.0
                if item.status is not None:
                    await trio.to_thread.run_sync(
                        lambda: append_audit(str(self.repo_path), item.files(self.yaml, self.fleets), item.message))
                else:
                    await trio.to_thread.run_sync(set_ref, str(self.repo_path), APPLIED_REF, item.applied)
            except Exception as exc:  # noqa: BLE001 - the audit must never stop the control plane; logged, retried
                self._writing = 0
                self.errors += 1
                self.last_error = f"writing the audit to {self.repo_path} failed (will retry): {exc}"
                if not isinstance(exc, (LlmgwError, OSError)):
                    log.exception("writing an audit commit failed with a bug; retrying in %g s", delay)
                await trio.sleep(delay)
                delay = min(60.0, delay * 2)
                continue
            for _ in range(taken):
                self._queue.popleft()
            self._writing = 0
            self.written += taken  # queued writes done (several passes may share one commit)
            self.last_error = None
            delay = 1.0
            if item.status is not None:  # an audit commit (an applied-ref move costs nothing to space out)
                await trio.sleep(self.min_gap)

    async def write_pending(self) -> int:
        """Write what is queued now, in order, stopping at the first failure; returns how many were written.

        For shutdown, when `run` is no longer running (call it under a shielded deadline).
        """
        written = 0
        while self._queue:
            item = self._queue[0]
            try:
                fenced = await self._fenced(item)
                if fenced is None:  # nobody holds the lease: nothing may be written now
                    break
                if not fenced:
                    continue
                if item.status is not None:
                    await trio.to_thread.run_sync(
                        lambda: append_audit(str(self.repo_path), item.files(self.yaml, self.fleets), item.message))
                else:
                    await trio.to_thread.run_sync(set_ref, str(self.repo_path), APPLIED_REF, item.applied)
            except (LlmgwError, OSError) as exc:
                self.last_error = f"writing the audit to {self.repo_path} failed at shutdown: {exc}"
                break
            self._queue.popleft()
            self.written += 1
            written += 1
        return written

    async def flush(self, timeout: float) -> bool:
        """Wait until the queue is empty (True) or `timeout` seconds pass (False)."""
        with trio.move_on_after(timeout):
            while self._queue:
                await trio.sleep(0.02)
            return True
        return False
