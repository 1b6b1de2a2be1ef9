"""The model explorer's serve form (issue 42, item 3), over HTTP on loopback against a real control plane and its
bare settings repository, the model read from a local stand-in of the Hub serving the real SmolLM2 GGUF
(tests/plan/hub_files.py, as `$HF_ENDPOINT`): the Explorer page fills the form in (a name, llama.cpp, the GGUF's
source and the sha256 the Hub's redirect published), the console's action shows the new catalog file's diff, and
confirmed it is a commit of the person's that the control plane then serves from; the same name again is refused
with a sentence, nothing committed."""

from __future__ import annotations

import html
import re
from contextlib import aclosing

import trio

from control.test_people_on_the_admin_api import head, people_repo
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane
from llmgw.engines.demo import SMOLLM2_SHA256
from llmgw.settings import load_commit
from plan.hub_files import HubFiles

from .test_console_actions import confirmation, form_with, logged_in, text_of

SOURCE = "hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF@" + "c" * 40 + "/smollm2-135m-instruct-q4_1.gguf"


async def test_the_explorers_serve_form_commits_a_new_catalog_file_as_the_person(
    tmp_path, weights_mirror, smollm2_gguf, monkeypatch,
):
    from control.test_people_on_the_admin_api import PASSWORD

    hub = HubFiles()
    hub.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf", smollm2_gguf,
            SMOLLM2_SHA256)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    repo = people_repo(tmp_path, weights_mirror[1])
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            plane.store.add_account("ops@lab.example", "Olga Ops", PASSWORD)
            operator, _ = await logged_in(plane, "ops@lab.example")
            async with aclosing(operator):
                page = await operator.get("/console/explorer", params={"source": SOURCE}, timeout=60)
                assert page.status_code == 200, page.text
                assert hub.served["smollm2-135m-instruct-q4_1.gguf"] < 3 * 2**20  # the header only
                fields = form_with(page.text, 'id="serve-model-button"')
                weights = html.unescape(re.search(r'<textarea id="serve-weights"[^>]*>(.*?)</textarea>', page.text,
                                                  re.S).group(1))
                assert weights == f"{SOURCE} {SMOLLM2_SHA256}"
                assert (fields["action"], fields["model"], fields["engine"], fields["gpus"], fields["cpu_cores"]) \
                    == ("serve", "smollm2-135m-instruct-q4_1", "llama.cpp", "0", "1")
                before = head(repo).id
                shown = await operator.post("/console/actions", data={**fields, "weights": weights})
                assert shown.status_code == 200 and 'id="confirm"' in shown.text, text_of(shown.text)
                diff = html.unescape(shown.text)
                assert "+++ b/catalog/smollm2-135m-instruct-q4_1.yaml" in diff and "+engine: llama.cpp" in diff
                assert f"sha256: {SMOLLM2_SHA256}" in diff and head(repo).id == before
                done = await operator.post("/console/actions", data=confirmation(shown.text))
                assert done.status_code == 200 and "Committed" in text_of(done.text), text_of(done.text)
                commit = head(repo)
                assert commit.message.startswith("llmgw model smollm2-135m-instruct-q4_1: served (llama.cpp, 1 "
                                                  "replica(s) of 1 cores)")
                assert (commit.author.email, commit.committer.name) == ("ops@lab.example", "llmgw")
                model = load_commit(str(repo)).models["smollm2-135m-instruct-q4_1"]
                assert (model.engine, model.replicas, model.resources.cpu_cores, model.resources.gpus) == \
                    ("llama.cpp", 1, 1.0, 0)
                assert [(w.source, w.sha256) for w in model.weights] == [(SOURCE, SMOLLM2_SHA256)]
                assert model.resources.memory_bytes >= smollm2_gguf.stat().st_size

                # the same name again: a sentence, nothing committed
                again = await operator.post("/console/actions", data={**fields, "weights": weights})
                assert again.status_code == 400 and "is in the catalog already" in text_of(again.text)
                assert head(repo).id == commit.id
            nursery.cancel_scope.cancel()
    finally:
        hub.close()


def test_the_serve_action_asks_for_a_gpu_model_or_a_cpu_one_and_names_a_wrong_field():
    import pytest

    from llmgw.console.actions import ActionError, request_of
    from llmgw.console.sessions import Login

    ops = Login("ops", person="ops@lab.example", role="operator")
    gpu = request_of({"action": "serve", "model": "big", "engine": "vllm", "replicas": "2", "gpus": "4",
                      "gpu_class": "h100-80g", "tensor_parallel": "4", "weights": "hf://acme/big@" + "a" * 40 + "/"},
                     ops)
    assert (gpu.path, gpu.body) == ("/api/v1/models/big/serve", {
        "engine": "vllm", "weights": [{"source": "hf://acme/big@" + "a" * 40 + "/", "sha256": ""}], "replicas": 2,
        "gpus": 4, "gpu_class": "h100-80g", "tensor_parallel": 4})
    assert gpu.title == "Serve big on vllm: 2 replica(s) of 4 x h100-80g"
    cpu = request_of({"action": "serve", "model": "s", "engine": "llama.cpp", "replicas": "1", "gpus": "0",
                      "cpu_cores": "0.5", "memory_bytes": "404144128", "weights": f"hf://a/b/s.gguf {'c' * 64}"}, ops)
    assert cpu.body == {"engine": "llama.cpp", "weights": [{"source": "hf://a/b/s.gguf", "sha256": "c" * 64}],
                        "replicas": 1, "cpu_cores": 0.5, "memory_bytes": 404144128}
    for field, value, words in (("cpu_cores", "two", "give a number of cores"),
                                ("weights", "hf://a/b/s.gguf", "write one file a line"),
                                ("memory_bytes", "4Gi", "give a size in bytes")):
        with pytest.raises(ActionError, match=words) as refused:
            request_of({"action": "serve", "model": "s", "engine": "llama.cpp", "replicas": "1", "cpu_cores": "1",
                        "weights": f"hf://a/b/s.gguf {'c' * 64}", field: value}, ops)
        assert refused.value.field == field


def test_the_serve_form_is_filled_in_from_the_first_class_that_fits_else_a_cpu_node():
    from llmgw.console.views import serve_form
    from llmgw.plan import Fleet, GpuState, NodeState
    from llmgw.plan.model_fit import plan_model
    from llmgw.tools.model_headers import ModelFacts

    facts = ModelFacts("hf://acme/Big-Model@" + "a" * 40 + "/", "safetensors", "LlamaForCausalLM", "", 150 * 2**30,
                       70 * 10**9, ())
    cards = tuple(GpuState(str(i), "h100-80g", 80 * 2**30, 80 * 2**30) for i in range(8))
    fit = plan_model(facts, Fleet((NodeState("g1", gpus=cards), NodeState("c1", cpu_cores=8, memory_bytes=2**40))))
    assert serve_form(fit) == {"model": "big-model", "replicas": 1, "weights": facts.source, "engine": "vllm",
                               "gpus": 4, "gpu_class": "h100-80g", "tensor_parallel": 4, "cpu_cores": "",
                               "memory_bytes": ""}
    cpu = serve_form(plan_model(facts, Fleet((NodeState("c1", cpu_cores=8, memory_bytes=2**40),))))
    assert (cpu["engine"], cpu["gpus"], cpu["cpu_cores"], cpu["memory_bytes"]) == ("vllm", 0, 8, 150 * 2**30)
