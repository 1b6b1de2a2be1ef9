"""`nvidia-smi topo -m`: the H200 capture, an 8-GPU NIC-legend layout and an older adapter-named layout."""

from __future__ import annotations

import pytest

from captures import capture, variant
from llmgw.tools import parse_topo_matrix


def test_h200_single_gpu_has_numa_and_affinity_despite_ansi_and_double_tabs():
    topo = parse_topo_matrix(capture("nvidia-smi-topo-m.txt"))
    assert topo.warnings == () and topo.nics == ()
    (gpu,) = topo.gpus
    assert (gpu.index, gpu.cpu_affinity, gpu.numa_node, gpu.gpu_numa_id) == (0, "0-15", 0, None)
    assert gpu.nvlink_peers == {} and gpu.nic_distance == {}


def test_eight_gpus_with_nic_legend_map_nics_to_adapters():
    topo = parse_topo_matrix(variant("topo-8xh100-nic-legend.txt"))
    assert topo.warnings == () and len(topo.gpus) == 8
    assert topo.nics == ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5")   # NIC index is not the mlx5 index
    gpu0, gpu5 = topo.gpu(0), topo.gpu(5)
    assert gpu0.nvlink_peers == {peer: 18 for peer in range(1, 8)}
    assert gpu0.nic_distance == {"mlx5_0": "PXB", "mlx5_3": "NODE", "mlx5_4": "SYS", "mlx5_5": "SYS"}
    assert (gpu0.numa_node, gpu5.numa_node, gpu5.cpu_affinity) == (0, 1, "56-111,168-223")
    assert gpu5.nic_distance["mlx5_4"] == "PXB"


def test_older_adapter_named_columns_and_na_numa():
    topo = parse_topo_matrix(variant("topo-4xv100-adapter-columns.txt"))
    assert topo.warnings == () and topo.nics == ("mlx5_0", "mlx5_1")
    assert [g.nvlink_peers for g in topo.gpus] == [{1: 12}, {0: 12}, {3: 4}, {2: 4}]
    assert [g.numa_node for g in topo.gpus] == [None] * 4
    assert topo.gpu(2).nic_distance == {"mlx5_0": "SYS", "mlx5_1": "PIX"} and topo.gpu(2).cpu_affinity == "20-39"


@pytest.mark.parametrize("text", ["", "No devices were found", "Failed to initialize NVML: Driver/library version mismatch"])
def test_output_without_a_matrix_gives_a_warning(text):
    topo = parse_topo_matrix(text)
    assert topo.gpus == () and topo.warnings[0].startswith("nvidia-smi topo -m: no matrix header")


def test_a_cell_that_is_not_a_link_is_reported_not_guessed():
    text = capture("nvidia-smi-topo-m.txt").replace("GPU0\t X ", "GPU0\t??")
    topo = parse_topo_matrix(text)
    assert topo.gpus[0].numa_node == 0 and "GPU0 to GPU0 reads '??'" in topo.warnings[0]
