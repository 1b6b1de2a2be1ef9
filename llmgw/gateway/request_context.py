"""One proxied request's data: who sent it (`Caller`), what was admitted (`RequestContext`), what happened (`Ledger`).

The request path is `Gateway._proxied` (authenticate, read, validate, admit) -> `Gateway._run` (choose, forward,
relay, settle). Each stage hands the next one value instead of a dozen arguments:

- `Caller`, frozen, built once the API key is accepted (before the body is read): key, project, ids, trace, start.
- `RequestContext`, frozen, built once at admission (after the model, the project's allowlist and the quota
  reservation): the caller, the model route and its routing policy, the body as parsed and as received, the
  reserved limits, and what the relay needs to know of the request (stream? usage asked for?).
- `Ledger`, mutable, one per admitted request: what the relay learns (the replica chosen, the routing decision's
  kind, the status the client got, tokens, time to first token), written by `proxying` as it goes and read once by
  `Gateway._settle` for the usage record, the quota settlement, the metrics and the trace.

Nothing here does I/O; the dataclasses are built once per request (never per streamed chunk).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.gateway.request_ids import RequestIds
from llmgw.gateway.routing_policies import RoutingPolicy
from llmgw.gateway.tracing import RequestTrace
from llmgw.routes import ModelRoute, ProjectPolicy, ReplicaRoute
from llmgw.store import ApiKey, Reservation

STATUS_CLIENT_CLOSED = 499
"""The status recorded for a request whose client left before its answer ended (nginx's 499)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request, and when: built once its API key is accepted, before its body is read.

    `key`: the accepted API key (never the secret). `project`: its project's policy (allowlist, quota chain).
    `ids`: the request's ids (`llmgw.gateway.request_ids`). `trace`: its span (None: not sampled).
    `started`: `time.perf_counter()` seconds when the request arrived (durations and TTFT count from it).
    `batch`: the id of the batch of /v1/batches this request is a line of (None: an interactive request), kept in
    its usage record. `once`: that line's key for the engine relay, the same on every try of the line
    (`batch_lines.line_once_key`; None: an interactive request), sent as `llmgw-once` (`proxying`).
    """

    key: ApiKey
    project: ProjectPolicy
    ids: RequestIds
    trace: RequestTrace | None
    started: float
    batch: str | None = None
    once: str | None = None


@dataclass(frozen=True, slots=True)
class RequestContext:
    """An admitted request, as every later step reads it. Built once at admission (`Gateway._admit`); frozen.

    `caller`: who sent it. `route`: the model's route (catalog name, replicas, prices, `routing`); `policy`: the
    routing policy that route names (`routing_policies.policy_of`). `path`: the engine's path
    ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"). `body`: the JSON body as parsed and validated
    (never changed); `raw`: its bytes as received (forwarded as they are when nothing needs rewriting).
    `requested`: the model name the client used (a catalog name or an alias; answers carry it back).
    `stream`: relayed as an event stream (`stream: true`, not embeddings); `include_usage`: the client asked for
    the usage event (`stream_options.include_usage`). `prompt_estimate`: prompt tokens guessed from the text
    (`accounting.estimate_prompt_tokens`; billed when the engine's usage never came). `overrides`: top-level fields
    forced into the forwarded body (the reserved `max_tokens`, `limits.enforced_fields`; empty: none).
    `reservation`: the quota reservation to settle (None: the project has no quotas).
    `prefix`: the prompt's prefix key (`routing.prefix_key`) when `policy.by_prefix`, else None.
    """

    caller: Caller
    route: ModelRoute
    policy: RoutingPolicy
    path: str
    body: Mapping[str, Any]
    raw: bytes
    requested: str
    stream: bool
    include_usage: bool
    prompt_estimate: int
    overrides: Mapping[str, Any]
    reservation: Reservation | None
    prefix: str | None


@dataclass(slots=True)
class Ledger:
    """What the relay learns about one admitted request, in named fields; one per request, read when it settles.

    `status`: the HTTP status the client got (0: nothing yet; STATUS_CLIENT_CLOSED: it left first).
    `replica`: the replica whose answer is relayed (None: none answered). `routing`: the kind of the last routing
    decision ("precise", "approximate", "least-loaded", "round-robin"; "": none was made).
    `sent_to_engine`: the request's bytes reached an engine that has not failed (yet): its prompt is billed.
    `started_response`: the response head went to the client. `prompt_tokens`, `completion_tokens`,
    `cached_tokens`: the engine's own usage (None: it never came). `counted_chunks`: content chunks relayed (the
    completion tokens billed when the engine's usage never came). `ttft_seconds`: seconds from arrival to the
    first content token (None: no token came).
    """

    status: int = 0
    replica: ReplicaRoute | None = None
    routing: str = ""
    sent_to_engine: bool = False
    started_response: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    counted_chunks: int = 0
    ttft_seconds: float | None = None

    def billed_tokens(self, prompt_estimate: int) -> tuple[int, int]:
        """(prompt, completion) tokens to bill: the engine's usage when it came; else the prompt estimate when the
        prompt reached an engine (the client left before the usage) and the content chunks counted; (0, 0) when
        nothing reached an engine."""
        generated = self.completion_tokens if self.completion_tokens is not None else self.counted_chunks
        if self.prompt_tokens is not None:
            return self.prompt_tokens, generated
        if self.started_response or generated or self.sent_to_engine:
            return prompt_estimate, generated
        return 0, generated
