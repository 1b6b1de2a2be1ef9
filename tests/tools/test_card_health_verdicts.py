"""Per-card verdicts: the real H200 is healthy; hand-made variants of it (each named by what it changes) and real
captures of other cards give the finding they should, and only that."""

from __future__ import annotations

import pytest

from fixture_files import fixture, h200_variant, h200_xml
from llmgw.tools import (
    Level, PcieLink, card_verdict, link_gbytes, node_health, parse_pcie_bandwidth, parse_smi_health, parse_xids,
    pcie_bandwidth_findings, pcie_findings,
)

H200_BUS = "00000000:00:06.0"


def verdict(xml: str, log: str = "", **expected):
    (card,) = parse_smi_health(xml)
    return card_verdict(card, parse_xids(log), **expected)


def codes(v) -> list[str]:
    return [f.code for f in v.findings]


def test_the_real_h200_idle_and_after_load_is_ok_and_placeable():
    for path in ("nvidia-h200/nvidia-smi-q-x.xml", "nvidia-h200/nvidia-smi-q-x-after-load.xml"):
        v = verdict(fixture(path), fixture("nvidia-h200/dmesg-xid.txt"), expected_pcie_gen=5, expected_pcie_width=16)
        assert v.findings == () and v.level is Level.OK and v.placeable
        assert v.pci_bus_id == H200_BUS


# Hand-made variants of the H200 capture: (what, replacements, expected codes, level, placeable)
VARIANTS = [
    ("x8 at full generation", [("<current_link_width>16x", "<current_link_width>8x")],
     ["pcie-width"], Level.WARN, True),
    ("gen4 slot", [("<max_link_gen>5", "<max_link_gen>4"), ("<max_host_link_gen>N/A", "<max_host_link_gen>4"),
                   ("<current_link_gen>5", "<current_link_gen>4")], ["pcie-gen"], Level.WARN, True),
    ("idle at gen1, slot fine", [("<current_link_gen>5", "<current_link_gen>1")], [], Level.OK, True),
    ("idle at gen1 and x8", [("<current_link_gen>5", "<current_link_gen>1"),
                             ("<current_link_width>16x", "<current_link_width>8x")], [], Level.OK, True),
    ("remap pending", [("<remapped_row_pending>No", "<remapped_row_pending>Yes")],
     ["remap-pending"], Level.WARN, True),
    ("remap failure", [("<remapped_row_failure>No", "<remapped_row_failure>Yes")],
     ["remap-failure"], Level.FAIL, False),
    ("MIG on, nothing carved", [("<current_mig>Disabled", "<current_mig>Enabled")],
     ["mig-uncarved"], Level.WARN, False),
    ("hardware slowdown", [("<clocks_event_reason_hw_slowdown>Not Active",
                            "<clocks_event_reason_hw_slowdown>Active")], ["clock-slowdown"], Level.WARN, True),
    ("fabric not joined", [("<state>N/A</state>", "<state>In Progress</state>"),
                           ("<status>N/A</status>", "<status>N/A</status>")], ["fabric-unjoined"], Level.WARN, True),
]


@pytest.mark.parametrize("what, replacements, expected, level, placeable", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_each_hand_made_h200_variant_gives_its_finding(what, replacements, expected, level, placeable):
    v = verdict(h200_variant(*replacements))
    assert codes(v) == expected and v.level is level and v.placeable is placeable
    for finding in v.findings:
        assert finding.source and finding.message


def test_x8_message_gives_the_bandwidth_carried_and_points_at_lspci():
    (finding,) = verdict(h200_variant(("<current_link_width>16x", "<current_link_width>8x"))).findings
    assert "x8 of x16" in finding.message and "31.5 GB/s of 63 GB/s" in finding.message
    assert "LnkCap" in finding.message and "LnkSta" in finding.message and "00:06.0" in finding.message


def test_a_gen5_card_in_a_gen4_slot_carries_half():
    v = verdict(h200_variant(("<max_host_link_gen>N/A", "<max_host_link_gen>4")))
    (finding,) = v.findings
    assert "supports gen 5 but the slot allows gen 4" in finding.message
    assert "31.5 GB/s of 63 GB/s" in finding.message


def test_an_expected_gen_and_width_above_what_card_and_slot_allow_warn():
    v = verdict(h200_xml(), expected_pcie_gen=6, expected_pcie_width=32)
    assert codes(v) == ["pcie-gen", "pcie-width"]


@pytest.mark.parametrize("log, xid, level, placeable", [
    ("[ 12.3] NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     79, Level.FAIL, False),
    ("[ 12.3] NVRM: Xid (PCI:0000:00:06): 48, pid=7, name=vllm, An uncorrectable double bit error", 48, Level.FAIL,
     False),
    ("[ 12.3] NVRM: Xid (PCI:0000:00:06): 95, pid=7, name=vllm, Uncontained: FBHUB.", 95, Level.FAIL, False),
    ("[ 12.3] NVRM: Xid (PCI:0000:00:06): 94, pid=7, name=vllm, Contained: SM (0x1).", 94, Level.WARN, True),
    ("[ 12.3] NVRM: Xid (PCI:0000:00:06): 13, pid=7, name=python, Graphics SM Warp Exception", 13, Level.WARN,
     True),
    ("[ 12.3] NVRM: Xid (PCI:0000:00:06): 63, pid=7, Row Remapper: New row marked for remapping", None, Level.OK,
     True),
])
def test_xids_of_the_card_judge_it_by_the_catalog(log, xid, level, placeable):
    v = verdict(h200_xml(), log)
    assert v.level is level and v.placeable is placeable
    if xid is not None:
        (finding,) = v.findings
        assert finding.code == "xid" and finding.message.startswith(f"Xid {xid}") and log in finding.source


def test_xids_of_another_pci_address_do_not_touch_this_card_but_are_reported_for_the_node():
    cards = parse_smi_health(h200_xml())
    log = fixture("hand-made/kernel-log-journalctl.txt")
    health = node_health(cards, parse_xids(log))
    assert health.cards[0].findings == ()
    fallen = [f for f in health.unattributed if "Xid 79" in f.message]
    assert fallen and fallen[0].message.startswith("00000000:5D:00.0: ") and fallen[0].blocks_placement
    assert health.level is Level.FAIL


def test_repeated_xids_give_one_finding_with_a_count():
    events = fixture("gpud/dmesg-T-xid-119.log").replace("PCI:0000:9b:00", "PCI:0000:00:06")
    (finding,) = verdict(h200_xml(), events).findings
    assert finding.message.startswith("Xid 119 (5 times), GSP RPC Timeout") and finding.level is Level.FAIL


@pytest.mark.parametrize("path, expected", [
    ("telegraf/a100-sxm4-v12.xml", []),               # MIG with 4 instances carved
    ("telegraf/a10g.xml", []),                        # gen1 x8 at idle of gen4 x16: no judgement at idle
    ("telegraf/rtx-4000-sff-ada-v13.xml", []),
    ("telegraf/tesla-t4.xml", ["pcie-width"]),        # at its full gen3 on 8 of 16 lanes
])
def test_real_captures_of_other_cards(path, expected):
    (card,) = parse_smi_health(fixture(path))
    assert codes(card_verdict(card)) == expected


@pytest.mark.parametrize("gen, lanes, gbytes", [(5, 16, 63.0), (4, 16, 31.5), (3, 8, 7.9), (6, 16, 121.0),
                                                (None, 16, None), (7, 16, None)])
def test_link_bandwidth_per_direction(gen, lanes, gbytes):
    assert link_gbytes(gen, lanes) == gbytes


def test_unknown_link_values_give_no_finding():
    assert pcie_findings(PcieLink()) == ()
    assert pcie_findings(PcieLink(gen_current=1, width_current=16)) == ()


def test_the_kernel_names_h100s_behind_a_gen4_switch():
    notes = parse_pcie_bandwidth(fixture("ml-engineering/dmesg-pcie-limited-by.txt"))
    assert [(n.pci_bus_id, n.gen, n.capable_gen, n.limited_at) for n in notes] == [
        ("00000000:04:00.0", 4, 5, "0000:01:00.0"), ("00000000:8B:00.0", 4, 5, "0000:87:00.0")]
    (finding,) = pcie_bandwidth_findings(notes[:1])
    assert "252.048 Gb/s available of 504.112 Gb/s" in finding.message and "gen 4 instead of gen 5" in finding.message
    assert "0000:01:00.0" in finding.message and finding.source.startswith("kernel log: [   10.735323] pci")


def test_a_kernel_note_for_this_card_warns_even_while_the_card_idles():
    log = ("[    9.1] pci 0000:00:06.0: 126.024 Gb/s available PCIe bandwidth, limited by 8.0 GT/s PCIe x16 link "
           "at 0000:00:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)\n"
           "[    9.2] pci 0000:00:07.0: 252.048 Gb/s available PCIe bandwidth (16.0 GT/s PCIe x16 link)\n")
    (card,) = parse_smi_health(h200_variant(("<current_link_gen>5", "<current_link_gen>1")))
    v = card_verdict(card, pcie_notes=parse_pcie_bandwidth(log))
    assert codes(v) == ["pcie-limited"] and "gen 3 instead of gen 5" in v.findings[0].message
    assert node_health([card], pcie_notes=parse_pcie_bandwidth(log)).cards[0].level is Level.WARN


def test_a_card_that_itself_allows_less_than_expected_is_told_apart_from_a_slow_slot():
    (finding, _) = verdict(h200_xml(), expected_pcie_gen=6, expected_pcie_width=32).findings
    assert "should run at gen 6 but itself allows only gen 5" in finding.message
