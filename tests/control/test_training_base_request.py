"""A job submitted with `"base_weights": "model"` (`llmgw train submit --base-from-model`) carries the catalog
model's own weights as its base's sources (`llmgw.control.training_requests.submit`), on the loop of
test_training_rule.py; the agent's side is tests/agent/test_training_base_weights.py."""

from __future__ import annotations

import trio

from llmgw.control.training_requests import submit

from .test_training_rule import PAIRS, Trainer


async def test_a_job_asking_for_the_models_weights_gets_the_catalogs_sources(tmp_path, autojump_clock):
    world = Trainer(tmp_path)
    weights = world.loop.state.settings.models["tiny"].weights
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        status = await submit(world.loop, {"model": "tiny", "base_weights": "model", "pairs": PAIRS, "job": "a"})
        assert status["base"] == ""
        assert status["base_weights"] == [{"source": f.source, "sha256": f.sha256} for f in weights] != []
        assert world.loop.state.training.get("a").job.base_weights == tuple((f.source, f.sha256) for f in weights)
        nursery.cancel_scope.cancel()
