"""A `ControlLoop` over a world the test controls: the settings in force, nodes as their agents report them, and
the commands the loop sends (optionally failing). Shared by the loop's and decide's tests."""

from __future__ import annotations

from dataclasses import replace

import trio

from llmgw.agent.reporting import FEATURES
from llmgw.control import ControlLoop, ControlState, FleetRegistry
from llmgw.control.handling import Handlers, every_command
from llmgw.control.state import Leadership, WatchState, frozen
from llmgw.plan import agent_settings_fingerprint
from llmgw.plan.types import NodeState, ObservedShard, ShardState


def control_state(settings, *nodes: NodeState, leader: bool = True, lost: tuple[str, ...] = (),
                  acked: bool = True, features: tuple[str, ...] = FEATURES) -> ControlState:
    """A state holding `settings` in force and `nodes` registered and connected (those in `lost` lost), their agents
    listing `features` (default: this version's agent's); with `acked`, every node already acknowledged its agent
    settings (so no CONFIGURE is planned)."""
    try:
        now = trio.current_time()  # inside a test's trio run: nodes are heard from "now"
    except RuntimeError:
        now = 0.0
    fleet = FleetRegistry(lost_after=30.0)
    for node in nodes:
        fleet, _ = fleet.register(node, now - 100.0 if node.node_id in lost else now, agent_version="0.1.0",
                                  features=features)
    if lost:
        fleet, _ = fleet.expire(now)
    acks = {n.node_id: agent_settings_fingerprint(settings, n.node_id) for n in nodes} if acked else {}
    return ControlState(watch=WatchState(settings=settings), fleet=fleet, leadership=Leadership(leader, "me"),
                        acked_settings=frozen(acks))


def report(node_id: str, *shards: ObservedShard):
    """The transition of a heartbeat from `node_id` listing `shards`."""
    def transition(state: ControlState):
        fleet, changed = state.fleet.heartbeat(node_id, trio.current_time(), shards=shards)
        return state.with_fleet(fleet), changed
    return transition


class World:
    """Records every command (kind, subject, trio time); `fail` is an exception the next commands raise."""

    def __init__(self, state: ControlState):
        self.sent: list[tuple[str, str, float]] = []
        self.fail: Exception | None = None
        self.loop = ControlLoop(state, Handlers(every_command(self.execute)), interval=lambda: 1000.0)

    async def execute(self, command) -> None:
        action = command.action
        self.sent.append((action.kind.value, action.shard_id or action.replica_id or action.engine
                          or action.fingerprint, trio.current_time()))
        if self.fail is not None:
            raise self.fail


def shard(replica: str, fp: str, state: ShardState = ShardState.READY, model: str = "tiny") -> ObservedShard:
    return ObservedShard(f"{replica}/0", replica, model, state, port=9000, fingerprint=fp)


__all__ = ["World", "control_state", "replace", "report", "shard"]
