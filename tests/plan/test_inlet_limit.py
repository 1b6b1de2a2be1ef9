"""`serving.max_inlet_celsius`: a node whose board inlet reads above the limit gets no new replica while it stays
above, with that reason; its replicas keep running; a node that measures no inlet is never judged hot. The verdict
is judged on each heartbeat from the agent's hwmon reading and is placement-relevant only when it flips."""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import pytest
from plan_fleets import GiB, cpu_node, fleet, model, settings, shard

from llmgw.control.readings import NodeReadings
from llmgw.control.registry import FleetRegistry
from llmgw.plan import ActionKind, make_plan
from llmgw.plan.cordons import inlet_verdict
from llmgw.plan.types import NodeState
from llmgw.settings.building import build_cluster
from llmgw.settings.schemas import load_schema
from llmgw.tools.sensors import NodeSensors, SensorValue

GEMMA = model("gemma", cores=2, memory=2 * GiB)
HOT = "board inlet above serving.max_inlet_celsius (35 °C): no new replicas until it cools"


@pytest.mark.parametrize(("inlet", "limit", "verdict"), [
    (38.5, 35.0, HOT),
    (35.0, 35.0, ""),       # at the limit: still placeable
    (20.0, 35.0, ""),
    (None, 35.0, ""),       # not measured (a VM): never taken for hot
    (60.0, None, ""),       # no limit set
])
def test_the_inlet_verdict(inlet, limit, verdict):
    assert inlet_verdict(inlet, limit) == verdict


def test_a_hot_node_gets_no_new_replica_and_the_reason_says_why():
    s = replace(settings(GEMMA), cluster=replace(settings(GEMMA).cluster, max_inlet_celsius=35.0))
    hot = replace(cpu_node("node01", cores=16), inlet_too_hot=HOT)
    plan = make_plan(s, fleet(hot))
    assert not [a for a in plan.actions if a.kind is ActionKind.START]
    [unplaced] = plan.unplaced
    assert dict(unplaced.reasons)["node01"] == HOT
    starts = {a.node_id for a in make_plan(s, fleet(hot, cpu_node("node02", cores=16))).actions
              if a.kind is ActionKind.START}
    assert starts == {"node02"}


def test_a_hot_node_keeps_the_replicas_it_runs():
    s = settings(GEMMA)
    hot = replace(cpu_node("node01", shards=[shard(GEMMA, 0)]), inlet_too_hot=HOT)
    plan = make_plan(s, fleet(hot, cpu_node("node02")))
    assert {(a.node_id, a.kind) for a in plan.actions} == {("node01", ActionKind.KEEP)}


def beat(registry: FleetRegistry, at: float, inlet: float | None) -> tuple[FleetRegistry, bool]:
    sensors = NodeSensors(inlet_celsius=SensorValue("nct6775.656", "SYSTIN", inlet) if inlet is not None else None)
    return registry.heartbeat("node01", at, readings=NodeReadings(at=at, sensors=sensors))


def test_the_registry_judges_each_heartbeat_and_a_flip_is_placement_relevant():
    registry = FleetRegistry(lost_after=30.0).with_limits(30.0, (), 35.0)
    registry, _ = registry.register(NodeState("node01", cpu_cores=16.0, memory_bytes=64 * GiB), 0.0)
    registry, changed = beat(registry, 1.0, 38.5)
    assert changed and registry.get("node01").state.inlet_too_hot == HOT
    registry, changed = beat(registry, 2.0, 38.0)
    assert not changed                                   # still hot: readings alone
    registry, changed = beat(registry, 3.0, 30.0)
    assert changed and registry.get("node01").state.inlet_too_hot == ""
    registry, changed = beat(registry, 4.0, None)        # no inlet measured: not judged hot
    assert not changed and registry.get("node01").state.inlet_too_hot == ""
    assert registry.with_limits(30.0, (), None).max_inlet_celsius is None


def test_the_settings_key_is_in_the_schema_and_built():
    schema = load_schema("llmgw")
    data = {"name": "lab", "serving": {"max_inlet_celsius": 35}}
    jsonschema.validate(data, schema)
    assert build_cluster(data).max_inlet_celsius == 35.0 and build_cluster({"name": "lab"}).max_inlet_celsius is None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "lab", "serving": {"max_inlet_celsius": "warm"}}, schema)
