"""The real llama-server started with llmgw's own command line (`llmgw.engines.llamacpp.command_line`), for the
tests that need a real engine: `async with running_llama_server(binary, gguf, log_path, api_key=KEY) as engine`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from llmgw.engines import Launch, llamacpp
from serving_process import free_port

TEST_THREADS = 1
"""Threads of a test's llama-server. One: `make test` keeps both cores busy (three workers, each with its gateway or
control plane in the same process), and llama.cpp's two threads (an OpenMP team) wait for each other at every step
when either is off its core. Measured on this 2-core machine with Gemma 3 270M (27-token prompt, 16 tokens, at a load
average of 6): 2 threads 26-31 s for three requests (1.4-4 tokens a second), 1 thread 4.4-7.4 s (6-16 a second)."""


@dataclass(frozen=True)
class RunningEngine:
    """A started llama-server: its port, base URL, and the argv and environment it was started with."""

    port: int
    base_url: str
    argv: tuple[str, ...]
    env: dict[str, str]


@asynccontextmanager
async def running_llama_server(binary: Path, gguf: Path, log_path: Path, *, api_key: str,
                               served_name: str = "gemma-3-270m", port: int | None = None,
                               engine_args: tuple[str, ...] = ("--no-jinja", "--chat-template", "gemma"),
                               threads: int = TEST_THREADS, prefix: tuple[str, ...] = (),
                               ) -> AsyncIterator[RunningEngine]:
    """Start llama-server (`threads` threads, 2048 context, Gemma's chat template unless `engine_args` say otherwise)
    with `api_key` on `port` (None: a free one), writing its output to `log_path`; yield once its health
    path answers 200 (within 60 s, else fail with its log); stop it on exit. `prefix`: a command to run it under
    (e.g. ("nice", "-n", "19"))."""
    port = port or free_port()
    launch = Launch(binary=binary, model_path=gguf, port=port, threads=threads, context_size=2048,
                    served_name=served_name, api_key=api_key, engine_args=engine_args)
    argv, env = llamacpp.command_line(launch)
    argv = [*prefix, *argv]
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(argv, env={**os.environ, **env}, stdout=log,
                                                   stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            with trio.fail_after(60):
                while True:
                    assert process.poll() is None, log_path.read_text()
                    try:
                        if (await client.get(llamacpp.HEALTH_PATH)).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.2)
        yield RunningEngine(port, base, tuple(argv), dict(env))
    finally:
        await stop(process)


async def stop(process: trio.Process) -> None:
    """SIGTERM, up to 10 s to exit (also when cancelled), then SIGKILL."""
    process.terminate()
    with trio.move_on_after(10, shield=True):
        await process.wait()
    if process.poll() is None:
        process.kill()
