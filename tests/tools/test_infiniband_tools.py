"""ibstat, sminfo, saquery SMIR and ibnetdiscover on real captures and hand-made variants (tests/fixtures/README.md)."""

from __future__ import annotations

import pytest

from fixture_files import fixture
from llmgw.tools import (
    ParseError, fabric_id, parse_ibnetdiscover, parse_ibstat, parse_saquery_smir, parse_sminfo,
)


def test_a_machine_without_infiniband_has_no_ports():
    assert parse_ibstat(fixture("nvidia-h200/ibstat.txt")) == ()
    assert parse_ibstat("ibpanic: [2137592] main: stat of IB device 'mthca0' failed: No such file or directory") == ()


def test_a_port_without_subnet_manager_is_linkup_but_not_active():
    (port,) = parse_ibstat(fixture("infiniband-diags/ibstat-connectx4-initializing.txt"))
    assert (port.ca, port.port, port.state, port.physical_state) == ("mlx5_0", 1, "Initializing", "LinkUp")
    assert (port.rate_gbps, port.base_lid, port.sm_lid, port.link_layer) == (100.0, 65535, 0, "InfiniBand")
    assert port.node_guid == "0x248a07030049aee0" and port.firmware == "12.20.1010" and not port.active


def test_eight_rails_with_one_down():
    ports = parse_ibstat(fixture("hand-made/ibstat-8-rails-one-down.txt"))
    assert [p.ca for p in ports] == [f"mlx5_{i}" for i in range(8)]
    assert [p.ca for p in ports if not p.active] == ["mlx5_3"]
    assert {p.rate_gbps for p in ports if p.active} == {400.0} and ports[0].ca_type == "MT4129"


def test_roce_fdr10_and_a_disabled_second_port():
    ports = parse_ibstat(fixture("hand-made/ibstat-roce.txt"))
    assert [(p.ca, p.port, p.link_layer, p.rate_gbps, p.active) for p in ports] == [
        ("mlx5_0", 1, "Ethernet", 100.0, True), ("mlx5_1", 1, "InfiniBand", 40.0, True),
        ("mlx5_1", 2, "InfiniBand", 2.5, False)]


def test_ibstat_text_out_of_format_raises_parse_error_naming_the_line():
    with pytest.raises(ParseError, match=r"ibstat: .*line 2"):
        parse_ibstat("CA 'mlx5_0'\n\tthis line has no colon\n")


def test_sminfo_gives_the_master_and_fails_loudly_without_one():
    master = parse_sminfo(fixture("hand-made/sminfo-master.txt"))
    assert (master.lid, master.guid, master.priority, master.state_name) == (15, "0010e0406d5aa0a0", 14, "master")
    standby = parse_sminfo(fixture("hand-made/sminfo-standby.txt"))
    assert standby.state_name == "standby" and not standby.is_master
    with pytest.raises(ParseError, match="ibwarn"):
        parse_sminfo(fixture("hand-made/sminfo-failed.txt"))
    with pytest.raises(ParseError, match="sminfo"):
        parse_sminfo(fixture("nvidia-h200/sminfo.txt"))


def test_saquery_lists_every_sm_and_the_fabric_keeps_its_name_across_a_failover():
    managers = parse_saquery_smir(fixture("hand-made/saquery-smir-two-sms.txt"))
    assert [(m.lid, m.state_name) for m in managers] == [(15, "master"), (16, "standby")]
    failed_over = [m.__class__(m.lid, m.guid, m.activity_count, m.priority, 3 if m.lid == 16 else 2)
                   for m in managers]
    assert fabric_id(managers) == fabric_id(failed_over) == "0010e0406d5aa0a0"
    assert fabric_id([]) is None and parse_saquery_smir("") == ()


def test_a_saquery_record_without_its_state_raises():
    text = fixture("hand-made/saquery-smir-two-sms.txt").replace("SMState...............2", "")
    with pytest.raises(ParseError, match="lacks smstate"):
        parse_saquery_smir(text)


def test_the_manual_example_map_has_its_nodes_links_and_its_1x_cable():
    fabric = parse_ibnetdiscover(fixture("infiniband-diags/ibnetdiscover-manpage-example.txt"))
    assert [n.kind for n in fabric.nodes] == ["switch", "switch", "ca", "ca", "ca", "ca"]
    assert fabric.node("0x5442ba00003080").lid == 6 and fabric.node("8f10400410015").ports == 8
    assert len(fabric.links) == 14
    slow = [(link.guid, link.port, link.width + link.speed, link.rate_gbps) for link in fabric.links
            if link.rate_gbps < 10]
    assert slow == [("0008f10400410015", 1, "1xSDR", 2.5), ("0008f10403960558", 1, "1xSDR", 2.5)]


def test_a_two_leaf_hdr_map_says_which_adapter_hangs_off_which_leaf():
    fabric = parse_ibnetdiscover(fixture("hand-made/ibnetdiscover-two-leaves-hdr.txt"))
    assert len(fabric.switches) == 3 and len(fabric.adapters) == 4
    leaf_of = {fabric.node(a.guid).description: fabric.node(fabric.links_of(a.guid)[0].peer_guid).description
               for a in fabric.adapters}
    assert leaf_of == {"node01 mlx5_0": "leaf-a", "node02 mlx5_0": "leaf-a",
                       "node01 mlx5_1": "leaf-b", "node02 mlx5_1": "leaf-b"}
    degraded = {(link.guid, link.width, link.rate_gbps) for link in fabric.links if link.rate_gbps < 200}
    assert degraded == {("b8599f0300a000b0", "2x", 100.0), ("1070fd0300c00004", "2x", 100.0)}
    node01 = [a for a in fabric.adapters if a.description.startswith("node01")]
    assert {a.system_guid for a in node01} == {"1070fd0300c00000"}


@pytest.mark.parametrize("text", ['[1]\t"S-0001"[2]\t\t# "x" lid 1 4xEDR', "Switch 24 garbage"])
def test_ibnetdiscover_lines_out_of_format_raise(text):
    with pytest.raises(ParseError, match="ibnetdiscover"):
        parse_ibnetdiscover(text)
