"""An engine's relay seen from other hosts (issue 25, item 3; network namespaces, tests/support/netns.py).

Three hosts on one bridge, none of them this test's own namespace:
- **node**: the relay (`python -P -m llmgw.engines.relay`, started with the argv the agent builds,
  `relay_command` around `llamacpp.command_line`) on the node's address, in front of a real llama-server (b11434,
  Gemma 3 270M) on 127.0.0.1 at its internal port. An nftables counter there counts the connections opened to the
  engine's port (SYNs; the relay opens one per client connection it forwards): it shows what reaches the engine.
- **client**: sends requests to every path of tests/agent/test_engine_relay.py's PATHS, with seven methods, without
  a key, with a wrong one, with its own gateway API key and with the replica key in llama-server's other header
  (`X-Api-Key`): every one is answered 401 by the relay and not one connection reaches the engine's port. The engine's
  own port is refused at once on the node's IPv4 and IPv6 addresses (and on the client's loopback, where a
  mistaken "127.0.0.1" would look), while the engine answers on the node's loopback.
- **gateway**: llmgw's gateway (`llmgw.gateway.Gateway`, as `llmgw server` runs it with one worker) with a routing
  table that names the relay and the replica key; the client's official openai SDK gets a chat completion and a
  streamed one through it, two usage rows are written, and connections now reach the engine.

What the client and gateway hosts run is tests/agent/other_host_calls.py. A real vLLM is not started here (minutes
on these cores): it runs behind the same relay process, with the same argv built by the agent, and its loopback
test through `llmgw up` is tests/up/test_vllm_through_up.py (docs/security.md, "An engine port").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.waiting import wait_for
from test_engine_relay import KEY, PATHS, SERVED

from llmgw.engines import ENGINE_HOST, Launch, llamacpp
from llmgw.engines.relay import relay_command
from llmgw.gateway.feed import table_to_json
from llmgw.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_harness import make_table, replica  # noqa: E402

CALLS = str(Path(__file__).with_name("other_host_calls.py"))
RELAY_PORT, ENGINE_PORT, GATEWAY_PORT = 8000, 8001, 8080  # each host is a namespace of its own: every port is free
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD")
COUNTER = """table inet probe {
    counter engine {}
    chain out { type filter hook output priority 0; policy accept; tcp dport %d tcp flags & (syn | ack) == syn counter name "engine"; }
}
"""


def _engine_connections(node) -> int:
    """Connections opened to the engine's port inside the node's namespace so far (SYNs, the nftables counter)."""
    document = json.loads(node.run(["nft", "-j", "list", "counter", "inet", "probe", "engine"]).stdout)
    return next(item["counter"]["packets"] for item in document["nftables"] if "counter" in item)


def _call(host, command: str, argument: dict, timeout: float = 60) -> dict:
    done = host.run([sys.executable, CALLS, command, json.dumps(argument)], check=False, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def knock_every_path_without_the_key(client, node, relay_port: int, engine_port: int, key: str, api_key: str,
                                     also_refused: list | None = None) -> None:
    """From `client`, every path of PATHS with every method of METHODS and five header sets that lack the replica
    `key` (none, a wrong key, the gateway's `api_key`, `key` in X-Api-Key or as Basic) to the node's relay: each is a
    401 of the relay (which `client` connects to) and none opens a connection to the engine's port (the node's
    COUNTER unchanged); the engine's port is refused at once on the node's IPv4 and IPv6 addresses and
    `also_refused` ([host, port] pairs)."""
    before = _engine_connections(node)
    headers = [{}, {"Authorization": "Bearer not-the-key"}, {"Authorization": f"Bearer {api_key}"},
               {"X-Api-Key": key}, {"Authorization": f"Basic {key}"}]
    knocked = _call(client, "knock", {
        "base": f"http://{node.address}:{relay_port}", "paths": list(PATHS), "methods": list(METHODS),
        "headers": headers, "ports": [[node.address, relay_port], [node.address, engine_port],
                                      [node.address6, engine_port], *(also_refused or [])]})
    answers = knocked["answers"]
    assert len(answers) == len(PATHS) * len(METHODS) * len(headers)
    wrong = [a for a in answers if a[3] != 401 or a[4] not in (None, "authentication_error")]
    assert not wrong, wrong[:10]
    assert _engine_connections(node) == before, "a refused request opened a connection to the engine"
    relay, *engine_ports = knocked["ports"]
    assert relay[2] == "connected"  # the relay is reachable from the client: the 401s were its answers
    for host, port, outcome, seconds in engine_ports:
        assert outcome == "refused" and seconds < 1, (host, port, outcome, seconds)


@pytest.mark.slow
def test_a_client_host_is_refused_on_every_path_and_a_gateway_host_gets_answers_through_the_relay(
    tmp_path, netns_lab, llama_server_binary, gemma_gguf,
) -> None:
    node, client, gateway = (netns_lab.host(name) for name in ("node", "client", "gateway"))
    node.run(["nft", "-f", "-"], input=COUNTER % ENGINE_PORT)
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("relay", "gateway")}

    def show() -> str:
        return "\n".join(f"--- {name}\n" + (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
                         for name in logs)

    argv, env = llamacpp.command_line(Launch(
        binary=llama_server_binary, model_path=gemma_gguf, host=ENGINE_HOST, port=ENGINE_PORT, threads=1,
        context_size=2048, served_name=SERVED, api_key=KEY, engine_args=("--no-jinja", "--chat-template", "gemma")))
    node.popen(relay_command(sys.executable, node.address, RELAY_PORT, ENGINE_PORT, llamacpp.API_KEY_ENV, argv),
               env={**os.environ, **env}, stdout=logs["relay"], stderr=subprocess.STDOUT)
    store = open_store(tmp_path / "store.db")
    try:
        _record, api_key = store.create_api_key("chat")

        def engine_health(address: str, port: int) -> str:
            return node.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5", "-H",
                             f"Authorization: Bearer {KEY}", f"http://{address}:{port}/health"], check=False).stdout

        wait_for(lambda: engine_health(node.address, RELAY_PORT) == "200", 60, "the engine ready behind its relay",
                 show)
        assert engine_health(ENGINE_HOST, ENGINE_PORT) == "200"  # the engine answers, on the node's loopback
        before = _engine_connections(node)
        assert before > 0  # the counter counts: the two health requests above reached the engine

        knock_every_path_without_the_key(client, node, RELAY_PORT, ENGINE_PORT, KEY, api_key,
                                         also_refused=[["127.0.0.1", ENGINE_PORT]])

        table = tmp_path / "table.json"
        table.write_text(json.dumps(table_to_json(make_table(
            {SERVED: [replica("gemma-0", f"http://{node.address}:{RELAY_PORT}", replica_key=KEY)]}))))
        gateway.popen([sys.executable, CALLS, "gateway", json.dumps({
            "store": str(tmp_path / "store.db"), "table": str(table), "host": gateway.address,
            "port": GATEWAY_PORT})], stdout=logs["gateway"], stderr=subprocess.STDOUT)
        answered = _call(client, "ask", {"url": f"http://{gateway.address}:{GATEWAY_PORT}/v1", "api_key": api_key,
                                         "model": SERVED})
        assert answered["completion_tokens"] == 4 and answered["content"] and answered["streamed"], answered
        assert _engine_connections(node) > before
        wait_for(lambda: len(store.recent_usage()) == 2, 10, "two usage rows", show)
    finally:
        store.close()
        for log in logs.values():
            log.close()
