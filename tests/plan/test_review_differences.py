"""Where a pass's plan differs from the plan a review showed, and why (`llmgw.plan.reviewed`): the review is made
against one fleet, the pass against the fleet of later, as `llmgw apply --review` compares them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_fleets import gpu_node, model, settings

from llmgw.plan import Fleet, make_plan
from llmgw.plan.reviewed import ReviewedPlan, review_differences

BIG = model("big", replicas=2, gpus=2, gpu_class="h100-80g", tp=2)
REVISION = "sha256:" + "ab" * 32


def reviewed_against(fleet: Fleet) -> ReviewedPlan:
    return ReviewedPlan("c0ffee" * 6 + "abcd", REVISION, make_plan(settings(BIG), fleet))


def lose(fleet: Fleet, node_id: str) -> Fleet:
    return Fleet(tuple(replace(n, alive=False) if n.node_id == node_id else n for n in fleet.nodes))


def foreign(fleet: Fleet, node_id: str, device: str) -> Fleet:
    return Fleet(tuple(replace(n, gpus=tuple(replace(g, foreign_processes=True) if g.device_id == device else g
                                             for g in n.gpus)) if n.node_id == node_id else n
                       for n in fleet.nodes))


def unhealthy(fleet: Fleet, node_id: str, device: str) -> Fleet:
    return Fleet(tuple(replace(n, gpus=tuple(replace(g, unhealthy="XID 79: fell off the bus")
                                             if g.device_id == device else g
                                             for g in n.gpus)) if n.node_id == node_id else n
                       for n in fleet.nodes))


BEFORE = Fleet((gpu_node("g1", count=2), gpu_node("g2", count=2), gpu_node("g3", count=2)))


def where(review: ReviewedPlan, replica: str) -> str:
    placed = [a for a in review.plan.assignments if a.replica_id == replica]
    return placed[0].node_id


@pytest.mark.parametrize(("change", "why"), [
    (lambda f, node: lose(f, node), "node {node} was lost since the review"),
    (lambda f, node: Fleet(tuple(n for n in f.nodes if n.node_id != node)), "node {node} is no longer registered"),
    (lambda f, node: foreign(f, node, "1"), "GPU 1 of {node} is now held by another process"),
    (lambda f, node: unhealthy(f, node, "0"), "GPU 0 of {node} is out of placement: XID 79: fell off the bus"),
])
def test_a_replica_placed_elsewhere_names_what_took_its_reviewed_place(change, why):
    review = reviewed_against(BEFORE)
    node = where(review, "big-0")
    now = change(BEFORE, node)
    differences = {d.replica_id: d for d in review_differences(review, make_plan(settings(BIG), now), now)}
    difference = differences["big-0"]
    assert difference.reviewed == f"{node} GPU 0,1" and difference.now.endswith("GPU 0,1")
    assert difference.now != difference.reviewed and difference.why == why.format(node=node)
    # the other replica, where it moved too (the planner spread the two again), moved for no reason of its own node
    assert all(d.why.startswith("the fleet changed since the review") for r, d in differences.items() if r != "big-0")
    assert str(difference).startswith(f"big-0: {difference.now}, reviewed {node} GPU 0,1: ")


def test_the_same_placements_are_no_difference_and_a_fleet_change_without_a_reason_names_the_review_s_fleet():
    review = reviewed_against(BEFORE)
    assert review_differences(review, make_plan(settings(BIG), BEFORE), BEFORE) == []
    # only g2 and g3 in the review: big-1 went to g3; now g1 is back and takes it (nothing of g3 changed)
    smaller = Fleet(BEFORE.nodes[1:])
    review = reviewed_against(smaller)
    differences = review_differences(review, make_plan(settings(BIG), BEFORE), BEFORE)
    assert differences and all(d.why == f"the fleet changed since the review (it was planned against "
                                         f"{REVISION[:19]})" for d in differences)


def test_a_replica_that_cannot_be_placed_now_says_why_not():
    review = reviewed_against(BEFORE)
    now = lose(lose(BEFORE, "g1"), "g2")
    differences = {d.replica_id: d for d in review_differences(review, make_plan(settings(BIG), now), now)}
    unplaced = [d for d in differences.values() if d.now == "unplaced"]
    assert len(unplaced) == 1 and "was lost since the review; now: " in unplaced[0].why
