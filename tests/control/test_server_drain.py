"""SIGTERM of `llmgw server` drains its gateway (`llmgw.gateway.draining`): the requests in flight, streamed and
not, all complete through the official openai SDK, each is recorded exactly once, and the server exits 0; served in
the control-plane process and by two gateway worker processes. A real server and agent; the engine is the
llama-server stand-in, streaming a token every 0.1 s."""

from __future__ import annotations

import shlex
import signal
import sys
import threading

import openai
import pytest

from llmgw.store import open_store
from support.llmgw_processes import LlmgwProcesses

from .conftest import FAKE_SERVER
from .process_fleet import server_and_agent
from .test_fleet_end_to_end import wait_for

CLIENTS = 8


def _in_flight(admin) -> float:
    """Requests the gateway proxies now (its requests_in_flight gauge, summed over models and workers)."""
    lines = admin.get("/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("llmgw_gateway_requests_in_flight{"))


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_lets_every_request_in_flight_finish_and_records_each_once(tmp_path, weights_mirror, workers):
    engine = tmp_path / "slow-llama-server"
    engine.write_text(f"#!/bin/sh\nPYTHONUNBUFFERED=1 exec {shlex.quote(sys.executable)} "
                      f"{shlex.quote(str(FAKE_SERVER))} \"$@\" --fake-token-delay 0.1\n")
    engine.chmod(0o755)
    fleet = LlmgwProcesses(tmp_path)
    with server_and_agent(tmp_path, weights_mirror, engine, fleet=fleet,
                          server_args=("--gateway-workers", workers)) as (admin, state):
        store = open_store(state / "llmgw.sqlite3")
        _record, key = store.create_api_key("demo")
        store.close()
        gateway = admin.get("/api/v1/status").json()["control_plane"]["gateway_url"]
        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=60)
        answers: dict[int, str | BaseException] = {}

        def one(i: int) -> None:
            ask = {"model": "tiny", "max_tokens": 12, "extra_headers": {"x-request-id": f"sigterm-{i}"},
                   "messages": [{"role": "user", "content": f"question {i}"}]}
            try:
                if i % 2:
                    stream = client.chat.completions.create(stream=True, **ask)
                    answers[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                else:
                    answers[i] = client.chat.completions.create(**ask).choices[0].message.content
            except openai.OpenAIError as error:
                answers[i] = error

        threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        wait_for(lambda: _in_flight(admin) == CLIENTS, 30, "every request in flight")
        fleet.procs["server"].send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=60)
        assert fleet.procs["server"].wait(timeout=60) == 0
        assert all(isinstance(answer, str) and answer for answer in answers.values()) and len(answers) == CLIENTS, \
            answers
        store = open_store(state / "llmgw.sqlite3")
        try:
            for i in range(CLIENTS):
                (record,) = [r for _id, r in store.usage_of_client_request(f"sigterm-{i}")]  # exactly once
                assert record.status == 200 and record.completion_tokens > 0
        finally:
            store.close()
