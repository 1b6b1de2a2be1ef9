"""A batch line handed back after its runner was killed goes to the replica it was sent to, whose engine relay runs
it once (issue 32: no request run twice). Two llama-server stand-ins, each behind a real engine relay (in process):
r-0 with 4 slots, r-1 with 1, so a new line would go to r-0. A "killed" runner claimed line 0, wrote r-1 as where it
goes and sent it to r-1's relay with the line's once key, then went away mid-answer; a live runner takes the batch
over. Each engine's own count of the requests it took: line 0 once, on r-1; 3 lines in all. Time: about 2 s."""

from __future__ import annotations

import json

import openai
import trio
from gateway_harness import ENGINE_KEY, FakeLlamaServer, make_table, replica, start_gateway

from llmgw.engines.relay import RelayTarget, open_relay_listeners, serve_relay
from llmgw.gateway.batch_lines import line_once_key
from llmgw.gateway.batch_runner import BatchRunner
from llmgw.routes import ReplicaSpeed


async def _relayed_engine(nursery) -> tuple[FakeLlamaServer, int]:
    engine = FakeLlamaServer("/models/gemma.gguf", alias="tiny", api_key=ENGINE_KEY, token_delay=0.1)
    engine_port = await nursery.start(engine.serve, "127.0.0.1", 0)
    listeners = await open_relay_listeners("127.0.0.1", 0)
    await nursery.start(serve_relay, listeners, RelayTarget("127.0.0.1", engine_port, ENGINE_KEY.encode()))
    return engine, listeners[0].socket.getsockname()[1]


async def test_a_line_handed_back_goes_to_the_replica_it_was_sent_to_and_runs_there_once(nursery, store, tmp_path):
    engines, ports = [], []
    for index in range(2):
        engine, port = await _relayed_engine(nursery)
        engine.request_log = str(tmp_path / f"r-{index}.jsonl")
        engines.append(engine)
        ports.append(port)
    table = make_table({"tiny": [replica("r-0", f"http://127.0.0.1:{ports[0]}", speed=ReplicaSpeed(100, 100, slots=4)),
                                 replica("r-1", f"http://127.0.0.1:{ports[1]}", speed=ReplicaSpeed(100, 100, slots=1))]})
    gateway, base = await start_gateway(nursery, store, table)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)
    bodies = [{"model": "tiny", "prompt": f"line {i}", "max_tokens": 4} for i in range(3)]
    rows = [json.dumps({"custom_id": f"c-{i}", "method": "POST", "url": "/v1/completions", "body": body})
            for i, body in enumerate(bodies)]
    upload = await sdk.files.create(file=("in.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")

    # the runner that is killed: line 0 claimed, written as sent to r-1, sent with its once key, then gone
    assert store.claim_batch_line(batch.id, "cp-killed").line == 0
    assert store.send_batch_line(batch.id, 0, "cp-killed", "r-1")
    body = json.dumps({**bodies[0], "stream": False}).encode()
    sender = await trio.open_tcp_stream("127.0.0.1", ports[1])
    await sender.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: r-1\r\nAuthorization: Bearer " + ENGINE_KEY.encode()
                          + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\nllmgw-once: %s\r\n\r\n"
                          % (len(body), line_once_key(batch.id, 0).encode()) + body)
    with trio.fail_after(5):
        while engines[1].stats.processing == 0:
            await trio.sleep(0.01)
    await sender.aclose()  # killed mid-answer: its request runs on in the engine

    await nursery.start(BatchRunner(gateway, "cp-live", poll=0.2).run)
    with trio.fail_after(20):
        while (done := await sdk.batches.retrieve(batch.id)).status != "completed":
            await trio.sleep(0.05)
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    output = [json.loads(row) for row in (await sdk.files.content(done.output_file_id)).text.splitlines()]
    assert [line["custom_id"] for line in output] == ["c-0", "c-1", "c-2"]
    took = [[json.loads(row)["prompt"] for row in (tmp_path / f"r-{i}.jsonl").read_text().splitlines()]
            if (tmp_path / f"r-{i}.jsonl").exists() else [] for i in range(2)]
    assert took[1].count("line 0") == 1 and "line 0" not in took[0]  # once, where it was sent first
    assert sorted(took[0] + took[1]) == ["line 0", "line 1", "line 2"]
