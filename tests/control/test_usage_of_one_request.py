"""From a response to its usage record: the gateway answers every request with its id (`x-request-id`, which the
openai SDK exposes as `_request_id`), and `llmgw usage --request ID` shows that request's row. Run against
`llmgw server` and `llmgw agent` as processes, the official openai SDK as the client."""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from llmgw.store import open_store

from .process_fleet import server_and_agent


def usage_of(state, request_id: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmgw.cli", "usage", "--request", request_id, "--json",
                           "--state", str(state)], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_the_request_id_a_client_gets_shows_its_usage_row(tmp_path, weights_mirror, fake_engine):
    with server_and_agent(tmp_path, weights_mirror, fake_engine) as (admin, state):
        store = open_store(state / "llmgw.sqlite3")
        key_record, key = store.create_api_key("demo")
        store.close()
        gateway = admin.get("/api/v1/status").json()["control_plane"]["gateway_url"]
        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0)
        reply = client.chat.completions.create(model="tiny", max_tokens=8,
                                               messages=[{"role": "user", "content": "Count to three."}])
        request_id = reply._request_id
        assert request_id and request_id.startswith("req_")

        answer = usage_of(state, request_id)
        assert answer.returncode == 0, answer.stderr
        row = json.loads(answer.stdout)
        assert {k: row[k] for k in ("request_id", "project", "key_id", "model", "replica", "node", "status")} == {
            "request_id": request_id, "project": "demo", "key_id": key_record.key_id, "model": "tiny",
            "replica": "tiny-0", "node": "n1", "status": 200}
        assert (row["prompt_tokens"], row["completion_tokens"]) == (reply.usage.prompt_tokens,
                                                                    reply.usage.completion_tokens)
        assert row["started"] <= row["ended"] and row["duration_seconds"] > 0 and row["cost"] >= 0

        # a refused request has an id and a row too
        with pytest.raises(openai.NotFoundError) as refused:
            client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
        assert refused.value.request_id and refused.value.request_id != request_id
        row = json.loads(usage_of(state, refused.value.request_id).stdout)
        assert (row["status"], row["model"], row["replica"], row["completion_tokens"]) == (404, "(unknown)", None, 0)

        # an id the store does not know is named in the answer, with what to give instead
        missing = usage_of(state, "req_" + "0" * 32)
        assert missing.returncode != 0
        assert "req_" + "0" * 32 in missing.stderr and "x-request-id" in missing.stderr
        assert "Traceback" not in missing.stderr
