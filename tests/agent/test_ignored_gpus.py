"""ignore_gpus: which devices the agent leaves alone, by index, card UUID or MIG UUID (llmgw.agent.ignoring).

The reports come from discovery over the NVML stand-in built from the real H200 captures (and the A100 MIG shape
of tests/agent/discovery)."""

from __future__ import annotations

import copy

import pytest

from nvml_support import FakeNvml, h200_dump, two_h200s

from llmgw.agent.discovery import read_nvml
from llmgw.agent.ignoring import ignored_cards, is_ignored, offered_gpus

H200_UUID = "GPU-050bda45-960a-207c-573e-20129c535d06"


def _a100_with_mig() -> dict:
    """The H200 capture reshaped as an A100 split into two MIG instances (as in tests/agent/discovery)."""
    card = copy.deepcopy(h200_dump()["devices"][0])
    card.update(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a100", cc=[8, 0], mig_mode=[1, 1], max_mig=7,
                memory={"total": 85899345920, "free": 85899345920, "used": 0}, power_limit_mw=400000,
                processes=[], mig_devices=[
                    {"name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "uuid": "MIG-11111111-aaaa",
                     "memory": {"total": 42144366592, "free": 42130735104, "used": 13631488}, "processes": []},
                    {"name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb", "uuid": "MIG-22222222-bbbb",
                     "memory": {"total": 20937965568, "free": 19679674368, "used": 1258291200}, "processes": []},
                ])
    return card


@pytest.mark.parametrize("entries, offered, skipped", [
    ((), ["0", "1"], set()),
    (("1",), ["0"], {1}),
    (("GPU-11111111-2222-3333-4444-555555555555",), ["0"], {1}),
    ((H200_UUID.upper(),), ["1"], {0}),                    # UUIDs in any case, as people copy them
    ((" 0 ", "1"), [], {0, 1}),
])
def test_a_card_is_left_out_by_its_index_or_uuid(entries, offered, skipped):
    report = read_nvml(two_h200s())
    kept = offered_gpus(report, entries)
    assert [g.device_id for g in kept.gpus] == offered
    assert ignored_cards(report, entries) == skipped
    assert len([n for n in kept.notes if "ignore_gpus" in n]) == 2 - len(offered)


def test_an_ignored_card_is_no_longer_anyones_nvlink_peer():
    report = read_nvml(two_h200s())
    assert [g.nvlink_peers for g in report.gpus] == [("1",), ("0",)]
    (kept,) = offered_gpus(report, ["1"]).gpus
    assert kept.nvlink_peers == ()


def test_a_mig_uuid_leaves_out_that_instance_only_and_the_card_is_still_read():
    report = read_nvml(FakeNvml([_a100_with_mig()]))
    kept = offered_gpus(report, ["MIG-11111111-aaaa"])
    assert [g.device_id for g in kept.gpus] == ["0", "MIG-22222222-bbbb"]
    assert ignored_cards(report, ["MIG-11111111-aaaa"]) == frozenset()


@pytest.mark.parametrize("entry", ["0", "GPU-a100"])
def test_a_card_named_by_index_or_uuid_takes_its_mig_instances_with_it(entry):
    report = read_nvml(FakeNvml([_a100_with_mig()]))
    assert offered_gpus(report, [entry]).gpus == ()
    assert all(is_ignored(g, [entry]) for g in report.gpus)
    assert ignored_cards(report, [entry]) == {0}


def test_an_entry_that_names_no_gpu_is_a_warning():
    report = read_nvml(FakeNvml.h200())
    kept = offered_gpus(report, ["7"])
    assert [g.device_id for g in kept.gpus] == ["0"]
    assert kept.warnings == ("ignore_gpus entry '7' names no GPU of this node (known: indices, GPU-/MIG- UUIDs)",)
