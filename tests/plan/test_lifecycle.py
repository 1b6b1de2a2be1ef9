"""What happens to shards that already run: keep, restart, stop, roll, adopt, and the stopped service."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_fleets import GiB, LLAMA, apply_plan, converge, cpu_node, fleet, gpu_node, model, settings, shard

from llmgw.plan import ActionKind, ShardState, fingerprint, make_plan
from llmgw.plan.spanning import LLAMACPP_SPAN_REFUSAL

GEMMA = model("gemma", cores=2, memory=2 * GiB)
H100 = model("llama", gpus=2, gpu_class="h100-80g", tp=2)


def kinds(plan) -> list[tuple[str, str, str]]:
    """(kind, shard id, node) of every action, in plan order."""
    return [(a.kind.value, a.shard_id or a.engine, a.node_id) for a in plan.actions]


@pytest.mark.parametrize("state, expected", [
    (ShardState.READY, "keep"),
    (ShardState.STARTING, "keep"),
    (ShardState.FETCHING, "keep"),
    (ShardState.PENDING, "keep"),
    (ShardState.FAILED, "restart"),
    (ShardState.STOPPED, "restart"),
    (ShardState.STOPPING, "keep"),
])
def test_a_shard_of_a_wanted_replica_is_kept_or_restarted_by_state(state, expected):
    f = fleet(cpu_node("node01", shards=[shard(GEMMA, 0, state=state)]), cpu_node("node02"))
    plan = make_plan(settings(GEMMA), f)
    assert kinds(plan) == [(expected, "gemma-0/0", "node01")]
    assert plan.assignments[0].node_id == "node01"
    assert plan.changes is (expected != "keep")


def test_a_failed_shard_restarts_on_its_own_devices():
    f = fleet(gpu_node("node01", shards=[shard(H100, 0, state=ShardState.FAILED, devices=("6", "7"))]))
    (action,) = make_plan(settings(H100), f).actions
    assert action.kind is ActionKind.RESTART and action.assignment.devices == ("6", "7")


@pytest.mark.parametrize("case, new_settings, reason", [
    ("model removed", settings(model("other", cores=1)), "model gemma is not in the catalog"),
    ("scaled to zero", settings(replace(GEMMA, replicas=0), model("other")), "model gemma wants 0 replicas"),
    ("moved to endpoints", settings(replace(GEMMA, endpoints=("https://x",))), "served by external endpoints"),
    ("serving stopped", settings(GEMMA, stopped=True), "serving is stopped"),
])
def test_shards_no_longer_wanted_are_stopped(case, new_settings, reason):
    f = fleet(cpu_node("node01", shards=[shard(GEMMA, 0)]))
    plan = make_plan(new_settings, f)
    stops = [a for a in plan.actions if a.kind is ActionKind.STOP]
    assert [(a.shard_id, a.node_id) for a in stops] == [("gemma-0/0", "node01")]
    assert reason in stops[0].reason


def test_scaling_down_stops_the_highest_replicas():
    f = converge(settings(replace(GEMMA, replicas=3)), fleet(cpu_node("node01"), cpu_node("node02"),
                                                             cpu_node("node03")))
    plan = make_plan(settings(replace(GEMMA, replicas=1)), f)
    assert [(a.kind.value, a.shard_id) for a in plan.actions] == [
        ("stop", "gemma-1/0"), ("stop", "gemma-2/0"), ("keep", "gemma-0/0")]


def test_serving_stopped_stops_everything_and_starts_nothing():
    f = converge(settings(GEMMA, H100), fleet(cpu_node("node01"), gpu_node("node02")))
    plan = make_plan(settings(GEMMA, H100, stopped=True), f)
    assert {a.kind for a in plan.actions} == {ActionKind.STOP}
    assert len(plan.actions) == 2 and plan.assignments == ()
    assert any("serving is stopped" in n for n in plan.notes)
    # Once stopped, nothing more to do; starting again restarts them where they were.
    stopped = fleet(*(replace(n, shards=tuple(replace(s, state=ShardState.STOPPED) for s in n.shards))
                      for n in f.nodes))
    assert not make_plan(settings(GEMMA, H100, stopped=True), stopped).changes
    again = make_plan(settings(GEMMA, H100), stopped)
    assert sorted(kinds(again)) == [("restart", "gemma-0/0", "node01"), ("restart", "llama-0/0", "node02")]


def test_foreign_engines_are_never_stopped_and_are_noted():
    foreign = shard(model("theirs"), 0, foreign=True, shard_id="pid-4242", cores=4, memory=8 * GiB)
    f = fleet(cpu_node("node01", cores=5, shards=[foreign]))
    plan = make_plan(settings(GEMMA), f)
    assert not [a for a in plan.actions if a.shard_id == "pid-4242"]
    assert "node01: engine process pid-4242 (serving theirs) was not started by llmgw; left running (it holds its " \
           "cores and memory; llmgw never stops it: that is for whoever started it, maybe another llmgw or a test run " \
           "on this machine)" in plan.notes, plan.notes
    listening = replace(foreign, port=8090)
    noted = make_plan(settings(GEMMA), fleet(cpu_node("node01", cores=5, shards=[listening]))).notes
    assert any("engine process pid-4242 (serving theirs, port 8090) was not started" in n for n in noted), noted
    # The foreign process's cores are held: 1 of 2 left.
    assert plan.unplaced[0].reasons == (("node01", "1 of 2 CPU cores free"),)


def test_replicas_of_a_lost_node_are_placed_again_elsewhere():
    f = converge(settings(GEMMA), fleet(cpu_node("node01"), cpu_node("node02", cores=1)))
    f = fleet(replace(f.nodes[0], alive=False), cpu_node("node02"))
    plan = make_plan(settings(GEMMA), f)
    (start,) = plan.actions
    assert (start.kind, start.node_id, start.previous_node) == (ActionKind.START, "node02", "node01")
    assert start.shard_id == "gemma-0/0@" + fingerprint(GEMMA, "b11434")[:8]
    assert any("node01 is lost" in n for n in plan.notes)


def test_a_lost_node_coming_back_has_its_duplicate_stopped_once_the_new_one_runs():
    s = settings(GEMMA)
    f = converge(s, fleet(cpu_node("node01"), cpu_node("node02")))
    lost = fleet(replace(f.nodes[0], alive=False), f.nodes[1])
    after = apply_plan(make_plan(s, lost), lost)
    back = fleet(replace(after.nodes[0], alive=True), after.nodes[1])
    plan = make_plan(s, back)
    # Both are current and ready: one is kept (node01 sorts first), the other stops as a duplicate.
    assert sorted(kinds(plan)) == sorted([("keep", "gemma-0/0", "node01"),
                                          ("stop", "gemma-0/0@" + fingerprint(GEMMA, "b11434")[:8], "node02")])


@pytest.mark.parametrize("change", [
    {"engine_args": ("--flash-attn",)},
    {"context_size": 8192},
    {"engine_version": "b12000"},
    {"weights": (replace(GEMMA.weights[0], sha256="cd" * 32),)},
])
def test_a_changed_fingerprint_rolls_the_replica_new_first(change):
    old_fleet = converge(settings(GEMMA), fleet(cpu_node("node01"), cpu_node("node02")))
    new_model = replace(GEMMA, **change)
    s = settings(new_model)
    new_fp = fingerprint(new_model, new_model.engine_version or "b11434")
    assert new_fp != fingerprint(GEMMA, "b11434")

    plan = make_plan(s, old_fleet)
    if "engine_version" in change:
        # b12000 is not installed anywhere: install it on a node that can host it, and keep the old serving.
        assert kinds(plan) == [("install", "llama.cpp@b12000", "node02"), ("keep", "gemma-0/0", "node01")]
        assert "installing llama.cpp b12000" in dict(plan.unplaced[0].reasons)["node02"]
        old_fleet = apply_plan(plan, old_fleet)
        plan = make_plan(s, old_fleet)
    new_id = "gemma-0/0@" + new_fp[:8]
    assert kinds(plan) == [("start", new_id, "node02"), ("keep", "gemma-0/0", "node01")]
    assert "kept until" in plan.actions[1].reason

    starting = apply_plan(plan, old_fleet, state=ShardState.STARTING)
    plan = make_plan(s, starting)
    assert sorted(kinds(plan)) == sorted([("keep", new_id, "node02"), ("keep", "gemma-0/0", "node01")])
    assert not plan.changes

    ready = fleet(*(replace(n, shards=tuple(replace(x, state=ShardState.READY) for x in n.shards))
                    for n in starting.nodes))
    plan = make_plan(s, ready)
    assert kinds(plan) == [("stop", "gemma-0/0", "node01"), ("keep", new_id, "node02")]

    done = apply_plan(plan, ready)
    assert not make_plan(s, done).changes
    # The next roll takes the plain id again.
    s2 = settings(replace(new_model, engine_args=("--mlock",)))
    starts = [a for a in make_plan(s2, done).actions if a.kind is ActionKind.START]
    assert [a.shard_id for a in starts] == ["gemma-0/0"]


def test_a_changed_selector_moves_the_replica_like_a_roll():
    s = settings(replace(GEMMA, node_selector={"zone": "b"}))
    f = fleet(cpu_node("node01", labels={"zone": "a"}, shards=[shard(GEMMA, 0)]),
              cpu_node("node02", labels={"zone": "b"}))
    plan = make_plan(s, f)
    assert kinds(plan)[0][0:1] == ("start",) and plan.actions[0].node_id == "node02"
    assert plan.actions[0].previous_node == "node01"


def test_a_full_node_rolls_its_only_replica_in_place():
    s = settings(replace(H100, engine_args=("--x",)))
    f = fleet(gpu_node("node01", count=2, shards=[shard(H100, 0, devices=("0", "1"))]))
    plan = make_plan(s, f)
    assert kinds(plan) == [("stop", "llama-0/0", "node01")]
    assert plan.unplaced[0].reasons == (("node01", "waiting for llama-0/0 to stop (rolling in place)"),)
    gone = fleet(replace(f.nodes[0], shards=()))
    assert [k[0] for k in kinds(make_plan(s, gone))] == ["start"]


def test_in_place_rolls_take_one_replica_of_a_model_at_a_time():
    m = replace(H100, replicas=2)
    s = settings(replace(m, engine_args=("--x",)))
    f = fleet(gpu_node("node01", count=2, shards=[shard(m, 0, devices=("0", "1"))]),
              gpu_node("node02", count=2, shards=[shard(m, 1, devices=("0", "1"))]))
    plan = make_plan(s, f)
    assert kinds(plan) == [("stop", "llama-0/0", "node01"), ("keep", "llama-1/0", "node02")]
    assert [u.replica_id for u in plan.unplaced] == ["llama-0", "llama-1"]


def test_an_in_place_roll_that_could_not_fit_keeps_the_old_shard():
    # The new generation asks for 4 GPUs; the node has 2: stopping the old would gain nothing.
    s = settings(replace(H100, resources=replace(H100.resources, gpus=4, tensor_parallel=4)))
    f = fleet(gpu_node("node01", count=2, shards=[shard(H100, 0, devices=("0", "1"))]))
    plan = make_plan(s, f)
    assert kinds(plan) == [("keep", "llama-0/0", "node01")]
    assert plan.unplaced[0].reasons == (("all nodes", LLAMACPP_SPAN_REFUSAL),  # a llama.cpp replica never spreads
                                        ("node01", "0 of 4 h100-80g free (2 held by shards)"))


def test_old_shards_that_are_not_healthy_stop_at_once():
    new = replace(GEMMA, engine_args=("--x",))
    f = fleet(cpu_node("node01", shards=[shard(GEMMA, 0, state=ShardState.FAILED)]), cpu_node("node02"))
    plan = make_plan(settings(new), f)
    assert sorted(k[0] for k in kinds(plan)) == ["start", "stop"]


def test_installs_happen_only_on_nodes_that_can_host_the_replica():
    s = settings(model("m", gpus=1, gpu_class="h100-80g"))
    f = fleet(cpu_node("node01", engines=()), gpu_node("node02", engines=(), foreign=tuple(range(8))),
              gpu_node("node03", engines=()))
    plan = make_plan(s, f)
    assert [(a.kind, a.node_id) for a in plan.actions] == [(ActionKind.INSTALL, "node03")]
    assert plan.actions[0].engine == LLAMA


def test_a_full_node_installs_the_new_engine_before_rolling_in_place():
    s = settings(replace(H100, engine_version="b12000"))
    f = fleet(gpu_node("node01", count=2, shards=[shard(H100, 0, devices=("0", "1"))]))
    plan = make_plan(s, f)
    assert kinds(plan) == [("install", "llama.cpp@b12000", "node01"), ("keep", "llama-0/0", "node01")]
    assert plan.unplaced[0].reasons == (
        ("node01", "installing llama.cpp b12000 (then rolling llama-0/0 in place)"),)
    installed = apply_plan(plan, f)
    assert kinds(make_plan(s, installed)) == [("stop", "llama-0/0", "node01")]


@pytest.mark.parametrize("max_surge", [1, 2, 3])
def test_a_roll_runs_at_most_max_surge_new_shards_of_a_model_beside_their_old_ones(max_surge):
    m = replace(GEMMA, replicas=3)
    old_fleet = converge(settings(m), fleet(cpu_node("node01"), cpu_node("node02"), cpu_node("node03")))
    s = settings(replace(m, context_size=8192))
    s = replace(s, cluster=replace(s.cluster, max_surge=max_surge))
    plan = make_plan(s, old_fleet)
    starts = [a.replica_id for a in plan.actions if a.kind is ActionKind.START]
    assert starts == ["gemma-0", "gemma-1", "gemma-2"][:max_surge]
    waiting = [a for a in plan.actions if a.kind is ActionKind.KEEP and "max_surge" in a.reason]
    assert len(waiting) == 3 - max_surge and not any(a.kind is ActionKind.STOP for a in plan.actions)

    starting = apply_plan(plan, old_fleet, state=ShardState.STARTING)  # the new shards not ready yet: no more
    assert not [a for a in make_plan(s, starting).actions if a.kind is ActionKind.START]

    ready = fleet(*(replace(n, shards=tuple(replace(x, state=ShardState.READY) for x in n.shards))
                    for n in starting.nodes))
    plan = make_plan(s, ready)  # those replaced: their old shards stop, the next ones start
    assert len([a for a in plan.actions if a.kind is ActionKind.STOP]) == max_surge
    assert [a.replica_id for a in plan.actions if a.kind is ActionKind.START] == [
        "gemma-0", "gemma-1", "gemma-2"][max_surge:2 * max_surge]
    for _ in range(4):
        ready = converge(s, ready)
    assert not make_plan(s, ready).changes


def test_a_draining_shard_holds_its_cards_until_it_stopped():
    """A shard told to stop drains its requests in flight first (STOPPING, up to the drain timeout): its cards are
    not free before it stopped, whether it was rolled in place or scaled down."""
    s = settings(replace(H100, engine_args=("--x",)))
    draining = fleet(gpu_node("node01", count=2, shards=[shard(H100, 0, devices=("0", "1"),
                                                               state=ShardState.STOPPING)]))
    plan = make_plan(s, draining)
    assert not [a for a in plan.actions if a.kind is ActionKind.START]
    assert plan.unplaced[0].reasons == (
        ("node01", "waiting for llama-0/0 to stop (it finishes its requests in flight first)"),)
    assert [k[0] for k in kinds(make_plan(s, fleet(replace(draining.nodes[0], shards=()))))] == ["start"]

    other = model("other", gpus=2, gpu_class="h100-80g")
    scaled_down = settings(replace(H100, replicas=0), other)
    assert kinds(make_plan(scaled_down, draining)) == []  # nothing starts on the draining shard's cards
    assert make_plan(scaled_down, draining).unplaced[0].replica_id == "other-0"
    cpu = fleet(cpu_node("node01", cores=4, shards=[shard(GEMMA, 0, state=ShardState.STOPPING)]))
    assert make_plan(settings(replace(GEMMA, replicas=0), model("big", cores=4)), cpu).unplaced[0].model == "big"
