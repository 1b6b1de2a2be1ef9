"""From a response to its usage record: the gateway answers every request with its id (`x-request-id`, which the
openai SDK exposes as `_request_id`; the client's own when it sent one), and `llmgw usage --request ID` shows that
request's row, with the settings commit its replica was started from and its trace id. Run against
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
        commit = admin.get("/api/v1/status").json()["settings"]["commit"]
        assert row["settings_commit"] == commit  # the commit tiny-0 was started from, as its node reports it
        assert row["client_request_id"] is None and row["trace_id"] is None  # no id of its own, not traced
        # from the record to the audit commit of the replica's start (the query docs/observability.md gives)
        found = subprocess.run(["git", "--git-dir", str(tmp_path / "settings.git"), "log", "refs/llmgw/audit",
                                "--format=%s", "--all-match", f"--grep=Settings-Commit: {row['settings_commit']}",
                                f"--grep=start {row['replica']}/"], capture_output=True, text=True, check=True)
        assert f"start {row['replica']}/0 on {row['node']}" in found.stdout, found.stdout

        # a client's own x-request-id (sent twice: it need not be unique) is answered back and found too; the
        # gateway's own id, still the record's key, comes in x-llmgw-request-id
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        own_ids = []
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-request-id": "order-17", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-00"})
            assert raw.headers["x-request-id"] == "order-17"
            own_ids.append(raw.headers["x-llmgw-request-id"])
        assert own_ids[0] != own_ids[1] and all(i.startswith("req_") for i in own_ids)
        answer = usage_of(state, "order-17")
        assert answer.returncode == 0, answer.stderr
        row = json.loads(answer.stdout)
        assert {k: row[k] for k in ("request_id", "client_request_id", "settings_commit", "trace_id",
                                    "also_matching")} == {
            "request_id": own_ids[1], "client_request_id": "order-17", "settings_commit": commit,
            "trace_id": trace_id, "also_matching": [own_ids[0]]}
        assert json.loads(usage_of(state, own_ids[0]).stdout)["client_request_id"] == "order-17"

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
