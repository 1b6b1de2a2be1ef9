"""`llmgw bench REPLICA|MODEL` as on the control plane's machine: the replica is found in the admin API's nodes
document (here a stand-in answering over real HTTP), its replica key worked out from the store's secret (the
llama-server stand-in accepts only that key), the run kept in the store with the node and its class, and
`llmgw nodes` prints it under the replica's shard."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trio
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.control.keys import REPLICA_KEY_SECRET, replica_key
from llmgw.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_llama_server import BUILD_INFO, FakeLlamaServer  # noqa: E402


def _admin_stand_in(documents: dict[str, dict]) -> ThreadingHTTPServer:
    """An admin API stand-in on 127.0.0.1:0 answering GET `path` with `documents[path]` (404 otherwise)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            doc = documents.get(self.path.split("?")[0])
            body = json.dumps(doc if doc is not None else {"error": {"message": "no route"}}).encode()
            self.send_response(200 if doc is not None else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def test_a_replica_is_benched_with_its_replica_key_and_shown_under_its_shard(nursery, tmp_path):
    store = open_store(tmp_path / "llmgw.sqlite3")
    key = replica_key(store.get_or_create_secret(REPLICA_KEY_SECRET), "gemma-0")
    store.close()
    engine = FakeLlamaServer("/models/gemma.gguf", "gemma", api_key=key)
    port = await nursery.start(engine.serve, "127.0.0.1", 0)
    shard = {"replica": "gemma-0", "model": "gemma", "state": "ready", "port": port, "settings_commit": "c0ffee"}
    nodes = {"nodes": {"gpu-1": {"state": "connected", "address": "127.0.0.1", "gpus": 0, "gpu_classes": {},
                                 "cpu_cores": 16, "engines": ["llama.cpp@b11434"], "shards": {"gemma-0/0": shard}}},
             "cordoned": [], "drained": [], "lent": []}
    admin = _admin_stand_in({"/api/v1/nodes": nodes, "/api/v1/status": {"control_plane": {}}})
    url = f"http://127.0.0.1:{admin.server_address[1]}"
    try:
        common = ["--url", url, "--token", "t", "--state", str(tmp_path)]
        bench = await trio.to_thread.run_sync(lambda: CliRunner().invoke(
            cli, ["bench", "gemma", "--output-tokens", "4", "--requests", "2", *common], catch_exceptions=False))
        assert bench.exit_code == 0, bench.output
        assert bench.output.startswith("gemma-0 (gemma) on gpu-1 (cpu 16 cores), engine build ")
        assert "kept as bench 1 in " in bench.output
        listed = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, ["nodes", *common],
                                                                          catch_exceptions=False))
    finally:
        admin.shutdown()
    lines = listed.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("gemma-0/0"))
    assert lines[at + 1].strip().startswith("bench ") and "128 in/4 out x1 via engine" in lines[at + 1]
    assert lines[at + 1].endswith(f"(cpu 16 cores, build {BUILD_INFO})")  # the engine's system_fingerprint
    assert all(body["model"] == "gemma" for body in engine.stats.bodies)
