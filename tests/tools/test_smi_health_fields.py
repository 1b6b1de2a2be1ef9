"""`nvidia-smi -q -x` health fields across DTD v10..v13, read from real captures (sources: tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixture_files import fixture, h200_variant, h200_xml
from llmgw.tools import ParseError, PcieLink, parse_smi_health

VARIANTS = Path(__file__).resolve().parents[1] / "agent" / "discovery" / "fixtures"

# capture, cards, PcieLink(gen current, gen max, device max, host max, width current, width max), ECC volatile
# uncorrected, remapped rows pending (None: not reported), retired pages pending, fabric reported, MIG mode, carved.
CASES = [
    ("nvidia-h200/nvidia-smi-q-x.xml", 1, PcieLink(5, 5, 5, None, 16, 16), 0, False, None, True, False, 0),
    ("nvidia-h200/nvidia-smi-q-x-after-load.xml", 1, PcieLink(5, 5, 5, None, 16, 16), 0, False, None, True, False, 0),
    ("telegraf/a100-sxm4-v12.xml", 1, PcieLink(4, 4, 4, 4, 16, 16), 0, None, None, True, True, 4),
    ("telegraf/a10g.xml", 1, PcieLink(1, 4, None, None, 8, 16), 0, False, None, False, None, 0),
    ("telegraf/tesla-t4.xml", 1, PcieLink(3, 3, None, None, 8, 16), 0, None, False, False, None, 0),
    ("telegraf/quadro-p400.xml", 1, PcieLink(1, 3, None, None, 16, 16), None, None, None, False, None, 0),
    ("telegraf/gtx-1070-ti.xml", 1, PcieLink(1, None, None, None, 16, None), None, None, None, False, None, 0),
    ("telegraf/rtx-3060-v12.xml", 1, PcieLink(1, 4, 4, 4, 16, 16), None, None, None, True, None, 0),
    ("telegraf/rtx-3080-v13.xml", 1, PcieLink(4, 4, 4, 4, 16, 16), None, None, None, True, None, 0),
    ("telegraf/rtx-4000-sff-ada-v13.xml", 1, PcieLink(1, 4, 4, 4, 16, 16), None, False, None, True, None, 0),
]


@pytest.mark.parametrize("path, cards, pcie, unc, remap_pending, retire_pending, has_fabric, mig, carved", CASES,
                         ids=[c[0] for c in CASES])
def test_health_fields_of_each_real_capture(path, cards, pcie, unc, remap_pending, retire_pending, has_fabric,
                                            mig, carved):
    found = parse_smi_health(fixture(path))
    assert len(found) == cards
    card = found[0]
    assert card.pcie == pcie
    assert card.ecc.volatile_uncorrected == unc
    assert (card.remapped_rows.pending if card.remapped_rows else None) == remap_pending
    assert (card.retired_pages.pending if card.retired_pages else None) == retire_pending
    assert (card.fabric is not None) == has_fabric
    assert (card.mig_enabled, card.mig_devices) == (mig, carved)
    assert card.pci_bus_id.startswith("0000") and card.uuid.startswith("GPU-")


def test_the_h200_reads_its_remapper_histogram_and_idle_clock_event():
    (card,) = parse_smi_health(h200_xml())
    assert card.remapped_rows.banks_without_spare == 0 and card.remapped_rows.failure is False
    assert card.clock_events == ("gpu_idle",)
    assert card.fabric.domain is None and not card.fabric.joined  # every fabric field N/A in this VM
    assert card.pcie.gen_capable == 5


def test_v10_ecc_counts_come_from_single_and_double_bit_totals():
    text = fixture("telegraf/quadro-p400.xml")  # driver 418: ecc_errors hold N/A under single_bit/double_bit
    (card,) = parse_smi_health(text)
    assert card.ecc.volatile_corrected is None and card.ecc.aggregate_uncorrected is None
    variant = text.replace("<double_bit>", "<double_bit><total>3</total>", 1)  # hand-made: a v10 DBE count
    (card,) = parse_smi_health(variant)
    assert card.ecc.volatile_uncorrected == 3


def test_older_driver_variants_beside_the_discovery_tests_parse_too():
    eight = parse_smi_health((VARIANTS / "smi-q-x-535-8xh100.xml").read_text())
    assert len(eight) == 8 and all(c.pcie.gen_capable == 5 for c in eight)
    mig = parse_smi_health((VARIANTS / "smi-q-x-525-a100-mig.xml").read_text())
    assert mig[0].mig_enabled and mig[0].mig_devices == 2 and mig[0].ecc.volatile_uncorrected == 2


def test_a_joined_multi_node_domain_and_a_single_machine_nvswitch_are_told_apart():
    domain = h200_variant(("<state>N/A</state>", "<state>Completed</state>"),
                          ("<status>N/A</status>", "<status>Success</status>"),
                          ("<cliqueId>N/A</cliqueId>", "<cliqueId>32766</cliqueId>"),
                          ("<clusterUuid>N/A</clusterUuid>",
                           "<clusterUuid>8cc6a1f5-2bb0-4b8c-9d5f-27b2f4d1c7a1</clusterUuid>"))
    (card,) = parse_smi_health(domain)
    assert card.fabric.joined and card.fabric.domain == "8cc6a1f5-2bb0-4b8c-9d5f-27b2f4d1c7a1"
    assert card.fabric.clique_id == "32766"
    single = domain.replace("8cc6a1f5-2bb0-4b8c-9d5f-27b2f4d1c7a1", "00000000-0000-0000-0000-000000000000")
    (card,) = parse_smi_health(single)
    assert card.fabric.joined and card.fabric.domain is None


@pytest.mark.parametrize("text", [
    "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "<html><body>proxy error</body></html>",
    '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>',
])
def test_text_that_is_not_nvidia_smi_xml_raises_parse_error_naming_the_tool(text):
    with pytest.raises(ParseError, match=r"^nvidia-smi -q -x: "):
        parse_smi_health(text)
