"""A real control plane runs /v1/batches itself: with an in-process agent running the llama-server stand-in, a batch
made through the official `openai` SDK on the plane's gateway completes (its batch runner works while the plane
leads) and its usage rows name the batch. Time: about 4 s."""

from __future__ import annotations

import json

import openai
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane

from .conftest import stand_in_agent


async def test_a_batch_made_on_the_planes_gateway_completes(tmp_path, settings_repo, weights_mirror, fake_engine):
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine),
                            plane.local_connector())
        with trio.fail_after(30):
            while not (plane.table.models.get("tiny") and plane.table.models["tiny"].replicas and plane.leader):
                await trio.sleep(0.05)
        sdk = openai.AsyncOpenAI(base_url=plane.gateway_url + "/v1", api_key=plane.store.create_api_key("demo")[1],
                                 max_retries=0)
        rows = [json.dumps({"custom_id": f"n-{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "tiny-alias", "prompt": f"{i} and", "max_tokens": 2}})
                for i in range(5)]
        upload = await sdk.files.create(file=("in.jsonl", "\n".join(rows).encode()), purpose="batch")
        batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                         completion_window="24h")
        with trio.fail_after(20):
            while (done := await sdk.batches.retrieve(batch.id)).status != "completed":
                await trio.sleep(0.1)
        assert done.request_counts.completed == 5
        output = [json.loads(row) for row in (await sdk.files.content(done.output_file_id)).text.splitlines()]
        assert [line["custom_id"] for line in output] == [f"n-{i}" for i in range(5)]
        assert {r.batch_id for r in plane.store.recent_usage(project="demo")} == {batch.id}
        nursery.cancel_scope.cancel()
