"""llmgw.plan: pure placement and planning, from (Settings, Fleet) to a Plan. No I/O."""

from llmgw.plan.types import (
    Action, ActionKind, Assignment, Fleet, GpuState, NodeState, ObservedShard, Plan, ShardState, Unplaced,
)

__all__ = [
    "Action", "ActionKind", "Assignment", "Fleet", "GpuState", "NodeState", "ObservedShard", "Plan",
    "ShardState", "Unplaced",
]
