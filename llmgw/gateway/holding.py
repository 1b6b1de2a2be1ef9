"""Requests held for a model scaled to zero while a replica starts.

A model whose settings give `replicas: {min: 0, ...}` (`ModelRoute.wakes`) has no replica once it was idle. Its next
request is not refused: the gateway holds it here, tells the control plane how many requests wait for the model
(`on_change(model, count)`: the autoscaler wakes it, `llmgw.plan.autoscaling`), and sends it on as soon as the
routing table has a ready replica of the model. Bounded:
- at most `limit` requests wait per model; one more is refused at once with 503 and `Retry-After`;
- one waits at most `timeout` seconds, then is refused the same way. A request cancelled meanwhile leaves the
  queue; a client that disconnects is not looked for here.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from llmgw.routes import ModelRoute, RouteTable

HOLD_LIMIT = 32
"""Requests held per model, at most, while it wakes."""

HOLD_SECONDS = 120.0
"""Seconds a held request waits for a replica, at most (llama-server loads Gemma 270M in about 1 s here; a large
model's weights may take a minute)."""

WAKE_RETRY_SECONDS = 10.0
"""The `Retry-After` of a request refused because the queue of a waking model is full or its wait ran out."""


class Holding:
    """The requests held per model. `table()` gives the routing table in force; the gateway calls `table_changed()`
    after each new one. `on_change(model, count)` is told every change of a model's count (the control plane sets
    it; by default nobody listens)."""

    def __init__(self, table: Callable[[], RouteTable], *, limit: int = HOLD_LIMIT, timeout: float = HOLD_SECONDS):
        self.table, self.limit, self.timeout = table, limit, timeout
        self.held: dict[str, int] = {}
        self.on_change: Callable[[str, int], None] = lambda model, count: None
        self._changed = trio.Event()

    def table_changed(self) -> None:
        """Wake the held requests to look at the new table."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for_replica(self, name: str) -> tuple[ModelRoute | None, str]:
        """Hold a request for model `name` until the table has a ready replica of it: (its route, ""), or (None, why)
        when the queue is full or `timeout` ran out. A checkpoint; cancelled with the request."""
        count = self.held.get(name, 0)
        if count >= self.limit:
            return None, f"{count} requests already wait for it to start"
        self._set(name, count + 1)
        try:
            with trio.move_on_after(self.timeout):
                while True:
                    route = self.table().resolve(name)
                    if route is None or not route.wakes and not route.replicas:
                        return None, "it is no longer served"
                    if route.replicas:
                        return route, ""
                    await self._changed.wait()
            return None, f"no replica was ready within {self.timeout:g} s"
        finally:
            self._set(name, self.held.get(name, 1) - 1)

    def _set(self, name: str, count: int) -> None:
        if count > 0:
            self.held[name] = count
        else:
            self.held.pop(name, None)
        self.on_change(name, count)
