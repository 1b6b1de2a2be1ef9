"""The gateway: the OpenAI-compatible API in front of the fleet's replicas and external endpoints.

Endpoints: GET /v1/models, GET /v1/models/{model}, POST /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/responses (and GET, DELETE /v1/responses/{id}, POST /v1/responses/input_tokens: `responses`),
/v1/files (upload, list, retrieve, content, delete: `files`), /v1/batches (create, list, retrieve, cancel: `batches`,
run by `batch_runner.BatchRunner` on idle capacity),
POST /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API), /v1/rerank, /v1/score (`dialects`),
GET /health. (The gateway's Prometheus counters are served with the fleet's on the admin listener's /metrics,
see llmgw.control.metrics; the API port has no /metrics.)

A proxied request goes through three stages, each handing the next one value (`request_context`):
1. admission (`admission.Admission`): key (store) -> project (a `Caller`) -> when the body may be over 1 MiB, the
   project's concurrency slots (`early_slots`; a 429 before any of the body is read) -> body (size limit, read
   deadline and minimum rate) -> bounded JSON and OpenAI's request schema (`validation`) -> model (catalog names
   and aliases only) -> project allowlist -> serving stopped? -> ready replicas? -> quota reservation (store;
   `limits`: the engine is held to the reserved max_tokens when tokens or budget are limited) -> a frozen
   `RequestContext` naming the route's routing policy (`routing_policies`);
2. `_run`: the prompt's blocks for precise routing (`_prompt_blocks`), then forward and relay (`proxying`: the
   policy chooses the replica; an internal replica gets the catalog name as `model`), what the relay learns going
   into the request's `Ledger`;
3. `_settle`: settle with the ledger's usage and record it (spooled, then one store transaction, waited for at most
   `settle_wait` before the response ends).
Store calls that may wait run in worker threads; SQLite writes that need not wait run on the event loop
(accounting.Accounting, llmgw.store.boundary). The concurrency slot is released on success, error, cancellation and
client disconnect. Health probes of the replicas run beside (`health.HealthProbes`).
A request whose body reached an engine is billed its prompt (estimated when the engine's usage never came) even if
the client left before the answer.

Limits of our own, stated: request bodies up to `RouteTable.max_request_body_bytes` (default 10 MiB), read within
10 s plus one second per 16 KiB (`asgi.read_body`); JSON and field bounds in `validation`; upstream connect 5 s,
response head 600 s, silence between two body reads 300 s (`upstream.Timeouts`); no limit on a stream's total
duration; hypercorn keep-alive 75 s between client requests; HTTP/2: at most MAX_STREAMS_PER_CONNECTION (100)
concurrent streams per client connection. A model name that is not in the catalog is counted and recorded as
`admission.UNKNOWN_MODEL`, so clients cannot grow metric label sets or usage rows with names of their choosing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from llmgw.gateway.holding import Holding
from llmgw.gateway.accounting import DEFAULT_SETTLE_WAIT, Accounting, cost_of, new_request_id, ratelimit_headers
from llmgw.gateway.admission import (
    CLEANUP_SECONDS, KEY_CACHE_SECONDS, Admission, keep_slots, project_of,
)
from llmgw.gateway.asgi import (
    BODY_GRACE_SECONDS, BODY_MIN_BYTES_PER_SECOND, Disconnected, header_map, send_error, send_json, serve_lifespan,
)
from llmgw.gateway.dialects import HANDLERS as DIALECTS
from llmgw.gateway.dialects import serve_dialect
from llmgw.gateway.batches import PREFIX as BATCHES_PREFIX
from llmgw.gateway.batches import BatchesApi
from llmgw.gateway.files import PREFIX as FILES_PREFIX
from llmgw.gateway.files import FilesApi
from llmgw.gateway.draining import DRAIN_TIMEOUT, Drain, close_header, cut_error, draining_error, serve_http
from llmgw.gateway.health import HealthProbes
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.probing import HEALTH_PROBE_CONCURRENCY
from llmgw.gateway.native import ENGINE_API_HEADER
from llmgw.gateway.problems import ApiError, model_not_found
from llmgw.gateway.proxying import open_upstream, relay_stream, relay_whole
from llmgw.gateway.request_context import STATUS_CLIENT_CLOSED, Caller, Ledger, RequestContext
from llmgw.gateway.request_ids import RequestIds, client_request_id, trace_id_of
from llmgw.gateway.responses import PREFIX as RESPONSES_PREFIX
from llmgw.gateway.responses import ResponsesApi
from llmgw.gateway.routing import Balancer, PromptBlocks
from llmgw.gateway.routing_prefix import hashing_scheme, held_by_replica, prompt_blocks, tokenize_body
from llmgw.gateway.streaming import error_event
from llmgw.gateway.tokenizing import engine_tokens
from llmgw.gateway.tracing import GatewayTracing, RequestTrace
from llmgw.gateway.upstream import Timeouts, UpstreamPool
from llmgw.gateway.validation import parse_body, validate_request
from llmgw.routes import BlockSnapshot, ReplicaRoute, RouteTable
from llmgw.store import UsageRecord

log = logging.getLogger("llmgw.gateway")

PROXIED = {"/v1/chat/completions": "/v1/chat/completions", "/v1/completions": "/v1/completions",
           "/v1/embeddings": "/v1/embeddings"}
HEALTH_INTERVAL = 5.0
MAX_STREAMS_PER_CONNECTION = 100


class Gateway:
    """The OpenAI-compatible API of one control plane.

    `store`: an `llmgw.store.Store` (keys, quotas, usage), called through `Accounting` (worker threads, usage
    through a spool in `spool_dir`: None puts it beside a SQLite store's file; a PostgreSQL store needs one).
    `settle_wait`: seconds a request waits for the store to commit its usage before its answer ends anyway.
    `table`: the routing table in force (replace it with
    `set_table`). `registry`: a prometheus CollectorRegistry (None: a fresh one). `timeouts`: upstream timeouts.
    `key_cache_seconds`: an accepted API key is remembered (by SHA-256 of the key) that long, so a revocation
    takes effect within that time (default 2 s). `body_grace_seconds` and `body_min_bytes_per_second`: the request
    body's read deadline and minimum rate (`asgi.read_body`). `tracing`: spans of sampled requests
    (`llmgw.gateway.tracing`; None: off). `asgi_app` is the ASGI callable for embedding. `journal`: keep each
    admitted request in the spool while it is in flight (`Accounting.open_entry`), so that if this process is
    killed it is billed what it reserved (status `admission.STATUS_PROCESS_LOST`) when the spool is next opened;
    gateway worker processes set it (`llmgw.gateway.worker`). `clock`: epoch seconds as quota reservations see them
    (default `time.time`; tests drive the sliding per-minute limits with it). `drain_timeout`: seconds the requests
    in flight get to finish when the gateway stops (`drain`, or `serve` cancelled; see `llmgw.gateway.draining`).

    Every proxied request gets a unique id (`new_request_id`, "req_" + 32 hex digits), sent to the engine as its
    `x-request-id` and kept as the key of its usage record. A client's own `x-request-id` (visible ASCII, at most
    128 characters) is accepted beside it: answered back in `x-request-id` (the gateway's own id then in
    `x-llmgw-request-id`) and kept in the usage record; without one, `x-request-id` answers the gateway's id. Both
    are answered on refusals too, and `llmgw usage --request ID` finds the request by either
    (`llmgw.gateway.request_ids`). The usage record also keeps the replica's settings commit and the trace id.
    """

    def __init__(self, store, table: RouteTable, *, registry=None, timeouts: Timeouts = Timeouts(),
                 spool_dir: str | Path | None = None, settle_wait: float = DEFAULT_SETTLE_WAIT,
                 health_interval: float = HEALTH_INTERVAL, health_concurrency: int = HEALTH_PROBE_CONCURRENCY,
                 key_cache_seconds: float = KEY_CACHE_SECONDS,
                 body_grace_seconds: float = BODY_GRACE_SECONDS,
                 body_min_bytes_per_second: float = BODY_MIN_BYTES_PER_SECOND,
                 tracing: GatewayTracing | None = None, journal: bool = False,
                 clock: Callable[[], float] = time.time, drain_timeout: float = DRAIN_TIMEOUT):
        self.store = store
        self.drain_state = Drain(drain_timeout)
        self.tracing = tracing
        self.accounting = Accounting(store, spool_dir, settle_wait=settle_wait)
        self.table = table
        self.blocks = BlockSnapshot()
        self.metrics = GatewayMetrics(registry)
        self.balancer = Balancer()
        self.pool = UpstreamPool(timeouts)
        self.admission = Admission(self.accounting, self.metrics, key_cache_seconds=key_cache_seconds,
                                   body_grace_seconds=body_grace_seconds,
                                   body_min_bytes_per_second=body_min_bytes_per_second, journal=journal)
        self.admission.clock = clock
        self.holding = self.admission.holding = Holding(lambda: self.table)
        self.probes = HealthProbes(self.pool, self.balancer, health_interval, health_concurrency)
        self._replicas_of: RouteTable | None = None  # the table _replicas_by_id was built from
        self._replicas_by_id: dict[str, ReplicaRoute] = {}
        # what GET /health adds to {"status": "ok"} (the control plane sets {"leader": bool}, and "status":
        # "recovering" while it learns its fleet back: then the answer is 503, see llmgw.control.recovering)
        self.health_details: Callable[[], dict[str, Any]] = dict
        self.metrics.observe_table(table)
        self.responses = ResponsesApi(self)  # /v1/responses (llmgw.gateway.responses)
        self.files = FilesApi(self)  # /v1/files (llmgw.gateway.files)
        self.batches = BatchesApi(self)  # /v1/batches (llmgw.gateway.batches; run by llmgw.gateway.batch_runner)

    def set_table(self, table: RouteTable) -> None:
        """Route by `table` from the next request on (requests in flight finish where they are)."""
        self.table = table
        self.metrics.observe_table(table)
        self.holding.table_changed()

    def set_blocks(self, blocks: BlockSnapshot) -> None:
        """Route by the prefix-cache blocks in `blocks` from the next request on (`llmgw.control.kv_blocks`)."""
        self.blocks = blocks

    async def _prompt_blocks(self, ctx: RequestContext) -> PromptBlocks | None:
        """Precise routing's inputs for this request, or None (the approximate policy decides): None when no
        replica of its route reports its blocks with a reproducible hashing, when the prompt is unlikely to fill one
        block (estimated under half a block), has no single prompt, or the engine could not tokenise it, and for a
        LoRA adapter (`routing_prefix.prompt_blocks` says why).
        The tokens come from the least loaded reporting replica's `/tokenize` (`llmgw.gateway.tokenizing`)."""
        route, snapshot = ctx.route, self.blocks
        if route.adapter_of is not None:  # vLLM hashes an adapter's blocks with its path on the node: unknown here
            return None
        scheme = hashing_scheme(route.replicas, snapshot) if snapshot.replicas else None
        if scheme is None or ctx.prompt_estimate * 2 < scheme.block_size:
            return None
        held = held_by_replica(route.replicas, snapshot, scheme)
        reporting = [r for r in route.replicas if held[r.replica_id] is not None]
        load = self.balancer.load()
        ask = min(reporting, key=lambda r: load.get(r.replica_id, 0))
        request = tokenize_body(ctx.path, ctx.body, ask.upstream_model or route.name)
        if request is None:
            return None
        tokens = request if isinstance(request, list) else await engine_tokens(self.pool, ask, request)
        if tokens is None:
            return None
        return PromptBlocks(tuple(prompt_blocks(tokens, scheme)), held)

    # ---- serving ----
    async def serve(self, host: str, port: int, *, fd: int | None = None,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve HTTP on hypercorn's trio connections until drained, health-checking each replica every
        `health_interval` seconds (`watch_health`). `task_status.started(bound_port)` (port 0 picks a free one).
        `fd`: a bound TCP socket's file descriptor to serve instead of binding `host`:`port` (a gateway worker's
        SO_REUSEPORT socket, `llmgw.gateway.worker`); hypercorn owns it from then on.
        Returns once `drain()` has run; cancelled, it drains first (shielded: at most the drain timeout plus
        `draining.CUT_GRACE` and hypercorn's graceful timeout), then re-raises the cancellation."""
        from hypercorn.config import Config

        from llmgw.gateway.client_writes import install

        install()  # writes to clients without a scheduler pass each (client_writes)
        config = Config()
        config.bind = [f"fd://{fd}" if fd is not None else f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.accesslog = None
        config.loglevel = "WARNING"
        config.keep_alive_timeout = 75
        config.keep_alive_max_requests = 1_000_000  # hypercorn's default (1000) closes busy client connections
        config.read_timeout = None
        config.graceful_timeout = 5  # after the drain: connections still open (idle ones close at once)
        config.include_server_header = False  # one header less to build and validate per response
        config.h2_max_concurrent_streams = MAX_STREAMS_PER_CONNECTION
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(await nursery.start(self._serve_until_drained, config))
                try:
                    await self.drain_state.done.wait()
                finally:  # cancelled (the control plane stops) or drained: requests in flight finish first
                    with trio.CancelScope(shield=True):
                        await self.drain_state.run()
        finally:
            with trio.move_on_after(2, shield=True):
                await self.pool.aclose()
                if self.tracing is not None:
                    await trio.to_thread.run_sync(self.tracing.shutdown)
            self.accounting.close()

    async def _serve_until_drained(self, config, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """hypercorn (`draining.serve_http`), health probes and the accounting, shielded from cancellation: they
        end once the drain is done and the connections have closed (`serve` drains when it is cancelled)."""
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as beside:
                beside.start_soon(self.watch_health)
                beside.start_soon(self.responses.purge_expired_periodically)
                beside.start_soon(self.files.purge_expired_periodically)
                await beside.start(self.accounting.run)
                async with trio.open_nursery() as serving:
                    task_status.started(await serving.start(serve_http, self.asgi_app, config, self.drain_state))
                beside.cancel_scope.cancel()

    async def drain(self) -> None:
        """Stop serving gracefully (`llmgw.gateway.draining`): refuse new connections and requests (503 with
        Retry-After), let the requests in flight finish for the drain timeout, cut the rest (billed, with an error);
        `serve` returns after. Returns when the requests are done. A checkpoint."""
        await self.drain_state.run()

    async def asgi_app(self, scope, receive, send) -> None:
        """The ASGI application (HTTP and lifespan)."""
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await serve_lifespan(receive, send)

    async def _http(self, scope, receive, send) -> None:
        path, method = scope["path"], scope["method"]
        if self.drain_state.draining:  # arrived on a connection kept alive: refused, and the connection closes
            health = path in ("/health", "/healthz")
            body = {"status": "draining", **{k: v for k, v in self.health_details().items() if k != "status"}}
            await (send_json(send, 503, body, close_header(scope)) if health
                   else send_error(send, draining_error(), close_header(scope)))
        elif path in ("/health", "/healthz"):
            health = {"status": "ok", **self.health_details()}
            await send_json(send, 200 if health["status"] == "ok" else 503, health)
        else:
            with self.drain_state.counted():
                await self._request(scope, receive, send, path, method)

    async def _request(self, scope, receive, send, path: str, method: str) -> None:
        ids = trace = None
        try:
            if path in PROXIED:
                headers = header_map(scope)
                ids, trace = self._ids(path, headers)
                if method != "POST":
                    raise ApiError(405, f"{path} takes POST.", "invalid_request_error", "method_not_allowed")
                await self._proxied(receive, send, headers, PROXIED[path], ids, trace)
            elif path == RESPONSES_PREFIX or path.startswith(RESPONSES_PREFIX + "/"):
                headers = header_map(scope)
                ids, trace = self._ids(path, headers)
                await self.responses.serve(scope, receive, send, headers, ids, trace)
            elif path in (FILES_PREFIX, BATCHES_PREFIX) or path.startswith((FILES_PREFIX + "/", BATCHES_PREFIX + "/")):
                headers = header_map(scope)
                ids, trace = self._ids(path, headers)
                api = self.files if path.startswith(FILES_PREFIX) else self.batches
                await api.serve(scope, receive, send, headers, ids)
                if trace is not None:
                    trace.end(200)
            elif path in DIALECTS:  # Anthropic's Messages API, rerank and score (llmgw.gateway.dialects)
                await serve_dialect(self, scope, receive, send, path, method)
            elif path == "/v1/models" or path.startswith("/v1/models/"):
                await self._models(scope, send, path[len("/v1/models/"):] if path != "/v1/models" else None)
            else:
                raise ApiError(404, f"There is no {method} {path} here; the API is under /v1.",
                               "invalid_request_error", "unknown_url")
        except ApiError as error:
            if trace is not None:
                trace.end(error.status)
            await send_error(send, error, ids.headers() if ids is not None else None)
        except Disconnected:
            return
        finally:
            if trace is not None:  # a request that ended without a settlement (a disconnect while reading)
                trace.end(STATUS_CLIENT_CLOSED)

    async def _models(self, scope, send, one: str | None) -> None:
        if scope["method"] != "GET":
            raise ApiError(405, "/v1/models takes GET.", "invalid_request_error", "method_not_allowed")
        policy = project_of(self.table, await self.admission.authenticate(header_map(scope)))
        entries = []
        for name, route in self.table.models.items():
            if policy.models is not None and name not in policy.models:
                continue
            for model_id in (name, *route.aliases):
                entry = {"id": model_id, "object": "model", "created": route.created, "owned_by": "llmgw"}
                if route.adapter_of is not None:  # a LoRA adapter: the model it runs on, as vLLM lists its own
                    entry["parent"] = route.adapter_of
                entries.append(entry)
        if one is not None:
            for entry in entries:
                if entry["id"] == one:
                    await send_json(send, 200, entry)
                    return
            raise model_not_found(one)
        await send_json(send, 200, {"object": "list", "data": entries})

    def _ids(self, path: str, headers: dict[bytes, bytes]) -> tuple[RequestIds, RequestTrace | None]:
        """A new request's ids (`llmgw.gateway.request_ids`) and its trace (None: not traced)."""
        own = new_request_id()
        client = client_request_id(headers.get(b"x-request-id"))
        traceparent = headers.get(b"traceparent")
        trace = self.tracing.begin(path, own, traceparent, client) if self.tracing is not None else None
        trace_id = trace.trace_id if trace is not None else trace_id_of(traceparent)
        return RequestIds(own, client, trace_id), trace

    async def _proxied(self, receive, send, headers: dict[bytes, bytes], upstream_path: str, ids: RequestIds,
                       trace: RequestTrace | None) -> None:
        """Admit (`admission`: key, project, body, schema, model, quotas), then forward and relay (`_run`). Raises
        ApiError for a refusal (recorded first when the key was accepted), Disconnected when the client left."""
        started = time.perf_counter()
        admission = self.admission
        key = await admission.authenticate(headers)
        caller = Caller(key, project_of(self.table, key), ids, trace, started)
        table = self.table
        raw = await admission.receive_body(caller, table, receive, headers)
        body = parse_body(raw)
        validate_request(upstream_path, body)
        await self._run(await admission.admit(caller, table, upstream_path, body, raw), send, receive)

    async def _run(self, ctx: RequestContext, send, receive, relay=None) -> None:
        """Forward an admitted request; settle and record whatever happens (shielded from cancellation).
        `relay`: an object with `whole` and `stream` taking `relay_whole`'s arguments, which relays the engine's
        answer in another API's shape, and `cut_event(message)`, the bytes that end its stream when the drain cuts
        it (`responses.ResponsesRelay`, `native_relay`); None: relayed as it is (`proxying`)."""
        route, reservation, trace = ctx.route, ctx.reservation, ctx.caller.trace
        extra_headers = ctx.caller.ids.headers()
        if reservation is not None:
            extra_headers.extend(ratelimit_headers(reservation.headroom))
        ledger = Ledger()
        settled = False
        in_flight = self.metrics.child(self.metrics.in_flight, route.name)
        in_flight.inc()

        async def settle() -> None:
            nonlocal settled
            if settled:
                return
            settled = True
            with trio.move_on_after(CLEANUP_SECONDS, shield=True):
                await self._settle(ctx, ledger)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope, ledger)
                if reservation is not None and reservation.slots:
                    nursery.start_soon(keep_slots, self.accounting, reservation)
                with self.drain_state.cuttable() as cut:
                    await self._forward(ctx, send, ledger, extra_headers, settle, relay)
                if cut.cancelled_caught:  # the drain timeout passed: billed what it used, ended with an error
                    await self._cut(ctx, send, ledger, extra_headers, settle, relay)
                nursery.cancel_scope.cancel()
        finally:
            in_flight.dec()
            if not settled:
                if ledger.status in (0, 200) or ledger.started_response:
                    ledger.status = STATUS_CLIENT_CLOSED
                await settle()

    async def _forward(self, ctx: RequestContext, send, ledger: Ledger, extra_headers: list[tuple[bytes, bytes]],
                       settle, relay=None) -> None:
        """Choose a replica, forward, relay its answer (`proxying`); an ApiError is settled and answered."""
        route, trace = ctx.route, ctx.caller.trace
        try:
            blocks = await self._prompt_blocks(ctx) if ctx.policy.by_prefix else None
            try:
                response = await open_upstream(ctx, self.pool, self.balancer, ledger, blocks)
                if response.status == 404 and getattr(relay, "translation", None) is not None:
                    await response.aclose()  # the engine's build lacks the native path: translated to chat
                    self.balancer.finished(ledger.replica.replica_id)
                    log.info("%s: replica %s answered 404 at %s; translated to chat", route.name,
                             ledger.replica.replica_id, ctx.path)
                    ctx, relay = relay.fall_back()
                    response = await open_upstream(ctx, self.pool, self.balancer, ledger, blocks)
            finally:
                if ledger.routing:
                    self.metrics.child(self.metrics.routing_decisions, route.name, ledger.routing).inc()
            if trace is not None:
                trace.responded(ledger.replica)
            try:
                extra = [*extra_headers, (b"x-llmgw-replica", ledger.replica.replica_id.encode()),
                         (ENGINE_API_HEADER, ctx.path.encode())]  # the engine's path that answered (`native`)
                if ctx.stream:
                    await (relay.stream if relay else relay_stream)(ctx, response, send, ledger, extra, settle)
                else:
                    await (relay.whole if relay else relay_whole)(ctx, response, send, ledger, extra, settle)
            finally:
                await response.aclose()
                self.balancer.finished(ledger.replica.replica_id)
        except ApiError as error:
            ledger.status = error.status
            await settle()
            await send_error(send, error, extra_headers)

    async def _cut(self, ctx: RequestContext, send, ledger: Ledger, extra_headers: list[tuple[bytes, bytes]],
                   settle, relay=None) -> None:
        """End a request the drain cut: settle what it used (status 503), then answer 503, or end a stream whose head
        went out with an error event (`data: {"error": ...}`), so the client sees a well-formed end, never a reset."""
        error = cut_error()
        ledger.status = error.status
        if getattr(relay, "translated", None):  # a native relay that fell back: the translation ends the stream
            relay = relay.translated[0]
        await settle()
        with trio.move_on_after(CLEANUP_SECONDS, shield=True):
            if not ledger.started_response:
                await send_error(send, error, extra_headers)
            elif ctx.stream:  # a relay in another dialect ends its stream its own way (`cut_event`)
                await send({"type": "http.response.body", "more_body": False,
                            "body": relay.cut_event(error.message) if relay is not None
                            else error_event(error.message, error.error_type, error.code)})

    async def _settle(self, ctx: RequestContext, ledger: Ledger) -> None:
        """Settle (or, when nothing reached an engine, release) the reservation and record the usage from `ledger`:
        one spooled settlement, one store transaction (see Accounting.settle)."""
        caller, route = ctx.caller, ctx.route
        prompt, generated = ledger.billed_tokens(ctx.prompt_estimate)
        replica = ledger.replica
        cost = cost_of(route, prompt, generated)
        record = UsageRecord(project=caller.project.name, model=route.name, time=time.time(),
                             key_id=caller.key.key_id, replica=replica.replica_id if replica else None,
                             node=replica.node_id if replica else None, prompt_tokens=prompt,
                             completion_tokens=generated, cached_tokens=ledger.cached_tokens,
                             ttft_seconds=ledger.ttft_seconds, duration_seconds=time.perf_counter() - caller.started,
                             status=ledger.status, cost=cost, client_request_id=caller.ids.client,
                             settings_commit=replica.settings_commit if replica else None, trace_id=caller.ids.trace,
                             batch_id=caller.batch)
        await self.accounting.settle(ctx.reservation, prompt + generated if (prompt or generated) else None, cost,
                                     record, caller.ids.own)
        if caller.trace is not None:
            caller.trace.end(ledger.status, record)
        labels = (route.name, caller.project.name)
        self.metrics.count_request(route.name, caller.project.name, ledger.status)
        self.metrics.child(self.metrics.duration, route.name).observe(record.duration_seconds)
        if ledger.ttft_seconds is not None:
            self.metrics.child(self.metrics.ttft, route.name).observe(ledger.ttft_seconds)
        if prompt:
            self.metrics.child(self.metrics.prompt_tokens, *labels).inc(prompt)
        if generated:
            self.metrics.child(self.metrics.completion_tokens, *labels).inc(generated)

    # ---- health ----
    def _replicas(self) -> dict[str, ReplicaRoute]:
        """The routing table's replicas by id (a replica of several models once), built once per table."""
        if self._replicas_of is not self.table:
            self._replicas_by_id = {r.replica_id: r for route in self.table.models.values() for r in route.replicas}
            self._replicas_of = self.table
        return self._replicas_by_id

    async def check_health(self) -> None:
        """Probe every replica once, now (at most `health_concurrency` at a time), and return when all are done
        (`health.HealthProbes.check`)."""
        await self.probes.check(self._replicas())

    async def watch_health(self) -> None:
        """Probe each replica once every `health_interval` seconds until cancelled, each at its own phase of the
        interval, at most `health_concurrency` at once (`health.HealthProbes.watch`)."""
        await self.probes.watch(self._replicas)


async def _watch_disconnect(receive, cancel_scope: trio.CancelScope, ledger: Ledger) -> None:
    """Cancel the request's work when the client disconnects (hypercorn delivers http.disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ledger.status = STATUS_CLIENT_CLOSED
            cancel_scope.cancel()
            return
