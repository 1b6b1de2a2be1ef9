"""Restarting a gateway worker process that died: the delay rule (pure) and the loop that applies it.

Rule (`restart_delay`): 1 s before the first restart, doubling after each quick death up to 30 s; a worker that had
run STABLE_SECONDS (60 s) or more before it died is restarted after 1 s again. So a worker killed once is back
within about a second, and one that dies at start (a bad store URL, a port taken) costs a restart every 30 s, not a
busy loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from llmgw.errors import LlmgwError

FIRST_DELAY = 1.0
MAX_DELAY = 30.0
STABLE_SECONDS = 60.0

log = logging.getLogger("llmgw.gateway")


def restart_delay(previous: float | None, uptime: float) -> float:
    """Seconds to wait before starting again a worker that ran `uptime` seconds, `previous` being the delay waited
    before its last start (None: it was the first start). Pure."""
    if previous is None or uptime >= STABLE_SECONDS:
        return FIRST_DELAY
    return min(MAX_DELAY, previous * 2)


def only_error(group: BaseExceptionGroup, kinds) -> BaseException | None:
    """The first error of `group` when every error in it is one of `kinds` (a class or tuple), else None: a
    failure to report as its own sentence rather than as a group (see cli/main.py's use of `split`)."""
    matched, rest = group.split(kinds)
    if matched is None or rest is not None:
        return None
    error: BaseException = matched
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


class WorkerStartError(LlmgwError):
    """A gateway worker ended before it was serving, the first time it was started (its log says why)."""


async def keep_running(run: Callable[..., Awaitable[None]], name: str, *,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run `await run(task_status=...)` again each time it returns (the worker process ended), waiting
    `restart_delay` between, until cancelled. `run` calls `task_status.started()` once it serves; the first run's
    goes to this function's caller, so `nursery.start(keep_running, ...)` returns once the worker first serves.

    Raises WorkerStartError when the first run returns without having started (nothing would serve the port).
    """
    delay: float | None = None
    first = True
    while True:
        began = trio.current_time()
        if first:
            ready = False

            class _Status:
                def started(self, value=None) -> None:
                    nonlocal ready
                    ready = True
                    task_status.started(value)

            await run(task_status=_Status())
            if not ready:
                raise WorkerStartError(f"gateway {name} ended before it was serving; its lines above in the log "
                                       "say why.")
            first = False
        else:
            await run(task_status=trio.TASK_STATUS_IGNORED)
        delay = restart_delay(delay, trio.current_time() - began)
        log.warning("gateway %s ended; starting it again in %.0f s", name, delay)
        await trio.sleep(delay)
