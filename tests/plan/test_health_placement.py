"""Cards out of placement for their health (GpuState.unhealthy): never chosen, named with their reason when a
replica cannot be placed, and replicas running on them are placed elsewhere."""

from __future__ import annotations

from dataclasses import replace

from plan_fleets import fleet, gpu_node, model, settings, shard

from llmgw.plan import ActionKind, make_plan
from llmgw.plan.headroom import headroom

XID_79 = "Xid 79, GPU has fallen off the bus: the machine needs a reboot"
ONE_GPU = model("m", gpus=1, gpu_class="h100-80g")


def out_for_health(node, *indexes: int, why: str = XID_79):
    gpus = tuple(replace(g, unhealthy=why) if int(g.device_id) in indexes else g for g in node.gpus)
    return replace(node, gpus=gpus)


def test_a_card_out_for_health_is_never_chosen():
    plan = make_plan(settings(ONE_GPU), fleet(out_for_health(gpu_node("node01", count=2), 0)))
    (placed,) = plan.assignments
    assert placed.devices == ("1",)


def test_an_unplaced_replica_names_the_cards_out_for_health_with_their_reason():
    plan = make_plan(settings(model("big", gpus=2, gpu_class="h100-80g", tp=2)),
                     fleet(out_for_health(gpu_node("node01", count=2), 1)))
    (unplaced,) = plan.unplaced
    reason = dict(unplaced.reasons)["node01"]
    assert reason.startswith("1 of 2 h100-80g free") and f"1 out of placement for health (GPU 1: {XID_79})" in reason


def test_a_serving_replica_on_a_card_gone_bad_is_placed_elsewhere_and_kept_until_the_new_one_is_ready():
    running = shard(ONE_GPU, 0, devices=("0",))
    node = out_for_health(gpu_node("node01", count=2, shards=[running]), 0)
    plan = make_plan(settings(ONE_GPU), fleet(node))
    kinds = {(a.kind, a.shard_id) for a in plan.actions}
    (start,) = [a for a in plan.actions if a.kind is ActionKind.START]
    assert start.assignment.devices == ("1",)
    assert (ActionKind.KEEP, "m-0/0") in kinds  # still serving while its replacement starts


def test_a_failed_shard_on_a_card_gone_bad_is_stopped_not_restarted():
    from llmgw.plan import ShardState

    failed = shard(ONE_GPU, 0, devices=("0",), state=ShardState.FAILED)
    plan = make_plan(settings(ONE_GPU), fleet(out_for_health(gpu_node("node01", count=2, shards=[failed]), 0)))
    kinds = [(a.kind, a.shard_id) for a in plan.actions]
    assert (ActionKind.STOP, "m-0/0") in kinds and not any(k is ActionKind.RESTART for k, _ in kinds)
    (start,) = [a for a in plan.actions if a.kind is ActionKind.START]
    assert start.assignment.devices == ("1",)


def test_headroom_does_not_count_cards_out_for_health():
    f = fleet(out_for_health(gpu_node("node01", count=4), 0, 1))
    room = headroom(f, make_plan(settings(), f))
    (row,) = [r for r in room.gpus if r.gpu_class == "h100-80g"]
    assert row.devices == 2
