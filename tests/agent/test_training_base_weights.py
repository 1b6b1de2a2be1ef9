"""A training job naming its base weights by source (docs/training.md, "The job"): the agent fetches them from a local
stand-in of the Hub (tests/plan/hub_files.py) serving the Gemma that `make vllm` converts to Hugging Face's format,
into its weights cache, checked as an engine's weights are, then trains on them (a stand-in trainer: the training
itself is tests/control/test_training_real.py's); a source that cannot be fetched fails the job naming it. And how a
job's request names its base (`llmgw.training.jobs.base_weights_of`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from llmgw.engines.installing import default_cache_dir
from llmgw.errors import UsageError
from llmgw.training.jobs import HyperParameters, TrainingJob, base_weights_of, job_from_json
from llmgw.wire import control_message, pb

from plan.hub_files import serve_directory
from test_command_answers import _agent, _answers, _reports

REPO = "google/gemma-3-270m"
REVISION = "c" * 40
SOURCE = f"hf://{REPO}@{REVISION}/"

# `python -I train_lora.py JOB BASE OUT`: checks the base it is given, notes where it is, reports a step, writes an
# adapter
TRAINER = """#!/bin/sh
test -f "$4/config.json" && test -f "$4/model.safetensors" && test -f "$4/tokenizer.json" || { echo "no base"; exit 3; }
echo "$4" > "$(dirname "$3")/base.txt"
echo '{"event": "step", "step": 1, "steps": 1, "loss": 2.5, "peak_memory_bytes": 1000, "seconds": 0.1}'
mkdir -p "$5" && echo '{"r": 4}' > "$5/adapter_config.json" && printf 'weights' > "$5/adapter_model.safetensors"
"""


@pytest.fixture(scope="module")
def gemma_hf() -> Path:
    """The converted Gemma's directory (converted when absent)."""
    from llmgw.engines.vllm_demo import ensure_gemma_hf, ensure_vllm

    cache = default_cache_dir()
    return ensure_gemma_hf(cache, trio.run(ensure_vllm, cache))


@pytest.fixture
def hub(gemma_hf, monkeypatch):
    server = serve_directory(REPO, gemma_hf, REVISION)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    try:
        yield server
    finally:
        server.close()


def _job(job_id: str, sources: tuple[tuple[str, str], ...]) -> pb.StartTraining:
    job = TrainingJob(job_id, "gemma", "", (("q", "a"),), base_weights=sources, hyper=HyperParameters(steps=1))
    return pb.StartTraining(job_id=job_id, spec_json=job.to_json())


async def test_a_job_naming_its_base_by_source_gets_it_fetched_checked_and_trains_on_it(tmp_path, hub, gemma_hf):
    directory = gemma_hf
    trainer = tmp_path / "python"
    trainer.write_text(TRAINER)
    trainer.chmod(0o755)
    async with _agent(tmp_path, training_python=trainer) as (agent, link):
        await link.send(control_message(command_id="t1", start_training=_job("j1", ((SOURCE, ""),))))
        seen = await _reports(link, "done")
        states = [r.state for r in seen if isinstance(r, pb.TrainingReport)]
        assert states == ["fetching", "running", "running", "sending", "done"], seen
        base = Path((tmp_path / "state" / "training" / "j1" / "base.txt").read_text().strip())
        assert base.parent == agent.config.weights_path / "models"  # laid out from the weights cache
        assert (base / "model.safetensors").stat().st_ino != (directory / "model.safetensors").stat().st_ino
        assert (base / "model.safetensors").stat().st_size == (directory / "model.safetensors").stat().st_size
        assert (base / "config.json").read_bytes() == (directory / "config.json").read_bytes()
        size = (directory / "model.safetensors").stat().st_size
        assert hub.served["model.safetensors"] == size

        # the same base again: from the cache, nothing fetched twice
        await link.send(control_message(command_id="t2", start_training=_job("j2", ((SOURCE, ""),))))
        assert [r.state for r in await _reports(link, "done") if isinstance(r, pb.TrainingReport)][0] == "fetching"
        assert hub.served["model.safetensors"] == size

        # a revision the Hub does not have: the job fails naming the source and the 404
        missing = f"hf://{REPO}@{'d' * 40}/"
        await link.send(control_message(command_id="t3", start_training=_job("j3", ((missing, ""),))))
        failed = (await _reports(link, "failed"))[-1]
        assert failed.error.startswith(f"{missing}: not found (404 at {hub.url}/api/models/{REPO}/tree/{'d' * 40}")

        # a file whose content is not the sha256 the job names: refused, not trained on
        wrong = ((f"hf://{REPO}@{REVISION}/config.json", "0" * 64),)
        await link.send(control_message(command_id="t4", start_training=_job("j4", wrong)))
        failed = (await _reports(link, "failed"))[-1]
        assert "expected " + "0" * 64 in failed.error and failed.error.startswith(wrong[0][0])
        assert not (tmp_path / "state" / "training" / "j4" / "base.txt").exists()

        # the directory form still needs its directory on the node
        no_base = pb.StartTraining(job_id="j5", spec_json=TrainingJob("j5", "gemma", "/nowhere", (("q", "a"),)
                                                                      ).to_json())
        await link.send(control_message(command_id="t5", start_training=no_base))
        answer = (await _answers(link, "t5"))[-1]
        assert not answer.ok and answer.error.startswith("node node-a has no base weights at /nowhere")


def test_a_request_names_its_base_by_directory_source_list_or_the_catalog_model():
    assert base_weights_of({"base": "/srv/gemma"}) == ("/srv/gemma", ())
    assert base_weights_of({"base": SOURCE}) == ("", ((SOURCE, ""),))
    listed = [{"source": "hf://o/r@" + "a" * 40 + "/model.safetensors", "sha256": "b" * 64}]
    assert base_weights_of({"base_weights": listed}) == ("", ((listed[0]["source"], "b" * 64),))
    catalog = ((SOURCE, "e" * 64, ""),)
    assert base_weights_of({"base_weights": "model"}, catalog) == ("", ((SOURCE, "e" * 64),))
    job = TrainingJob("j", "m", "", (("q", "a"),), base_weights=((SOURCE, ""),))
    assert job_from_json(job.to_json()) == job
    directory = TrainingJob("j", "m", "/srv/gemma", (("q", "a"),))
    assert "base_weights" not in directory.to_json() and job_from_json(directory.to_json()) == directory  # as before
    refused = [
        ({}, "a training job needs \"base\""),
        ({"base": "/a", "base_weights": "model"}, "a training job needs \"base\""),
        ({"base": "hf://google/gemma-3-270m/"}, "\"base\" 'hf://google/gemma-3-270m/': a source of base weights is "
                                                "a directory pinned to a commit"),
        ({"base": "https://example.com/m/"}, "\"base\" 'https://example.com/m/': give a directory on the node"),
        ({"base_weights": [{"source": "https://example.com/model.safetensors", "sha256": ""}]},
         "\"base_weights\": 'https://example.com/model.safetensors' needs a source URL and its sha256"),
        ({"base_weights": "model"}, "\"base_weights\": \"model\" names the catalog model's weights, and it lists none"),
        ({"base_weights": [1]}, "\"base_weights\" must be \"model\" or a list"),
    ]
    for body, said in refused:
        with pytest.raises(UsageError) as caught:
            base_weights_of(body)
        assert str(caught.value).startswith(said), (body, str(caught.value))
    with pytest.raises(UsageError, match="name a secret"):
        base_weights_of({"base_weights": "model"}, ((SOURCE, "", "hf-token"),))


def test_the_cli_sends_the_base_as_a_directory_files_or_the_models(tmp_path):
    """`llmgw train submit --base / --base-file / --base-from-model`: the body posted to POST /api/v1/training."""
    import http.server
    import json
    import threading

    from support.http_stub import StubHandler
    from support.in_process_cli import run_llmgw

    posted: list[dict] = []
    status = {"job": "j", "model": "m", "state": "queued", "node_id": "", "waiting": "no node", "step": 0,
              "steps": 1, "loss": None, "peak_memory_bytes": 0, "error": ""}

    class Admin(StubHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._send(200, json.dumps(status).encode(), {"Content-Type": "application/json"})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Admin)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    pairs = tmp_path / "qa.jsonl"
    pairs.write_text('{"question": "q", "answer": "a"}\n')
    common = ["train", "submit", "--model", "m", "--pairs", str(pairs), "--url",
              f"http://127.0.0.1:{server.server_address[1]}", "--token", "t"]
    file = f"hf://{REPO}@{REVISION}/model.safetensors"
    try:
        for extra, base in [(["--base", SOURCE], {"base": SOURCE}),
                            (["--base-file", file, "a" * 64, "--base-file", file + "2", "b" * 64],
                             {"base_weights": [{"source": file, "sha256": "a" * 64},
                                               {"source": file + "2", "sha256": "b" * 64}]}),
                            (["--base-from-model"], {"base_weights": "model"})]:
            code, out, err = run_llmgw([*common, *extra])
            assert code == 0, err
            assert {k: posted[-1][k] for k in ("base", "base_weights") if k in posted[-1]} == base
        code, _, err = run_llmgw([*common, "--base", "/w", "--base-from-model"])
        assert code != 0 and "give the base weights once" in err and len(posted) == 3
    finally:
        server.shutdown()
        server.server_close()
