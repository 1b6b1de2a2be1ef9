"""The empty-catalog guard, fingerprints and shard ids."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_fleets import GiB, cpu_node, fleet, model, settings, shard

from llmgw.errors import SettingsError
from llmgw.identity import Routing
from llmgw.plan import (
    EmptiedCatalogError, ShardState, check_not_emptied, fingerprint, make_plan, new_shard_id,
)
from llmgw.settings.model import Adapter, WeightsFile, frozen_map

GEMMA = model("gemma", cores=2, memory=2 * GiB)


@pytest.mark.parametrize("previous, new, allow, refused", [
    (settings(GEMMA), settings(), False, True),
    (settings(GEMMA), settings(replace(GEMMA, replicas=0)), False, True),
    (settings(GEMMA), settings(), True, False),
    (settings(GEMMA), settings(allow_empty=True), False, False),
    (settings(GEMMA), settings(model("other")), False, False),
    (settings(GEMMA), settings(model("ext", endpoints=("https://x",))), False, False),
    (settings(GEMMA), settings(GEMMA, stopped=True), False, False),
    (None, settings(), False, False),
    (settings(), settings(), False, False),
])
def test_a_commit_that_removes_every_model_is_refused_unless_allowed(previous, new, allow, refused):
    why = check_not_emptied(previous, new, allow_empty=allow)
    assert (why is not None) is refused
    if refused:
        assert "gemma" in why and "allow_empty: true" in why and "--allow-empty" in why


def test_the_planner_refuses_to_empty_a_running_fleet():
    f = fleet(cpu_node("node01", shards=[shard(GEMMA, 0)]))
    with pytest.raises(EmptiedCatalogError) as caught:
        make_plan(settings(), f)
    assert isinstance(caught.value, SettingsError)
    assert "gemma-0/0" in str(caught.value) and "allow_empty" in str(caught.value)
    assert [a.kind.value for a in make_plan(settings(), f, allow_empty=True).actions] == ["stop"]
    assert [a.kind.value for a in make_plan(settings(allow_empty=True), f).actions] == ["stop"]


def test_an_empty_catalog_on_an_idle_fleet_is_no_error():
    f = fleet(cpu_node("node01", shards=[shard(GEMMA, 0, state=ShardState.STOPPED)]))
    assert not make_plan(settings(), f).changes


BASE_FP = fingerprint(GEMMA, "b11434")


@pytest.mark.parametrize("change, restarts", [
    ({"engine_args": ("--mlock",)}, True),
    ({"context_size": 4096}, True),
    ({"weights": (WeightsFile("hf://x/y/z.gguf", "ef" * 32),)}, True),
    ({"adapters": (Adapter("sql", (WeightsFile("hf://x/y/lora.gguf", "01" * 32),)),)}, True),
    ({"allow_pickle": True}, True),
    ({"engine": "vllm"}, True),
    ({"replicas": 7}, False),
    ({"aliases": ("g",)}, False),
    ({"node_selector": frozen_map({"zone": "a"})}, False),
    ({"routing": Routing.ROUND_ROBIN}, False),  # the gateway's choice among replicas: no engine sees it
    ({"source_file": "catalog/other.yaml"}, False),
])
def test_the_fingerprint_changes_exactly_when_a_restart_is_needed(change, restarts):
    assert (fingerprint(replace(GEMMA, **change), "b11434") != BASE_FP) is restarts


def test_the_fingerprint_covers_the_engine_version_and_is_stable_text():
    assert fingerprint(GEMMA, "b12000") != BASE_FP
    assert len(BASE_FP) == 64 and int(BASE_FP, 16) >= 0
    # Equal settings built separately give the same fingerprint (no identity or hash randomness).
    assert fingerprint(model("gemma", cores=2, memory=2 * GiB), "b11434") == BASE_FP


@pytest.mark.parametrize("taken, expected", [
    (set(), "m-0/0"),
    ({"m-0/0"}, "m-0/0@" + BASE_FP[:8]),
    ({"m-0/0", "m-0/0@" + BASE_FP[:8]}, "m-0/0@" + BASE_FP[:8] + ".1"),
    ({"m-0/0@" + BASE_FP[:8]}, "m-0/0"),
])
def test_new_shard_ids_avoid_ids_in_use(taken, expected):
    assert new_shard_id("m-0", BASE_FP, taken) == expected
