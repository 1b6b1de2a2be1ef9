"""Plans as lines for people and as JSON for `llmgw diff --live --json` and the audit."""

from __future__ import annotations

import json
from dataclasses import replace

from plan_fleets import GiB, cpu_node, fleet, gpu_node, model, settings, shard

from llmgw.plan import fingerprint, make_plan, plan_from_json, plan_to_json, render_plan
from llmgw.plan.spanning import LLAMACPP_SPAN_REFUSAL

GEMMA = model("gemma", cores=2, memory=2 * GiB)
H100 = model("llama", gpus=2, gpu_class="h100-80g", tp=2)


def test_the_lines_say_start_stop_move_keep_install_and_why_not():
    s = settings(GEMMA, H100, model("huge", gpus=16, gpu_class="h100-80g", tp=16),
                 model("late", cores=1, selector={"pool": "new"}))
    f = fleet(
        cpu_node("node01", alive=False, shards=[shard(GEMMA, 0)]),
        cpu_node("node02", shards=[shard(model("old", cores=1), 0)]),
        gpu_node("node03", shards=[shard(H100, 0, devices=("0", "1"))]),
        cpu_node("node04", engines=(), labels={"pool": "new"}),
    )
    lines = render_plan(make_plan(s, f))
    assert lines == [
        "install llama.cpp b11434 on node04: needed by late-0",
        f"move gemma-0 from node01 to node02 (2 cores, 2Gi) as gemma-0/0@{fingerprint(GEMMA, 'b11434')[:8]}: "
        "replaces gemma-0/0 on lost node node01",
        "stop old-0/0 on node02: model old is not in the catalog",
        "keep llama-0/0 on node03 (GPU 0,1)",
        f"cannot place huge-0: all nodes: {LLAMACPP_SPAN_REFUSAL}; node01: lost (no heartbeat); "
        "node02: no h100-80g GPUs; "
        "node03: 6 of 16 h100-80g free (2 held by shards); node04: no h100-80g GPUs",
        "cannot place late-0: node01: lost (no heartbeat); node02: labels do not match node_selector pool=new; "
        "node03: labels do not match node_selector pool=new; node04: installing llama.cpp b11434",
        "note: node01 is lost (no heartbeat): gemma-0/0 placed again",
    ]


def test_a_roll_to_another_node_reads_as_a_move_once_the_new_one_is_ready():
    new = replace(GEMMA, engine_args=("--x",))
    new_fp = fingerprint(new, "b11434")
    f = fleet(cpu_node("node01", cores=2, shards=[shard(GEMMA, 0)]),
              cpu_node("node02", shards=[shard(new, 0, shard_id="gemma-0/0@" + new_fp[:8])]))
    assert render_plan(make_plan(settings(new), f)) == [
        "stop gemma-0/0 on node01: rolled: replaced by gemma-0/0@" + new_fp[:8],
        f"keep gemma-0/0@{new_fp[:8]} on node02 (2 cores, 2Gi)",
    ]
    f = fleet(cpu_node("node01", cores=2, shards=[shard(GEMMA, 0)]), cpu_node("node02"))
    assert render_plan(make_plan(settings(new), f), include_keep=False) == [
        f"move gemma-0 from node01 to node02 (2 cores, 2Gi) as gemma-0/0@{new_fp[:8]}: "
        "rolling: new generation of gemma-0/0",
    ]


def test_the_json_form_is_plain_json_and_reads_back_to_the_same_plan():
    s = settings(GEMMA, H100, model("refused", gpus=9, gpu_class="h100-80g", tp=9))
    f = fleet(cpu_node("node01"), gpu_node("node02", engines=()))
    plan = make_plan(s, f)
    data = plan_to_json(plan)
    text = json.dumps(data, sort_keys=True)
    again = json.loads(text)
    assert again["changes"] is True and again["settings_commit"] == s.commit
    assert {a["kind"] for a in again["actions"]} == {"install", "start"}
    assert again["unplaced"][-1]["reasons"][:2] == [{"node": "all nodes", "reason": LLAMACPP_SPAN_REFUSAL},
                                                    {"node": "node01", "reason": "no h100-80g GPUs"}]
    assert plan_from_json(again) == plan
