"""One connected agent as the control plane holds it: its link, its commands in flight and its log requests.

A command (StartShard, StopShard, InstallEngine) carries a fresh `command_id`; the agent answers with a
`CommandResult` echoing it. `AgentSession.command` sends one and waits for that answer under the caller's
deadline. `request_logs` does the same round trip for `RequestLogs` -> `LogLines`, `fabric_test` for
`FabricTest` -> `FabricTestOutput`.
The session's receive loop (in `llmgw.control.plane`) hands answers in with `deliver_result` / `deliver_logs`.
Nothing is sent that the agent cannot take: `send` checks each message against the features the agent listed at
Register (`llmgw.wire.features.lacking`) and refuses one that needs a feature the agent lacks, naming it.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass

import trio

from llmgw.errors import TemporaryError, UsageError, WireError
from llmgw.wire import pb
from llmgw.wire.features import lacking
from llmgw.wire.messages import control_message

_ids = itertools.count(1)
_PREFIX = secrets.token_hex(3)
"""Command ids are unique across control planes: an agent connected to several sends every result to each."""


@dataclass(frozen=True)
class CommandOutcome:
    """What an agent answered to one command: `ok`, and `error` (a sentence) when not; `report`: what it did, one
    line each (WipeNode: what it removed), () for most commands."""

    command_id: str
    ok: bool
    error: str = ""
    report: tuple[str, ...] = ()


class _Waiter:
    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: object = None

    def set(self, value: object) -> None:
        if not self.event.is_set():
            self.value = value
            self.event.set()


class AgentSession:
    """The control plane's end of one agent's stream (`link`), once that agent registered as `node_id`; `replicas`
    the replica ids of the shards it last reported (the hub keeps them, `llmgw.control.agents`); `features` and
    `agent_version` what its Register listed (an agent listing none is sent the protocol's base only)."""

    def __init__(self, link, node_id: str, peer: str, features=(), agent_version: str = ""):
        self.link = link
        self.node_id = node_id
        self.peer = peer
        self.features = frozenset(features)
        self.agent_version = agent_version
        self.closed = False
        self.replicas: frozenset[str] = frozenset()  # of the shards it reports (its prefix-cache blocks' scope)
        self._send_lock = trio.Lock()
        self._results: dict[str, _Waiter] = {}
        self._logs: dict[str, _Waiter] = {}
        self._fabric: dict[str, _Waiter] = {}

    async def send(self, message: pb.ControlMessage) -> None:
        """Send one message to the agent. Raises UsageError (nothing sent) when it needs a feature the agent did not
        list, naming the node, its version and the features; TemporaryError when the stream is gone."""
        missing = lacking(message, self.features)
        if missing:
            raise UsageError(
                f"node {self.node_id} runs llmgw agent {self.agent_version or '(unknown version)'}, which cannot take "
                f"{message.WhichOneof('body')} (it lacks {', '.join(repr(f) for f in missing)}); upgrade its agent.")
        if self.closed:
            raise TemporaryError(f"node {self.node_id} is not connected; the command waits for it to return.")
        try:
            async with self._send_lock:
                await self.link.send(message)
        except (WireError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.close()
            raise TemporaryError(f"node {self.node_id} went away while sending to it: {exc}") from exc

    async def command(self, timeout: float, **body) -> CommandOutcome:
        """Send a command (`start_shard=...`, `stop_shard=...`, `install_engine=...`) and wait for its result.

        `timeout` seconds for the answer. A checkpoint; cancellable.
        Raises: TemporaryError when the node is not connected, goes away, or does not answer in time.
        """
        command_id = f"c{_PREFIX}-{next(_ids)}"
        waiter = _Waiter()
        self._results[command_id] = waiter
        try:
            await self.send(control_message(command_id=command_id, **body))
            with trio.move_on_after(timeout):
                await waiter.event.wait()
            if not waiter.event.is_set():
                raise TemporaryError(f"node {self.node_id} did not answer within {timeout:g} s.", delay=timeout)
            if waiter.value is None:
                raise TemporaryError(f"node {self.node_id} went away before answering.")
            return waiter.value  # type: ignore[return-value]
        finally:
            self._results.pop(command_id, None)

    async def request_logs(self, shard_id: str, lines: int, timeout: float = 10.0) -> list[str]:
        """The last `lines` log lines of `shard_id` on this node ("" for the agent's own log).

        Raises: TemporaryError when the node is gone or does not answer within `timeout` seconds.
        """
        request_id = f"l{_PREFIX}-{next(_ids)}"
        waiter = _Waiter()
        self._logs[request_id] = waiter
        try:
            await self.send(control_message(
                command_id=request_id,
                request_logs=pb.RequestLogs(request_id=request_id, shard_id=shard_id, lines=lines),
            ))
            with trio.move_on_after(timeout):
                await waiter.event.wait()
            if not waiter.event.is_set() or waiter.value is None:
                raise TemporaryError(f"node {self.node_id} did not send the logs within {timeout:g} s.")
            return list(waiter.value)  # type: ignore[arg-type]
        finally:
            self._logs.pop(request_id, None)

    async def fabric_test(self, request: pb.FabricTest, timeout: float) -> pb.FabricTestOutput:
        """Send one FabricTest (its `request_id` set here) and wait up to `timeout` seconds for its output.

        Raises: TemporaryError when the node is gone or does not answer in time.
        """
        request_id = f"f{_PREFIX}-{next(_ids)}"
        request.request_id = request_id
        waiter = _Waiter()
        self._fabric[request_id] = waiter
        try:
            await self.send(control_message(command_id=request_id, fabric_test=request))
            with trio.move_on_after(timeout):
                await waiter.event.wait()
            if not waiter.event.is_set() or waiter.value is None:
                raise TemporaryError(f"node {self.node_id} did not answer the fabric test within {timeout:g} s.")
            return waiter.value  # type: ignore[return-value]
        finally:
            self._fabric.pop(request_id, None)

    def deliver_fabric_test(self, output: pb.FabricTestOutput) -> None:
        waiter = self._fabric.get(output.request_id)
        if waiter is not None:
            waiter.set(output)

    def deliver_result(self, result: pb.CommandResult) -> None:
        waiter = self._results.get(result.command_id)
        if waiter is not None:
            waiter.set(CommandOutcome(result.command_id, bool(result.ok), result.error, tuple(result.report)))

    def deliver_logs(self, logs: pb.LogLines) -> None:
        waiter = self._logs.get(logs.request_id)
        if waiter is not None:
            waiter.set(tuple(logs.lines))

    def close(self) -> None:
        """Mark the session gone and wake every waiter (they raise TemporaryError)."""
        self.closed = True
        for waiter in [*self._results.values(), *self._logs.values(), *self._fabric.values()]:
            waiter.set(None)
