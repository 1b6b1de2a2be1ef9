"""llmgw.plan: pure placement and planning, from (Settings, Fleet) to a Plan. No I/O.

`make_plan(settings, fleet)` is the planner; `fingerprint(model, engine_version)` names what a replica runs;
`check_not_emptied(previous, new)` is the empty-catalog guard; `render_plan` / `plan_to_json` show a plan.
`recorded_files` / `fleet_from_record` / `plan_digest` record a pass's planning in its audit commit so that
`llmgw plan --at` can make that plan again (`llmgw.plan.recorded`).
`place_multinode(offers, nodes, per_node)` / `split_over_nodes` place one replica over several nodes (`make_plan`
uses them for a replica that needs more GPUs than one node has); `interconnect_of(report)` is what a node's health
report offers them. `pair_rails` / `grade_rail` are `llmgw fabric-test`'s rail pairing and grading.
`forecast_change(base, head, fleet, plan, load)` forecasts what a change does to each model it touches from the
fleet's recorded load (`llmgw.plan.forecasting`); `check_forecast` holds a forecast against the load measured after
(`llmgw.plan.forecast_check`).
`plan_model(facts, fleet)` is the model explorer's answer: where a model fits per GPU class and CPU node, its
tensor parallel and expected CPU speed (`llmgw.plan.model_fit`).
`ShardState` and the id and engine-key builders are `llmgw.identity`'s, re-exported here.
"""

from llmgw.plan.guard import EmptiedCatalogError, check_not_emptied, guard_fleet_not_emptied, serves_something
from llmgw.identity import (
    ShardState, base_shard_id, describe_engine, engine_key, new_shard_id, replica_id, replica_index,
    split_engine_key,
)
from llmgw.plan.fabric_rails import OK_FRACTION, Rail, RailGrade, grade_rail, pair_rails
from llmgw.plan.identity import engine_version_of, fingerprint, replica_ids
from llmgw.plan.multinode import (
    MultiNodePlacement, NodeOffer, ShardSlot, interconnect_of, place_multinode, split_over_nodes,
)
from llmgw.plan.planning import agent_settings_fingerprint, demand_of, is_mig_class, make_plan
from llmgw.plan.recorded import (
    FLEET_FILE, PASS_FILE, PlannedPass, canary_holds, fleet_from_record, fleet_record, pass_from_record, plan_digest,
    plan_or_refusal, recorded_files,
)
from llmgw.plan.forecasting import ModelForecast, RecordedLoad, forecast_change
from llmgw.plan.forecast_check import ForecastCheck, check_forecast
from llmgw.plan.model_fit import ClassFit, CpuNodeFit, ModelFit, plan_model
from llmgw.plan.canary import CanaryHold, CanarySample, CanaryVerdict, Verdict, judge_canary
from llmgw.plan.rendering import plan_from_json, plan_to_json, render_plan
from llmgw.plan.types import (
    Action, ActionKind, Assignment, Fleet, GpuState, Interconnect, MemoryBandwidth, NodeState, ObservedShard, Plan,
    Unplaced,
)

__all__ = [
    "Action", "ActionKind", "Assignment", "EmptiedCatalogError", "agent_settings_fingerprint", "Fleet", "GpuState", "NodeState",
    "MemoryBandwidth", "ObservedShard", "Plan", "ShardState", "Unplaced",
    "base_shard_id", "check_not_emptied", "demand_of", "describe_engine", "engine_key", "engine_version_of",
    "fingerprint", "guard_fleet_not_emptied", "is_mig_class", "make_plan", "new_shard_id", "plan_from_json",
    "plan_to_json", "render_plan", "replica_id", "replica_ids", "replica_index", "serves_something",
    "split_engine_key", "Interconnect", "interconnect_of", "MultiNodePlacement", "NodeOffer", "ShardSlot", "place_multinode", "split_over_nodes",
    "OK_FRACTION", "Rail", "RailGrade", "grade_rail", "pair_rails",
    "FLEET_FILE", "PASS_FILE", "PlannedPass", "fleet_from_record", "fleet_record", "pass_from_record", "plan_digest",
    "plan_or_refusal", "recorded_files", "canary_holds",
    "CanaryHold", "CanarySample", "CanaryVerdict", "Verdict", "judge_canary",
    "ClassFit", "CpuNodeFit", "ModelFit", "plan_model",
    "ModelForecast", "RecordedLoad", "forecast_change", "ForecastCheck", "check_forecast",
]
