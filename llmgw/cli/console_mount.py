"""The web console on the admin listener: `console_mount(admin_app)` builds a `llmgw.console.Console` over the
control plane's view (`ControlView.snapshot`) and the few functions it needs beyond the state (login check, audit
log, usage, quotas, logs, the settings diff of an audit commit), and mounts it under /console. Blocking reads (git, the
store) run in worker threads.

    ControlPlane(ControlConfig(..., admin_mounts=(console_mount,)))   what `llmgw server` and `llmgw up` run

It lives in the CLI, the layer above both: the control plane imports no console, and the console imports of the
control plane only its view (`llmgw.control.view`; the import contracts in pyproject.toml check both).
"""

from __future__ import annotations

import hmac
import logging
import os
import time

import trio

from llmgw.console import Console, Login
from llmgw.console.oidc import OidcClient, OidcSettings
from llmgw.settings import ConsoleOidc
from llmgw.control.admin import AdminApp, AdminMount, Caller, Person
from llmgw.errors import WeightsError

log = logging.getLogger("llmgw.console")
CONSOLE_SCOPE = "console"
"""The token scope the console's login asks the admin API for."""
EXPLORE_SECONDS = 25.0
"""The longest the console's model explorer reads a model's headers (the console answers within 30 s)."""


def console_mount(admin: AdminApp) -> AdminMount:
    """The console of the admin API `admin` (an `llmgw.control.admin.AdminApp` over a `ControlView`), under
    /console, with its sampler (`Console.run_sampler`) as the mount's task."""
    plane = admin.plane

    async def login(token: str) -> Login | None:
        # the plane's own admin token, or a store token of scope "console" or "admin", looked up in a worker
        # thread (`AdminApp.in_store_thread`): a stream of fake tokens never holds the event loop. A token that
        # belongs to a person gives that person's role (`AdminApp.person_of`: none while their account is disabled)
        if plane.admin_token and hmac.compare_digest(plane.admin_token.encode(), token.encode()):
            return Login("admin")
        if plane.store is None or not token:
            return None
        found = await admin.in_store_thread(plane.store.find_token, token)
        if found is None or found.scope not in (CONSOLE_SCOPE, "admin") or not _active(found):
            return None
        if found.owner is None:  # an admin token of nobody's is an operator's; a console token only reads
            return Login(found.name or found.scope, found.token_id, role="operator" if found.scope == "admin"
                         else "viewer")
        person = await admin.person_of(found.owner)
        if person is None or not person.access.role:
            return None
        return Login(person.name, found.token_id, person.email, person.access.role, person.access.projects)

    async def still_valid(token_id: str) -> bool:
        found = await admin.in_store_thread(plane.store.token_by_id, token_id)
        return found is not None and _active(found)

    async def usage(by: str, since: float | None, projects: tuple[str, ...] | None = None,
                    model: str | None = None) -> list:
        return await trio.to_thread.run_sync(plane.store.query_usage, projects, since, by, model)

    async def gpu_hours(since: float) -> list:
        from llmgw.control.usage_hours import hours_document

        settings = plane.snapshot().watch.settings
        if settings is None:
            return []
        document = await trio.to_thread.run_sync(hours_document, plane.store, settings, since)
        return document["rows"]

    async def quota_use(scopes: list) -> list:
        # what counts now against each limit, as the gateway's quota check reads it (`Store.quota_use`)
        return await admin.in_store_thread(plane.store.quota_use, scopes)

    async def applied(audit_commit: str):
        from llmgw.control.audit_diff import applied_diff

        return await trio.to_thread.run_sync(applied_diff, str(plane.watcher_repo_path), audit_commit)

    accounts = StoreAccounts(admin) if plane.store is not None else None

    async def act(who: Login, path: str, body: dict, method: str = "POST") -> tuple[int, dict]:
        # the admin API's own route, as the person logged in (their role checked there, them the commit's author);
        # a login of nobody's acts as its token may on the admin API: the plane's own admin token and store tokens
        # of scope admin change settings, a token of scope console only reads (GET)
        if who.person is None:
            if who.token_id is not None and method != "GET":
                found = await admin.in_store_thread(plane.store.token_by_id, who.token_id)
                if found is None or not _active(found) or found.scope != "admin":
                    return 403, {"error": {"type": "forbidden", "message": "this console login's token (scope "
                                           f"{found.scope if found else 'unknown'}) reads the console and changes "
                                           "nothing: log in with an admin token or as a person with a role"}}
            return await admin.act(Caller(token_id=who.token_id), path, body, method)
        fresh = await accounts.person(who.person) if accounts is not None else None
        if fresh is None or not fresh.role:
            return 401, {"error": {"type": "unauthorized", "message": f"{who.person} may no longer act here (account "
                                   "disabled, or no role in projects.yaml): log in again"}}
        person = Person(fresh.person or who.person, fresh.principal, admin.access_of(fresh.person or who.person))
        return await admin.act(Caller(person, who.token_id), path, body, method)

    async def explore(source: str):
        # the model explorer reads the Hub as the control plane's host reaches it: $HF_ENDPOINT, $HF_TOKEN
        from llmgw.agent.model_metadata import read_source

        with trio.move_on_after(EXPLORE_SECONDS):
            return await read_source(source, token=os.environ.get("HF_TOKEN") or None)
        raise WeightsError(f"{source}: reading its headers took more than {EXPLORE_SECONDS:.0f} s; check the Hub "
                           "(or $HF_ENDPOINT) is reachable from the control plane's host")

    console = Console(plane.snapshot, authorise=login, still_valid=still_valid, history=admin.history_entries,
                      usage=usage, gpu_hours=gpu_hours if plane.store is not None else None, logs=plane.logs,
                      fabric_tests=plane.last_fabric_tests,
                      applied_diff=applied, accounts=accounts, oidc=SettingsOidc(plane), act=act,
                      quotas=quota_use if plane.store is not None else None, explore=explore)
    return AdminMount("/console", console, console.run_sampler)


class SettingsOidc:
    """The console's OpenID provider client as llmgw.yaml `console.oidc` names it in the settings in force (None
    without one, or while its client secret cannot be read: logged once); a new client when those settings change."""

    def __init__(self, plane):
        self.plane = plane
        self._of: ConsoleOidc | None = None
        self._client: OidcClient | None = None
        self._missing: ConsoleOidc | None = None  # whose missing secret was logged already

    def __call__(self) -> OidcClient | None:
        settings = self.plane.snapshot().settings
        wanted = settings.cluster.console_oidc if settings is not None else None
        if wanted is None:
            return None
        if wanted != self._of:
            secret = self.plane.secret(wanted.client_secret)
            if secret is None:
                if self._missing != wanted:
                    self._missing = wanted
                    log.warning("llmgw.yaml console.oidc names the secret %r, which is neither in the secrets "
                                "directory nor in the environment: no OpenID login until it is", wanted.client_secret)
                return None
            self._client = OidcClient(OidcSettings(wanted.issuer, wanted.client_id, secret, wanted.redirect_uri))
            self._of = wanted
        return self._client


class StoreAccounts:
    """The console's `Accounts` over the admin API's store and settings: a password checked in a worker thread
    (`Store.check_password`, one scrypt), the role from the settings in force (`Settings.access_of`)."""

    def __init__(self, admin: AdminApp):
        self.admin = admin

    async def log_in(self, email: str, password: str) -> Login | None:
        account = await self.admin.in_store_thread(self.admin.plane.store.check_password, email, password)
        if account is None:
            return None
        access = self.admin.access_of(account.email)
        return Login(account.name, None, account.email, access.role or "", access.projects)

    async def person(self, email: str) -> Login | None:
        """The login of `email` vouched for by an OpenID provider: None when they have a disabled local account,
        role "" when the settings give them none; named as their account is, else by the e-mail."""
        account = await self.admin.in_store_thread(self.admin.plane.store.account, email)
        if account is not None and not account.active:
            return None
        access = self.admin.access_of(email)
        return Login(account.name if account else access.email, None, access.email, access.role or "",
                     access.projects)

    async def recheck(self, login: Login) -> Login | None:
        fresh = await self.person(login.person or "")
        if fresh is None or not fresh.role:
            return None
        return Login(login.principal, login.token_id, fresh.person, fresh.role, fresh.projects)


def _active(token) -> bool:
    from llmgw.store import CredentialState

    return token.state(time.time()) is CredentialState.ACTIVE
