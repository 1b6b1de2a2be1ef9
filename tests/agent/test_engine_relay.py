"""An engine answers only through its relay, and the relay only with the replica key (issue 25, item 3).

A real agent (`run_agent`, in process) starts a real llama-server (b11434, Gemma 3 270M) from a StartShard: the engine
listens on 127.0.0.1 at an internal port, the agent's relay on the node's address at the port the shard reports.
Through the relay, a request without the key (or with another) to any path, with any method, is refused with 401
before it reaches the engine; with the key it is answered, a streamed completion arrives event by event, and the
gateway (which addresses the reported port with the key) answers the openai SDK unchanged.

Where: here the "other host" is this one: the relay listens on 127.0.0.1 (the agent's address here) and the engine's
own port is shown unreachable on the machine's other addresses by its command line (`--host 127.0.0.1`) and by
connecting to them. From hosts of their own (network namespaces: a client host refused on every path, the engine's
port refused at once, a gateway host answered through the relay): tests/agent/test_engine_relay_other_hosts.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.engines.relay import BIND_FAILED, RelayTarget, open_relay_listeners, relay_command, serve_relay
from llmgw.engines.relay_framing import Refusal, chunk_size, parse_head
from llmgw.store import open_store
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_harness import make_table, replica, start_gateway  # noqa: E402

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
KEY = "relay-test-replica-key-5b1d"
SERVED = "gemma"
PATHS = ("/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/classify", "/embedding",
         "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/completion", "/health",
         "/v1/health", "/metrics", "/props", "/slots", "/")


# --------------------------------------------------------------------------------------------- the head (pure)

def _head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("lines, status", [
    (("POST /invocations HTTP/1.1", "Host: x", "Content-Length: 2"), 401),
    (("GET /health HTTP/1.1", "Authorization: Bearer wrong"), 401),
    (("GET /health HTTP/1.1", f"Authorization: Basic {KEY}"), 401),
    (("GET /health HTTP/1.1", f"Authorization: Bearer {KEY}", f"Authorization: Bearer {KEY}"), 401),
    (("GET /health HTTP/1.1", f"X-Api-Key: {KEY}"), 401),  # llama-server's other header: not the gateway's
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}", "Content-Length: 2", "Transfer-Encoding: chunked"), 400),
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}", "Content-Length: 2", "Content-Length: 3"), 400),
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}", "Content-Length: +2"), 400),
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}", "Transfer-Encoding: gzip, chunked"), 501),
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}", "Transfer-Encoding : chunked"), 400),
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}", " folded: line"), 400),
    (("POST / HTTP/1.1", f"Authorization: Bearer {KEY}\nContent-Length: 5"), 400),
    (("GET / HTTP/1.1", f"Authorization: Bearer {KEY}", "Upgrade: websocket"), 501),
    (("CONNECT x:1 HTTP/1.1", f"Authorization: Bearer {KEY}"), 501),
    (("GET / HTTP/2.0", f"Authorization: Bearer {KEY}"), 400),
])
def test_a_head_without_the_key_or_framed_two_ways_is_refused(lines, status):
    with pytest.raises(Refusal) as refused:
        parse_head(_head(*lines), KEY.encode())
    assert refused.value.status == status


def test_a_keyed_head_is_framed_as_the_engine_frames_it_and_an_empty_key_admits_nothing():
    key = KEY.encode()
    head = parse_head(_head("POST /score HTTP/1.1", f"authorization: bearer {KEY}", "Content-Length: 12, 12"), key)
    assert (head.method, head.target, head.content_length, head.chunked) == (b"POST", b"/score", 12, False)
    assert parse_head(_head("POST /x HTTP/1.1", f"Authorization: Bearer {KEY}", "Transfer-Encoding: Chunked"),
                      key).chunked
    with pytest.raises(Refusal):
        parse_head(_head("GET / HTTP/1.1", "Authorization: Bearer "), b"")
    assert (chunk_size(b"1a"), chunk_size(b"0;ext=1")) == (26, 0)
    with pytest.raises(Refusal):
        chunk_size(b"-1")


# --------------------------------------------------------------------------------------------- a real agent

def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses outside 127/8 (none on a machine with loopback only)."""
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: it only picks the outgoing address
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    try:
        found.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))


@pytest.fixture
async def relayed(tmp_path, llama_server_binary, gemma_mirror, nursery):
    """A real agent running a llama-server shard: (the agent, the relay's base URL, the ShardStatus ready)."""
    config = AgentConfig(node_id="node-a", state_dir=tmp_path / "state", mirrors=(str(gemma_mirror),),
                         heartbeat_interval=60.0, address="127.0.0.1", stop_shards_on_exit=True,
                         engine_binaries={"llama.cpp@b11434": llama_server_binary})
    control = ControlSide()
    agent = await nursery.start(run_agent, config, control.connect)
    link = await control.links.receive()
    assert (await link.receive()).WhichOneof("body") == "register"
    await link.send(control_message(command_id="s1", start_shard=pb.StartShard(
        shard_id="gemma-0/0", replica_id="gemma-0", model=SERVED, engine="llama.cpp", engine_version="b11434",
        fingerprint="fp", replica_key=KEY, cpu_cores=1, context_size=2048,  # one thread (support's TEST_THREADS)
        engine_args=["--no-jinja", "--chat-template", "gemma"],
        weights=[pb.WeightsFile(source="hf://org/gemma@main/gemma.gguf", sha256=GEMMA_SHA256)])))
    ready = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                and m.shard_status.state in ("ready", "failed"), timeout=90)
    assert ready.shard_status.state == "ready", ready.shard_status
    yield agent, f"http://127.0.0.1:{ready.shard_status.port}", ready.shard_status
    await agent.supervisor.stop_all(5)


async def test_the_engine_listens_on_loopback_and_the_reported_port_is_the_relays(relayed):
    agent, _base, status = relayed
    spec = agent.supervisor.get("gemma-0/0").spec
    argv = list(spec.argv)
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and spec.host == "127.0.0.1"
    assert status.port == spec.relay_port != spec.port and str(spec.port) == argv[argv.index("--port") + 1]
    assert KEY not in argv
    for address in _other_addresses():  # the engine's own port is not reachable on the node's other addresses
        with pytest.raises(OSError):
            await trio.open_tcp_stream(address, spec.port)


async def test_without_the_key_every_path_and_method_is_refused_and_with_it_answered(relayed):
    _agent, base, _status = relayed
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        for path in PATHS:
            for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"):
                for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"X-Api-Key": KEY}):
                    body = b'{"model":"gemma","prompt":"hi","max_tokens":1}' if method in ("POST", "PUT") else None
                    reply = await client.request(method, path, headers=headers, content=body)
                    assert reply.status_code == 401, (method, path, headers, reply.status_code, reply.text)
                    if method != "HEAD":
                        assert reply.json()["error"]["type"] == "authentication_error"
        keyed = {"Authorization": f"Bearer {KEY}"}
        assert (await client.get("/health", headers=keyed)).json() == {"status": "ok"}
        assert (await client.get("/v1/models", headers=keyed)).json()["data"][0]["id"] == SERVED
        tokens = (await client.post("/tokenize", headers=keyed, json={"content": "Hello there"})).json()["tokens"]
        assert tokens and all(isinstance(t, int) for t in tokens)
        answer = await client.post("/v1/completions", headers=keyed, json={
            "model": SERVED, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        # on the same keep-alive connection, a keyless request after a keyed one is still refused
        assert (await client.post("/invocations", json={"prompt": "x"})).status_code == 401
        # a chunked request body is framed and forwarded whole
        async def chunks():
            yield b'{"content": '
            yield b'"Hello there"}'
        assert (await client.post("/tokenize", headers=keyed, content=chunks())).json()["tokens"] == tokens


async def test_a_streamed_completion_comes_through_the_relay_event_by_event(relayed):
    _agent, base, _status = relayed
    arrivals: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        async with client.stream("POST", "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json={
                "model": SERVED, "prompt": "Count from one to twenty:", "max_tokens": 24, "temperature": 0,
                "ignore_eos": True, "stream": True}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    arrivals.append(trio.current_time())
    assert len(arrivals) >= 24
    # a relay that buffered would hand the events over at once; here they come as the engine makes them
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert sum(1 for gap in gaps if gap > 0.002) >= 12, gaps
    assert arrivals[-1] - arrivals[0] > 0.05


async def test_the_gateway_answers_the_openai_sdk_through_the_relay(relayed, nursery, tmp_path):
    _agent, base, _status = relayed
    store = open_store(tmp_path / "store.db")
    try:
        _gateway, url = await start_gateway(nursery, store, make_table(
            {SERVED: [replica("gemma-0", base, replica_key=KEY)]}))
        _key, plaintext = store.create_api_key("chat")
        sdk = openai.AsyncOpenAI(base_url=url, api_key=plaintext, max_retries=0)
        reply = await sdk.chat.completions.create(model=SERVED, max_tokens=4, temperature=0,
                                                  messages=[{"role": "user", "content": "Say hello."}])
        assert reply.usage.completion_tokens == 4 and reply.choices[0].message.content
        chunks = [c async for c in await sdk.chat.completions.create(
            model=SERVED, max_tokens=4, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Say hello."}])]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        await wait_for(lambda: len(store.recent_usage()) == 2)
    finally:
        store.close()


async def test_a_real_llama_server_runs_a_keyed_request_once_whoever_asks_again(relayed):
    """`llmgw-once` (`llmgw.engines.relay_once`) against the real engine: a sender gone mid-answer, the same key
    twice more; llama-server's own counter of generated tokens grows by one request's tokens."""
    _agent, base, _status = relayed
    keyed = {"Authorization": f"Bearer {KEY}"}

    async def predicted(client) -> float:
        text = (await client.get("/metrics", headers=keyed)).text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("llamacpp:tokens_predicted_total")))

    body = json.dumps({"model": SERVED, "prompt": "Count from one to forty:", "max_tokens": 32, "temperature": 0,
                       "ignore_eos": True}).encode()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        before = await predicted(client)
        sender = await trio.open_tcp_stream("127.0.0.1", int(base.rsplit(":", 1)[1]))
        await sender.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                              + b"\r\nContent-Type: application/json\r\nllmgw-once: line_1\r\nContent-Length: %d"
                              b"\r\n\r\n" % len(body) + body)
        await trio.sleep(0.05)
        await sender.aclose()  # gone before the answer, as a killed control plane
        answers = [await client.post("/v1/completions", headers={**keyed, "llmgw-once": "line_1"}, content=body)
                   for _ in range(2)]
        assert [a.status_code for a in answers] == [200, 200] and answers[0].json() == answers[1].json()
        assert answers[0].json()["usage"]["completion_tokens"] == 32
        assert answers[0].headers["connection"] == "close"
        assert await predicted(client) - before == 32  # one run, not two or three


async def test_a_connection_that_sends_no_head_is_closed_after_the_head_timeout(nursery):
    engine = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listeners = await open_relay_listeners("127.0.0.1", 0)
    port = listeners[0].socket.getsockname()[1]
    await nursery.start(serve_relay, listeners, RelayTarget("127.0.0.1", engine[0].socket.getsockname()[1],
                                                            KEY.encode(), head_timeout=0.2))
    stranger = await trio.open_tcp_stream("127.0.0.1", port)
    began = trio.current_time()
    await stranger.send_all(b"GET / HTTP/1.1\r\n")  # and never the rest
    with trio.fail_after(5):
        assert await stranger.receive_some(100) == b""
    assert trio.current_time() - began >= 0.15
    await stranger.aclose()
    await engine[0].aclose()


async def test_the_relay_process_exits_with_the_engines_status_and_starts_no_engine_on_a_taken_port(tmp_path):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    marker = tmp_path / "engine-ran"
    engine = [sys.executable, "-c", f"open({str(marker)!r}, 'w'); raise SystemExit(7)"]
    env = {**os.environ, "K": KEY}
    refused = await trio.run_process(relay_command(sys.executable, "127.0.0.1", taken, 1, "K", engine), env=env,
                                     check=False, capture_stderr=True)
    assert refused.returncode == BIND_FAILED and b"cannot listen on 127.0.0.1:" in refused.stderr
    assert not marker.exists()
    held.close()
    ran = await trio.run_process(relay_command(sys.executable, "127.0.0.1", 0, 1, "K", engine), env=env, check=False)
    assert ran.returncode == 7 and marker.exists()


async def test_an_engine_never_outlives_its_relay_process(tmp_path):
    pid_file = tmp_path / "engine.pid"
    engine = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "time.sleep(60)"]
    relay = await trio.lowlevel.open_process(relay_command(sys.executable, "127.0.0.1", 0, 1, "K", engine),
                                             env={**os.environ, "K": KEY})
    await wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
    engine_pid = int(pid_file.read_text())
    assert relay.poll() is None  # (that it lives as long as its relay: the real llama-server tests above)
    relay.kill()  # the relay alone, as a crash would end it
    await relay.wait()
    await wait_for(lambda: not Path(f"/proc/{engine_pid}").exists()
                   or Path(f"/proc/{engine_pid}/stat").read_text().split(") ")[1].startswith("Z"), timeout=10)


def test_the_relay_process_loads_only_what_it_relays_with():
    """A relay starts with every engine start: it imports trio and its own framing, not the llama.cpp installer
    (httpx and the rest: about 0.6 s more before the engine could start)."""
    code = ("import sys, runpy; sys.argv = ['relay', '--help']\n"
            "try: runpy.run_module('llmgw.engines.relay', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('llmgw', 'httpx')))))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    loaded = set(done.stdout.split("\n")[-2].split())
    assert "llmgw.engines.relay_framing" in loaded and "httpx" not in loaded, loaded
    assert not loaded & {"llmgw.engines.installing", "llmgw.engines.building", "llmgw.engines.llamacpp"}, loaded
