"""A replica spread over two nodes, end to end: a real control plane and two in-process agents, each the real H200
(NVML stand-in and `nvidia-smi -q -x` from the captures) with one active InfiniBand port on one fabric (sysfs as
gpud's H100 capture lays it out, `sminfo` as FORMATS.md quotes it). A vLLM model of tensor parallel 2 needs two
H200s, more than one node has: each node starts one shard with its rank, the rendezvous of rank 0 and the NCCL
adapter, rank 1 headless; only rank 0 is routed to."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.discovery import ToolOutput
from llmgw.agent.health import HealthReader
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository
from support.stand_ins import python_tool

from .conftest import write_seed
from .test_in_process_fleet import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from captures import capture  # noqa: E402
from fake_nvml import FakeNvml  # noqa: E402

SUPPORT = Path(__file__).resolve().parents[1] / "support"
HAND_MADE = Path(__file__).resolve().parents[1] / "fixtures" / "hand-made"
SPREAD_MODEL = """\
name: spread
engine: vllm
engine_version: 0.11.0
weights:
  - source: https://example.invalid/spread/model.safetensors
    sha256: {sha}
replicas: 1
resources:
  gpus: 2
  gpu_class: h200-141g
  tensor_parallel: 2
"""


def ib_sysfs(root: Path, adapters: tuple[str, ...] = ("mlx5_0",), rate: str = "400 Gb/sec (4X NDR)") -> Path:
    """One active InfiniBand port (port 1) per adapter, 4X NDR by default, in sysfs's layout (values as gpud's H100
    capture has them)."""
    for ca in adapters:
        port = root / "class" / "infiniband" / ca / "ports" / "1"
        port.mkdir(parents=True)
        for name, value in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", rate),
                            ("link_layer", "InfiniBand")):
            (port / name).write_text(value + "\n")
    return root


def tools(argv):
    if argv[0] == "nvidia-smi":
        return ToolOutput(tuple(argv), 0, capture("nvidia-smi-q-x.xml"))
    if argv[0] == "sminfo":
        return ToolOutput(tuple(argv), 0, (HAND_MADE / "sminfo-master.txt").read_text())
    return None  # journalctl, dmesg, saquery, nvidia-imex-ctl: not installed


async def test_a_replica_needing_two_h200s_starts_one_ranked_shard_on_each_of_two_nodes(
    tmp_path, weights_mirror, monkeypatch,
):
    mirror, sha = weights_mirror
    records = tmp_path / "ranks"
    monkeypatch.setenv("FAKE_VLLM_RECORDS", str(records))
    vllm = python_tool(tmp_path / "bin" / "vllm", SUPPORT / "fake_vllm_multinode.py")
    seed = write_seed(tmp_path / "seed", sha, replicas=0)
    (seed / "catalog" / "spread.yaml").write_text(SPREAD_MODEL.format(sha=sha))
    (seed / "projects.yaml").write_text((seed / "projects.yaml").read_text().replace("[tiny]", "[tiny, spread]"))
    init_repository(tmp_path / "settings.git", seed)
    plane = ControlPlane(ControlConfig(repo=str(tmp_path / "settings.git"), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        for name in ("gpu1", "gpu2"):
            reader = HealthReader(tools, sys_root=ib_sysfs(tmp_path / name / "sys"), etc_root=tmp_path / name,
                                  interval=0.3)
            agent = AgentConfig(node_id=name, state_dir=tmp_path / name / "agent", mirrors=(str(mirror),),
                                heartbeat_interval=0.2, engine_binaries={"vllm@0.11.0": vllm},
                                stop_shards_on_exit=True, shard_stop_grace=2.0)
            await nursery.start(lambda task_status, agent=agent, reader=reader: run_agent(
                agent, plane.local_connector(), nvml=FakeNvml.h200(), health=reader, task_status=task_status))

        await wait_for(lambda: plane.table.models["spread"].replicas, 30, "a route to spread-0",
                       lambda: plane.status())
        await wait_for(lambda: len(list(records.glob("*.json"))) == 2, 10, "both ranks started")
        rank0 = json.loads((records / "0.json").read_text())
        rank1 = json.loads((records / "1.json").read_text())

        def flag(record, name):
            return record["argv"][record["argv"].index(name) + 1]

        assert "--headless" in rank1["argv"] and "--headless" not in rank0["argv"]
        assert flag(rank0, "--master-addr") == flag(rank1, "--master-addr") == "127.0.0.1"
        assert flag(rank0, "--master-port") == flag(rank1, "--master-port")
        assert [flag(r, "--nnodes") for r in (rank0, rank1)] == ["2", "2"]
        assert rank0["env"]["NCCL_IB_HCA"] == rank1["env"]["NCCL_IB_HCA"] == "mlx5_0"
        assert rank0["env"]["CUDA_VISIBLE_DEVICES"] == rank1["env"]["CUDA_VISIBLE_DEVICES"] == "0"

        fleet = plane.snapshot().fleet
        shards = {n: [(s.shard_id, s.rank, s.group) for s in fleet.get(n).state.shards if not s.adopted_foreign]
                  for n in ("gpu1", "gpu2")}  # other engines on this shared machine show as foreign: left out
        assert sorted(shards["gpu1"] + shards["gpu2"]) == [("spread-0/0", 0, "spread-0/0"),
                                                          ("spread-0/1", 1, "spread-0/0")]
        assert fleet.get("gpu1").state.interconnect.adapters == (("mlx5_0", "0010e0406d5aa0a0", ""),)
        (route,) = plane.table.models["spread"].replicas  # rank 0 only: rank 1 serves no API
        rank0_node = next(n for n in ("gpu1", "gpu2") if ("spread-0/0", 0, "spread-0/0") in shards[n])
        assert route.replica_id == "spread-0" and route.node_id == rank0_node
        nursery.cancel_scope.cancel()
