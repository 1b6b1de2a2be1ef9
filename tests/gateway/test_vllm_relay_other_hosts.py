"""The real vLLM behind its relay, seen from other hosts (issue 25, item 3; network namespaces, tests/support/netns.py).

vLLM answers some paths without its key (`/invocations`, `/tokenize`, `/pooling`, `/score`, `/rerank`,
`/classify`: it checks the key only under `/v1`); the relay must refuse them all. The run's one real vLLM
(`vllm_server`, shared: starting another costs minutes) listens on the root namespace's loopback; the node host
reaches it as an engine on its own loopback: the relay (`relay_command`, the argv the agent builds) runs `socat`
as its engine process, listening on the node's 127.0.0.1 at the engine's port and forwarding over a Unix socket to
a second `socat` beside vLLM. So the node looks as a node running vLLM does: the relay on the node's address, the
engine on its loopback only.

- **node**: shows first that vLLM answers `/tokenize` without a key on its own port (the finding), and counts the
  connections opened to the engine's port with an nftables counter (tests/agent/test_engine_relay_other_hosts.py);
- **client**: every path of `PATHS`, seven methods, five header sets without the replica key: each answered 401
  by the relay, and not one connection reaches the engine; the engine's port is refused at once on the node's
  IPv4 and IPv6 addresses;
- **gateway**: llmgw's gateway with a routing table naming the relay and the key answers the client's openai SDK
  (a chat completion and a streamed one) from vLLM, and two usage rows are written.

About 10 s once vLLM runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.waiting import wait_for
from vllm_harness import ENGINE_KEY, SERVED

from llmgw.engines import ENGINE_HOST
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.relay import relay_command
from llmgw.gateway.feed import table_to_json
from llmgw.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from test_engine_relay import PATHS  # noqa: E402
from test_engine_relay_other_hosts import (  # noqa: E402
    COUNTER, _call, _engine_connections, knock_every_path_without_the_key,
)

from gateway_harness import make_table, replica  # noqa: E402

RELAY_PORT, ENGINE_PORT, GATEWAY_PORT = 8000, 8001, 8080
VLLM_WITHOUT_KEY = ("/invocations", "/tokenize", "/pooling", "/score", "/rerank", "/classify")


@pytest.mark.slow
def test_vllm_behind_its_relay_refuses_a_client_host_on_every_path_and_answers_a_gateway_host(
    tmp_path, netns_lab, vllm_server,
) -> None:
    assert set(VLLM_WITHOUT_KEY) <= set(PATHS)
    node, client, gateway = (netns_lab.host(name) for name in ("node", "client", "gateway"))
    node.run(["nft", "-f", "-"], input=COUNTER % ENGINE_PORT)
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("bridge", "relay", "gateway")}
    socket_path = tmp_path / "vllm.sock"
    vllm_port = vllm_server.url.rpartition(":")[2]
    bridge = subprocess.Popen(["socat", f"UNIX-LISTEN:{socket_path},fork", f"TCP:127.0.0.1:{vllm_port}"],
                              stdout=logs["bridge"], stderr=subprocess.STDOUT)
    engine = ["socat", f"TCP-LISTEN:{ENGINE_PORT},bind={ENGINE_HOST},fork,reuseaddr", f"UNIX-CONNECT:{socket_path}"]
    node.popen(relay_command(sys.executable, node.address, RELAY_PORT, ENGINE_PORT, vllm_engine.API_KEY_ENV, engine),
               env={**os.environ, vllm_engine.API_KEY_ENV: ENGINE_KEY}, stdout=logs["relay"],
               stderr=subprocess.STDOUT)
    store = open_store(tmp_path / "store.db")

    def show() -> str:
        return "\n".join(f"--- {name}\n" + (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
                         for name in logs)

    def status(address: str, port: int, path: str, key: str | None, data: str = "") -> str:
        argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "10"]
        argv += ["-H", f"Authorization: Bearer {key}"] if key else []
        argv += ["-H", "Content-Type: application/json", "-d", data] if data else []
        return node.run([*argv, f"http://{address}:{port}{path}"], check=False).stdout

    try:
        _record, api_key = store.create_api_key("chat")
        wait_for(lambda: status(node.address, RELAY_PORT, "/health", ENGINE_KEY) == "200", 30,
                 "vLLM ready behind the relay on the node", show)
        tokenize = json.dumps({"model": SERVED, "prompt": "hello"})
        assert status(ENGINE_HOST, ENGINE_PORT, "/tokenize", None, tokenize) == "200"  # vLLM itself: no key asked
        assert status(node.address, RELAY_PORT, "/tokenize", None, tokenize) == "401"  # the relay: refused
        before = _engine_connections(node)
        assert before > 0

        knock_every_path_without_the_key(client, node, RELAY_PORT, ENGINE_PORT, ENGINE_KEY, api_key)

        table = tmp_path / "table.json"
        table.write_text(json.dumps(table_to_json(make_table(
            {SERVED: [replica("vllm-0", f"http://{node.address}:{RELAY_PORT}", replica_key=ENGINE_KEY)]}))))
        gateway.popen([sys.executable, str(Path(__file__).resolve().parents[1] / "agent" / "other_host_calls.py"),
                       "gateway", json.dumps({"store": str(tmp_path / "store.db"), "table": str(table),
                                              "host": gateway.address, "port": GATEWAY_PORT})],
                      stdout=logs["gateway"], stderr=subprocess.STDOUT)
        answered = _call(client, "ask", {"url": f"http://{gateway.address}:{GATEWAY_PORT}/v1", "api_key": api_key,
                                         "model": SERVED}, timeout=120)
        assert answered["completion_tokens"] == 4 and answered["content"] and answered["streamed"], answered
        assert _engine_connections(node) > before
        wait_for(lambda: len(store.recent_usage()) == 2, 10, "two usage rows", show)
    finally:
        store.close()
        bridge.terminate()
        bridge.wait(10)
        for log in logs.values():
            log.close()
