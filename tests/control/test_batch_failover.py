"""A batch survives its leader, and no line runs twice (issue 32): two `llmgw server`s on one PostgreSQL database,
one `llmgw agent` with the llama-server stand-in (0.1 s per token) behind its engine relay. A batch of 24 lines made
through the official `openai` SDK; the leader, whose runner is running it, SIGKILLed while a line's request is inside
the engine (the engine's request log holds more lines than the store has answered); the standby takes the lease and
finishes it. Then: 24 output lines, one per custom_id in input order; the engine's own log of the requests it took
says each line's prompt exactly once, the line in flight at the kill included (the relay ran it to its end and gave
its kept answer to the standby: `llmgw.engines.relay_once`), and so does its counter of generated tokens; one
answered usage row per line (at most one more: a leader killed between writing the usage row and the line's result).
Time: about 40 s (two servers starting, the lease's 3 s)."""

from __future__ import annotations

import json
import signal
from collections import Counter

import openai
import pytest
import trio

from llmgw.store import open_store

from support.llmgw_processes import LlmgwProcesses

from .conftest import MODEL_YAML
from .test_failover import Plane, wait_for
from .test_failover import postgres_url  # noqa: F401  (the fixture: a schema of its own in the test database)

LINES = 24
TOKENS = 4


@pytest.mark.slow
async def test_a_standby_finishes_the_batch_of_a_killed_leader_and_no_line_is_lost_or_run_twice(
        tmp_path, postgres_url, weights_mirror, fake_engine):
    import support.settings_seed as settings_seed
    from llmgw.settings import init_repository

    mirror, sha = weights_mirror
    requests_log = tmp_path / "engine-requests.jsonl"  # the stand-in's own log: one line per request it took
    model = MODEL_YAML.format(sha=sha, replicas=1) + (
        f'engine_args: ["--fake-token-delay=0.1", "--fake-request-log={requests_log}"]\n')
    repo = tmp_path / "settings.git"
    init_repository(repo, settings_seed.write_seed(tmp_path / "seed", "tiny", model))
    procs = LlmgwProcesses(tmp_path)
    try:
        planes = [Plane(tmp_path / f"cp{i}") for i in range(2)]
        for i, plane in enumerate(planes):
            procs.spawn(f"cp{i}", "server", "--repo", str(repo), "--state", str(plane.state), "--store", postgres_url,
                        "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0",
                        "--lease", "3s")
        docs = [await wait_for(plane.connect, 60, f"control plane {i}") for i, plane in enumerate(planes)]
        procs.spawn("n1", "agent", *[a for doc in docs for a in
                                     ("--control-plane", f"127.0.0.1:{doc['control_plane']['agents_port']}")],
                    "--node-id", "n1", "--state-dir", str(tmp_path / "n1"), "--mirror", str(mirror),
                    "--heartbeat-interval", "200ms", "--insecure", "--engine-binary",
                    f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit", "--no-bandwidth-probe")

        async def leader() -> int | None:
            leads = [i for i, p in enumerate(planes) if procs.procs[f"cp{i}"].poll() is None
                     and (await p.health())["leader"]]
            return leads[0] + 1 if len(leads) == 1 else None

        async def ready_everywhere() -> bool:
            states = [(await p.status())["replicas"].get("tiny-0", {}).get("state") for p in planes]
            return states == ["ready", "ready"]

        old = await wait_for(leader, 30, "one leader") - 1
        await wait_for(ready_everywhere, 60, "tiny-0 ready, as both control planes see it")
        store = await trio.to_thread.run_sync(open_store, postgres_url)
        key = store.create_api_key("demo")[1]
        sdks = [openai.AsyncOpenAI(base_url=doc["control_plane"]["gateway_url"] + "/v1", api_key=key, max_retries=0)
                for doc in docs]
        rows = [json.dumps({"custom_id": f"f-{i:02d}", "method": "POST", "url": "/v1/completions", "body": {
            "model": "tiny", "prompt": f"line {i}", "max_tokens": TOKENS}}) for i in range(LINES)]
        upload = await sdks[old].files.create(file=("in.jsonl", "\n".join(rows).encode()), purpose="batch")
        batch = await sdks[1 - old].batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                                   completion_window="24h")  # made on the standby, run by the leader

        async def completed(sdk) -> int:
            return (await sdk.batches.retrieve(batch.id)).request_counts.completed

        def engine_took() -> list[str]:
            text = requests_log.read_text() if requests_log.exists() else ""
            return [json.loads(row)["prompt"] for row in text.splitlines()]

        await wait_for(lambda: _at_least(completed(sdks[1 - old]), 6), 30, "6 lines done by the leader")
        with trio.fail_after(30):  # the kill lands while a line is inside the engine, not yet answered
            while len(engine_took()) <= store.batch(batch.id).counts.completed:
                await trio.sleep(0.01)
        procs.procs[f"cp{old}"].send_signal(signal.SIGKILL)
        killed = store.batch(batch.id).counts
        at_kill, in_flight = killed.completed, killed.running
        assert at_kill < LINES, "the batch finished before the kill: make its lines slower"
        assert in_flight >= 1, "no line was in flight at the kill"
        await wait_for(lambda: _at_least(leader(), 1), 30, "the standby to lead")
        standby = sdks[1 - old]

        async def finished():
            found = await standby.batches.retrieve(batch.id)
            return found if found.status == "completed" else None

        done = await wait_for(finished, 60, "the batch completed by the standby")
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        output = [json.loads(row) for row in (await standby.files.content(done.output_file_id)).text.splitlines()]
        assert [line["custom_id"] for line in output] == [f"f-{i:02d}" for i in range(LINES)]
        took = Counter(engine_took())
        assert took == {f"line {i}": 1 for i in range(LINES)}, f"the engine ran a line twice or never: {took}"
        records = [r for r in store.recent_usage(project="demo", limit=1000) if r.batch_id == batch.id]
        answered = [r for r in records if r.status == 200]
        assert LINES <= len(answered) <= LINES + 1  # once per line; once more only if killed between usage and result
        assert len({r.replica for r in answered}) == 1 and Counter(r.completion_tokens for r in answered) == {
            TOKENS: len(answered)}

        async def engine_generated() -> float | None:
            text = (await planes[1 - old].client.get("/metrics")).text
            for line in text.splitlines():
                if line.startswith("llmgw_engine_generation_tokens_total{") and 'replica="tiny-0"' in line:
                    value = float(line.rsplit(" ", 1)[1])
                    return value if value >= LINES * TOKENS else None
            return None

        generated = await wait_for(engine_generated, 15, "the engine's counter in the standby's readings")
        assert generated == LINES * TOKENS  # the engine ran each line once
        print(f"batch failover: {at_kill} of {LINES} lines done at the kill, {in_flight} in flight, "
              f"{len(answered)} answered rows, the engine took {sum(took.values())} requests (at most "
              f"{max(took.values())} a line) and generated {generated:.0f} tokens ({TOKENS} a line)")
        store.close()
    finally:
        await trio.to_thread.run_sync(procs.stop)


async def _at_least(value, least: int):
    got = await value
    return got if got is not None and got >= least else None
