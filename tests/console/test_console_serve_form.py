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
