"""What a node's agent can be sent: the features (`llmgw.wire.features`) a planned action's command needs, checked
against what the agent listed at Register. Pure: a pass asks `refusal_for` before it sends an action, so an action
for a node whose agent lacks a feature is refused, its reason (node, agent version, features) in the pass's record
(`llmgw status`, the audit). `AgentSession.send` checks every message the same way, as the last guard.
"""

from __future__ import annotations

from llmgw.control.state import ControlState
from llmgw.plan.types import Action, ActionKind
from llmgw.settings.model import Settings
from llmgw.wire.features import IGNORE_GPUS, install_feature, weights_features


def action_features(action: Action, settings: Settings) -> tuple[str, ...]:
    """The agent features (`llmgw.wire.features`) the command of `action` needs under `settings`, as
    `features.needed` finds them in the message it becomes: INSTALL its engine's install feature, START and
    RESTART the weights sources of the model and its adapters, CONFIGURE `ignore_gpus` when the node's agent
    settings set any; STOP none. Pure."""
    if action.kind is ActionKind.INSTALL:
        return (install_feature(action.engine),)
    if action.kind in (ActionKind.START, ActionKind.RESTART):
        model = settings.models.get(action.model)
        if model is None:
            return ()
        return weights_features([w.source for w in model.weights]
                                + [w.source for a in model.adapters for w in a.weights])
    if action.kind is ActionKind.CONFIGURE and settings.agent_settings_for(action.node_id).ignore_gpus:
        return (IGNORE_GPUS,)
    return ()


def refusal_for(action: Action, state: ControlState) -> str | None:
    """Why `action`'s node cannot do it (its agent does not list a feature the command needs, `action_features`),
    naming the node, its agent version and the features; None when it can. An agent that lists no features gets
    the base only. Pure."""
    record = state.fleet.get(action.node_id)
    if record is None or state.settings is None:
        return None
    missing = [f for f in action_features(action, state.settings) if f not in record.features]
    if not missing:
        return None
    return (f"node {action.node_id} runs llmgw agent {record.agent_version or '(unknown version)'}, which cannot "
            f"{action.kind.value} {action.engine or action.replica_id or 'its agent settings'} (it lacks "
            f"{', '.join(repr(f) for f in missing)}); upgrade its agent")
