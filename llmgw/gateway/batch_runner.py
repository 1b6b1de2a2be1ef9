"""`BatchRunner`: runs the lines of `/v1/batches` on the fleet's replicas while interactive load leaves room.

A low-priority queue beside the gateway's own requests: every `poll` seconds (at once when a batch is made or
cancelled here) the runner reads the store's active batches and runs each in a task of its own. A batch's task
claims its lines one at a time in the store (`Store.claim_batch_line`: one transaction each, so no two control planes
ever run one line) and starts each on the replica of its model with the most room (`batch_lines.batch_room`: the
table's `batch_slot_share` of the replica's slots, never while interactive requests fill them or wait in its engine's
queue); a line waits while no replica has room. A line runs through the gateway's own request path (admission,
routing, relay, settlement: `Gateway._run`, or `ResponsesApi.create` for /v1/responses) under a table that holds only
that replica, the model's batch prices and the project's daily token and budget limits (per-minute, concurrency and
request limits are left out: `batch_lines.batch_table`); its usage row names the batch. Its answer, whatever its
status, becomes the line's result in the store (`finish_batch_line`). When no line is left pending or running, the
output and error files are written with the batch's final status in one transaction ("completed"; "cancelled" once a
cancel's running lines ended, the finished ones kept; "expired" past the completion window, its unrun lines error
lines with code batch_expired).

Only a runner whose `leading()` is true works (the control plane's leader): a restart or a failover resumes every
active batch where the store says it is; the lines a killed control plane had running are handed back
(`requeue_batch_lines`) and sent again. No line runs twice on an engine: before a line's request leaves, the runner
writes in the store the replica it goes to (`send_batch_line`, which also fails when the line is no longer this
runner's: then it is not sent), and the request carries the line's once key (`batch_lines.line_once_key`, as
`llmgw-once`); that replica's engine relay, part of the shard's process and not of any control plane, runs a
request of a key once, to its end whoever still waits, and keeps its answer (`llmgw.engines.relay_once`). A line
handed back goes to the replica it was sent to (waiting up to SENT_TO_WAIT_SECONDS for it to be routable again),
and gets the kept answer, or joins the request still running.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import trio

from llmgw.errors import LlmgwError
from llmgw.gateway.accounting import new_request_id
from llmgw.gateway.batch_lines import (
    batch_room, batch_table, error_line, line_once_key, result_line, usage_of,
)
from llmgw.gateway.files import new_file_id
from llmgw.gateway.problems import ApiError
from llmgw.gateway.request_context import Caller
from llmgw.gateway.request_ids import RequestIds
from llmgw.gateway.responses import PREFIX as RESPONSES_PREFIX
from llmgw.gateway.responses import with_omitted_nullables
from llmgw.gateway.responses_chat import context_items
from llmgw.gateway.validation import validate_request
from llmgw.routes import ReplicaRoute, RouteTable
from llmgw.store import ApiKey, BatchLine, BatchRecord, FileRecord
from llmgw.store.batches import ACTIVE

log = logging.getLogger("llmgw.gateway")
POLL_SECONDS = 1.0
"""Seconds between two reads of the active batches, and between two looks for room while a line waits."""
ROOM_POLL_SECONDS = 0.05
"""Seconds between two looks at the replicas' load while a claimed line waits for room."""
SENT_TO_WAIT_SECONDS = 60.0
"""How long a line that was sent before (by a runner that stopped) waits for that replica, whose engine relay holds
its answer, before it runs on another (that replica is gone or no longer serves the model: its engine with it)."""


class _Answer:
    """An ASGI `send` that keeps the status and body of one answer."""

    def __init__(self) -> None:
        self.status = 0
        self.parts: list[bytes] = []

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.parts.append(message.get("body", b""))

    def body(self):
        raw = b"".join(self.parts)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")


async def _never() -> dict:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _slots(replica: ReplicaRoute) -> int:
    return replica.speed.slots if replica.speed is not None and replica.speed.slots > 0 else 1


class BatchRunner:
    """Runs `gateway`'s store's batches (see the module docstring) as `holder` (the control plane's lease holder
    name: what the store's line claims carry). `leading()`: whether to work now (default: always). `waiting(replica
    id)`: requests its engine reports queued (default: 0, unknown). `poll`: seconds between two reads of the store."""

    def __init__(self, gateway, holder: str, *, leading: Callable[[], bool] = lambda: True,
                 waiting: Callable[[str], int] = lambda replica_id: 0, poll: float = POLL_SECONDS):
        self.gateway, self.holder, self.leading, self.waiting, self.poll = gateway, holder, leading, waiting, poll
        self.in_flight: dict[str, int] = {}  # batch requests in flight per replica id, from this runner
        self._running: set[str] = set()  # batch ids with a task here

    async def _call(self, function, *args):
        return await self.gateway.accounting.boundary.call(function, *args)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run batches until cancelled (the lines in flight are cancelled too, and sent again by whoever runs the
        batch next: their engine relays run each once). A store that cannot be read now is tried again after `poll`
        seconds."""
        store = self.gateway.accounting.store
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                changed = self.gateway.batches.changed
                if self.leading():
                    try:
                        active = await self._call(store.active_batches)
                    except LlmgwError as error:
                        log.warning("batches: cannot read the active batches: %s", type(error).__name__)
                        active = []
                    for record in active:
                        if record.id not in self._running:
                            self._running.add(record.id)
                            nursery.start_soon(self._run_batch, record.id)
                with trio.move_on_after(self.poll):
                    await changed.wait()

    async def _run_batch(self, batch_id: str) -> None:
        store = self.gateway.accounting.store
        try:
            await self._call(store.requeue_batch_lines, batch_id, self.holder)
            async with trio.open_nursery() as lines:
                while self.leading():
                    record = await self._call(store.batch, batch_id)
                    if record is None or record.status != "in_progress" or time.time() >= record.body["expires_at"]:
                        break
                    line = await self._call(store.claim_batch_line, batch_id, self.holder, time.time())
                    if line is None:
                        break
                    replica, table = await self._wait_for_room(record, line)
                    if replica is None and table is None:  # cancelled (or no longer leading) while it waited
                        await self._call(store.release_batch_line, batch_id, line.line, self.holder)
                        break
                    if replica is not None:
                        if not await self._call(store.send_batch_line, batch_id, line.line, self.holder,
                                                replica.replica_id):
                            continue  # handed to another runner meanwhile: it sends it, not this one
                        self.in_flight[replica.replica_id] = self.in_flight.get(replica.replica_id, 0) + 1
                    lines.start_soon(self._run_line, record, line, table, replica)
            if self.leading():
                await self._finish(batch_id)
        except LlmgwError as error:
            log.warning("batches: %s paused, the store failed: %s", batch_id, type(error).__name__)
        finally:
            self._running.discard(batch_id)

    async def _wait_for_room(self, record: BatchRecord, line: BatchLine
                             ) -> tuple[ReplicaRoute | None, RouteTable | None]:
        """The replica to run `line` on and the table it runs under, once one has room (the replica it was sent to
        before, if any, for up to SENT_TO_WAIT_SECONDS); (None, table) when the line cannot run anywhere (an unknown
        model: it runs to its refusal); (None, None) when the batch was cancelled, its completion window ended or
        this runner stopped leading meanwhile (the line is handed back)."""
        body = json.loads(line.request).get("body") or {}
        model = body.get("model")
        checked = began = trio.current_time()
        while True:
            table = self.gateway.table
            route = table.resolve(model) if isinstance(model, str) else None
            project = table.projects.get(record.project)
            held = line.sent_to is not None and trio.current_time() - began < SENT_TO_WAIT_SECONDS
            if route is None or project is None:
                if not held:
                    return None, table
                replicas: tuple[ReplicaRoute, ...] = ()  # not routable here yet: wait for the replica it was sent to
            else:
                replicas = tuple(r for r in route.replicas if r.replica_id == line.sent_to) if held else route.replicas
            load = self.gateway.balancer.load()
            best, most = None, 0
            for replica in replicas:
                ours = self.in_flight.get(replica.replica_id, 0)
                interactive = max(0, load.get(replica.replica_id, 0) - ours)
                room = batch_room(_slots(replica), interactive + ours, ours, table.batch_slot_share,
                                  self.waiting(replica.replica_id))
                if room > most and not self.gateway.balancer.is_ejected(replica.replica_id, trio.current_time()):
                    best, most = replica, room
            if best is not None and route is not None and project is not None and not table.stopped:
                return best, batch_table(table, route, best, project)
            await trio.sleep(ROOM_POLL_SECONDS)
            if trio.current_time() - checked >= self.poll:
                checked = trio.current_time()
                latest = await self._call(self.gateway.accounting.store.batch, record.id)
                if (not self.leading() or latest is None or latest.status != "in_progress"
                        or time.time() >= record.body["expires_at"]):
                    return None, None

    async def _run_line(self, record: BatchRecord, line: BatchLine, table: RouteTable,
                        replica: ReplicaRoute | None) -> None:
        """Run one claimed line through the gateway and keep its result (shielded: a result is never lost to a
        cancel once the answer came). An unexpected exception fails this line alone (status 500, `internal_error`,
        logged with its traceback) instead of ending the runner's nursery and every batch with it."""
        gateway = self.gateway
        endpoint = record.body["endpoint"]
        body = {**(json.loads(line.request)["body"]), "stream": False}
        if endpoint == "/v1/embeddings":
            body.pop("stream")
        key = ApiKey(name=None, prefix="", created_at=record.created_at, key_id=record.key_id or "",
                     project=record.project)
        project = table.projects.get(record.project)
        caller = Caller(key, project, RequestIds(new_request_id()), None, time.perf_counter(), batch=record.id,
                        once=line_once_key(record.id, line.line))
        answer = _Answer()
        try:
            if project is None:
                raise ApiError(403, f"The project '{record.project}' of this batch is no longer in projects.yaml.",
                               "invalid_request_error", "project_unknown")
            if endpoint == RESPONSES_PREFIX:
                checked = with_omitted_nullables(body)
                validate_request(RESPONSES_PREFIX, checked)
                if checked.get("previous_response_id") is not None:
                    raise ApiError(400, "A batch's /v1/responses line cannot name previous_response_id; send the "
                                        "whole input.", "invalid_request_error", "unsupported_in_batch",
                                   "previous_response_id")
                await gateway.responses.create(caller, table, (checked, context_items((), (), checked), body),
                                               answer.send, _never)
            else:
                validate_request(endpoint, body)
                raw = json.dumps(body, separators=(",", ":")).encode()
                ctx = await gateway.admission.admit(caller, table, endpoint, body, raw)
                await gateway._run(ctx, answer.send, _never)
        except ApiError as error:
            answer.status, answer.parts = error.status, [error.body()]
        except Exception:  # a bug, or an answer this code could not read: this line fails, its batch goes on
            log.exception("batches: line %d of %s failed unexpectedly", line.line, record.id)
            error = ApiError(500, "This line failed inside the gateway (its log has the cause); the other lines of "
                                  "the batch go on.", "server_error", "internal_error")
            answer.status, answer.parts = error.status, [error.body()]
        finally:
            if replica is not None:
                self.in_flight[replica.replica_id] -= 1
        ok = 200 <= answer.status < 300
        result = result_line(line.custom_id, caller.ids.own, answer.status, answer.body())
        with trio.CancelScope(shield=True):
            await self._keep(record.id, line.line, ok, result)

    async def _keep(self, batch_id: str, line: int, ok: bool, result: str) -> None:
        """Write a line's result, retrying a store that cannot be reached for up to a minute."""
        store = self.gateway.accounting.store
        for attempt in range(12):
            try:
                await self._call(store.finish_batch_line, batch_id, line, self.holder, ok, result)
                return
            except LlmgwError as error:
                log.warning("batches: cannot keep a result of %s yet: %s", batch_id, type(error).__name__)
                await trio.sleep(min(5.0, 0.5 * 2 ** attempt))

    async def _finish(self, batch_id: str) -> None:
        """Give the batch its final status and files once none of its lines is running, and none pending unless it
        was cancelled or expired (its pending lines then become batch_expired error lines)."""
        store = self.gateway.accounting.store
        record = await self._call(store.batch, batch_id)
        if record is None or record.status not in ACTIVE or record.counts.running:
            return
        now = time.time()
        expired = record.status == "in_progress" and now >= record.body["expires_at"]
        if expired:
            while (line := await self._call(store.claim_batch_line, batch_id, self.holder, now)) is not None:
                await self._keep(batch_id, line.line, False, error_line(
                    line.custom_id, "batch_expired", "The batch's completion window ended before this line ran."))
            record = await self._call(store.batch, batch_id)
        elif record.status == "in_progress" and record.counts.pending:
            return  # claimed by someone else meanwhile, or a line handed back: the next pass goes on
        status = "cancelled" if record.status == "cancelling" else "expired" if expired else "completed"
        results = await self._call(store.batch_results, batch_id)
        body = {**record.body, "finalizing_at": int(now), f"{status}_at": int(time.time()),
                "usage": usage_of(r for r in results if r.state == "completed")}
        outputs = []
        for state, field, name in (("completed", "output_file_id", "output"), ("failed", "error_file_id", "error")):
            data = "".join(r.result + "\n" for r in results if r.state == state and r.result).encode()
            if data:
                made = FileRecord(new_file_id(), record.project, "batch_output", f"{batch_id}_{name}.jsonl", len(data),
                                  now, now + self.gateway.table.files_retention_seconds)
                outputs.append((made, data))
                body[field] = made.id
        if await self._call(store.update_batch, batch_id, (record.status,), status, body, outputs):
            log.info("batches: %s %s (%d lines: %d completed, %d failed)", batch_id, status, record.counts.total,
                     record.counts.completed, record.counts.failed)
