"""A real server process for a test (llama-server, vLLM, ...), started and waited for until it serves, then stopped:
`with serving_process(argv, env, log_path, url, what="vLLM", limit=600) as process:`. Blocking (real time: the
process is real); the async twin for trio tests is `llama_server_process.running_llama_server`."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from llmgw.http_trust import default_verify


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick for port 0; another process may take it before use)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving_process(argv: Sequence[str], env: Mapping[str, str], log_path: Path, url: str, *, what: str,
                    limit: float, health: str = "/health", interval: float = 0.2,
                    stop_grace: float = 10.0) -> Iterator[subprocess.Popen]:
    """Start `argv` with `env` added to this environment, stdout and stderr to `log_path`; yield the process once
    GET `url` + `health` answers 200. Fails the test (AssertionError naming `what` and ending with the log's last
    3,000 characters) when the process exits first or `limit` seconds pass. On exit: SIGTERM, then SIGKILL after
    `stop_grace` seconds."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(list(argv), env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        # one client for the polls (a client per poll loaded the CA bundle each time: 24 s of a whole run's CPU)
        with httpx.Client(timeout=1, verify=default_verify()) as client:
            while True:
                assert process.poll() is None, f"{what} exited; see {log_path}:\n" + log_path.read_text()[-3000:]
                try:
                    if client.get(url + health).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() - started < limit, (f"{what} did not become healthy in {limit:g} s; see "
                                                            f"{log_path}:\n" + log_path.read_text()[-3000:])
                time.sleep(interval)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(stop_grace)
        except subprocess.TimeoutExpired:
            process.kill()
