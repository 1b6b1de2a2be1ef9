"""One rail of `llmgw fabric-test`, on this node: perftest's `ib_write_bw` as server or client (agent.proto FabricTest).

`ib_write_bw` is looked up on PATH (Debian and Ubuntu: `apt install perftest`; RHEL: `dnf install perftest`). A
missing binary, a server that exits at once, or a client that fails or outlives its timeout is answered with an
error sentence for that rail; the client's stdout is sent as it is, and the control plane reads its table
(`llmgw.tools.parse_perftest_bw`).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable

import trio

from llmgw.wire import pb

log = logging.getLogger("llmgw.agent")

TOOL = "ib_write_bw"
SERVER_SETTLE = 0.5
"""Seconds a just-started server is watched: one that exits within them (no such device, port taken) failed."""
CONNECT_ATTEMPTS = 3
CONNECT_RETRY = 1.0
"""A client that "Couldn't connect" to its server (still opening its device) is run again, up to CONNECT_ATTEMPTS
times, CONNECT_RETRY seconds apart: perftest's client does not retry by itself."""
MISSING = (f"{TOOL} is not installed on this node (it is perftest's): install it (Debian/Ubuntu: apt install perftest; "
           "RHEL: dnf install perftest) and run the test again")


def perftest_argv(binary: str, request: pb.FabricTest) -> list[str]:
    """The command line perftest's documentation gives: `ib_write_bw -d ADAPTER -p PORT [SERVER]`. Pure."""
    argv = [binary, "-d", request.adapter, "-p", str(request.port)]
    return argv + [request.server] if request.server else argv


def _last_line(*outputs: bytes) -> str:
    for output in outputs:
        lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


async def run_perftest(request: pb.FabricTest, nursery: trio.Nursery,
                      which: Callable[[str], str | None] = shutil.which) -> pb.FabricTestOutput:
    """Run one FabricTest and return its answer. A server goes on in `nursery` (until its client is done or
    `timeout_seconds` pass); a client is awaited, at most `timeout_seconds`. Never raises for the tool's
    failures: they are the answer's `error`. A checkpoint; cancellable."""
    answer = pb.FabricTestOutput(request_id=request.request_id, adapter=request.adapter)
    binary = which(TOOL)
    if binary is None:
        answer.error = MISSING
        return answer
    argv = perftest_argv(binary, request)
    timeout = request.timeout_seconds or 60.0
    if request.server:
        with trio.move_on_after(timeout):
            for _ in range(CONNECT_ATTEMPTS):
                done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
                if done.returncode == 0 or b"Couldn't connect" not in done.stderr + done.stdout:
                    break
                await trio.sleep(CONNECT_RETRY)  # the server is not listening yet
            if done.returncode == 0:
                answer.output = done.stdout.decode("utf-8", "replace")
            else:
                answer.error = (f"{TOOL} on {request.adapter} exited with status {done.returncode}: "
                                f"{_last_line(done.stderr, done.stdout) or 'no output'}")
            return answer
        answer.error = f"{TOOL} on {request.adapter} gave no result within {timeout:g} s"
        return answer
    return await _start_server(argv, request, timeout, nursery, answer)


async def _start_server(argv: list[str], request: pb.FabricTest, timeout: float, nursery: trio.Nursery,
                        answer: pb.FabricTestOutput) -> pb.FabricTestOutput:
    ended = trio.Event()
    outcome: list[subprocess.CompletedProcess] = []

    async def serve() -> None:
        with trio.move_on_after(timeout):
            outcome.append(await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False))
        ended.set()
        if not outcome:
            log.warning("%s server on %s had no client within %g s; stopped", TOOL, request.adapter, timeout)

    nursery.start_soon(serve)
    with trio.move_on_after(SERVER_SETTLE):
        await ended.wait()
    if outcome and outcome[0].returncode != 0:
        done = outcome[0]
        answer.error = (f"{TOOL} server on {request.adapter} exited with status {done.returncode}: "
                        f"{_last_line(done.stderr, done.stdout) or 'no output'}")
    return answer
