"""What a ControlMessage needs of the agent it goes to (issue 30, `llmgw.wire.features.needed`): every kind of
agent.proto is either one every agent of protocol 1 handles or names its feature, fields that need one say so, and
this version's agent lists everything this version's control plane may send."""

from __future__ import annotations

from llmgw.agent.commands import COMMANDS
from llmgw.agent.reporting import FEATURES
from llmgw.wire import control_message, features, pb
from llmgw.wire.features import BASE_KINDS, KIND_FEATURES, lacking, needed

KINDS = {field.name for field in pb.ControlMessage.DESCRIPTOR.oneofs_by_name["body"].fields}


def test_every_kind_is_in_the_base_or_names_its_feature_and_the_base_is_closed():
    assert KINDS == BASE_KINDS | set(KIND_FEATURES), (
        f"kinds without a feature: {sorted(KINDS - BASE_KINDS - set(KIND_FEATURES))}; a new ControlMessage kind "
        "names the feature its agents list in llmgw.wire.features.KIND_FEATURES")
    assert BASE_KINDS == {"start_shard", "stop_shard", "install_engine", "agent_settings", "registered",
                          "slurm_jobs_recorded", "certificate_renewed", "trust_certificates"}, \
        "the base is what protocol 1 agents handle: it never grows"
    assert not BASE_KINDS & set(KIND_FEATURES)


def test_this_agent_handles_every_kind_and_lists_every_feature_this_control_plane_may_ask_for():
    assert KINDS <= set(COMMANDS)
    assert set(KIND_FEATURES.values()) <= set(FEATURES)
    assert set(FEATURES) <= set(features.ALL)


def test_kinds_and_fields_need_their_features():
    assert needed(control_message(stop_shard=pb.StopShard(shard_id="a/0"))) == ()
    assert needed(control_message(restart=pb.Restart())) == (features.RESTART,)
    assert needed(control_message(request_logs=pb.RequestLogs(request_id="r"))) == (features.LOGS,)
    assert needed(control_message(install_engine=pb.InstallEngine(engine="vllm"))) == (features.INSTALL_VLLM,)
    start = pb.StartShard(weights=[pb.WeightsFile(source="hf://org/repo/model.gguf"),
                                   pb.WeightsFile(source="https://example.org/a.gguf"),
                                   pb.WeightsFile(source="file:///srv/a.gguf")],
                          adapters=[pb.LoraAdapter(weights=[pb.WeightsFile(source="hf://org/repo@abc/lora/")])])
    assert needed(control_message(start_shard=start)) == (
        features.WEIGHTS_HF, features.WEIGHTS_HTTPS, features.WEIGHTS_HF_DIRECTORY)
    assert needed(control_message(agent_settings=pb.AgentSettings(weights_dir="/w"))) == ()
    assert needed(control_message(agent_settings=pb.AgentSettings(ignore_gpus=["0"]))) == (features.IGNORE_GPUS,)
    older = ("adopt", "install:llama.cpp", "weights:https")
    assert lacking(control_message(start_shard=start), older) == (features.WEIGHTS_HF, features.WEIGHTS_HF_DIRECTORY)
    assert lacking(control_message(restart=pb.Restart()), ()) == (features.RESTART,)
    assert lacking(control_message(stop_shard=pb.StopShard()), ()) == ()
