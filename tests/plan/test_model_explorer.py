"""The model explorer (`llmgw model plan`) on a local stand-in of the Hub (hub_files.py) holding the real Gemma 3
270M and SmolLM2 135M GGUFs and Gemma converted to Hugging Face's format (config.json, model.safetensors): what the
metadata says is read from the files' headers alone (bytes served counted), checked against what the `gguf` and
`safetensors` packages read from the whole files; where it fits on seeded fleets; the CPU estimate against llama-server's
speed measured on this machine (test_cpu_speed.CALIBRATION)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.agent.model_metadata import FIRST_READ_BYTES, read_model_facts
from llmgw.engines.demo import GEMMA_SHA256, SMOLLM2_SHA256
from llmgw.engines.installing import default_cache_dir
from llmgw.errors import WeightsError
from llmgw.plan import Fleet, GpuState, MemoryBandwidth, NodeState
from llmgw.plan.model_fit import GPU_MEMORY_FRACTION, plan_model, tensor_parallel_needed
from llmgw.tools.model_headers import ModelFacts, Quantisation, parse_gguf_header

from hub_files import HubFiles
from test_cpu_speed import CALIBRATION

MiB, GiB = 2**20, 2**30


@pytest.fixture(scope="module")
def gemma_hf() -> Path:
    """Gemma converted to Hugging Face's format in the cache (the vLLM tests' model), converted when absent."""
    from llmgw.engines.vllm_demo import ensure_gemma_hf, ensure_vllm

    cache = default_cache_dir()
    return ensure_gemma_hf(cache, trio.run(ensure_vllm, cache))


@pytest.fixture
def hub(gemma_gguf: Path, smollm2_gguf: Path, gemma_hf: Path):
    server = HubFiles()
    server.add("unsloth/gemma-3-270m-it-GGUF", "gemma-3-270m-it-Q4_K_M.gguf", gemma_gguf, GEMMA_SHA256)
    server.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf", smollm2_gguf,
               SMOLLM2_SHA256)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        server.add("google/gemma-3-270m", name, gemma_hf / name, None if name != "tokenizer.json" else "f" * 64)
    server.add("google/gemma-3-270m", "model.safetensors", gemma_hf / "model.safetensors", "a" * 64)
    try:
        yield server
    finally:
        server.close()


GEMMA = "hf://unsloth/gemma-3-270m-it-GGUF@" + "c" * 40 + "/gemma-3-270m-it-Q4_K_M.gguf"
SMOLLM2 = "hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q4_1.gguf"
GEMMA_HF = "hf://google/gemma-3-270m@" + "c" * 40 + "/"


async def _facts(hub: HubFiles, source: str):
    async with httpx.AsyncClient(follow_redirects=True) as client:
        return await read_model_facts(source, client=client, endpoint=hub.url)


# (source, name in the repository, fixture of the local file, tensors per ggml type, parameters): the types and
# counts the `gguf` package's GGUFReader reads from the whole files (checked once; it takes 60 s on 2 cores)
GGUFS = [(GEMMA, "gemma-3-270m-it-Q4_K_M.gguf", "gemma_gguf",
          {"Q8_0": 10, "Q5_0": 81, "Q4_K": 27, "Q6_K": 9, "F32": 109}, 268_098_176),
         (SMOLLM2, "smollm2-135m-instruct-q4_1.gguf", "smollm2_gguf", {"Q4_1": 210, "Q8_0": 1, "F32": 61},
          134_515_008)]


@pytest.mark.parametrize(("source", "name", "local", "types", "parameters"), GGUFS, ids=["gemma", "smollm2"])
async def test_a_gguf_is_read_from_its_header_alone_and_its_tensors_account_for_the_file(hub, source, name, local,
                                                                                        types, parameters, request):
    path = request.getfixturevalue(local)
    facts = await _facts(hub, source)
    size = path.stat().st_size
    assert (facts.format, facts.weight_bytes, facts.parameters) == ("gguf", size, parameters)
    assert {q.type: q.tensors for q in facts.quantisations} == types
    # the header read whole from the local file ends where the tensors begin: they fill the rest of the file but
    # for each tensor's alignment padding (general.alignment, 32)
    with path.open("rb") as handle:
        header = parse_gguf_header(handle.read(facts.header_bytes), str(path), size).header_bytes
    tensors = sum(q.bytes for q in facts.quantisations)
    assert header + tensors <= size <= header + tensors + 32 * (sum(types.values()) + 1)
    # what the stand-in served: the header (at most twice it, plus the first 1 MiB read), nothing of the weights
    assert hub.served[name] == facts.header_bytes
    assert header <= facts.header_bytes <= 2 * header + FIRST_READ_BYTES and facts.header_bytes < size / 10
    print(f"{name}: header {header} bytes, read {facts.header_bytes} of {size}")


async def test_gemmas_header_and_tensors_are_what_was_expected(hub):
    gemma = await _facts(hub, GEMMA)
    assert (gemma.architecture, gemma.file_type, gemma.layers, gemma.kv_heads, gemma.head_dim,
            gemma.context_length) == ("gemma3", "Q4_K_M", 18, 1, 256, 32768)
    assert [q.type for q in gemma.quantisations] == ["Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"]
    assert gemma.header_bytes > FIRST_READ_BYTES  # a 262k-token vocabulary: several reads, each of the rest only


async def test_a_safetensors_repository_is_read_from_config_json_and_each_files_first_8_plus_n_bytes(hub, gemma_hf):
    from safetensors import safe_open

    facts = await _facts(hub, GEMMA_HF)
    weights = gemma_hf / "model.safetensors"
    with weights.open("rb") as handle:
        header = 8 + int.from_bytes(handle.read(8), "little")
    assert hub.served["model.safetensors"] == header  # the length, then the JSON: nothing of the weights
    assert hub.served["config.json"] == (gemma_hf / "config.json").stat().st_size
    assert hub.served["tokenizer.json"] == 0 and facts.header_bytes == sum(hub.served.values())
    config = json.loads((gemma_hf / "config.json").read_text())
    with safe_open(weights, framework="numpy") as opened:
        elements = sum(math.prod(opened.get_slice(k).get_shape()) for k in opened.keys())
        count = len(list(opened.keys()))
    assert (facts.format, facts.architecture, facts.weight_bytes, facts.parameters, facts.files) == \
        ("safetensors", config["architectures"][0], weights.stat().st_size, elements, 1)
    assert [(q.type, q.tensors) for q in facts.quantisations] == [("BF16", count)]
    assert (facts.layers, facts.kv_heads, facts.head_dim) == (config["num_hidden_layers"],
                                                              config["num_key_value_heads"], config["head_dim"])


async def test_what_is_not_there_or_not_a_model_is_refused_naming_the_source(hub):
    with pytest.raises(WeightsError, match=r"not found \(404"):
        await _facts(hub, "hf://google/gemma-3-270m@" + "c" * 40 + "/absent.gguf")
    with pytest.raises(WeightsError, match="GGUF magic"):
        await _facts(hub, "hf://google/gemma-3-270m/config.json")
    with pytest.raises(WeightsError, match="no .safetensors file; it holds GGUF files, name one"):
        await _facts(hub, "hf://unsloth/gemma-3-270m-it-GGUF/")


def _probe(all_cores: float, cores: int) -> MemoryBandwidth:
    return MemoryBandwidth(all_cores / cores, all_cores, cores, 0.5)


@pytest.mark.parametrize("calibration", CALIBRATION, ids=[c[0] for c in CALIBRATION])
async def test_the_cpu_estimate_is_within_30_percent_of_llama_servers_speed_measured_here(hub, calibration):
    label, size, bandwidth, measured = calibration
    source = GEMMA if label.startswith("gemma") else SMOLLM2
    facts = await _facts(hub, source)
    assert facts.weight_bytes == size
    # this machine as a node: 2 cores, the probe's 2-core bandwidth; a node never probed gets no estimate
    fleet = Fleet((NodeState("here", cpu_cores=2, memory_bytes=4 * GiB, memory_bandwidth=_probe(bandwidth, 2)),
                   NodeState("unprobed", cpu_cores=8, memory_bytes=4 * GiB)))
    here, unprobed = plan_model(facts, fleet).cpu_nodes
    assert here.fits and here.threads == 2 and here.engines == ("llama.cpp",)
    assert here.decode_tokens_per_second == pytest.approx(measured, rel=0.30)
    assert unprobed.fits and unprobed.decode_tokens_per_second is None and "not probed" in unprobed.why
    print(f"{label}: estimated {here.decode_tokens_per_second:.1f} tokens/s, measured {measured}")


def _gpu_node(node_id: str, gpu_class: str, cards: int, card_bytes: int, held: int = 0) -> NodeState:
    gpus = tuple(GpuState(str(i), gpu_class, card_bytes, card_bytes, foreign_processes=i < held)
                 for i in range(cards))
    return NodeState(node_id, cpu_cores=32, memory_bytes=256 * GiB, gpus=gpus)


async def test_gemma_in_hf_format_fits_or_not_per_class_with_the_tensor_parallel_it_needs(hub):
    facts = await _facts(hub, GEMMA_HF)
    fit = plan_model(facts, Fleet((
        _gpu_node("g1", "h100-80g", 8, 80 * GiB),
        _gpu_node("s1", "small-512m", 1, 512 * MiB),  # 0.45 GiB usable: Gemma's 0.68 GiB needs two cards
        _gpu_node("s2", "small-512m", 4, 512 * MiB, held=3),  # one card free of foreign processes
        _gpu_node("p1", "pair-512m", 2, 512 * MiB),
        NodeState("c-small", cpu_cores=4, memory_bytes=512 * MiB),
        NodeState("c-big", cpu_cores=4, memory_bytes=8 * GiB, engines_installable=frozenset({"llama.cpp"})),
        NodeState("c-vllm", cpu_cores=4, memory_bytes=8 * GiB))))
    assert fit.needed_bytes == facts.weight_bytes + 2 * 18 * 1 * 256 * 2 * 8192
    classes = {c.gpu_class: (c.fits, c.tensor_parallel, c.nodes_fitting, c.engines) for c in fit.classes}
    assert classes == {"h100-80g": (True, 1, 1, ("vllm", "sglang")),
                       "small-512m": (False, 2, 0, ("vllm", "sglang")),
                       "pair-512m": (True, 2, 1, ("vllm", "sglang"))}
    assert "no node has 2 usable cards (at most 1)" in {c.gpu_class: c for c in fit.classes}["small-512m"].why
    nodes = {n.node_id: (n.fits, n.engines, n.decode_tokens_per_second) for n in fit.cpu_nodes}
    assert nodes == {"c-small": (False, ("vllm",), None), "c-big": (False, (), None),
                     "c-vllm": (True, ("vllm",), None)}


@pytest.mark.parametrize("seed", range(40))
def test_on_seeded_fleets_a_class_fits_exactly_when_one_node_has_the_cards_its_tensor_parallel_needs(seed):
    rng = random.Random(seed)
    weights = rng.choice([98_362_432, 253_113_024, 536_223_056, 7 * GiB, 70 * GiB, 400 * GiB])
    facts = ModelFacts("hf://x/y/m.gguf", rng.choice(["gguf", "safetensors"]), "llama", "m", weights, weights // 2,
                       (Quantisation("Q4_K", 1, weights),), layers=rng.choice([0, 32]), kv_heads=8, head_dim=128,
                       context_length=rng.choice([0, 4096, 131072]))
    nodes = []
    for n in range(rng.randint(0, 8)):
        card = rng.choice([16, 24, 40, 80, 141]) * GiB
        nodes.append(_gpu_node(f"g{n}", f"class-{card // GiB}g", rng.randint(1, 8), card, held=rng.randint(0, 2)))
    for n in range(rng.randint(0, 4)):
        probe = _probe(rng.uniform(5e9, 200e9), 8) if rng.random() < 0.7 else None
        nodes.append(NodeState(f"c{n}", cpu_cores=rng.choice([2, 8, 64]), memory_bytes=rng.choice([4, 64, 512]) * GiB,
                               memory_bandwidth=probe, alive=rng.random() < 0.9))
    fleet = Fleet(tuple(nodes))
    fit = plan_model(facts, fleet)
    assert fit.needed_bytes >= facts.weight_bytes
    for c in fit.classes:
        members = [n for n in fleet.nodes if n.alive and any(g.gpu_class == c.gpu_class for g in n.gpus)]
        tp = c.tensor_parallel
        assert tp == 0 or (fit.needed_bytes / tp <= c.card_bytes * GPU_MEMORY_FRACTION
                           and (tp == 1 or fit.needed_bytes / (tp // 2) > c.card_bytes * GPU_MEMORY_FRACTION))
        usable = [sum(1 for g in n.gpus if not g.foreign_processes) for n in members]
        assert c.fits == (tp > 0 and any(u >= tp for u in usable))
        assert c.nodes_fitting == sum(1 for u in usable if tp and u >= tp) and c.nodes == len(members)
    assert [n.node_id for n in fit.cpu_nodes] == sorted(n.node_id for n in fleet.nodes if n.alive and not n.gpus)
    for n in fit.cpu_nodes:
        node = fleet.node(n.node_id)
        assert n.fits == (fit.needed_bytes <= node.memory_bytes)
        assert (n.decode_tokens_per_second is not None) == (node.memory_bandwidth is not None
                                                            and facts.format == "gguf")
    assert tensor_parallel_needed(10 * GiB, 0) == 0 and tensor_parallel_needed(10**15, 80 * GiB) == 0


def test_llmgw_model_plan_prints_each_class_and_cpu_node_from_a_fleet_snapshot(hub, tmp_path, capsys):
    from llmgw.cli.main import main
    from llmgw.plan.snapshot import FleetSnapshot, snapshot_to_json

    bandwidth = CALIBRATION[0][2]
    fleet = Fleet((_gpu_node("g1", "h100-80g", 8, 80 * GiB),
                   NodeState("here", cpu_cores=2, memory_bytes=4 * GiB, memory_bandwidth=_probe(bandwidth, 2)),
                   NodeState("tiny", cpu_cores=2, memory_bytes=256 * MiB)))
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(json.dumps(snapshot_to_json(FleetSnapshot(fleet))))
    main(["model", "plan", GEMMA, "--fleet", str(snapshot), "--hf-endpoint", hub.url])
    text = capsys.readouterr().out
    assert "gguf, architecture gemma3, Q4_K_M, 0.27B parameters" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.split()}
    assert lines["h100-80g"].split()[1:6] == ["1", "80Gi", "1", "yes", "llama.cpp:"]
    here = lines["here"].split()
    assert float(here[3]) == pytest.approx(CALIBRATION[0][3], rel=0.30) and here[4] == "yes"
    assert " no " in lines["tiny"] and "needs 385.4Mi, the node has 256Mi" in lines["tiny"]
    main(["model", "plan", GEMMA_HF, "--fleet", str(snapshot), "--hf-endpoint", hub.url, "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["model"]["architecture"] == "Gemma3ForCausalLM"
    assert [(c["gpu_class"], c["fits"], c["engines"]) for c in answer["classes"]] == \
        [("h100-80g", True, ["vllm", "sglang"])]
    with pytest.raises(SystemExit) as exited:
        main(["model", "plan", "hf://google/gemma-3-270m/absent.gguf", "--fleet", str(snapshot),
              "--hf-endpoint", hub.url])
    assert exited.value.code == 1 and "not found (404" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # a source written wrong is named before any fleet is read
        main(["model", "plan", "gemma.gguf", "--admin", "http://127.0.0.1:9", "--token", "x"])
    said = capsys.readouterr().err
    assert exited.value.code == 1 and "gemma.gguf: the explorer reads hf://" in said and "127.0.0.1" not in said


async def test_the_consoles_explorer_page_shows_the_model_and_where_it_fits(hub):
    from console.test_console_security import HTML, Wall, admin_only, log_in, no_history
    from llmgw.console import Console
    from llmgw.control.registry import FleetRegistry
    from llmgw.control.view import ControlState

    registry = FleetRegistry(lost_after=30.0)
    for node in (_gpu_node("g1", "h100-80g", 8, 80 * GiB), _gpu_node("s1", "small-512m", 1, 512 * MiB),
                 NodeState("here", cpu_cores=2, memory_bytes=4 * GiB, memory_bandwidth=_probe(CALIBRATION[1][2], 2))):
        registry, _ = registry.register(node, 0.0)
    state = ControlState(fleet=registry)
    asked = []

    async def explore(source: str):
        asked.append(source)
        return await _facts(hub, source)

    console = Console(lambda: state, authorise=admin_only, history=no_history, clock=lambda: 1.0, wall=Wall(),
                      session_ttl=3600.0, explore=explore)
    client = console.app.test_client()
    await log_in(client)
    empty = await client.get("/console/explorer", headers=HTML)
    text = await empty.get_data(as_text=True)
    assert empty.status_code == 200 and 'id="nav-explorer"' in text and 'id="source"' in text and not asked
    page = await client.get("/console/explorer", query_string={"source": SMOLLM2}, headers=HTML)
    html = await page.get_data(as_text=True)
    assert page.status_code == 200 and asked == [SMOLLM2]
    assert '<dd id="architecture">llama</dd>' in html and '<tr id="quant-Q4_1"><td>Q4_1</td><td>210</td>' in html
    for gpu_class, fits, tp in (("h100-80g", "yes", "1"), ("small-512m", "yes", "1")):
        row = re.search(rf'<tr id="class-{gpu_class}" class="[^"]+">.*?</tr>', html, re.S).group(0)
        assert f'<td class="tp">{tp}</td><td class="fits">{fits}</td>' in row and "llama.cpp" in row
    speed = re.search(r'<tr id="cpu-here" class="fits">.*?<td class="speed">([\d.]+) tokens/s</td>', html, re.S)
    assert float(speed.group(1)) == pytest.approx(CALIBRATION[1][3], rel=0.30)
    big = await client.get("/console/explorer", query_string={"source": GEMMA_HF, "context": "32768"},
                           headers=HTML)
    html = await big.get_data(as_text=True)
    assert re.search(r'<tr id="class-small-512m" class="does-not-fit">.*?<td class="tp">4</td><td class="fits">no'
                     r'</td>.*?no node has 4 usable cards \(at most 1\)', html, re.S), html
    missing = await client.get("/console/explorer", query_string={"source": "hf://google/gemma-3-270m/x.gguf"},
                               headers=HTML)
    assert missing.status_code == 400
    assert "not found (404" in await missing.get_data(as_text=True)
