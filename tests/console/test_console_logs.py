"""The console's log pages over quart-trio's test client: the lines a node's agent returns, followed or not, and
a sentence when the node cannot answer."""

from __future__ import annotations

import trio

from llmgw.console import Console
from llmgw.errors import TemporaryError, UsageError

from .test_console_security import TOKEN, admin_only, no_history, state_with_one_gpu_node


BEARER = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}


def console_with(logs) -> Console:
    state = state_with_one_gpu_node()
    return Console(lambda: state, authorise=admin_only, history=no_history, logs=logs)


async def test_a_shards_log_lines_are_shown_and_following_refreshes_every_two_seconds():
    asked = []

    async def logs(node: str, shard: str, lines: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        asked.append((node, shard, lines))
        return ["first <line>", "second line"]

    client = console_with(logs).app.test_client()
    response = await client.get("/console/nodes/gpu1/logs?shard=big-0/0&lines=50&follow=1", headers=BEARER)
    html = await response.get_data(as_text=True)
    assert response.status_code == 200 and asked == [("gpu1", "big-0/0", 50)]
    assert "first &lt;line&gt;\nsecond line\n</pre>" in html
    assert 'data-refresh="2"' in html and ">Stop following</a>" in html
    still = await (await client.get("/console/nodes/gpu1/logs", headers=BEARER)).get_data(as_text=True)
    assert 'data-refresh="0"' in still and "Log of the agent on" in still and asked[-1] == ("gpu1", "", 200)


async def test_a_node_that_cannot_answer_gets_a_sentence_with_409_or_503():
    async def disconnected(node: str, shard: str, lines: int) -> list[str]:
        raise UsageError(f"node {node} is not connected")

    async def slow(node: str, shard: str, lines: int) -> list[str]:
        raise TemporaryError(f"node {node} did not answer within 10 s", delay=1.0)

    for logs, status, sentence in ((disconnected, 409, "is not connected"), (slow, 503, "did not answer")):
        response = await console_with(logs).app.test_client().get("/console/nodes/gpu1/logs", headers=BEARER)
        assert response.status_code == status and sentence in await response.get_data(as_text=True)


async def test_the_log_of_a_node_not_in_the_fleet_is_404():
    async def logs(node: str, shard: str, lines: int) -> list[str]:
        raise AssertionError("not asked")

    response = await console_with(logs).app.test_client().get("/console/nodes/elsewhere/logs", headers=BEARER)
    assert response.status_code == 404
