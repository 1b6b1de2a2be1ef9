"""The real llama-servers shared by the test modules that only need a serving engine (issue 40 item 2), one per model
and flags, each started once per test run by the first test that asks for it and stopped at the run's end.

The fixtures (`shared_gemma`, `shared_smollm2`: tests/gateway/conftest.py) are session-scoped, which under
pytest-xdist means once per worker; `make test`'s scheduler (tests/conftest.py, `pytest_xdist_make_scheduler`) runs
every module that names one in that engine's scope (tests/conftest.py `SHARED_ENGINE_SCOPES`), whole, on one worker,
so each starts once per `make test` too. A module names one fixture of these at most (the run's collection fails
otherwise).

What a module may do with a shared engine: send it requests, with its key, through a gateway or straight. What it
may not: stop it, restart it, or count on its counters, slots or prefix cache being fresh (other modules used it
first); a test that needs that starts its own (tests/support/llama_server_process.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llama_server_process import TEST_THREADS
from serving_process import free_port, serving_process

from llmgw.engines import Launch, llamacpp


@dataclass(frozen=True)
class SharedEngine:
    """How a shared llama-server is started: the model's name it serves (`--alias`), its replica key, and the flags
    after llmgw's own command line (`llamacpp.command_line`: 2,048 tokens of context, `TEST_THREADS` threads,
    `--metrics`)."""

    served_name: str
    key: str
    engine_args: tuple[str, ...]


@dataclass(frozen=True)
class ServingEngine:
    """A started shared llama-server: its base URL (http://127.0.0.1:PORT), the model name it serves and its key."""

    base_url: str
    served_name: str
    key: str


ENGINES = {
    "shared_gemma": SharedEngine("gemma-3-270m", "sk-shared-gemma-5d1c",
                                 ("--no-jinja", "--chat-template", "gemma", "--parallel", "2")),
    "shared_smollm2": SharedEngine("smollm2-135m-instruct", "sk-shared-smollm2-8e4b", ("--jinja", "--parallel", "2")),
}
"""The shared engines by fixture name. Gemma 3 270M with llama.cpp's built-in gemma template and no jinja (a request
with tools is refused, as tests/gateway/test_real_llama_server.py checks); SmolLM2 135M Instruct with its own chat
template (jinja). Two slots each."""


@contextmanager
def shared_engine(fixture: str, binary: Path, gguf: Path, log_path: Path) -> Iterator[ServingEngine]:
    """Start the shared engine `fixture` names (`ENGINES`) from `binary` with the weights `gguf`, its output to
    `log_path`; yield it once its health path answers 200 (60 s at most, else fail with its log's tail); stop it
    on exit (SIGTERM, then SIGKILL after 10 s)."""
    engine = ENGINES[fixture]
    port = free_port()
    argv, env = llamacpp.command_line(Launch(
        binary=binary, model_path=gguf, port=port, threads=TEST_THREADS, context_size=2048,
        served_name=engine.served_name, api_key=engine.key, engine_args=engine.engine_args))
    url = f"http://127.0.0.1:{port}"
    with serving_process(argv, env, log_path, url, what=f"the shared llama-server ({fixture})", limit=60):
        yield ServingEngine(url, engine.served_name, engine.key)
