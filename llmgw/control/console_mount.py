"""The console as the admin listener mounts it: `console_for(admin_app)` builds a `llmgw.console.Console` over the
plane's `snapshot` and the few functions it needs beyond the state (login check, audit log, usage, logs, the
settings diff of an audit commit). Blocking reads (git, the store) run in worker threads.
"""

from __future__ import annotations

from typing import Any

import trio

from llmgw.console import Console

CONSOLE_SCOPE = "console"
"""The token scope the console's login asks the admin API for."""


def console_for(admin: Any) -> Console:
    """The console of the admin API `admin` (an `llmgw.control.admin.AdminApp` over a `ControlView`)."""
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

    return Console(plane.snapshot, authorise=principal, history=admin.history_entries, usage=usage,
                   logs=plane.logs, applied_diff=applied)
