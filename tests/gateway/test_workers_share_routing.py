"""Gateway worker processes (`GatewayWorkers`, real processes sharing one port) route alike: a prompt goes to the same
replica whichever worker the kernel gave its connection to (rendezvous affinity, no shared memory), and a new routing
table and /health's details reach every worker; a worker that cannot open the store fails the start with a sentence."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
import trio

from gateway_harness import make_table, replica, start_engine
from llmgw.gateway import GatewayWorkers
from llmgw.gateway.restarts import WorkerStartError


async def _ask(port: int, key: str, prompt: str) -> str:
    """One chat request on a connection of its own (so SO_REUSEPORT picks a worker anew); the replica that served."""
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                   headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "gemma", "max_tokens": 2,
                                         "messages": [{"role": "user", "content": prompt}]})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-llmgw-replica"]


async def test_a_prompt_reaches_the_same_replica_from_every_worker_and_new_tables_reach_them_all(store, tmp_path):
    _record, key = store.create_api_key("chat")
    async with trio.open_nursery() as nursery:
        urls = [(await start_engine(nursery))[1] for _ in range(3)]
        replicas = [replica(f"r{i}", url) for i, url in enumerate(urls)]
        workers = GatewayWorkers(2, "127.0.0.1", 0, store_url=str(store.path), spool_root=tmp_path / "spools",
                                 metrics_dir=tmp_path / "metrics")
        workers.set_table(make_table({"gemma": replicas}))
        health = {"leader": True}
        workers.health_details = lambda: dict(health)
        port = await nursery.start(workers.serve)
        homes = {}
        for prompt in ("alpha", "bravo", "charlie", "delta"):
            served = {await _ask(port, key, f"tell me about {prompt}") for _ in range(6)}
            assert len(served) == 1, served  # one replica, from whichever worker
            homes[prompt] = served.pop()
        assert all((tmp_path / "spools" / f"worker-{k}" / "usage.spool").stat().st_size for k in (0, 1))

        gone = homes["alpha"]
        workers.set_table(make_table({"gemma": [r for r in replicas if r.replica_id != gone]}))
        with trio.fail_after(30):  # every worker gets the new table within a round of the feed
            while True:
                served = [await _ask(port, key, "tell me about alpha") for _ in range(8)]
                if gone not in served:
                    break
                await trio.sleep(0.05)
        assert len(set(served)) == 1

        # /health says what the control plane says (leadership, recovering), from every worker
        async def healths() -> list[httpx.Response]:
            answers = []
            for _ in range(8):
                async with httpx.AsyncClient(timeout=30) as client:
                    answers.append(await client.get(f"http://127.0.0.1:{port}/health"))
            return answers

        assert all(a.status_code == 200 and a.json() == {"status": "ok", "leader": True} for a in await healths())
        health["status"] = "recovering"
        with trio.fail_after(30):
            while not all(a.status_code == 503 for a in await healths()):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()


async def test_a_worker_that_cannot_open_the_store_fails_the_start(tmp_path):
    workers = GatewayWorkers(2, "127.0.0.1", 0, store_url="postgresql://nobody@127.0.0.1:1/none",
                             spool_root=tmp_path / "spools", metrics_dir=tmp_path / "metrics")
    with pytest.raises(WorkerStartError, match="worker 0 ended before it was serving"):
        with trio.fail_after(60):
            await workers.serve()


async def test_a_worker_holds_a_request_for_a_model_waking_from_zero_and_says_so(store, tmp_path):
    """(about 3 s) A model at zero (`wakes`, no replica): a request through a worker process is held, the control
    plane's side hears that one request waits for it, and once a table with a ready replica reaches the workers the
    request is answered and the count goes back to 0."""
    _record, key = store.create_api_key("chat")
    heard: list[tuple[str, int]] = []
    async with trio.open_nursery() as nursery:
        url = (await start_engine(nursery))[1]
        workers = GatewayWorkers(2, "127.0.0.1", 0, store_url=str(store.path), spool_root=tmp_path / "spools",
                                 metrics_dir=tmp_path / "metrics")
        workers.on_held = lambda model, count: heard.append((model, count))
        asleep = make_table({"gemma": []})
        workers.set_table(replace(asleep, models={"gemma": replace(asleep.models["gemma"], wakes=True)}))
        port = await nursery.start(workers.serve)
        answered: list[str] = []

        async def ask() -> None:
            answered.append(await _ask(port, key, "wake up"))

        nursery.start_soon(ask)
        with trio.fail_after(20):
            while workers.held() != {"gemma": 1}:
                await trio.sleep(0.05)
        assert heard == [("gemma", 1)] and not answered
        workers.set_table(make_table({"gemma": [replica("r0", url)]}))
        with trio.fail_after(20):
            while not answered or workers.held():
                await trio.sleep(0.05)
        assert answered == ["r0"] and heard == [("gemma", 1), ("gemma", 0)]
        nursery.cancel_scope.cancel()
