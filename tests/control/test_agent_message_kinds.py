"""The control plane finds each agent message's handler by its kind (`llmgw.control.agents.MESSAGES`): every kind
the wire defines has one, and an engine state this control plane does not know changes nothing."""

from __future__ import annotations

from llmgw.control.agents import MESSAGES, AgentHub
from llmgw.control.state import ControlState
from llmgw.identity import EngineState
from llmgw.wire import pb


def test_every_agent_message_kind_of_the_wire_has_a_handler():
    kinds = {field.name for field in pb.AgentMessage.DESCRIPTOR.oneofs_by_name["body"].fields}
    assert kinds == set(MESSAGES)


def test_an_engine_state_from_a_newer_agent_is_left_alone_and_a_known_one_is_an_event():
    updates: list = []
    hub = AgentHub(lambda transition, reason=None, origin_unix=None: updates.append((transition, reason)))
    unknown = pb.EngineStatus(engine="llama.cpp@b1", state="verifying")
    assert MESSAGES["engine_status"](hub, "n1", None, unknown, 0.0) is None
    known = pb.EngineStatus(engine="llama.cpp@b1", state=EngineState.INSTALLING.value)
    transition, origin = MESSAGES["engine_status"](hub, "n1", None, known, 0.0)
    assert origin is None
    state, changed = transition(ControlState())
    assert not changed and state.fleet.get("n1") is None  # a node never registered: nothing to record
