"""The autoscaler against a real control plane, its gateway, an in-process agent running the llama-server stand-in
and a real settings repository (pushes with the git CLI, hooks running).

tiny gets `replicas: {min: 1, max: 2, queue_per_replica: 1}` with short windows. Four slow streamed requests at once
(the stand-in waits between tokens) fill tiny-0's engine queue: the agent's readings of its /metrics carry it, the
rule wants 2, tiny-1 starts and serves; once the requests end, the count comes back to 1 and tiny-1 stops. The
wanted count is runtime state: the settings never change, `llmgw status` and the audit commits carry the count and
the reason. Time: about 10 s.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import trio

from llmgw.cli.server_cmds import render_status
from llmgw.control import ControlPlane
from llmgw.plan.types import ActionKind
from llmgw.settings import read_audit_log

from support.settings_seed import GEMMA_YAML

from .test_in_process_fleet import push_catalog, replica_states, wait_for
from .test_reviewed_rollout import head, serving_one_replica

RANGE = ("replicas:\n  min: 1\n  max: 2\n  queue_per_replica: 1\n  kv_cache_usage: 1\n  scale_up_window: 0s\n"
         "  scale_down_window: 1s\n  cooldown: 1s\n")


def set_range(checkout: Path, text: str) -> None:
    """Replace catalog/tiny.yaml's `replicas:` line with `text` (a range, and any lines after it)."""
    path = checkout / "catalog" / "tiny.yaml"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("replicas:")]
    path.write_text("\n".join(lines) + "\n" + text)


def autoscaled(checkout: Path) -> None:
    set_range(checkout, RANGE + 'engine_args: ["--fake-token-delay", "0.1"]\n')
    agents = checkout / "agents" / "default.yaml"  # the engines' load read every 200 ms
    agents.write_text(agents.read_text() + "telemetry_interval: 200ms\n")


async def slow_streams(url: str, api_key: str, answered: list[int]) -> None:
    """Slow streamed chat completions to tiny, one after the other, until cancelled."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while True:
            await _slow_stream(client, api_key, answered)


async def _slow_stream(client: httpx.AsyncClient, api_key: str, answered: list[int]) -> None:
    async with client.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                             json={"model": "tiny", "stream": True, "max_tokens": 30,
                                   "messages": [{"role": "user", "content": "hi"}]}) as reply:
        body = await reply.aread()
        answered.append(reply.status_code)
        assert reply.status_code == 200, body


async def scrape(plane: ControlPlane) -> str:
    async with httpx.AsyncClient(timeout=10) as client:
        reply = await client.get(f"{plane.admin_url}/metrics", headers={"Authorization": f"Bearer {plane.admin_token}"})
    assert reply.status_code == 200
    return reply.text


def scaling_of(plane: ControlPlane) -> dict:
    return plane.status().get("scaling", {}).get("tiny", {})


async def ranged_plane(nursery, tmp_path: Path, settings_repo: Path, weights_mirror, fake_engine: Path, edit,
                       message: str) -> tuple[ControlPlane, str]:
    """A control plane serving tiny-0, then the settings commit `edit` makes (a range starting at 1) applied and
    tiny-0 ready by it: (the plane, that commit)."""
    mirror, _sha = weights_mirror
    plane = await serving_one_replica(nursery, tmp_path, settings_repo, mirror, fake_engine)
    await push_catalog(tmp_path / "checkout", settings_repo, edit, message)
    commit = head(settings_repo)
    await wait_for(lambda: plane.audit.applied == commit and replica_states(plane) == {"tiny-0": "ready"}, 30,
                   "the range applied", plane.status)
    assert scaling_of(plane)["wanted"] == 1
    return plane, commit


async def test_a_queue_on_the_engine_starts_a_second_replica_and_its_end_stops_it(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    async with trio.open_nursery() as nursery:
        plane, commit = await ranged_plane(nursery, tmp_path, settings_repo, weights_mirror, fake_engine, autoscaled,
                                           "tiny: 1 to 2 replicas, autoscaled")

        _record, api_key = plane.store.create_api_key("demo")
        answered: list[int] = []
        async with trio.open_nursery() as clients:
            for _ in range(4):
                clients.start_soon(slow_streams, plane.gateway_url, api_key, answered)
            await wait_for(lambda: scaling_of(plane).get("wanted") == 2, 10, "the autoscaler wanting 2",
                           plane.status)
            assert "scaled up" in scaling_of(plane)["reason"]
            await wait_for(lambda: replica_states(plane).get("tiny-1") == "ready", 20, "tiny-1 ready", plane.status)
            # a quick machine has tiny-1 ready before one slow stream ended: each client's first answer, then stop
            await wait_for(lambda: len(answered) >= 4, 30, "the slow streams answered")
            clients.cancel_scope.cancel()
        assert answered and set(answered) == {200}
        assert "autoscaler  tiny: 2 wanted" in "\n".join(render_status(plane.status()))  # `llmgw status`
        preview, _ = await plane.preview(None)  # what `llmgw plan` and `llmgw diff --live` show: the pass's own plan
        assert [a.kind for a in preview.actions] == [ActionKind.KEEP, ActionKind.KEEP], preview.actions
        metrics = await scrape(plane)  # /metrics of the admin listener
        assert 'llmgw_model_replicas_desired{model="tiny"} 2.0' in metrics
        assert 'llmgw_model_replicas_ready{model="tiny"} 2.0' in metrics

        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready"}, 20, "tiny-1 stopped after the load",
                       plane.status)
        assert scaling_of(plane)["wanted"] == 1 and "scaled down" in scaling_of(plane)["reason"]
        assert head(settings_repo) == commit  # the settings never changed
        await wait_for(lambda: plane.audit.pending() == 0, 10, "the audit written")
        messages = [entry.message for entry in read_audit_log(settings_repo)]
        assert any("autoscaler: tiny: 2 wanted" in m and "scaled up" in m for m in messages), messages[:5]
        nursery.cancel_scope.cancel()


ZERO = "replicas:\n  min: 0\n  max: 1\n  scale_up_window: 0s\n  scale_down_window: 0s\n  cooldown: 0s\n  idle: 1s\n"


def to_zero(checkout: Path) -> None:
    set_range(checkout, ZERO)


async def test_an_idle_model_stops_and_its_next_request_is_held_while_it_starts_then_served(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    """(about 8 s) `min: 0`, idle 1 s: tiny-0 stops; a request through the openai SDK is held while tiny-0 starts
    again and is answered; with one request held and the queue bounded at 1, another gets 503 with Retry-After."""
    mirror, _sha = weights_mirror
    checkout = tmp_path / "checkout"
    async with trio.open_nursery() as nursery:
        plane = await serving_one_replica(nursery, tmp_path, settings_repo, mirror, fake_engine)
        await push_catalog(checkout, settings_repo, to_zero, "tiny: scaled to zero when idle")
        await wait_for(lambda: scaling_of(plane).get("wanted") == 0 and replica_states(plane) == {}, 20,
                       "tiny stopped after 1 s idle", plane.status)
        assert "idle" in scaling_of(plane)["reason"]
        assert not plane.table.models["tiny"].replicas and plane.table.models["tiny"].wakes

        _record, api_key = plane.store.create_api_key("demo")
        client = openai.OpenAI(base_url=plane.gateway_url + "/v1", api_key=api_key, max_retries=0, timeout=30)
        plane.gateway.holding.limit = 1
        answers: list = []

        def ask() -> None:
            answers.append(client.chat.completions.create(
                model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hello"}]))

        async with trio.open_nursery() as clients:
            clients.start_soon(trio.to_thread.run_sync, ask)
            await wait_for(lambda: plane.gateway.holding.held == {"tiny": 1}, 10, "the request held")
            await wait_for(lambda: plane.snapshot().held == {"tiny": 1}, 10, "the control plane told")
            held = await scrape(plane)
            assert 'llmgw_model_requests_held{model="tiny"} 1.0' in held
            try:  # the queue is full: refused at once
                await trio.to_thread.run_sync(ask)
            except openai.APIStatusError as exc:
                assert exc.status_code == 503 and int(exc.response.headers["retry-after"]) >= 1
                assert "is starting" in exc.message
            else:
                raise AssertionError("a request beyond the held queue was not refused")
        assert len(answers) == 1 and answers[0].choices[0].message.content
        assert answers[0].usage.completion_tokens == 4
        assert scaling_of(plane)["wanted"] == 1 and "woken" in scaling_of(plane)["reason"]
        assert plane.gateway.holding.held == {}
        # the gateway tells the control plane its queue is empty by a message the plane's next pass takes in
        await wait_for(lambda: not plane.snapshot().held.get("tiny"), 10, "the control plane told", plane.status)
        woken = await scrape(plane)  # /metrics of the admin listener
        assert 'llmgw_model_replicas_desired{model="tiny"} 1.0' in woken
        assert 'llmgw_model_requests_held{model="tiny"}' not in woken
        nursery.cancel_scope.cancel()


GEMMA_AT_ZERO = GEMMA_YAML.format(replicas="{min: 0, max: 1, idle: 2s, cooldown: 0s}").replace(
    "node_selector: {engine: real}\n", "")


async def test_a_real_llama_server_at_zero_is_started_by_the_request_it_then_answers(
    tmp_path, llama_server_binary, gemma_mirror,
):
    """(10-40 s, with the machine's load) Gemma 3 270M on the real llama-server, `min: 0`: nothing runs until a request comes through the
    openai SDK; it is held while the engine starts and loads the model, then answered (temperature 0); 2 s after,
    idle, the replica stops again."""
    from llmgw.agent import run_agent
    from llmgw.control import ControlConfig
    from llmgw.settings import init_repository

    from .conftest import settings_seed, stand_in_agent

    repo = tmp_path / "settings.git"
    init_repository(repo, settings_seed.write_seed(tmp_path / "seed", "gemma-3-270m", GEMMA_AT_ZERO))
    async with trio.open_nursery() as nursery:
        plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
        await nursery.start(plane.run)
        await nursery.start(run_agent, stand_in_agent("n1", tmp_path / "a1", gemma_mirror, llama_server_binary),
                            plane.local_connector())
        await wait_for(lambda: plane.is_connected("n1") and plane.status().get("scaling", {}).get("gemma-3-270m"),
                       20, "the autoscaler at work", plane.status)
        await trio.sleep(1)
        assert replica_states(plane) == {} and plane.status()["scaling"]["gemma-3-270m"]["wanted"] == 0

        _record, api_key = plane.store.create_api_key("demo")
        client = openai.OpenAI(base_url=plane.gateway_url + "/v1", api_key=api_key, max_retries=0, timeout=60)
        began = trio.current_time()
        answer = await trio.to_thread.run_sync(lambda: client.chat.completions.create(
            model="gemma-3-270m", max_tokens=8, temperature=0, seed=1,
            messages=[{"role": "user", "content": "The capital of France is"}]))
        waited = trio.current_time() - began
        assert answer.choices[0].message.content and answer.usage.completion_tokens <= 8
        print(f"first request at zero answered after {waited:.2f} s (engine started, model loaded)")
        await wait_for(lambda: replica_states(plane) == {}, 20, "the replica stopped after 2 s idle", plane.status)
        assert "idle" in plane.status()["scaling"]["gemma-3-270m"]["reason"]
        await wait_for(lambda: plane.audit.pending() == 0, 10, "the audit written")
        messages = "\n".join(entry.message for entry in read_audit_log(repo))
        assert "autoscaler: gemma-3-270m: 1 wanted" in messages and "woken: 1 request waits" in messages
        nursery.cancel_scope.cancel()
