"""Health checks eject and readmit replicas (external endpoints too); the stand-in runs as llama-server would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import trio
from gateway_harness import make_table, replica, start_engine, start_gateway

STAND_IN = Path(__file__).resolve().parents[1] / "support" / "fake_llama_server.py"


async def test_failed_health_ejects_a_replica_until_it_recovers(nursery, store):
    sick, sick_url = await start_engine(nursery)
    well, well_url = await start_engine(nursery)
    table = make_table({"gemma": [replica("sick-1", sick_url),
                                  replica("ext-1", well_url, external=True, node_id="elsewhere")]})
    gateway, base = await start_gateway(nursery, store, table, health_interval=3600)
    sick.healthy = False
    await gateway.check_health()
    now = trio.current_time()
    assert gateway.balancer.is_ejected("sick-1", now) and not gateway.balancer.is_ejected("ext-1", now)
    assert well.stats.requests.get("/v1/models") == 1 and "/health" not in well.stats.requests  # external probe
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    for i in range(3):
        await client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": f"q{i}"}])
    assert {r.replica for r in store.recent_usage()} == {"ext-1"}
    sick.healthy = True
    await gateway.check_health()
    assert not gateway.balancer.is_ejected("sick-1", trio.current_time())


def test_stand_in_runs_with_llama_servers_command_line_and_wants_the_key():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(STAND_IN), "--host", "127.0.0.1", "--port", str(port), "-m", "/m/gemma.gguf",
         "--alias", "gemma", "-c", "2048", "-t", "2", "--no-jinja", "--chat-template", "gemma", "--metrics",
         "-ngl", "99"], env={**os.environ, "LLAMA_API_KEY": "k1"}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        assert health.json() == {"status": "ok"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"] == "gemma"
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        assert refused.status_code == 401 and refused.json() == {
            "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
        ok = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers={"x-api-key": "k1"})
        assert ok.json()["usage"]["completion_tokens"] > 0
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"authorization": "Bearer k1"}).text
        assert "llamacpp:prompt_tokens_total" in metrics and "llamacpp:requests_processing 0" in metrics
    finally:
        process.terminate()
        process.wait(10)
