"""The pure half of /v1/batches: input lines read into requests and error lines, the room a batch gets on a replica
(checked on 60 seeded random loads), and the table a line runs under (batch prices, daily limits only)."""

from __future__ import annotations

import json
import random

import pytest
from gateway_harness import make_table, replica

from llmgw.gateway.batch_lines import batch_room, batch_table, read_lines
from llmgw.routes import ModelRoute, ProjectPolicy, Quota

CHAT = "/v1/chat/completions"


def _line(custom_id, url=CHAT, method="POST", body=None) -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body or {"model": "m"}})


def test_good_lines_are_pending_and_each_malformed_line_is_an_error_line_of_its_own():
    rows = [_line("a"), "not json", _line("a"), _line(None), _line("b", url="/v1/embeddings"),
            _line("c", method="GET"), json.dumps({"custom_id": "d", "method": "POST", "url": CHAT, "body": []}),
            "[1, 2]", "", _line("e")]
    lines = read_lines("\n".join(rows).encode(), CHAT)
    assert [(line.line, line.state) for line in lines] == [
        (0, "pending"), (1, "failed"), (2, "failed"), (3, "failed"), (4, "failed"), (5, "failed"), (6, "failed"),
        (7, "failed"), (8, "pending")]
    codes = [json.loads(line.result)["error"]["code"] for line in lines if line.state == "failed"]
    assert codes == ["invalid_json_line", "duplicate_custom_id", "missing_custom_id", "invalid_url",
                     "invalid_method", "invalid_body", "invalid_json_line"]
    assert json.loads(lines[2].result)["custom_id"] == "a" and json.loads(lines[2].result)["response"] is None


@pytest.mark.parametrize(("data", "says"), [(b"", "no request lines"), (b"\n \n", "no request lines"),
                                            (b"\xff\xfe", "not UTF-8")])
def test_a_file_without_requests_is_refused_with_a_sentence(data, says):
    with pytest.raises(ValueError, match=says):
        read_lines(data, CHAT)


@pytest.mark.parametrize(("slots", "in_flight", "ours", "share", "waiting", "room"), [
    (4, 0, 0, 0.5, 0, 2),     # idle: half the slots
    (4, 1, 0, 0.5, 0, 2),     # one interactive request: still half
    (4, 3, 0, 0.5, 0, 1),     # only one slot free
    (4, 4, 0, 0.5, 0, 0),     # interactive requests fill every slot
    (4, 2, 2, 0.5, 0, 0),     # the batch has its share
    (4, 0, 0, 0.5, 1, 0),     # the engine queues requests
    (1, 0, 0, 0.5, 0, 1),     # one slot: at least one for the batch when idle
    (1, 1, 0, 0.5, 0, 0),
    (0, 0, 0, 0.5, 0, 1),     # unknown slots: one
    (8, 0, 0, 0.0, 0, 0),     # share 0 stops batches
    (8, 0, 0, 1.0, 0, 8),
])
def test_room_of_a_batch_on_a_replica(slots, in_flight, ours, share, waiting, room):
    assert batch_room(slots, in_flight, ours, share, waiting) == room


@pytest.mark.parametrize("seed", range(60))
def test_a_batch_never_passes_its_share_nor_the_free_slots_nor_runs_beside_a_queue(seed):
    rng = random.Random(seed)
    slots, share = rng.choice([0, 1, 2, 4, 8, 16]), rng.choice([0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
    ours = rng.randint(0, 16)
    interactive = rng.randint(0, 20)
    waiting = rng.choice([0, 0, 0, 1, 5])
    room = batch_room(slots, interactive + ours, ours, share, waiting)
    effective = max(slots, 1)
    assert room >= 0
    if waiting or interactive >= effective or share == 0:
        assert room == 0
    else:
        assert room == 0 or ours + room <= max(1, int(share * effective + 1e-9))
        assert room == 0 or interactive + ours + room <= effective
        free = min(max(1, int(share * effective + 1e-9)) - ours, effective - interactive - ours)
        assert room == max(0, free)  # all the room there is, not less


def test_a_line_runs_on_its_replica_at_batch_prices_under_daily_limits_only():
    one, two = replica("r-1", "http://127.0.0.1:1"), replica("r-2", "http://127.0.0.1:2")
    table = make_table({"m": [one, two]})
    route = ModelRoute(name="m", replicas=(one, two), prompt_price_per_million=2.0, completion_price_per_million=4.0,
                       batch_prompt_price_per_million=1.0)
    project = ProjectPolicy("chat", "t", "o", quotas=(
        ("project:chat", Quota(requests_per_minute=1, tokens_per_minute=10, tokens_per_day=1000, concurrent_requests=1)),
        ("team:t", Quota(requests_per_minute=5)), ("org:o", Quota(budget=3.0))))
    made = batch_table(table, route, two, project)
    assert made.models["m"].replicas == (two,)
    assert (made.models["m"].prompt_price_per_million, made.models["m"].completion_price_per_million) == (1.0, 4.0)
    assert made.projects["chat"].quotas == (("project:chat", Quota(tokens_per_day=1000)),
                                            ("org:o", Quota(budget=3.0)))
    assert table.models["m"].replicas == (one, two)  # the table in force is untouched
