"""`Handlers`: the registry that maps each effect type (`llmgw.control.effects`) to its one async handler.

    handlers = Handlers()
    handlers.register(StopShard, send_stop)          # async def send_stop(effect: StopShard) -> None
    loop = ControlLoop(state, handlers)

The control loop (`llmgw.control.looping`) looks each effect's handler up by the effect's exact type and awaits it
in its own nursery. Effects other than commands are handled one after the other per lane, in the order they were
emitted: each type is a lane of its own unless registered into a named one (`WriteAudit` and `SetApplied` share
"audit", so the applied ref moves after the audit commit queued before it). A command's handler (`StartShard`, `StopShard`, `InstallEngine`, `ConfigureAgent`) sends the
command and returns once the node answered, raising LlmgwError when it did not (a TemporaryError's `delay` is
honoured): the loop turns either outcome into a transition. Any other handler reports what it learns as transitions
itself (through the loop's `update`) and raises nothing. Adding a kind of effect is: its class, a rule that emits
it, and one handler registered here; no if-chain grows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from llmgw.control.effects import COMMANDS

Handler = Callable[[Any], Awaitable[None]]
"""`async def handle(effect) -> None`."""


class Handlers:
    """Effect type -> handler. `register` adds one; `get(effect)` finds the handler of an effect (None: the effect
    has no handler here and is dropped, e.g. a loop under test without an audit)."""

    def __init__(self, handlers: Mapping[type, Handler] | None = None):
        self._handlers: dict[type, Handler] = dict(handlers or {})
        self._lanes: dict[type, str] = {}

    def register(self, kind: type, handler: Handler, *, lane: str | None = None) -> None:
        """Make `handler` the one handler of effects of type `kind`, handled in order in `lane` (None: a lane of
        the type's own). Raises ValueError when `kind` has one."""
        if kind in self._handlers:
            raise ValueError(f"effects of type {kind.__name__} have a handler already")
        self._handlers[kind] = handler
        self._lanes[kind] = lane or kind.__name__

    def lane(self, effect: object) -> str:
        """The lane `effect` is handled in (see the module docstring)."""
        return self._lanes.get(type(effect), type(effect).__name__)

    def get(self, effect: object) -> Handler | None:
        """The handler of `effect`'s type, or None."""
        return self._handlers.get(type(effect))

    def kinds(self) -> tuple[type, ...]:
        """The effect types that have a handler."""
        return tuple(self._handlers)


def every_command(handler: Handler) -> dict[type, Handler]:
    """`handler` for every command type (StartShard, StopShard, InstallEngine, ConfigureAgent): for tests and
    stand-ins that treat all commands alike."""
    return {kind: handler for kind in COMMANDS}
