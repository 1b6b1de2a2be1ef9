"""`NodeWipes`: `llmgw node remove NODE` takes llmgw off the node's machine over its agent's own stream.

    outcome = await wipes.wipe("node-2", keep_weights=False)    # the admin API's POST /api/v1/nodes/NODE/wipe
    outcome.report                                                # what the agent removed, one line each

A request becomes an event on the control loop's channel (`wipe_requested`) whose effect, `WipeNode`, this module's
handler (`handle`) sends to the node as the WipeNode command (agent.proto; the agent's side is
`llmgw.agent.wiping`) and whose answer goes back to the requester by the request's id. The control plane's state is
not changed by it: the agent stops itself once it answered, its stream ends, and `llmgw node remove` then forgets
the node (POST /api/v1/nodes/NODE/forget).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

import trio

from llmgw.control.agents import AgentHub
from llmgw.control.effects import WipeNode
from llmgw.control.events import wipe_requested
from llmgw.errors import LlmgwError, TemporaryError, UsageError
from llmgw.wire import pb

WIPE_TIMEOUT = 300.0
"""Seconds the control plane waits for an agent's answer to WipeNode (its engines' stop and the removal)."""


@dataclass(frozen=True)
class WipeOutcome:
    """The agent's answer: `report`, what it removed (the lines `llmgw wipe` prints)."""

    node_id: str
    report: tuple[str, ...]


class NodeWipes:
    """The requests to wipe a node's host, and the handler of their `WipeNode` effects. `update`: the control
    loop's `update`; `connected(node_id)`: whether the node's agent has a stream open here."""

    def __init__(self, agents: AgentHub, update: Callable[..., None], connected: Callable[[str], bool]):
        self.agents, self.update, self.connected = agents, update, connected
        self._waiting: dict[str, tuple[trio.Event, list]] = {}

    async def wipe(self, node_id: str, *, keep_weights: bool = False, timeout: float = WIPE_TIMEOUT) -> WipeOutcome:
        """Ask `node_id`'s agent to wipe its host and wait for its answer. A checkpoint.
        Raises UsageError when the node is not connected (nothing was sent) or its agent refused (its words: no
        install journal, or a wipe stopped halfway); TemporaryError when it went away or did not answer in time."""
        if not self.connected(node_id):
            raise UsageError(f"node {node_id} is not connected, so its agent cannot wipe its machine: start its agent "
                             "(`systemctl start llmgw-agent` there) and try again, or wipe it over ssh (`llmgw node "
                             f"remove {node_id} --over-ssh`), or leave the machine as it is (--keep-machine)")
        request = secrets.token_hex(8)
        done, answer = self._waiting[request] = (trio.Event(), [])
        try:
            self.update(wipe_requested(WipeNode(request, node_id, keep_weights, timeout)), f"wipe of node {node_id}")
            await done.wait()
        finally:
            del self._waiting[request]
        outcome = answer[0]
        if isinstance(outcome, LlmgwError):
            raise outcome
        return outcome

    async def handle(self, effect: WipeNode) -> None:
        """The handler of `WipeNode`: send the command, hand the answer (or the error) to the waiting request.
        Raises nothing."""
        done, answer = self._waiting.get(effect.request) or (trio.Event(), [])
        try:
            outcome = await self.agents.command(effect.node_id, effect.timeout, fencing_token=effect.token,
                                                wipe_node=pb.WipeNode(keep_weights=effect.keep_weights))
        except TemporaryError as exc:
            answer.append(TemporaryError(f"the wipe of node {effect.node_id} got no answer: {exc} Its agent may "
                                         "have stopped halfway: `llmgw wipe` on the machine finishes it"))
        else:
            answer.append(WipeOutcome(effect.node_id, outcome.report) if outcome.ok
                          else UsageError(f"node {effect.node_id} did not wipe its machine: {outcome.error}"))
        finally:
            done.set()
