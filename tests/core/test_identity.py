"""llmgw.identity: the shared words are built one way and read back one way."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llmgw import plan
from llmgw.identity import (
    ShardState, base_shard_id, describe_engine, engine_key, new_shard_id, replica_id, resolve_model, split_engine_key,
)
from llmgw.plan import types


def test_plan_re_exports_the_one_shard_state():
    assert plan.ShardState is ShardState and types.ShardState is ShardState
    assert ShardState("ready") is ShardState.READY and ShardState.READY.value == "ready"


@pytest.mark.parametrize("engine, version, key, words", [
    ("llama.cpp", "b11434", "llama.cpp@b11434", "llama.cpp b11434"),
    ("vllm", None, "vllm@", "vllm"),
])
def test_engine_keys_are_built_and_split_back(engine, version, key, words):
    assert engine_key(engine, version) == key
    assert split_engine_key(key) == (engine, version or "")
    assert describe_engine(key) == words


def test_shard_ids_are_built_from_the_replica_id_and_avoid_taken_ones():
    rid = replica_id("gemma-3-270m", 2)
    assert rid == "gemma-3-270m-2" and base_shard_id(rid) == "gemma-3-270m-2/0"
    taken = {"gemma-3-270m-2/0", "gemma-3-270m-2/0@abcdef01"}
    assert new_shard_id(rid, "abcdef0123", set()) == "gemma-3-270m-2/0"
    assert new_shard_id(rid, "abcdef0123", taken) == "gemma-3-270m-2/0@abcdef01.1"


@dataclass(frozen=True)
class _Named:
    name: str
    aliases: tuple[str, ...] = ()


@pytest.mark.parametrize("asked, found", [("gemma", "gemma"), ("small", "gemma"), ("qwen", "qwen"), ("gpt-4", None)])
def test_a_model_is_found_by_its_name_or_an_alias(asked, found):
    models = {"gemma": _Named("gemma", ("small", "g3")), "qwen": _Named("qwen")}
    model = resolve_model(models, asked)
    assert (model.name if model else None) == found
