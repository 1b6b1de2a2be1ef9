"""The admin API: JSON over HTTP on the admin listener (a bare ASGI app on hypercorn's trio worker).

Every route but the git hook and /api/v1/health needs `Authorization: Bearer <token>`: the control plane's own
admin token, or a token of the store (`llmgw token create --scope S`) whose scope the route accepts. Scopes
(`llmgw.store.TOKEN_SCOPES`): `admin` passes every route; `review` the read-only GET /api/v1/plan, /api/v1/fleet
and /api/v1/status (`REVIEW_ROUTES`); `metrics` GET /metrics and `console` the web console's views (routes other
modules add with `await authorised(request, "metrics")`). A missing or wrong token, or one of another
scope, is 401. A token that belongs to a person (`llmgw token create --owner EMAIL`) does what their role in
projects.yaml allows (`refusal`: 403 with a sentence otherwise; a disabled account's tokens are 401), and the
settings commits made for it have that person as author (`Caller.author`), llmgw as committer.
Errors are `{"error": {"type", "message"}}` with 400 (bad request or settings; a wrong query parameter or body
field adds `"param"`: its name), 401, 403, 404, 409 (the node is not connected) or 503 (try again).
The API is described in docs/admin-api.yaml (OpenAPI 3.1), served at GET /openapi.yaml without a token.

    GET  /metrics                             Prometheus text format: fleet, control plane and gateway
                                              (llmgw.control.metrics); the admin token or a metrics token
    GET  /api/v1/status                      the status document
    GET  /api/v1/history?limit=N&author=P     audit commits, newest first (of person P's settings commits)
    GET  /api/v1/nodes | /api/v1/replicas     parts of the status
    POST /api/v1/apply {"wait", "allow_empty", "timeout", "expect", "reviewed"}    NDJSON progress lines, the
                                              last {"event": "end"}; "expect": refused unless the head is that
                                              REV; "reviewed": the plan a review showed (audited differences)
    GET  /api/v1/plan?rev=REV                 the plan REV (default: branch head) would run on the live fleet
    GET  /api/v1/usage/gpu-hours?since=T&project=P   GPU-hours and core-hours per project and model, priced
    POST /api/v1/restart                      every agent restarts over its stream, then the control plane (ndjson)
    POST /api/v1/upgrade | /api/v1/upgrade/pause | /api/v1/upgrade/resume   `llmgw upgrade`: a release tar
                                              rolled out node by node (llmgw.control.admin_upgrade); its progress
                                              in the status ("upgrade")
    GET  /api/v1/fleet?window=SECONDS         the fleet snapshot (llmgw.plan.snapshot) `llmgw review` plans against,
                                              with the load of the last window (default 3 days; llmgw.control.load_record)
    GET  /api/v1/logs?node=N&shard=S&lines=K  a shard's (or the agent's) last log lines
    POST /api/v1/stop | /api/v1/start {"author_name", "author_email"}   serving.stopped commits
    POST /api/v1/nodes/{node}/{verb} {"author_name", "author_email"}   verb: cordon|uncordon|drain|lend|reclaim
    POST /api/v1/models/{model}/replicas {"replicas"} | {"min", "max"}   the model's replica count or range
    POST /api/v1/models/{model}/adapters {"action": "add"|"remove", "name", "weights"}   its LoRA adapters
                                              (these, and slurm/users/keys below, are settings commits as the
                                              caller: llmgw.control.admin_edits; each takes "preview" and "expect")
    POST /api/v1/nodes/{node}/wipe {"keep_weights"}   its agent takes llmgw off its machine (install journal) and
                                              stops (`llmgw node remove`): {"node", "report"} (409: not connected)
    POST /api/v1/nodes/{node}/forget          a node whose agent is stopped (`llmgw node remove`): its
                                              certificates revoked, node secret and fleet record forgotten (409
                                              while it is connected)
    POST /api/v1/fabric-test {"a", "b"}     ib_write_bw from node a to node b, rail by rail, each graded
                                              (llmgw.control.fabric_test); seconds per rail
    GET  /api/v1/slurm/users                  members as Linux users on Slurm nodes: login, UID, home, keys
    POST /api/v1/slurm/users/keys {"action": "add"|"remove", "email", "keys": [...], "author_name", "author_email"}
                                              a commit of slurm.yaml ssh_keys
    GET  /api/v1/keys?project=P | POST /api/v1/keys {"project", "name"} | POST /api/v1/keys/{id}/revoke
                                              API keys (llmgw.control.admin_keys: members their projects')
    POST /api/v1/training {"model", "base", "pairs", "node", "node_class", "memory", "hyper", "adapter", "job"}
                                              queue a training job (llmgw.control.training_requests)
    GET  /api/v1/training | /api/v1/training/{job}   the training jobs, one job (state, loss, peak memory)
    POST /api/v1/training/{job}/cancel        cancel a training job
    GET  /api/v1/training/{job}/adapter       a finished job's adapter from the store (base64)
    POST /api/v1/join-tokens {"ttl_seconds"}  a one-time token for `llmgw node join` (mTLS control planes), at
                                              most 7 days (MAX_JOIN_TOKEN_TTL)
    GET  /console/...                         the web console (llmgw.console; its own login, docs/console.md),
                                              mounted by the CLI (`AdminMount`; no console without one)
    POST /api/v1/hooks/git                    wake the watcher: a forge signs with X-Hub-Signature-256
                                              (wrong signature: 401); unsigned only with the repository's hook
                                              token in X-Llmgw-Hook-Token (the post-receive hook of `llmgw repo
                                              init`; llmgw.settings.hook_token) or an admin token

The listener serves TLS when given a certificate (`serve_admin(tls=...)`); requests from a trusted proxy have their
X-Forwarded-Proto and X-Forwarded-For believed (`llmgw.control.admin_listener.forwarded_scope`). Every store lookup
of a presented token runs in a worker thread under one CapacityLimiter (`TOKEN_CHECK_THREADS`): a stream of fake
tokens while the store is slow or locked queues there and never holds the event loop.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any
from urllib.parse import parse_qs, unquote_plus

import trio

from llmgw.control import admin_edits, admin_keys, admin_upgrade
from llmgw.control.admin_listener import HOOK_TOKEN_HEADER, AdminTls, Network, forwarded_scope
from llmgw.control.admin_inputs import (
    MAX_APPLY_TIMEOUT,
    MAX_HISTORY_LIMIT,
    MAX_JOIN_TOKEN_TTL,
    MAX_LOG_LINES,
    AdminInputError,
    body_bool,
    body_number,
    body_reviewed,
    body_text,
    check_query_names,
    query_int,
)
from llmgw.control.audit import KEPT_OFF
from llmgw.control.load_record import LOAD_WINDOW_SECONDS, MAX_LOAD_WINDOW_SECONDS
from llmgw.control.keys import token_matches, webhook_signature_valid
from llmgw.control.view import ControlView
from llmgw.errors import LlmgwError, SettingsError, TemporaryError, UsageError
from llmgw.settings import MEMBER, OPERATOR, VIEWER, Access
from llmgw.store import CredentialState
from llmgw.gateway import serve_lifespan

log = logging.getLogger("llmgw.control")

MAX_BODY = 1 << 20
TOKEN_CHECK_THREADS = 4
"""Worker threads at most looking tokens up in the store at once (the admin API's and the console's together)."""
SCOPE_ADMIN = "admin"
# GET routes a token of scope "review" may read (besides admin tokens)
REVIEW_ROUTES = frozenset({"/api/v1/plan", "/api/v1/fleet", "/api/v1/status"})


def openapi_document() -> bytes:
    """The OpenAPI 3.1 description of this API (docs/admin-api.yaml; in a wheel, its copy in llmgw/control/_openapi).

    Raises: LlmgwError when neither file is there (a broken install).
    """
    here = Path(__file__).resolve().parent
    for path in (here / "_openapi" / "admin-api.yaml", here.parent.parent / "docs" / "admin-api.yaml"):
        if path.is_file():
            return path.read_bytes()
    raise LlmgwError("docs/admin-api.yaml is missing from this llmgw install; reinstall llmgw.")


class _HttpError(Exception):
    def __init__(self, status: int, kind: str, message: str):
        self.status, self.kind, self.message = status, kind, message
        super().__init__(message)


async def _status_aside(plane: ControlView) -> dict[str, Any]:
    """`plane.status()` built in a worker thread from the state now: a fleet's readings (2,000 nodes x 8 cards)
    held the trio loop 0.4-0.8 s per request on this machine; in a thread the loop folds heartbeats meanwhile."""
    state, now = plane.snapshot(), trio.current_time()
    return await trio.to_thread.run_sync(functools.partial(plane.status, state, now=now))


def _large(data: Any) -> bool:
    """A document with a section of more than 64 entries (a fleet's `nodes` or `replicas`)."""
    return isinstance(data, dict) and any(isinstance(v, dict) and len(v) > 64 for v in data.values())


def _json_default(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _encode(data: Any) -> bytes:
    return json.dumps(data, default=_json_default).encode()


def _encode_in_parts(data: Any) -> bytes:
    """`_encode(data)`, the byte-identical text, with each entry of a top-level mapping's mappings (the status
    document's `nodes` and `replicas`) encoded on its own: json's C encoder holds the GIL for a whole call, so
    encoding 2,000 nodes in one call held every other thread (the trio loop among them) for seconds."""
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        return _encode(data)
    parts = []
    for key, value in data.items():
        if isinstance(value, dict) and len(value) > 64 and all(isinstance(k, str) for k in value):
            inner = ", ".join(f"{json.dumps(str(k))}: {json.dumps(v, default=_json_default)}"
                              for k, v in value.items())
            parts.append(f"{json.dumps(str(key))}: {{{inner}}}")
        else:
            parts.append(f"{json.dumps(str(key))}: {json.dumps(value, default=_json_default)}")
    return ("{" + ", ".join(parts) + "}").encode()


async def _send_json(send, status: int, data: Any) -> None:
    # a large document is encoded in a worker thread, in parts: the trio loop folds heartbeats meanwhile
    body = await trio.to_thread.run_sync(_encode_in_parts, data) if _large(data) else _encode(data)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _HttpError(400, "bad_request", "the client went away before sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise _HttpError(413, "too_large", f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise _HttpError(400, "bad_request", f"the body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _HttpError(400, "bad_request", "the body must be a JSON object")
    return data


@dataclass(frozen=True)
class Person:
    """Someone with an active account (`llmgw users add`): their `email`, `name` and what the settings in force let
    them do (`access`: role and projects, llmgw.settings.people)."""

    email: str
    name: str
    access: Access


@dataclass(frozen=True)
class Caller:
    """Who sent an admin-API request: a `person` (a token that belongs to someone), or nobody's token (`person`
    None: the control plane's own admin token, `token_id` None, or a store token of nobody's)."""

    person: Person | None = None
    token_id: str | None = None

    def author(self, body: dict[str, Any]) -> tuple[str, str]:
        """The author (name, e-mail) of a settings commit made for this caller: the person, whatever the body
        says; for nobody's token the body's `author_name`/`author_email` (the CLI sends the caller's git config),
        else "llmgw operator <operator@llmgw.invalid>"."""
        if self.person is not None:
            return self.person.name, self.person.email
        return (body_text(body, "author_name", "llmgw operator"),
                body_text(body, "author_email", "operator@llmgw.invalid"))


def refusal(person: Person, method: str, path: str, body: dict[str, Any] | None = None) -> str | None:
    """Why `person` may not send `method path` (a sentence for a 403), or None when they may. Operators may do
    everything; viewers read (GET) everything; a project member may add and remove their own SSH keys only. Pure."""
    role = person.access.role
    if role == OPERATOR:
        return None
    if role == VIEWER:
        return None if method == "GET" else (
            f"{person.email} is a viewer (projects.yaml people.viewers): viewers read everything and change nothing; "
            f"ask an operator to {method} {path}.")
    if role == MEMBER:
        if method == "POST" and path == "/api/v1/slurm/users/keys" and body is not None \
                and str(body.get("email", "")).strip().lower() == person.email:
            return None
        return (f"{person.email} is a member of {', '.join(person.access.projects)}: members may change their own "
                "SSH keys here, and see their projects' usage in the console; the rest of the admin API is for "
                "operators and viewers (projects.yaml people).")
    return (f"{person.email} has no role: projects.yaml names them neither in people.operators or people.viewers nor "
            "as a project's member; ask an operator.")


Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
"""An ASGI app: `await app(scope, receive, send)`."""


@dataclass(frozen=True)
class AdminMount:
    """An ASGI app served on the admin listener under the path `prefix` ("/console": that path and every path
    under it), and the task `run(task_status=...)` it needs beside it (None: none), which `serve_admin` starts
    with `nursery.start` before the listener is bound and cancels with it.

    Mounts are made by the layer above the control plane (the CLI mounts `llmgw.console`), so the control plane
    imports none of them: `ControlConfig.admin_mounts` holds `MountFactory`s, each called once with the `AdminApp`.
    """

    prefix: str
    app: Asgi
    run: Callable[..., Awaitable[None]] | None = None

    def serves(self, path: str) -> bool:
        """True when `path` is `prefix` or under it."""
        return path == self.prefix or path.startswith(self.prefix + "/")


MountFactory = Callable[["AdminApp"], AdminMount]
"""What `ControlConfig.admin_mounts` holds: given the admin API (its `plane`, `authorised_for` and
`history_entries`), the mount to serve beside it."""


class AdminApp:
    """The ASGI app of the admin API over one `ControlView`, with the `mounts` (`MountFactory`s) made over it."""

    def __init__(self, plane: ControlView, mounts: tuple[MountFactory, ...] = (), proxies: tuple[Network, ...] = ()):
        self.plane = plane
        self.proxies = proxies
        self.token_checks = trio.CapacityLimiter(TOKEN_CHECK_THREADS)
        self.mounts = tuple(factory(self) for factory in mounts)  # the console under /console (docs/console.md)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
        if scope["type"] != "http":
            return
        scope = forwarded_scope(scope, self.proxies)
        for mount in self.mounts:
            if mount.serves(scope["path"]):
                return await mount.app(scope, receive, send)
        await self._answer(scope, receive, send)

    async def act(self, caller: Caller, path: str, body: dict[str, Any],
                  method: str = "POST") -> tuple[int, dict[str, Any]]:
        """Send `method path` (a GET's query after "?") with the JSON `body` as `caller` through the routes an HTTP
        request takes (the same role checks, writers and error answers), without a token: how the console acts and
        reads for the person logged in. Returns (HTTP status, the JSON answer). A checkpoint."""
        encoded = _encode(body) if method == "POST" else b""
        path, _, query = path.partition("?")
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": encoded, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": []}
        await self._answer(scope, receive, send, caller)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return status, json.loads(text)

    async def _answer(self, scope, receive, send, caller: Caller | None = None) -> None:
        """Route the request (as `caller` when given, else as its bearer token says) and answer every LlmgwError
        with its status and `{"error": ...}`."""
        try:
            await self._route(scope, receive, send, caller)
        except _HttpError as exc:
            await _send_json(send, exc.status, {"error": {"type": exc.kind, "message": exc.message}})
        except AdminInputError as exc:
            await _send_json(send, 400, {"error": {"type": "bad_request", "message": str(exc), "param": exc.field}})
        except SettingsError as exc:
            await _send_json(send, 400, {"error": {"type": "settings", "message": str(exc),
                                                   "issues": [str(i) for i in exc.issues]}})
        except UsageError as exc:
            await _send_json(send, 409, {"error": {"type": "usage", "message": str(exc)}})
        except TemporaryError as exc:
            await _send_json(send, 503, {"error": {"type": "temporary", "message": str(exc)}})
        except LlmgwError as exc:
            await _send_json(send, 500, {"error": {"type": type(exc).__name__, "message": str(exc)}})
        except Exception as exc:  # noqa: BLE001 - the HTTP boundary: a bug answers in words and is logged
            log.exception("the admin API failed on %s %s", scope.get("method"), scope.get("path"))
            await _send_json(send, 500, {"error": {"type": "internal", "message": (
                f"the control plane failed on this request ({type(exc).__name__}: {exc}); its log has the "
                "traceback")}})

    def _presented(self, request) -> bool | str:
        """What the request's Authorization presents: True for the control plane's own admin token, else the bearer
        token to look up in the store ("" when there is none to look up: no bearer token, or no store)."""
        headers = dict(request.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if token_matches(self.plane.admin_token, authorization):
            return True
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or self.plane.store is None:
            return ""
        return token

    async def authorised(self, request, needed: str = SCOPE_ADMIN) -> bool:
        """True when the request's bearer token may use a route of scope `needed` (one of TOKEN_SCOPES)
        (`caller` is not None). A checkpoint."""
        return await self.caller(request, needed) is not None

    async def caller(self, request, needed: str = SCOPE_ADMIN, held: list[str] | None = None) -> Caller | None:
        """Who sent the request, when its bearer token may use a route of scope `needed`; None when it may not.

        The control plane's own admin token passes every scope, as nobody's; a store token passes its own scope,
        and an admin one every scope (looked up in a worker thread, once). A token that belongs to a person is theirs
        (`Caller.person`) while their account is active; a disabled account's tokens pass nothing. `held`, when
        given, gets the scope of a live store token refused for its scope (to say so: "this token is of scope
        review"). A checkpoint.
        """
        presented = self._presented(request)
        if presented is True:
            return Caller()
        if not presented:
            return None
        token = await self.in_store_thread(self.plane.store.find_token, presented)
        if token is None or token.state(time.time()) is not CredentialState.ACTIVE:
            return None
        if token.scope not in (needed, SCOPE_ADMIN):
            if held is not None:
                held.append(token.scope)
            return None
        if token.owner is None:
            return Caller(token_id=token.token_id)
        person = await self.person_of(token.owner)
        return None if person is None else Caller(person, token.token_id)

    async def person_of(self, email: str) -> Person | None:
        """The person of `email` when their account is active (a store read in a worker thread), with what the
        settings in force let them do; None without an active account. A checkpoint."""
        if self.plane.store is None or not email:
            return None
        account = await self.in_store_thread(self.plane.store.account, email)
        if account is None or not account.active:
            return None
        return Person(account.email, account.name, self.access_of(account.email))

    def access_of(self, email: str) -> Access:
        """What `email` may do under the settings in force (no settings yet: nothing)."""
        settings = self.plane.snapshot().settings
        return settings.access_of(email) if settings is not None else Access(email.strip().lower(), None)

    async def in_store_thread(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` (a blocking store read) in a worker thread, at most TOKEN_CHECK_THREADS at once; the
        caller waits for a thread when all are busy (the event loop does not). A checkpoint; cancelling it abandons
        the thread."""
        return await trio.to_thread.run_sync(functools.partial(function, *args), limiter=self.token_checks,
                                             abandon_on_cancel=True)

    async def _metrics(self, scope, send) -> None:
        from llmgw.control.metrics import CONTENT_TYPE, METRICS_SCOPE, ControlCollector, render_metrics

        if not await self.authorised(scope, METRICS_SCOPE):
            raise _HttpError(401, "unauthorized", "/metrics needs the admin token (or a metrics token) as "
                             "`Authorization: Bearer <token>`; see docs/observability.md for the scrape config")
        # One snapshot and one clock reading, taken here; the rendering (0.5 s for 100 nodes of 8 GPUs on a loaded
        # 2-core machine) runs in a worker thread so the event loop keeps serving: the snapshot is immutable and
        # prometheus_client's registries are thread-safe.
        state, now = self.plane.snapshot(), trio.current_time()
        body = await trio.to_thread.run_sync(
            render_metrics, ControlCollector(lambda: state, lambda: now), self.plane.gateway_registry())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _route(self, scope, receive, send, caller: Caller | None = None) -> None:
        method, path = scope["method"], scope["path"].rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("utf-8", "replace"),
                                                      keep_blank_values=True).items()}
        if path == "/api/v1/hooks/git" and method == "POST":
            return await self._hook(scope, receive, send)
        if path == "/api/v1/health":
            leadership = self.plane.snapshot().leadership  # for load balancers and `llmgw status`: who leads
            return await _send_json(send, 200, {"ok": True, "leader": leadership.leader,
                                                "leader_holder": leadership.holder,
                                                "fleet": self.plane.recovery().text})
        if path == "/openapi.yaml" and method == "GET":
            return await self._openapi(send)
        if path == "/metrics" and method == "GET":
            return await self._metrics(scope, send)
        needed = "review" if method == "GET" and path in REVIEW_ROUTES else SCOPE_ADMIN
        held: list[str] = []
        if caller is None:
            caller = await self.caller(scope, needed, held)
        if caller is None:
            wanted = "an admin token" + ("" if needed == SCOPE_ADMIN else f" or a token of scope {needed}")
            what = (f"this token is of scope {held[0]}; {method} {path} needs {wanted}" if held
                    else f"{wanted} is needed")
            raise _HttpError(401, "unauthorized",
                             f"{what}: pass --token, set LLMGW_ADMIN_TOKEN, or run on the control plane's machine (it "
                             "reads <state>/admin-token); a token of a disabled account passes nothing")
        person = caller.person
        if admin_keys.serves(path):  # their own rule: a member may use their projects' keys
            body = _json_body(await _read_body(receive)) if method == "POST" else {}
            status, doc = await admin_keys.serve_keys(self, person.access if person else None, method, path, query,
                                                      body)
            return await _send_json(send, status, doc)
        if person is not None and not (method == "POST" and path == "/api/v1/slurm/users/keys"):
            why = refusal(person, method, path)  # the SSH keys' route is checked with its body below
            if why is not None:
                raise _HttpError(403, "forbidden", why)
        raw_query = scope.get("query_string", b"").decode("utf-8", "replace")
        check_query_names(path, {unquote_plus(part.partition("=")[0]): "" for part in raw_query.split("&") if part})
        plane = self.plane
        if method == "GET" and path == "/api/v1/status":
            return await _send_json(send, 200, await _status_aside(plane))
        if method == "GET" and path == "/api/v1/nodes":
            doc = await _status_aside(plane)
            return await _send_json(send, 200, {"nodes": doc["nodes"], **{
                key: doc["settings"].get(key, []) for key in KEPT_OFF}, "speeds": {
                rid: replica["speed"] for rid, replica in doc["replicas"].items() if "speed" in replica}})
        if method == "GET" and path == "/api/v1/replicas":
            doc = plane.status()
            return await _send_json(send, 200, {"replicas": doc["replicas"],
                                                "serving_stopped": doc["settings"]["serving_stopped"]})
        if method == "GET" and path == "/api/v1/history":
            return await self._history(send, query_int(query, "limit", 50, 1, MAX_HISTORY_LIMIT),
                                       query.get("author") or None)
        if method == "GET" and path == "/api/v1/fleet":
            window = query_int(query, "window", int(LOAD_WINDOW_SECONDS), 60, MAX_LOAD_WINDOW_SECONDS)
            return await _send_json(send, 200, await self._fleet_snapshot(float(window)))
        if method == "GET" and path == "/api/v1/plan":
            return await self._plan(send, query.get("rev") or None)
        if method == "GET" and path == "/api/v1/usage/gpu-hours":
            return await self._gpu_hours(send, query)
        if method == "GET" and path == "/api/v1/logs":
            node = query.get("node")
            if not node:
                raise _HttpError(400, "bad_request", "say which node: /api/v1/logs?node=NODE[&shard=SHARD]")
            lines = await plane.logs(node, query.get("shard", ""), query_int(query, "lines", 200, 1, MAX_LOG_LINES))
            return await _send_json(send, 200, {"node": node, "shard": query.get("shard", ""), "lines": lines})
        if method == "POST" and path.startswith("/api/v1/nodes/") and path.count("/") == 5 and path.endswith("/forget"):
            return await _send_json(send, 200, await plane.forget_node(path.split("/")[4]))
        if method == "POST" and path.startswith("/api/v1/nodes/") and path.count("/") == 5 and path.endswith("/wipe"):
            body = _json_body(await _read_body(receive))
            keep = body.get("keep_weights", False)
            if not isinstance(keep, bool):
                raise _HttpError(400, "bad_request", "keep_weights must be true or false")
            return await _send_json(send, 200, await plane.wipe_node(path.split("/")[4], keep_weights=keep))
        if admin_edits.serves(method, path):
            return await self._edit(send, caller, path, _json_body(await _read_body(receive)))
        if method == "POST" and path == "/api/v1/fabric-test":
            body = _json_body(await _read_body(receive))
            a, b = body_text(body, "a", ""), body_text(body, "b", "")
            if not a or not b:
                raise _HttpError(400, "bad_request", "say which nodes: {\"a\": CLIENT_NODE, \"b\": SERVER_NODE}")
            return await _send_json(send, 200, await plane.fabric_test(a, b))
        if path == "/api/v1/training" or path.startswith("/api/v1/training/"):
            return await self._training(receive, send, method, path)
        if method == "GET" and path == "/api/v1/slurm/users":
            return await _send_json(send, 200, await plane.slurm_users())
        if method == "POST" and path == "/api/v1/join-tokens":
            body = _json_body(await _read_body(receive))
            ttl = body_number(body, "ttl_seconds", 3600.0, 0.0, MAX_JOIN_TOKEN_TTL)
            return await _send_json(send, 200, plane.create_join_token(ttl))
        if method == "POST" and path == "/api/v1/apply":
            return await self._apply(receive, send, caller)
        if method == "POST" and path == "/api/v1/restart":
            return await self._restart(receive, send)
        if admin_upgrade.serves(method, path):
            return await _send_json(send, 200, await admin_upgrade.serve_upgrade(
                plane, path, query, receive, Path(getattr(plane, "state_dir", "."))))
        raise _HttpError(404, "not_found", f"no route {method} {path}")

    async def _training(self, receive, send, method: str, path: str) -> None:
        """The training routes (`llmgw.control.training_requests`)."""
        parts = path.split("/")[4:]  # after /api/v1/training
        plane = self.plane
        if method == "POST" and not parts:
            return await _send_json(send, 200, await plane.submit_training(_json_body(await _read_body(receive))))
        if method == "GET" and not parts:
            return await _send_json(send, 200, plane.training_jobs())
        if method == "GET" and len(parts) == 1:
            return await _send_json(send, 200, plane.training_job(parts[0]))
        if method == "POST" and len(parts) == 2 and parts[1] == "cancel":
            return await _send_json(send, 200, await plane.cancel_training(parts[0]))
        if method == "GET" and len(parts) == 2 and parts[1] == "adapter":
            return await _send_json(send, 200, await plane.training_adapter(parts[0]))
        raise _HttpError(404, "not_found", f"no route {method} {path}")

    async def _edit(self, send, caller: Caller, path: str, body: dict[str, Any]) -> None:
        """An edit route (`llmgw.control.admin_edits`): the edit committed as the caller, or its preview."""
        found = admin_edits.edit_of(path, body)
        if found is None:
            raise _HttpError(404, "not_found", f"no route POST {path}")
        edit, answer = found
        if caller.person is not None and (why := refusal(caller.person, "POST", path, body)) is not None:
            raise _HttpError(403, "forbidden", why)
        preview, expect = body_bool(body, "preview", False), admin_edits.body_expect(body)
        name, email = caller.author(body)
        done = await self.plane.edit_settings(edit, name, email, expect=expect, preview=preview)
        if "node" in answer:  # a node no settings file names is committed all the same: say so
            answer["known"] = self.plane.snapshot().fleet.get(answer["node"]) is not None
        await _send_json(send, 200, {"commit": done.commit, "changed": done.changed, "preview": done.preview,
                                     "diff": done.diff, **answer, "author": f"{name} <{email}>"})

    async def _hook(self, scope, receive, send) -> None:
        body = await _read_body(receive)
        headers = dict(scope.get("headers") or [])
        signature = headers.get(b"x-hub-signature-256")
        presented = headers.get(HOOK_TOKEN_HEADER, b"").decode("latin-1").strip()
        hook_token = getattr(self.plane, "hook_token", "")
        if signature is not None:
            secret = self.plane.webhook_secret()
            if secret is None or not webhook_signature_valid(secret, body, signature):
                raise _HttpError(401, "bad_signature", "the X-Hub-Signature-256 of this webhook does not match "
                                 "the secret \"webhook\" of the control plane")
        elif not (hook_token and presented and hmac.compare_digest(hook_token.encode(), presented.encode())) \
                and not await self.authorised(scope):
            raise _HttpError(401, "unauthorized", "an unsigned notification needs the settings repository's hook "
                             "token (X-Llmgw-Hook-Token, from its llmgw-hook-token file) or an admin token; a "
                             "forge signs its webhook (X-Hub-Signature-256 with the secret \"webhook\")")
        self.plane.wake_watcher()
        await _send_json(send, 202, {"ok": True})

    async def _openapi(self, send) -> None:
        body = await trio.to_thread.run_sync(openapi_document)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/yaml"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _fleet_snapshot(self, window: float) -> dict[str, Any]:
        """The fleet snapshot, with its load (`llmgw.control.load_record`: the usage records of the last `window`
        seconds, read in a store thread, and the speeds routing uses) when the plane has a store."""
        from llmgw.plan.snapshot import FleetSnapshot, snapshot_to_json

        state = self.plane.snapshot()
        settings = state.settings
        now = time.time()
        taken = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        load = await self._load(window, now, taken)
        return snapshot_to_json(FleetSnapshot(state.fleet.fleet(), taken, settings.commit if settings else None,
                                              load))

    async def history_entries(self, limit: int, author: str | None = None) -> list:
        """The last `limit` audit commits, newest first, of `author`'s settings commits when given (a name or
        e-mail: `llmgw.settings.AuditEntry.by`; `llmgw.settings.read_audit_log`, in a thread)."""
        from llmgw.settings import read_audit_log

        return await trio.to_thread.run_sync(read_audit_log, str(self.plane.watcher_repo_path), limit, author)

    async def _history(self, send, limit: int, author: str | None = None) -> None:
        entries = await self.history_entries(limit, author)
        await _send_json(send, 200, {"entries": [
            asdict(e) if is_dataclass(e) else e for e in entries
        ]})

    async def _plan(self, send, rev: str | None) -> None:
        from llmgw.plan import plan_to_json, render_plan
        from llmgw.plan.forecasting import forecast_lines, forecast_to_json

        load = await self._load(LOAD_WINDOW_SECONDS, time.time(), "")
        plan, forecasts, speeds = await self.plane.preview_with_estimates(rev, load)
        await _send_json(send, 200, {"plan": plan_to_json(plan), "lines": render_plan(plan, include_keep=False),
                                     "changes": plan.changes or bool(plan.unplaced),
                                     "expected_speeds": [speed.to_json() for speed in speeds],
                                     "forecast": [forecast_to_json(f) for f in forecasts],
                                     "forecast_lines": forecast_lines(forecasts)})

    async def _load(self, window: float, now: float, until: str) -> Any:
        """The fleet's load over the last `window` seconds before `now` (`llmgw.control.load_record`; the store read
        in a store thread), or None when the plane has no store."""
        from llmgw.control.load_record import recorded_load

        if self.plane.store is None:
            return None
        usage = await self.in_store_thread(self.plane.store.usage_load, now - window)
        return recorded_load(usage, self.plane.speeds, window, until)

    async def _gpu_hours(self, send, query: dict[str, str]) -> None:
        from llmgw.control.usage_hours import hours_document

        settings = self.plane.snapshot().watch.settings
        if settings is None or self.plane.store is None:
            raise _HttpError(503, "unavailable", "no settings are in force yet, or no store is open: try again")
        since = query_int(query, "since", -1, 0, 10**11)  # unix seconds; absent: every record
        document = await self.in_store_thread(hours_document, self.plane.store, settings,
                                               None if since < 0 else float(since), query.get("project") or None)
        await _send_json(send, 200, document)

    async def _apply(self, receive, send, caller: Caller) -> None:
        body = _json_body(await _read_body(receive))
        if caller.person is not None:  # the audit names the person, whatever the body says
            body["who"] = f"{caller.person.name} <{caller.person.email}>"

        async def emit(event: dict[str, Any]) -> None:
            await send({"type": "http.response.body", "body": _encode(event) + b"\n", "more_body": True})

        options = dict(wait=body_bool(body, "wait", True), allow_empty=body_bool(body, "allow_empty", False),
                       timeout=body_number(body, "timeout", 600.0, 0.0, MAX_APPLY_TIMEOUT),
                       who=body_text(body, "who", "admin API"), expect=body_text(body, "expect", ""),
                       reviewed=body_reviewed(body))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        ok = await self.plane.apply(emit, **options)
        await send({"type": "http.response.body", "body": _encode({"event": "end", "ok": ok}) + b"\n"})


    async def _restart(self, receive, send) -> None:
        body = _json_body(await _read_body(receive))
        control_plane = body_bool(body, "control_plane", True)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})

        async def emit(event: dict[str, Any]) -> None:
            await send({"type": "http.response.body", "body": _encode(event) + b"\n", "more_body": True})

        ok = await self.plane.restart(emit, control_plane=control_plane)
        await send({"type": "http.response.body", "body": _encode({"event": "end", "ok": ok}) + b"\n"})
        if control_plane:
            self.plane.request_restart()  # after the answer is out


async def serve_admin(plane: ControlView, host: str, port: int, *, mounts: tuple[MountFactory, ...] = (),
                      tls: AdminTls | None = None, proxies: tuple[Network, ...] = (),
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the admin API for `plane`, and the `mounts` beside it (`AdminMount`), until cancelled;
    `task_status.started(bound_port)`. `tls`: serve HTTPS with that certificate (None: plain HTTP). `proxies`: the
    networks whose X-Forwarded-Proto/-For are believed (`forwarded_scope`)."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    if tls is not None:
        config.certfile, config.keyfile = str(tls.cert_file), str(tls.key_file)
        create = config.create_ssl_context

        def kept_context() -> Any:  # kept, so that a certificate issued after a CA rotation replaces the old one
            context = create()
            tls.contexts.append(context)
            return context

        config.create_ssl_context = kept_context  # type: ignore[method-assign]

    app = AdminApp(plane, mounts, proxies)

    async def started(task_status=trio.TASK_STATUS_IGNORED):
        await serve(app, config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        for mount in app.mounts:
            if mount.run is not None:
                await nursery.start(mount.run)
        binds = await nursery.start(started)
        task_status.started(int(binds[0].rsplit(":", 1)[1]))
