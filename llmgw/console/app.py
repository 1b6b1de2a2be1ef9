"""The console's web app: quart-trio pages under /console, mounted on the admin listener by the admin API.

    console = Console(plane.snapshot, authorise=check_token, history=read_history)
    await console(scope, receive, send)          # from the admin API's ASGI app, for paths under /console
    nursery.start_soon(console.run_sampler)      # folds GPU readings into one-minute buckets (owned by its caller)

The console reads the control plane through `snapshot()` (an immutable `ControlState`) only; what it needs
beyond the state comes in as functions: `authorise(token) -> Login | None` (a checkpoint: the admin API's token
check for the scope "console", in a worker thread) and `still_valid(token_id) -> bool` (a checkpoint: the store
token a session logged in with is neither revoked nor expired; asked at least every minute per session) `history(limit) -> entries` (the admin API's
audit log reader, a checkpoint) and `usage(by, since[, projects][, model=]) -> rows` (usage summed by "day", "model" or
"project" since a unix time, of some projects and one model when given, rows shaped like `llmgw.store.UsageRow`; None
hides the Usage page) and `quotas(scopes) -> rows` (what counts now against each limit of those quota scopes, as the
gateway's quota check reads it: `Store.quota_use`, rows shaped like `llmgw.store.LimitUse`; None hides the Quotas
page, `llmgw.console.quotas`) and `logs(node, shard, lines)` (a shard's last log lines, "" for the agent's own; None
hides the log pages) and `fabric_tests()` (the last fabric test of each pair, `ControlView.last_fabric_tests`; None:
none shown) and `applied_diff(audit_commit)`
(the settings diff an audit commit applied, shaped like `llmgw.control.audit_diff.AppliedDiff`; None: history
entries show their message only) and `accounts` (`Accounts`: people's password logins and their roles, rechecked
every minute; None: tokens only; failed logins limited by `llmgw.console.throttle`) and `act(login, path, body) ->
(status, answer)` (POST an admin-API edit route as the person logged in: `llmgw.control.admin.AdminApp.act`, which
also takes a method, "GET" to read the API keys; None: a console without actions nor API keys) and `explore(source)
-> ModelFacts` (a model's metadata read from its files' headers, a checkpoint raising WeightsError; None hides the
Explorer page, which shows where the model would fit in the fleet: `llmgw.plan.plan_model`). Actions
(`llmgw.console.actions`): a form posts to /console/actions, which shows the
diff the edit would commit (a preview) and, confirmed, commits it onto the head that diff was made against; refusals
(a role's 403, `llmgw validate`'s words, a branch that moved meanwhile) are shown as the admin API says them. The API
keys page (/console/keys) lists, makes (the plaintext shown once) and revokes keys through /api/v1/keys as the
person: a member their own projects' only. Of the control plane it imports only `llmgw.control.view` (an import contract);
`llmgw.cli.console_mount` makes these functions and mounts the console on the admin listener.

Security: every page but the login form and the stylesheet/script needs a session cookie (set by the login form,
HttpOnly, SameSite=Strict, Secure over TLS, path /console, expires after `SESSION_TTL`) or an
`Authorization: Bearer` token; without one an HTML GET is redirected to the login form and anything else gets 401.
Every form carries a CSRF token (403 when it does not match). Every answer carries a Content-Security-Policy
that allows no inline script or style, and no token ever appears in a URL.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import trio
from quart import Response, g, redirect, render_template, request
from quart_trio import QuartTrio

from llmgw.console.actions import FORM_FIELDS, ActionError, back_of, request_of
from llmgw.console.buckets import FleetHistory
from llmgw.console.fabrics import fabrics_view
from llmgw.console.charts import day_columns, gpu_chart, window_days
from llmgw.console.sessions import SESSION_TTL, Login, SessionBook, csrf_matches
from llmgw.console.oidc import OidcClient, OidcError
from llmgw.console.quotas import project_quotas, scopes_of
from llmgw.console.throttle import LoginThrottle
from llmgw.console.views import (
    MAP_COLOURINGS, card_verdicts, cluster_view, gpu_tiles, load_class, models_view, node_row, serve_form,
)
from llmgw.control.view import ControlState, PassRecord
from llmgw.errors import TemporaryError, UsageError, WeightsError
from llmgw.plan.model_fit import plan_model
from llmgw.tools.model_headers import ModelFacts
from llmgw.units import format_duration, format_size

log = logging.getLogger("llmgw.console")
HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "llmgw_console"
LOGIN_COOKIE = "llmgw_console_login"
PREFIX = "/console"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
PASSES_KEPT = 20

Authorise = Callable[[str], Awaitable["Login | None"]]
StillValid = Callable[[str], Awaitable[bool]]
History = Callable[[int], Awaitable[list[Any]]]
Usage = Callable[..., Awaitable[list[Any]]]  # (by, since[, projects][, model=]) -> rows
GpuHours = Callable[[float], Awaitable[list[dict[str, Any]]]]  # since -> rows of llmgw.store.gpu_hours, as JSON
Logs = Callable[[str, str, int], Awaitable[list[str]]]
AppliedDiff = Callable[[str], Awaitable[Any]]
Act = Callable[..., Awaitable[tuple[int, dict[str, Any]]]]  # (login, path, body[, method]) -> (status, answer)
QuotaUse = Callable[[list[tuple[str, Any]]], Awaitable[list[Any]]]  # scopes -> LimitUse rows
Explore = Callable[[str], Awaitable[ModelFacts]]  # source -> what its metadata says (llmgw.agent.model_metadata)
USAGE_GROUPS = ("day", "model", "project")
MEMBER_PAGES = frozenset({"usage", "quotas", "logout", "cluster", "cluster_bare", "ssh_keys", "act", "keys",
                          "key_create", "key_revoke"})
"""The endpoints a project member may open (the cluster's page sends them to their usage; their projects' quotas;
what an action may do is the admin API's word: a member's own SSH keys, their own projects' API keys)."""
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""An API key's id as it may appear in a route's path."""


class Accounts(Protocol):
    """People's logins, given to the console by its mount (llmgw.cli.console_mount)."""

    async def log_in(self, email: str, password: str) -> Login | None:
        """The login of `email` when `password` is its active account's password and the settings give it a role;
        None otherwise. A checkpoint (a scrypt in a worker thread)."""

    async def recheck(self, login: Login) -> Login | None:
        """`login` as it stands now (account still active, role still given by the settings, maybe another), or
        None when it must end. A checkpoint."""

    async def person(self, email: str) -> Login | None:
        """The login of `email` as an OpenID provider vouched for it (no password): None when refused (a disabled
        account), role "" when the settings give none. A checkpoint."""


class Console:
    """The console over one control plane's `snapshot` function. See the module's docstring.

    `sample_interval` seconds between two samples of the snapshot by `run_sampler` (GPU buckets and the list of
    recent passes); `session_ttl` seconds a login lasts; `clock` the control plane's clock (that of
    `NodeReadings.at`), `wall` unix seconds (for buckets and session expiry).
    """

    def __init__(self, snapshot: Callable[[], ControlState], *, authorise: Authorise, history: History,
                 still_valid: StillValid | None = None, usage: Usage | None = None, logs: Logs | None = None,
                 gpu_hours: GpuHours | None = None, fabric_tests: Callable[[], list[dict[str, Any]]] | None = None,
                 applied_diff: AppliedDiff | None = None, accounts: Accounts | None = None,
                 oidc: OidcClient | Callable[[], OidcClient | None] | None = None, act: Act | None = None,
                 quotas: QuotaUse | None = None, explore: Explore | None = None, sample_interval: float = 5.0,
                 session_ttl: float = SESSION_TTL, clock: Callable[[], float] = trio.current_time,
                 wall: Callable[[], float] = time.time):
        self.snapshot = snapshot
        self.authorise = authorise
        self.accounts = accounts
        self._oidc = oidc  # a client, or a function giving the one the settings in force name (None: none)
        self.throttle = LoginThrottle()
        self.still_valid = still_valid
        self.history = history
        self.usage = usage
        self.gpu_hours = gpu_hours
        self.fabric_tests = fabric_tests
        self.logs = logs
        self.applied_diff = applied_diff
        self.act = act
        self.quotas = quotas
        self.explore = explore
        self.sample_interval = sample_interval
        self.clock, self.wall = clock, wall
        self.sessions = SessionBook(session_ttl)
        self.gpu_history = FleetHistory()
        self.passes: deque[PassRecord] = deque(maxlen=PASSES_KEPT)
        self.app = self._build()

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)

    # -- sampling -----------------------------------------------------------------------------------------

    async def sample(self) -> None:
        """Fold the snapshot's new readings into the GPU buckets (in a worker thread: 0.1-0.3 s for 1000 nodes of
        8 cards on 2 shared cores) and remember its last pass. A checkpoint."""
        state = self.snapshot()
        self.gpu_history = await trio.to_thread.run_sync(self.gpu_history.folded, state.fleet.records(),
                                                         int(self.wall() // 60))
        last = state.last_pass
        if last is not None and (not self.passes or self.passes[-1].number != last.number):
            self.passes.append(last)

    async def run_sampler(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Sample every `sample_interval` seconds until cancelled; `task_status.started()` after the first."""
        await self.sample()
        task_status.started()
        while True:
            await trio.sleep(self.sample_interval)
            await self.sample()

    # -- the web app ----------------------------------------------------------------------------------------

    def _build(self) -> QuartTrio:
        app = QuartTrio("llmgw.console", static_folder=str(HERE / "static"), static_url_path=f"{PREFIX}/static",
                        template_folder=str(HERE / "templates"))
        app.config["RESPONSE_TIMEOUT"] = 30
        app.jinja_env.filters.update(size=_size, duration=_duration, percent=_percent, short=_short, when=_when)
        app.jinja_env.globals.update(load_class=load_class)
        app.before_request(self._guard)
        app.register_error_handler(BadParameter, _bad_parameter)
        app.after_request(_secure_headers)
        app.add_url_rule(f"{PREFIX}/login", "login", self._login, methods=["GET", "POST"])
        app.add_url_rule(f"{PREFIX}/logout", "logout", self._logout, methods=["POST"])
        app.add_url_rule(f"{PREFIX}/oidc/start", "oidc_start", self._oidc_start)
        app.add_url_rule(f"{PREFIX}/oidc/callback", "oidc_callback", self._oidc_callback)
        app.add_url_rule(f"{PREFIX}/", "cluster", self._cluster)
        app.add_url_rule(PREFIX, "cluster_bare", self._cluster)
        app.add_url_rule(f"{PREFIX}/nodes", "nodes", self._nodes)
        app.add_url_rule(f"{PREFIX}/nodes/<node_id>", "node", self._node)
        app.add_url_rule(f"{PREFIX}/nodes/<node_id>/logs", "logs", self._logs)
        app.add_url_rule(f"{PREFIX}/gpus", "gpus", self._gpus)
        app.add_url_rule(f"{PREFIX}/fabrics", "fabrics", self._fabrics)
        app.add_url_rule(f"{PREFIX}/replicas", "replicas", self._replicas)
        app.add_url_rule(f"{PREFIX}/history", "history", self._history)
        app.add_url_rule(f"{PREFIX}/history/<commit>", "history_entry", self._history_entry)
        app.add_url_rule(f"{PREFIX}/usage", "usage", self._usage)
        app.add_url_rule(f"{PREFIX}/quotas", "quotas", self._quotas)
        app.add_url_rule(f"{PREFIX}/explorer", "explorer", self._explorer)
        app.add_url_rule(f"{PREFIX}/ssh-keys", "ssh_keys", self._ssh_keys)
        app.add_url_rule(f"{PREFIX}/actions", "act", self._act, methods=["POST"])
        app.add_url_rule(f"{PREFIX}/keys", "keys", self._keys)
        app.add_url_rule(f"{PREFIX}/keys/new", "key_create", self._key_create, methods=["POST"])
        app.add_url_rule(f"{PREFIX}/keys/<key_id>/revoke", "key_revoke", self._key_revoke, methods=["POST"])
        return app

    async def _guard(self) -> Response | None:
        if request.endpoint in ("login", "static", "oidc_start", "oidc_callback"):
            return None
        authorization = request.headers.get("Authorization", "")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            login = await self.authorise(token.strip())
            if login is None:
                return Response("the bearer token is not valid for the console\n", 401,
                                {"WWW-Authenticate": "Bearer"}, content_type="text/plain")
            g.principal, g.csrf, g.bearer, g.login = login.principal, "", True, login
            return self._member_refusal(login)
        now = self.wall()
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE), now)
        if session is not None and session.due(now):
            session = await self._recheck(session, now)
        if session is None:
            if request.method == "GET" and "text/html" in request.headers.get("Accept", ""):
                return redirect(f"{PREFIX}/login")
            return Response("log in to the console first (or send Authorization: Bearer <admin token>)\n", 401,
                            content_type="text/plain")
        g.principal, g.csrf, g.bearer, g.session_id = session.principal, session.csrf, False, session.session_id
        g.login = session.login or Login(session.principal, session.token_id)
        if request.method == "POST":
            form = await request.form
            if not csrf_matches(session.csrf, form.get("csrf")):
                return Response("the form's CSRF token does not match this session: reload the page\n", 403,
                                content_type="text/plain")
        return self._member_refusal(g.login)

    async def _recheck(self, session: Any, now: float) -> Any:
        """`session` after checking again its store token (revoked, expired?) and its person (account disabled,
        role taken away?): the refreshed session, or None (closed)."""
        login = session.login or Login(session.principal, session.token_id)
        fresh: Login | None = login
        if session.token_id is not None and self.still_valid is not None \
                and not await self.still_valid(session.token_id):
            fresh = None
        if fresh is not None and login.person is not None and self.accounts is not None:
            fresh = await self.accounts.recheck(login)
        if fresh is None:
            self.sessions.close(session.session_id)
            return None
        return self.sessions.checked(session, now, fresh)

    def _member_refusal(self, login: Login) -> Response | None:
        """A project member sees their projects' usage only: the cluster's page sends them there, any other page
        is a 403 with a sentence. None for operators and viewers, and for the pages a member may open."""
        if login.role != "member":
            return None
        if request.endpoint in ("cluster", "cluster_bare"):
            return redirect(f"{PREFIX}/usage", 303)
        if request.endpoint in MEMBER_PAGES:
            return None
        return Response(f"{login.person} is a member of {', '.join(login.projects)}: members see their projects' "
                        "usage (/console/usage), quotas (/console/quotas) and keys; the cluster's pages are for operators and viewers "
                        "(projects.yaml people)\n", 403, content_type="text/plain")

    def _secure(self) -> bool:
        # the scheme the client used: https when served over TLS, or behind a trusted proxy that says so
        # (X-Forwarded-Proto, believed from trusted proxies only: llmgw.control.admin_listener)
        return request.scheme == "https"

    async def _login(self) -> Any:
        if request.method == "GET":
            nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)
            response = Response(await self._login_page(nonce, None))
            response.set_cookie(LOGIN_COOKIE, nonce, httponly=True, samesite="Strict", secure=self._secure(),
                                path=f"{PREFIX}/login")
            return response
        form = await request.form
        nonce = request.cookies.get(LOGIN_COOKIE) or ""
        if not nonce or not csrf_matches(nonce, form.get("csrf")):
            return Response("the login form's CSRF token does not match: reload the login page\n", 403,
                            content_type="text/plain")
        if "email" in form:
            login, refusal = await self._password_login(str(form.get("email") or ""), str(form.get("password") or ""))
            if login is None:
                return Response(await self._login_page(nonce, refusal[1]), refusal[0])
        else:
            login = await self.authorise((form.get("token") or "").strip())
            if login is None:
                return Response(await self._login_page(nonce, "That token is not valid. Use the control plane's "
                                                              "admin token (<state>/admin-token)."), 401)
        return self._opened(login)

    def _opened(self, login: Login) -> Response:
        """The answer of a login that succeeded: a new session's cookie and a redirect to the cluster's page."""
        session = self.sessions.open(login.principal, self.wall(), login.token_id, login)
        response = redirect(f"{PREFIX}/", 303)
        response.set_cookie(SESSION_COOKIE, session.session_id, httponly=True, samesite="Strict",
                            secure=self._secure(), path=PREFIX, max_age=int(self.sessions.ttl))
        response.delete_cookie(LOGIN_COOKIE, path=f"{PREFIX}/login")
        return response

    async def _login_page(self, nonce: str, error: str | None) -> str:
        return await render_template("login.html", csrf=nonce, error=error, accounts=self.accounts is not None,
                                     oidc=self.oidc is not None)

    @property
    def oidc(self) -> OidcClient | None:
        """The OpenID provider's client now (None: no OpenID login)."""
        return self._oidc() if callable(self._oidc) else self._oidc

    async def _oidc_start(self) -> Any:
        oidc = self.oidc
        if oidc is None or self.accounts is None:
            return Response("this console has no OpenID provider\n", 404, content_type="text/plain")
        try:
            return redirect(await oidc.begin(self.wall()), 303)
        except OidcError as exc:
            return Response(await self._login_page("", str(exc)), 502)

    async def _oidc_callback(self) -> Any:
        """The provider's answer: the code exchanged, the ID token checked (`OidcClient.finish`), the e-mail's role
        read from the settings (`Accounts.person`); a session like a password login's, or the login page with why
        not. The provider's own error (access_denied, ...) is shown as it says it."""
        oidc = self.oidc
        if oidc is None or self.accounts is None:
            return Response("this console has no OpenID provider\n", 404, content_type="text/plain")
        args = request.args
        if args.get("error"):
            return Response(await self._login_page("", f"The OpenID provider refused the login: "
                                                       f"{args.get('error')[:80]} {args.get('error_description', '')[:200]}"), 401)
        try:
            email = await oidc.finish(args.get("code", ""), args.get("state", ""), self.wall())
        except OidcError as exc:
            return Response(await self._login_page("", f"{exc}."), 401)
        login = await self.accounts.person(email)
        if login is None or not login.role:
            return Response(await self._login_page("", f"{email} has no role here: projects.yaml names them "
                                                       "neither in people nor as a project's member (or their "
                                                       "account is disabled). Ask an operator."), 403)
        return self._opened(login)

    async def _password_login(self, email: str, password: str) -> tuple[Login | None, tuple[int, str]]:
        """An account's login, or None and (status, sentence): 429 while the e-mail or the client's address is
        locked out (`LoginThrottle`: even a right password), 401 for a wrong one (counted), 403 for no role."""
        if self.accounts is None:
            return None, (404, "This console takes tokens only: no accounts are set up.")
        email = email.strip().lower()
        keys = (f"email:{email}", f"address:{request.remote_addr or ''}")
        wait = self.throttle.wait(keys, self.clock())
        if wait > 0:
            minutes = max(1, round(wait / 60))
            return None, (429, f"Too many failed logins for this account or from this address: try again in about "
                               f"{minutes} minute{'s' if minutes != 1 else ''}.")
        login = await self.accounts.log_in(email, password)
        if login is None:
            self.throttle.failed(keys, self.clock())
            return None, (401, "That e-mail and password do not match an active account.")
        self.throttle.succeeded(keys)
        if login.role not in ("operator", "viewer", "member"):
            return None, (403, f"{email} has no role: projects.yaml names them neither in people.operators or "
                               "people.viewers nor as a project's member. Ask an operator.")
        return login, (200, "")

    async def _logout(self) -> Any:
        if not g.bearer:
            self.sessions.close(g.session_id)
        response = redirect(f"{PREFIX}/login", 303)
        response.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return response

    async def _page(self, template: str, page: str, **context: Any) -> str:
        state = context.pop("state")
        settings = state.settings
        return await render_template(
            template, page=page, principal=g.principal, csrf=g.csrf, bearer=g.bearer, login=g.login,
            leader=state.leadership.leader, leader_holder=state.leadership.holder,
            cluster_name=settings.cluster.name if settings else "", usage_page=self.usage is not None,
            quotas_page=self.quotas is not None,
            logs_page=self.logs is not None, explorer_page=self.explore is not None, can_act=self.act is not None and g.login.role == "operator",
            actions=self.act is not None, **context,
        )

    async def _cluster(self) -> str:
        state = self.snapshot()
        return await self._page("cluster.html", "cluster", state=state, passes=list(reversed(self.passes)),
                                **cluster_view(state))

    async def _nodes(self) -> str:
        state, now = self.snapshot(), self.clock()
        return await self._page("nodes.html", "nodes", state=state,
                                rows=[node_row(r, now) for r in state.fleet.records()])

    async def _node(self, node_id: str) -> Any:
        state, now = self.snapshot(), self.clock()
        record = state.fleet.get(node_id)
        if record is None:
            return await self._page("missing.html", "nodes", state=state, what=f"node {node_id}"), 404
        minute = int(self.wall() // 60)
        series = self.gpu_history.node(node_id)
        tiles = gpu_tiles(record, now)
        charts = {t.device_id: gpu_chart(None if t.mig else series.get(t.index), minute, t.memory_total_bytes,
                                         t.power_limit_watts, f"GPU {t.device_id} of {node_id}, last hour")
                  for t in tiles}
        readings = record.readings if record.readings is not None and record.readings.fresh(now) else None
        shard_readings = {s.shard_id: s for s in (readings.shards if readings else ())}
        return await self._page("node.html", "nodes", state=state, record=record, row=node_row(record, now),
                                tiles=tiles, charts=charts, readings=readings, shard_readings=shard_readings,
                                verdicts=card_verdicts(record))

    async def _logs(self, node_id: str) -> Any:
        state = self.snapshot()
        shard = request.args.get("shard", "")
        lines = _int_arg("lines", 200, 1, 2000)
        follow = request.args.get("follow") == "1"
        if self.logs is None or state.fleet.get(node_id) is None:
            return await self._page("missing.html", "nodes", state=state, what=f"log of node {node_id}"), 404
        error, text, status = "", [], 200
        try:
            text = await self.logs(node_id, shard, lines)
        except UsageError as exc:
            error, status = str(exc), 409
        except TemporaryError as exc:
            error, status = str(exc), 503
        return await self._page("logs.html", "nodes", state=state, node_id=node_id, shard=shard, lines=lines,
                                follow=follow, text=text, error=error), status

    async def _gpus(self) -> str:
        state, now = self.snapshot(), self.clock()
        groups: dict[str, list] = {}
        for record in state.fleet.records():
            for tile in gpu_tiles(record, now):
                groups.setdefault(tile.gpu_class, []).append(tile)
        by = request.args.get("by", "utilization")
        by = by if by in MAP_COLOURINGS else "utilization"
        return await self._page("gpus.html", "gpus", state=state, groups=dict(sorted(groups.items())), by=by,
                                colourings=MAP_COLOURINGS)

    async def _fabrics(self) -> str:
        """NVLink domains and IMEX, InfiniBand fabrics by subnet manager with each node's rails and ports, and the
        last fabric test of each pair (`llmgw.console.fabrics`)."""
        state = self.snapshot()
        tests = self.fabric_tests() if self.fabric_tests is not None else []
        return await self._page("fabrics.html", "fabrics", state=state,
                                view=fabrics_view(state.fleet.records(), tests))

    async def _replicas(self) -> str:
        state = self.snapshot()
        return await self._page("replicas.html", "replicas", state=state, models=models_view(state, self.wall()))

    async def _history(self) -> str:
        state = self.snapshot()
        limit = _int_arg("limit", 50, 1, 500)
        entries = [_plain(e) for e in await self.history(limit)]
        return await self._page("history.html", "history", state=state, entries=entries, limit=limit)


    async def _history_entry(self, commit: str) -> Any:
        state = self.snapshot()
        entries = [_plain(e) for e in await self.history(200)]
        entry = next((e for e in entries if e["commit"] == commit), None)
        if entry is None:
            return await self._page("missing.html", "history", state=state, what=f"audit commit {commit[:12]} "
                                    "among the last 200"), 404
        applied = await self.applied_diff(commit) if self.applied_diff is not None else None
        return await self._page("history_entry.html", "history", state=state, entry=entry, applied=applied)

    async def _usage(self) -> Any:
        """Usage of the last `days` days by day (a column chart and a table), model and project, of the project and
        model chosen (`project`, `model`: "" all; a member chooses among their projects only)."""
        state = self.snapshot()
        if self.usage is None:
            return await self._page("missing.html", "usage", state=state, what="usage store"), 404
        days = _int_arg("days", 7, 1, 366)
        project, model = _text_arg("project"), _text_arg("model")
        since = self.wall() - days * 86400.0
        member = g.login.role == "member"
        allowed = tuple(g.login.projects or ()) if member else None
        if member and project and project not in allowed:
            raise BadParameter("project", f"is {project!r}, not one of your projects ({', '.join(allowed)})")
        chosen = (project,) if project else allowed
        groups = {by: await self._usage_rows(by, since, chosen, model) for by in USAGE_GROUPS}
        projects = [r.group for r in (await self._usage_rows("project", since, allowed, None)
                                      if project or model else groups["project"])]
        models = [r.group for r in (await self._usage_rows("model", since, allowed, None)
                                    if project or model else groups["model"])]
        hours = await self.gpu_hours(since) if self.gpu_hours is not None else None
        if hours is not None:  # a member's projects only, and the project and model chosen
            hours = [row for row in hours if (not member or row["project"] in allowed)
                     and (not project or row["project"] == project) and (not model or row["model"] == model)]
        settings = state.settings
        currency = settings.cluster.currency if settings else ""
        what = " · ".join(x for x in (f"project {project}" if project else "", f"model {model}" if model else "") if x)
        title = f"tokens per day, last {days} day{'s' if days != 1 else ''}" + (f", {what}" if what else "")
        return await self._page("usage.html", "usage", state=state, days=days, groups=groups, currency=currency,
                                chart=day_columns(groups["day"], title, window_days(self.wall(), days)),
                                gpu_hours=hours, project=project, model=model,
                                projects=sorted(set(projects) | ({project} if project else set())),
                                models=sorted(set(models) | ({model} if model else set())))

    async def _usage_rows(self, by: str, since: float, projects: tuple[str, ...] | None,
                          model: str | None) -> list[Any]:
        """`usage` grouped `by`, of `projects` (None: all) and `model` (None or "": all); passed on only when
        given, so a usage function of (by, since) still serves a console without choices."""
        assert self.usage is not None
        args = (by, since) if projects is None else (by, since, projects)
        return await self.usage(*args, **({"model": model} if model else {}))


    async def _quotas(self) -> Any:
        """The quotas of the projects the person may see (a member: theirs; anyone else: every project's) and what
        counts against each limit now (`quotas`: one store read for every scope)."""
        state = self.snapshot()
        settings = state.settings
        if self.quotas is None or settings is None:
            return await self._page("missing.html", "quotas", state=state, what="quota store"), 404
        projects = self._visible_projects(state)
        uses = await self.quotas(scopes_of(settings, projects))
        return await self._page("quotas.html", "quotas", state=state, projects=projects,
                                sections=project_quotas(settings, projects, uses), currency=settings.cluster.currency)

    async def _explorer(self) -> Any:
        """The model explorer: a form for a source and, given one, what its metadata says and where it would fit
        in the fleet now (per GPU class and CPU node). A source that cannot be read is a 400 naming why."""
        state = self.snapshot()
        if self.explore is None:
            return await self._page("missing.html", "explorer", state=state, what="model explorer"), 404
        source = request.args.get("source", "").strip()[:500]
        context = _int_arg("context", 0, 0, 10_000_000) or None
        fit, error = None, ""
        if source:
            try:
                fit = plan_model(await self.explore(source), state.fleet.fleet(), context)
            except WeightsError as exc:
                error = str(exc)
        return await self._page("explorer.html", "explorer", state=state, source=source, context=context or "",
                                fit=fit, error=error, serve=serve_form(fit) if fit else None), 400 if error else 200

    async def _ssh_keys(self) -> Any:
        """The SSH keys of slurm.yaml `ssh_keys` (a member's own only), with forms to add and remove them."""
        state = self.snapshot()
        keys = dict(state.settings.slurm.ssh_keys) if state.settings else {}
        member = g.login.role == "member"
        if member:
            keys = {g.login.person: keys.get(g.login.person, ())}
        return await self._page("ssh_keys.html", "ssh-keys", state=state, keys=dict(sorted(keys.items())),
                                member=member, may_edit=self.act is not None and g.login.role in ("operator", "member"))

    async def _act(self) -> Any:
        """An action form: without `expect`, the diff its edit would commit (nothing committed) and a form to confirm
        it; with `expect` (the head the diff was made against), the commit. Either way as the person logged in,
        through the admin API's edit routes (`act`); what they refuse is shown with their status and words."""
        state = self.snapshot()
        if self.act is None:
            return await self._page("missing.html", "actions", state=state, what="action on this console"), 404
        form = await request.form
        fields = {name: str(form.get(name)) for name in FORM_FIELDS if form.get(name)}
        back = back_of(form)
        try:
            wanted = request_of(form, g.login)
        except ActionError as exc:
            return await self._page("acted.html", "actions", state=state, title="Not an action", status=400,
                                    error={"message": str(exc)}, fields={}, back=back), 400
        expect = str(form.get("expect") or "")
        status, answer = await self.act(g.login, wanted.path,
                                        {**wanted.body, **({"expect": expect} if expect else {"preview": True})})
        if status != 200:
            return await self._page("acted.html", "actions", state=state, title=wanted.title, status=status,
                                    error=answer.get("error", {}), fields=fields, back=back), status
        if answer.get("preview"):
            return await self._page("confirm.html", "actions", state=state, title=wanted.title, answer=answer,
                                    diff=_diff_lines(answer.get("diff", "")), fields=fields, back=back)
        return await self._page("acted.html", "actions", state=state, title=wanted.title, status=200, answer=answer,
                                error=None, fields=fields, back=back)


    # -- API keys: the admin API's /api/v1/keys as the person logged in ------------------------------------------

    def _visible_projects(self, state: ControlState) -> list[str]:
        """The projects whose keys and quotas the pages show (and keys they may make): a member's own, every project
        of the settings for anyone else."""
        if g.login.role == "member":
            return sorted(g.login.projects)
        return sorted(state.settings.projects) if state.settings else []

    async def _keys(self) -> Any:
        """The API keys of the projects the person may see (a member: theirs, one GET /api/v1/keys?project=P each;
        anyone else: every project's), with a form to make one and a button to revoke each active one."""
        state = self.snapshot()
        if self.act is None:
            return await self._page("missing.html", "keys", state=state, what="API keys on this console"), 404
        projects = self._visible_projects(state)
        paths = ([f"/api/v1/keys?project={quote(p)}" for p in projects] if g.login.role == "member"
                 else ["/api/v1/keys"])
        keys, error = [], None
        for path in paths:
            status, answer = await self.act(g.login, path, {}, "GET")
            if status != 200:
                error = answer.get("error", {})
                break
            keys += answer.get("keys", [])
        keys.sort(key=lambda k: (k.get("state") != "active", -(k.get("created_at") or 0)))
        return await self._page("keys.html", "keys", state=state, keys=keys, projects=projects, error=error,
                                may_make=g.login.role in ("operator", "member") and bool(projects))

    async def _key_create(self) -> Any:
        """A new key of the form's `project` (named `name`): POST /api/v1/keys as the person; its plaintext shown
        on this answer once (never stored by the console, never in a URL; the page does not refresh)."""
        state = self.snapshot()
        if self.act is None:
            return await self._page("missing.html", "keys", state=state, what="API keys on this console"), 404
        form = await request.form
        project = str(form.get("project") or "").strip()
        name = " ".join(str(form.get("name") or "").split())[:100]
        status, answer = await self.act(g.login, "/api/v1/keys", {"project": project, "name": name})
        title = f"New API key of project {project[:60]}"
        return await self._page("key_done.html", "keys", state=state, title=title, status=status, answer=answer,
                                error=answer.get("error", {}), made=True), status

    async def _key_revoke(self, key_id: str) -> Any:
        """Revoke a key: POST /api/v1/keys/ID/revoke as the person (the admin API says whether they may)."""
        state = self.snapshot()
        if self.act is None:
            return await self._page("missing.html", "keys", state=state, what="API keys on this console"), 404
        if not _KEY_ID.fullmatch(key_id):
            return await self._page("key_done.html", "keys", state=state, title="Not a key", status=400, answer={},
                                    error={"message": f"{key_id[:40]!r} is not an API key's id"}, made=False), 400
        status, answer = await self.act(g.login, f"/api/v1/keys/{key_id}/revoke", {})
        title = f"Revoke API key {answer.get('prefix', key_id)}"
        return await self._page("key_done.html", "keys", state=state, title=title, status=status, answer=answer,
                                error=answer.get("error", {}), made=False), status


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """A unified diff's lines, each with its class: "file" (---/+++), "hunk" (@@), "added", "removed" or "same"."""
    lines = []
    for line in diff.splitlines():
        kind = ("file" if line.startswith(("--- ", "+++ ")) else "hunk" if line.startswith("@@") else
                "added" if line.startswith("+") else "removed" if line.startswith("-") else "same")
        lines.append((kind, line))
    return lines


class BadParameter(ValueError):
    """A query parameter of a console page that is not what the page takes: 400 with a sentence naming it."""

    def __init__(self, name: str, message: str):
        super().__init__(f"the query parameter {name!r} {message}")
        self.name = name


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    """The request's query parameter `name` as a whole number from `low` to `high` (`default` when absent or
    empty). Raises BadParameter naming it for anything else (`abc`, `1e9`, `-3`)."""
    text = request.args.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise BadParameter(name, f"is {text[:40]!r}: give a whole number from {low} to {high}")
    return int(text)


def _text_arg(name: str, longest: int = 200) -> str:
    """The request's query parameter `name` stripped ("" when absent). Raises BadParameter naming it when longer
    than `longest` characters or holding a control character."""
    text = request.args.get(name, "").strip()
    if len(text) > longest or any(ord(c) < 32 for c in text):
        raise BadParameter(name, f"is not a name (at most {longest} printable characters)")
    return text


async def _bad_parameter(error: BadParameter) -> Response:
    return Response(f"{error}\n", 400, {"X-Bad-Parameter": error.name}, content_type="text/plain")


def _plain(entry: Any) -> dict[str, Any]:
    if isinstance(entry, dict):
        return entry
    return {name: getattr(entry, name, "") for name in ("commit", "time", "author", "message", "files",
                                                         "settings_author")}


async def _secure_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    if not request.path.startswith(f"{PREFIX}/static/"):
        response.headers["Cache-Control"] = "no-store"
    return response


def _size(value: int | float | None) -> str:
    return "–" if value is None else format_size(int(value))


def _duration(value: float | None) -> str:
    return "–" if value is None else format_duration(float(value))


def _percent(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f} %"


def _short(commit: str | None) -> str:
    return (commit or "")[:12] or "–"


def _when(unix: float | None) -> str:
    if not unix:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))
