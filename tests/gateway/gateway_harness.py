"""Helpers for gateway tests: in-process llama-server stand-ins, routing tables, a served gateway.

Imported by name (`from gateway_harness import ...`), not from conftest: several test folders have a conftest.py
and a bare `import conftest` would pick whichever was loaded last.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from fake_llama_server import FakeLlamaServer  # noqa: E402

from llmgw.gateway import Gateway  # noqa: E402
from llmgw.routes import ModelRoute, ProjectPolicy, QuotaLimits, ReplicaRoute, RouteTable  # noqa: E402

ENGINE_KEY = "engine-secret-1"


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


__all__ = ["FakeLlamaServer", "ModelRoute", "ProjectPolicy", "QuotaLimits", "ReplicaRoute", "RouteTable",
           "start_engine", "make_table", "replica", "start_gateway", "ENGINE_KEY"]
