"""GPU classes from product names and memory as the drivers report them (MiB figures from real cards)."""

from __future__ import annotations

import pytest

from llmgw.tools import card_label, gpu_class, marketed_gb, mig_class, mig_profile

MiB = 1024**2


@pytest.mark.parametrize(("name", "memory", "expected"), [
    ("NVIDIA H200", 150754820096, "h200-141g"),             # the NVML capture in shared/fixtures
    ("NVIDIA H200", 143771 * MiB, "h200-141g"),             # the same card through nvidia-smi
    ("NVIDIA H100 80GB HBM3", 81559 * MiB, "h100-80g"),
    ("NVIDIA H100 PCIe", 81559 * MiB, "h100-80g"),
    ("NVIDIA H100 NVL", 95830 * MiB, "h100-94g"),
    ("NVIDIA A100-SXM4-80GB", 81920 * MiB, "a100-80g"),
    ("NVIDIA A100-PCIE-40GB", 40960 * MiB, "a100-40g"),
    ("NVIDIA A100-SXM4-40GB", 40536 * MiB, "a100-40g"),
    ("NVIDIA L40S", 46068 * MiB, "l40s-48g"),
    ("NVIDIA L4", 23034 * MiB, "l4-24g"),
    ("NVIDIA GeForce RTX 4090", 24564 * MiB, "rtx-4090-24g"),
    ("NVIDIA GeForce RTX 3060", 12288 * MiB, "rtx-3060-12g"),
    ("NVIDIA RTX A6000", 49140 * MiB, "rtx-a6000-48g"),
    ("NVIDIA RTX 6000 Ada Generation", 49140 * MiB, "rtx-6000-ada-48g"),
    ("Tesla T4", 15360 * MiB, "t4-16g"),
    ("Tesla V100-SXM2-32GB", 32510 * MiB, "v100-32g"),
    ("NVIDIA A10G", 23028 * MiB, "a10g-24g"),
    ("NVIDIA GH200 480GB", 97871 * MiB, "gh200-96g"),
    ("NVIDIA B200", 183359 * MiB, "b200-180g"),
])
def test_class_is_card_and_marketed_memory(name, memory, expected):
    assert gpu_class(name, memory) == expected


@pytest.mark.parametrize(("name", "memory"), [("", 80 * 1024**3), ("NVIDIA H200", None), ("NVIDIA H200", 0)])
def test_class_is_unknown_without_name_or_memory(name, memory):
    assert gpu_class(name, memory) is None


def test_sizes_beyond_the_table_round_to_whole_gib():
    assert marketed_gb(1000 * 1024**3) == 1000


def test_marketed_size_refuses_nonsense():
    with pytest.raises(ValueError, match="positive"):
        marketed_gb(-1)


@pytest.mark.parametrize(("name", "profile"), [
    ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "3g.40gb"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
    ("NVIDIA H200 MIG 1g.18gb+me", "1g.18gb+me"),
    ("NVIDIA A100-SXM4-80GB", ""),
])
def test_mig_profile_comes_from_the_device_name(name, profile):
    assert mig_profile(name) == profile


def test_mig_class_joins_parent_class_and_profile():
    assert mig_class("a100-80g", "3g.40gb") == "a100-80g-mig-3g.40gb"
    assert mig_class(None, "3g.40gb") is None
    assert card_label("NVIDIA A100-SXM4-80GB MIG 3g.40gb") == "a100"
