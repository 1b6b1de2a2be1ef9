"""The web console on the admin listener: `console_mount(admin_app)` builds a `llmgw.console.Console` over the
control plane's view (`ControlView.snapshot`) and the few functions it needs beyond the state (login check, audit
log, usage, logs, the settings diff of an audit commit), and mounts it under /console. Blocking reads (git, the
store) run in worker threads.

    ControlPlane(ControlConfig(..., admin_mounts=(console_mount,)))   what `llmgw server` and `llmgw up` run

It lives in the CLI, the layer above both: the control plane imports no console, and the console imports of the
control plane only its view (`llmgw.control.view`; the import contracts in pyproject.toml check both).
"""

from __future__ import annotations

import trio

from llmgw.console import Console
from llmgw.control.admin import AdminApp, AdminMount

CONSOLE_SCOPE = "console"
"""The token scope the console's login asks the admin API for."""


def console_mount(admin: AdminApp) -> AdminMount:
    """The console of the admin API `admin` (an `llmgw.control.admin.AdminApp` over a `ControlView`), under
    /console, with its sampler (`Console.run_sampler`) as the mount's task."""
    plane = admin.plane

    def principal(token: str) -> str | None:
        # the admin API's check for the scope "console": today the plane's admin token or one of the store's;
        # scoped console tokens plug in there (`AdminApp.authorised_for`)
        scope = {"headers": [(b"authorization", f"Bearer {token}".encode())]}
        return "admin" if admin.authorised_for(scope, CONSOLE_SCOPE) else None

    async def usage(by: str, since: float | None) -> list:
        return await trio.to_thread.run_sync(plane.store.query_usage, None, since, by)

    async def applied(audit_commit: str):
        from llmgw.control.audit_diff import applied_diff

        return await trio.to_thread.run_sync(applied_diff, str(plane.watcher_repo_path), audit_commit)

    console = Console(plane.snapshot, authorise=principal, history=admin.history_entries, usage=usage,
                      logs=plane.logs, applied_diff=applied)
    return AdminMount("/console", console, console.run_sampler)
