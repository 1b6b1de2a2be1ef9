"""NVLink judgements: inactive links and error counters per card, and whether a node's cards form part of one
multi-node NVLink domain (hand-made fabric variants of the real H200 capture; real nvlink captures)."""

from __future__ import annotations

from fixture_files import fixture, h200_variant, h200_xml
from llmgw.tools import (
    Level, nvlink_domain, nvlink_findings, parse_nvlink_errors, parse_nvlink_status, parse_smi_health,
)

UUID = "8cc6a1f5-2bb0-4b8c-9d5f-27b2f4d1c7a1"
ZEROS = "00000000-0000-0000-0000-000000000000"


def fabric(state: str, status: str, uuid: str, clique: str = "32766"):
    (card,) = parse_smi_health(h200_variant(
        ("<state>N/A</state>", f"<state>{state}</state>"), ("<status>N/A</status>", f"<status>{status}</status>"),
        ("<cliqueId>N/A</cliqueId>", f"<cliqueId>{clique}</cliqueId>"),
        ("<clusterUuid>N/A</clusterUuid>", f"<clusterUuid>{uuid}</clusterUuid>")))
    return card


def renumber(card, index: int):
    return card.__class__(**{**card.__dict__, "index": index})


def test_healthy_links_of_real_captures_give_no_finding():
    for status in parse_nvlink_status(fixture("gpud/nvlink-s-8xa100.txt")):
        assert nvlink_findings(status) == ()
    (errors,) = parse_nvlink_errors(fixture("ml-engineering/nvlink-e-h100-excerpt.txt"))
    assert nvlink_findings(None, errors) == ()
    assert parse_nvlink_status(fixture("nvidia-h200/nvidia-smi-nvlink-s.txt")) == ()


def test_an_inactive_link_among_active_ones_and_counted_errors_warn():
    text = fixture("gpud/nvlink-s-8xa100.txt").replace("Link 5: 25 GB/s", "Link 5: <inactive>", 1)
    status = parse_nvlink_status(text)[0]
    errors = parse_nvlink_errors(fixture("ml-engineering/nvlink-e-h100-excerpt.txt").replace(
        "Link 1: Replay Errors: 0", "Link 1: Replay Errors: 17"))[0]
    inactive, noisy = nvlink_findings(status, errors)
    assert inactive.code == "nvlink-inactive" and "NVLink 5 of GPU 0 inactive while 11 are up" in inactive.message
    assert noisy.code == "nvlink-errors" and "link 1: Replay Errors 17" in noisy.message
    assert {inactive.level, noisy.level} == {Level.WARN}


def test_eight_joined_cards_with_one_cluster_uuid_are_in_that_domain():
    card = fabric("Completed", "Success", UUID)
    membership = nvlink_domain([renumber(card, i) for i in range(8)])
    assert membership.domain == UUID and membership.reason == "" and membership.clique_ids == ("32766",) * 8


def test_a_single_machine_nvswitch_is_no_domain():
    card = fabric("Completed", "Success", ZEROS, clique="0")
    membership = nvlink_domain([renumber(card, i) for i in range(8)])
    assert membership.domain is None and "single-machine NVSwitch" in membership.reason


def test_an_unjoined_card_takes_the_node_out_of_the_domain_with_its_index():
    joined = fabric("Completed", "Success", UUID)
    pending = renumber(fabric("In Progress", "N/A", ZEROS), 3)
    membership = nvlink_domain([joined, pending])
    assert membership.domain is None and membership.unjoined == (3,) and "GPU 3 not joined" in membership.reason


def test_cards_without_any_fabric_are_no_domain_and_no_complaint():
    (card,) = parse_smi_health(h200_xml())
    assert nvlink_domain([card]).domain is None
    assert nvlink_domain([]).reason == "no card reports an NVLink fabric"


def test_cards_that_disagree_on_the_cluster_are_no_domain():
    other = renumber(fabric("Completed", "Success", UUID.replace("8cc6", "9dd7")), 1)
    membership = nvlink_domain([fabric("Completed", "Success", UUID), other])
    assert membership.domain is None and "different ClusterUUIDs" in membership.reason
