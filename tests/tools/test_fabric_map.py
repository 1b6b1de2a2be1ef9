"""What an ibnetdiscover map means for placement (llmgw.tools.fabric_map): switch tiers and each adapter port's
leaf, on the hand-made two-leaf HDR fabric and on ibnetdiscover's manual example."""

from __future__ import annotations

from llmgw.tools import adapter_leaves, node_guid, parse_ibnetdiscover, switch_tiers

from fixture_files import fixture

SPINE, LEAF_A, LEAF_B = "b8599f0300a00001", "b8599f0300a000a0", "b8599f0300a000b0"


def test_two_leaves_under_one_spine_with_each_nodes_rails_on_their_own_leaf():
    fabric = parse_ibnetdiscover(fixture("hand-made/ibnetdiscover-two-leaves-hdr.txt"))
    assert switch_tiers(fabric) == {SPINE: "spine", LEAF_A: "leaf", LEAF_B: "leaf"}
    assert adapter_leaves(fabric) == {("1070fd0300c00001", 1): LEAF_A, ("1070fd0300c00002", 1): LEAF_B,
                                      ("1070fd0300c00003", 1): LEAF_A, ("1070fd0300c00004", 1): LEAF_B}


def test_the_manual_examples_switches_all_carry_adapters_so_all_are_leaves():
    fabric = parse_ibnetdiscover(fixture("infiniband-diags/ibnetdiscover-manpage-example.txt"))
    tiers = switch_tiers(fabric)
    assert set(tiers) == {s.guid for s in fabric.switches}
    leaves = adapter_leaves(fabric)
    assert leaves and set(leaves.values()) <= {g for g, tier in tiers.items() if tier == "leaf"}
    assert {guid for guid, _ in leaves} == {a.guid for a in fabric.adapters}


def test_sysfs_node_guids_read_as_map_guids():
    assert node_guid("1070:fd03:00c0:0001\n") == "1070fd0300c00001"
    assert node_guid("") == "" and node_guid("zz70:fd03:00c0:0001") == ""
