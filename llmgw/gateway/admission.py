"""Admission: from an HTTP request to an admitted `RequestContext`, or a refusal that is recorded.

The steps, in order (`Gateway._proxied` calls them): the API key (`authenticate`: store, or the cache of keys
accepted in the last `key_cache_seconds`) -> its project (`project_of`) -> the body (`receive_body`; when it may be over
1 MiB, held under the project's concurrency slots, `early_slots`) -> JSON and OpenAI's schema (`validation`, by the
caller) -> `admit`: the model (catalog names and aliases only) -> the project's allowlist -> serving stopped? ->
a ready replica? -> the quota reservation (prompt tokens: `token_bounds.prompt_token_bound`, never below the engine's
count; completion tokens: `limits`, max tokens or the route's context size, the engine held to the reserved
max_tokens when tokens or budget are limited and its context does not hold it) -> journaled (gateway workers) ->
the `RequestContext`, with the route's routing policy.

A refusal after the key was accepted is counted and recorded as a usage record of its status that consumed nothing
(`refused`); a model name that is not in the catalog is recorded as UNKNOWN_MODEL, so clients cannot grow metric
label sets or usage rows with names of their choosing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import trio

from llmgw.gateway.holding import WAKE_RETRY_SECONDS, Holding
from llmgw.gateway.accounting import Accounting, cost_of, estimate_prompt_tokens, ratelimit_headers
from llmgw.gateway.asgi import BODY_GRACE_SECONDS, BODY_MIN_BYTES_PER_SECOND, Disconnected, read_body
from llmgw.gateway.early_slots import body_may_be_big, slot_quotas
from llmgw.gateway.limits import completion_limit, enforced_fields, limits_tokens
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.problems import (
    ApiError,
    bad_request,
    forbidden,
    model_not_found,
    not_serving,
    unauthorized,
    unavailable,
)
from llmgw.gateway.request_context import Caller, RequestContext
from llmgw.gateway.routing import prefix_key
from llmgw.gateway.routing_policies import policy_of
from llmgw.gateway.token_bounds import prompt_token_bound
from llmgw.routes import ProjectPolicy, RouteTable
from llmgw.store import ApiKey, Rejection, Reservation, UsageRecord

NO_REPLICA_RETRY_SECONDS = 5.0
STOPPED_RETRY_SECONDS = 60.0
CLEANUP_SECONDS = 10.0
"""How long a release or a record of a request that is over may take, shielded from cancellation."""
SLOT_RENEW_SECONDS = 60.0
KEY_CACHE_SECONDS = 2.0
KEY_CACHE_ENTRIES = 10000
STATUS_PROCESS_LOST = 502
"""The status of a usage record billed for a request whose gateway process died before it settled (`journal`)."""
UNKNOWN_MODEL = "(unknown)"  # catalog names match ^[a-z0-9][a-z0-9._-]{0,62}$, so this is never one


def project_of(table: RouteTable, key: ApiKey) -> ProjectPolicy:
    """The policy of `key`'s project in `table`. Raises ApiError 403 when the project is not (or no longer) there."""
    policy = table.projects.get(key.project)
    if policy is None:
        raise forbidden(f"The project '{key.project}' of this API key is not in projects.yaml (removed, or never "
                        "added); ask your operator.", "project_unknown")
    return policy


async def keep_slots(accounting: Accounting, reservation: Reservation) -> None:
    """Renew a long request's concurrency slots every SLOT_RENEW_SECONDS until cancelled (the store expires them
    after its slot TTL, 300 s by default, so a crashed gateway cannot hold them for ever)."""
    while True:
        await trio.sleep(SLOT_RENEW_SECONDS)
        await accounting.renew(reservation, time.time())


class Admission:
    """The gateway's admission of requests: keys (with their cache), bodies, models, quotas.

    `accounting`: the store's calls (keys, reservations, usage); `metrics`: the gateway's counters.
    `key_cache_seconds`: an accepted API key is remembered (by SHA-256 of the key) that long, so a revocation takes
    effect within that time. `body_grace_seconds`, `body_min_bytes_per_second`: the body's read deadline and
    minimum rate (`asgi.read_body`). `journal`: keep each admitted request in the spool while it is in flight
    (`Accounting.open_entry`), billed what it reserved (STATUS_PROCESS_LOST) if this process dies before it settles.
    `clock` (an attribute, `time.time` unless the gateway sets another): epoch seconds as quota reservations see
    them (tests drive the sliding windows with it).
    """

    def __init__(self, accounting: Accounting, metrics: GatewayMetrics, *, key_cache_seconds: float = KEY_CACHE_SECONDS,
                 body_grace_seconds: float = BODY_GRACE_SECONDS,
                 body_min_bytes_per_second: float = BODY_MIN_BYTES_PER_SECOND, journal: bool = False):
        self.accounting = accounting
        self.clock: Callable[[], float] = time.time
        self.metrics = metrics
        self.key_cache_seconds = key_cache_seconds
        self.body_grace_seconds = body_grace_seconds
        self.body_min_bytes_per_second = body_min_bytes_per_second
        self.journal = journal
        self._keys: dict[bytes, tuple[ApiKey, float]] = {}
        self.holding: Holding | None = None  # requests held for a model waking from zero (the gateway sets it)

    async def authenticate(self, headers: dict[bytes, bytes]) -> ApiKey:
        """The API key of `Authorization: Bearer KEY` (or `x-api-key: KEY`, Anthropic's, or `api-key: KEY`), checked by the store (worker thread) or
        found in the cache of keys accepted in the last `key_cache_seconds`. Raises ApiError 401 naming what to
        send or why the key is refused."""
        raw = headers.get(b"authorization")
        token = None
        if raw is not None:
            scheme, _, value = raw.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                token = value.strip()
        for name in (b"x-api-key", b"api-key"):
            if not token and name in headers:
                token = headers[name].decode("latin-1").strip()
        if not token:
            raise unauthorized("No API key: send `Authorization: Bearer sk-llmgw-...` (or `x-api-key: sk-llmgw-...`; "
                               "ask your operator for a key).")
        now = time.time()
        digest = hashlib.sha256(token.encode()).digest()
        cached = self._keys.get(digest)
        if cached is not None and cached[1] > now and cached[0].state(now) == "active":
            return cached[0]
        check = await self.accounting.check_key(token, now)
        key = check.key
        if key is None:
            self._keys.pop(digest, None)
            raise unauthorized(check.message or "The API key is not valid here.")
        if len(self._keys) >= KEY_CACHE_ENTRIES:
            self._keys.clear()
        self._keys[digest] = (key, now + self.key_cache_seconds)
        return key

    async def receive_body(self, caller: Caller, table: RouteTable, receive,
                           headers: dict[bytes, bytes]) -> bytes:
        """The request's body (`asgi.read_body`: at most `table.max_request_body_bytes`, within the read deadline
        and minimum rate). A body that may be over 1 MiB (`early_slots.body_may_be_big`) is read holding the
        project's concurrency slots, released once it is read (a 429 refusal, recorded, before any byte is read
        when they are taken). Raises ApiError (400, 408, 413, 429, 503) or Disconnected."""
        early = slot_quotas(caller.project.quotas) if body_may_be_big(headers) else ()
        held = await self.reserve(caller, UNKNOWN_MODEL, early, 0, 0.0) if early else None
        try:
            if held is None:
                return await read_body(receive, headers, table.max_request_body_bytes,
                                       grace_seconds=self.body_grace_seconds,
                                       min_bytes_per_second=self.body_min_bytes_per_second)
            return await self._read_holding(held, receive, headers, table.max_request_body_bytes)
        finally:
            if held is not None:  # freed before the request's own reservation takes the slots again
                with trio.move_on_after(CLEANUP_SECONDS, shield=True):
                    await self.accounting.release(held)

    async def admit(self, caller: Caller, table: RouteTable, upstream_path: str, body: dict,
                    raw: bytes) -> RequestContext:
        """The request's context once `table` resolves its model, the project may use it, serving is on, a replica
        is ready and its quotas are reserved (in that order); journaled when `journal`. A refusal is recorded and
        raised as ApiError (400 empty model, 404, 403, 503, 429)."""
        requested = body["model"]
        if not requested:
            raise bad_request("The request has an empty `model`; name a model from GET /v1/models.", "missing_model",
                              "model")
        policy, ids, trace = caller.project, caller.ids, caller.trace
        route = table.resolve(requested)
        error: ApiError | None = None
        if route is None:
            error = model_not_found(requested)
        elif policy.models is not None and route.name not in policy.models:
            error = forbidden(f"The project '{policy.name}' may not use the model '{requested}'; "
                              "ask your operator to add it to the project's models in projects.yaml.")
        elif table.stopped:
            error = unavailable("Serving is stopped on this cluster (serving.stopped); try again later.",
                                "system_stopped", STOPPED_RETRY_SECONDS)
        elif not route.replicas and route.off:
            error = not_serving(route.name)
        elif not route.replicas and not (route.wakes and self.holding is not None):
            error = unavailable(f"No replica of model '{route.name}' is ready yet; retry in a few seconds.",
                                "model_not_ready", NO_REPLICA_RETRY_SECONDS)
        elif not route.replicas:
            assert self.holding is not None
            woken, why = await self.holding.wait_for_replica(route.name)
            if woken is None:
                error = unavailable(f"Model '{route.name}' was stopped while idle and is starting; {why}. Retry "
                                    "in a few seconds.", "model_waking", WAKE_RETRY_SECONDS)
            else:
                route = woken
        if trace is not None:
            trace.request(route.name if route else UNKNOWN_MODEL, body, policy.name)
        if error is not None:
            await self.refused(caller, route.name if route else UNKNOWN_MODEL, error.status)
            raise error
        assert route is not None
        embeddings = upstream_path.endswith("embeddings")
        prompt_estimate = estimate_prompt_tokens(body)
        prompt_bound = max(prompt_estimate, prompt_token_bound(body))  # reserved: never below the engine's count
        limit = completion_limit(body, embeddings, route.context_size)
        estimate = prompt_bound + limit.total
        cost = cost_of(route, prompt_bound, limit.total)
        reservation: Reservation | None = None
        if policy.quotas:
            reservation = await self.reserve(caller, route.name, policy.quotas, estimate, cost)
        if self.journal:  # billed what it reserved if this process dies before it settles
            self.accounting.open_entry(reservation, estimate, cost, UsageRecord(
                project=policy.name, model=route.name, time=time.time(), key_id=caller.key.key_id,
                prompt_tokens=prompt_bound, completion_tokens=limit.total, status=STATUS_PROCESS_LOST,
                cost=cost, client_request_id=ids.client, trace_id=ids.trace), ids.own)
        if trace is not None:
            trace.admitted(reservation is not None)
        routing = policy_of(route)
        options = body.get("stream_options")
        return RequestContext(
            caller=caller, route=route, policy=routing, path=upstream_path, body=body, raw=raw, requested=requested,
            stream=bool(body.get("stream")) and not embeddings,
            include_usage=bool(options.get("include_usage")) if isinstance(options, dict) else False,
            prompt_estimate=prompt_estimate,
            overrides=enforced_fields(body, limit, embeddings) if limits_tokens(policy) else {},
            reservation=reservation, prefix=prefix_key(route.name, body) if routing.by_prefix else None)

    async def _read_holding(self, held: Reservation, receive, headers, limit: int) -> bytes:
        """`read_body`, renewing `held`'s slots meanwhile (a 10 MiB body may take longer than the slot TTL).
        Its refusals (ApiError, Disconnected) are raised as they are, not grouped."""
        failure: ApiError | Disconnected | None = None
        raw = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_slots, self.accounting, held)
            try:
                raw = await read_body(receive, headers, limit, grace_seconds=self.body_grace_seconds,
                                      min_bytes_per_second=self.body_min_bytes_per_second)
            except (ApiError, Disconnected) as exc:
                failure = exc
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return raw

    async def reserve(self, caller: Caller, model: str, quotas, estimate: int, cost: float) -> Reservation:
        """Reserve `quotas` for a request of `model` (`estimate` tokens, `cost` in the cluster's currency); a
        refusal is recorded and raised: 429 (a limit, with Retry-After and the x-ratelimit headers) or 503 (the
        store cannot take reservations now)."""
        try:
            decision = await self.accounting.reserve(quotas, estimate, cost, self.clock())
        except ApiError as error:  # the store cannot take reservations now: 503, recorded through the spool
            await self.refused(caller, model, error.status)
            raise
        if isinstance(decision, Rejection):
            self.metrics.quota_rejections.labels(caller.project.name, decision.limit_name).inc()
            await self.refused(caller, model, 429)
            raise ApiError(429, decision.message, "rate_limit_error" if decision.limit_name != "budget"
                           else "insufficient_quota", "rate_limit_exceeded" if decision.limit_name != "budget"
                           else "insufficient_quota",
                           headers=[(b"retry-after", str(max(1, round(decision.retry_after_seconds))).encode()),
                                    *ratelimit_headers(decision.headroom)])
        return decision

    async def refused(self, caller: Caller, model: str, status: int) -> None:
        """Record a request refused before admission (403, 404, 429, 503): it consumed nothing."""
        self.metrics.count_request(model, caller.project.name, status)
        record = UsageRecord(project=caller.project.name, model=model, time=time.time(), key_id=caller.key.key_id,
                             duration_seconds=time.perf_counter() - caller.started, status=status,
                             client_request_id=caller.ids.client, trace_id=caller.ids.trace, batch_id=caller.batch)
        with trio.move_on_after(CLEANUP_SECONDS, shield=True):
            await self.accounting.settle(None, None, 0.0, record, caller.ids.own)
