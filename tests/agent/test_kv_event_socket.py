"""The KV-event socket takes only the engine's events, and never more than the agent can hold (issue 25, item 5).

The agent gives vLLM an IPC socket in a 0700 directory of its own user; the listener connects to it (vLLM binds an
`ipc://` endpoint) with ZMQ_MAXMSGSIZE, caps the hashes it mirrors, and empties the mirror at most once per
interval whatever sequence numbers arrive. Here a real ZMQ PUB socket bound at the agent's endpoint plays the
engine, sending vLLM 0.32's message shape (`[topic, seq, msgpack batch]`, map-encoded events).
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
import tempfile
from pathlib import Path

import msgpack
import pytest
import trio
import zmq

from llmgw.agent.kv_sockets import MAX_SOCKET_PATH, kv_endpoint, kv_socket_dir
from llmgw.engines import Launch, vllm
from llmgw.engines.vllm_kv_listener import KvEventListener
from llmgw.errors import EngineError
from llmgw.tools.vllm_kv_events import AllBlocksCleared, BlockStored, KvBlocks, KvEventBatch

from agent_support import wait_for


def _message(seq: int, hashes, topic: bytes = b"kv") -> list[bytes]:
    events = [{"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None, "token_ids": [],
               "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}]
    return [topic, struct.pack(">Q", seq), msgpack.packb([1.0, events, 0])]


def _engine_publisher(state_dir, shard_id: str) -> tuple[zmq.Socket, str]:
    """(a PUB socket bound at the agent's endpoint for `shard_id`, as vLLM binds it; that endpoint)."""
    endpoint = kv_endpoint(kv_socket_dir(state_dir), shard_id)
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.setsockopt(zmq.LINGER, 0)
    publisher.bind(endpoint)
    return publisher, endpoint


@pytest.fixture
async def engine_and_listener(tmp_path, nursery):
    """(a PUB socket bound at the agent's endpoint, as vLLM binds it; the agent's listener connected to it)."""
    publisher, endpoint = _engine_publisher(tmp_path / "state", "gemma-0/0")
    listener = KvEventListener(endpoint=endpoint)
    await nursery.start(listener.run)
    yield publisher, listener
    publisher.close(linger=0)


async def _until_applied(publisher, listener, message, count: int) -> None:
    """Send `message` again and again until the listener has applied `count` messages (a PUB drops what it sends
    before the subscriber's connection is up)."""
    with trio.fail_after(10):
        while listener.messages < count:
            publisher.send_multipart(message)
            await trio.sleep(0.02)


def test_the_socket_directory_is_the_agents_own_and_closed_to_everyone_else(tmp_path):
    directory = kv_socket_dir(tmp_path / "state")
    info = os.lstat(directory)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    os.chmod(directory, 0o755)  # loosened by hand: tightened again
    assert stat.S_IMODE(os.lstat(kv_socket_dir(tmp_path / "state")).st_mode) == 0o700
    endpoint = kv_endpoint(directory, "gemma-0/0")
    assert endpoint.startswith(f"ipc://{directory}/") and len(endpoint) - len("ipc://") <= MAX_SOCKET_PATH
    short = Path(tempfile.mkdtemp(prefix="kv-"))  # short enough for a socket's name wherever pytest's tmp_path is
    try:
        (short / "elsewhere").mkdir()
        (short / "linked").mkdir()
        (short / "linked" / "kv").symlink_to(short / "elsewhere")
        with pytest.raises(EngineError, match="not a directory"):
            kv_socket_dir(short / "linked")
    finally:
        shutil.rmtree(short)
    deep = kv_socket_dir(tmp_path / ("d" * 120))  # too deep for a socket's name: the temporary directory's
    assert stat.S_IMODE(os.lstat(deep).st_mode) == 0o700 and len(kv_endpoint(deep, "x")) - 6 <= MAX_SOCKET_PATH


def test_vllm_is_told_to_publish_on_that_socket():
    endpoint = "ipc:///state/kv/0123456789abcdef.sock"
    argv, _env = vllm.command_line(Launch(binary="vllm", model_path="/m", kv_events_endpoint=endpoint))
    config = argv[argv.index(vllm.KV_EVENTS_FLAG) + 1]
    assert f'"endpoint": "{endpoint}"' in config and argv[argv.index("--host") + 1] == "127.0.0.1"


async def test_a_9_mb_message_is_refused_by_its_size_and_changes_nothing(engine_and_listener):
    publisher, listener = engine_and_listener
    await _until_applied(publisher, listener, _message(0, [1, 2, 3]), 1)
    huge = _message(1, range(2**63, 2**63 + 1_000_000))  # 1,000,000 forged 64-bit hashes, 9 bytes each
    assert len(huge[2]) > 9_000_000
    publisher.send_multipart(huge)
    await _until_applied(publisher, listener, _message(2, [4]), 2)  # after the refused one, events come again
    assert listener.blocks.held() <= {1, 2, 3, 4} and 4 in listener.blocks.held()
    assert listener.messages >= 2 and listener.malformed == 0 and listener.blocks.capped == 0
    assert listener.disconnects >= 1  # ZMQ dropped the connection that carried it, and the listener made it again


async def test_out_of_sequence_messages_empty_the_mirror_at_most_once_per_interval(engine_and_listener):
    publisher, listener = engine_and_listener
    await _until_applied(publisher, listener, _message(0, [1]), 1)
    seq = 100
    for forged in range(50):  # every message out of sequence
        seq += 7
        publisher.send_multipart(_message(seq, [1000 + forged]))
        await trio.sleep(0.005)
    await wait_for(lambda: 1049 in listener.blocks.held(), timeout=10)
    assert listener.blocks.resets == 1  # the first gap emptied it; the next 49 within 10 s did not
    assert {1000 + i for i in range(50)} <= listener.blocks.held()


def test_a_postponed_reset_happens_at_the_first_message_after_the_interval():
    state = KvBlocks().apply(KvEventBatch("kv", 0, 0.0, (BlockStored((1,), None, (), 16),)), now=0.0,
                             reset_interval=10.0)
    state = state.apply(KvEventBatch("kv", 5, 0.0, (BlockStored((2,), None, (), 16),)), now=1.0, reset_interval=10.0)
    assert (state.held(), state.resets, state.reset_due) == ({2}, 1, False)  # the first gap: emptied
    state = state.apply(KvEventBatch("kv", 9, 0.0, (AllBlocksCleared(), BlockStored((3,), None, (), 16))), now=2.0,
                        reset_interval=10.0)
    assert (state.held(), state.resets, state.reset_due) == ({2, 3}, 1, True)  # postponed
    state = state.apply(KvEventBatch("kv", 10, 0.0, (BlockStored((4,), None, (), 16),)), now=11.0,
                        reset_interval=10.0)
    assert (state.held(), state.resets, state.reset_due) == ({4}, 2, False)


def test_the_mirror_holds_at_most_max_hashes_and_counts_the_rest():
    state = KvBlocks().apply(KvEventBatch("kv", 0, 0.0, (BlockStored(tuple(range(8)), None, (), 16),)),
                             max_hashes=5)
    assert (state.held(), state.capped) == (set(range(5)), 3)
    state = state.apply(KvEventBatch("kv", 1, 0.0, (BlockStored((0, 1, 99), None, (), 16),)), max_hashes=5)
    assert (state.held(), state.capped) == (set(range(5)), 4)  # held again: no room taken; 99 left out


async def test_an_engine_gone_as_its_listener_stops_leaves_the_other_listeners_hearing(tmp_path):
    """An engine that sent an oversized message (its connection dropped and made again) and then exits just as the
    agent stops following it: libzmq's I/O thread, shared by every listener of the process, must not hang on the
    monitor event of that drop (it did, one time in a few, when the monitor's reader closed first)."""
    huge = _message(1, range(2**63, 2**63 + 500_000))
    for round_ in range(20):
        publisher, endpoint = _engine_publisher(tmp_path / "state", f"gone-{round_}/0")
        listener = KvEventListener(endpoint=endpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            await _until_applied(publisher, listener, _message(0, [1]), 1)
            publisher.send_multipart(huge)
            await _until_applied(publisher, listener, _message(2, [2]), 2)
            publisher.close(linger=0)  # the engine exits, and the agent stops following it at once
            nursery.cancel_scope.cancel()
    publisher, endpoint = _engine_publisher(tmp_path / "state", "after/0")
    listener = KvEventListener(endpoint=endpoint)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await _until_applied(publisher, listener, _message(0, [7]), 1)
        nursery.cancel_scope.cancel()
    publisher.close(linger=0)
    assert 7 in listener.blocks.held()


def test_two_agents_with_deep_state_directories_get_socket_directories_of_their_own(tmp_path):
    first = kv_socket_dir(tmp_path / "a" / ("d" * 120))
    second = kv_socket_dir(tmp_path / "b" / ("d" * 120))
    assert first != second and first.parent == second.parent  # both in the temporary directory, never shared
    assert kv_endpoint(first, "gemma-0/0") != kv_endpoint(second, "gemma-0/0")
