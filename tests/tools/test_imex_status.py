"""`nvidia-imex-ctl -N -j` (llmgw.tools.imex) on the hand-made files written from the documented JSON shape (no
verbatim public capture exists; tests/fixtures/hand-made/README.md): the domain, each node, and whether IMEX is up
for one node."""

from __future__ import annotations

import pytest

from llmgw.tools import ParseError, imex_ready, parse_imex_status

from fixture_files import fixture


def test_an_up_domain_of_two_nodes_is_ready_for_either():
    domain = parse_imex_status(fixture("hand-made/imex-ctl-N-j-up.json"))
    assert domain.state == "UP" and [(n.index, n.host, n.hostname, n.status) for n in domain.nodes] == [
        (0, "10.0.0.1", "gpu-node-1", "READY"), (1, "10.0.0.2", "gpu-node-2", "READY")]
    assert domain.nodes[0].connections == ((0, "10.0.0.1", "CONNECTED"), (1, "10.0.0.2", "CONNECTED"))
    assert imex_ready(domain, ["gpu-node-2"]) == (True, "") and imex_ready(domain, ["10.0.0.1"]) == (True, "")


def test_a_peer_down_makes_the_domain_down_and_each_node_says_why():
    domain = parse_imex_status(fixture("hand-made/imex-ctl-N-j-peer-down.json"))
    assert imex_ready(domain, ["gpu-node-1"]) == (False, "IMEX domain is DOWN (nvidia-imex-ctl -N)")
    up_but_cut = domain.__class__("UP", domain.nodes)
    assert imex_ready(up_but_cut, ["gpu-node-1"]) == (False, "IMEX on 10.0.0.1 is not connected to 10.0.0.2 INVALID")
    assert imex_ready(up_but_cut, ["gpu-node-2"]) == (False, "this node's IMEX daemon (10.0.0.2) is UNAVAILABLE")


@pytest.mark.parametrize("text", ["", "Connectivity Table Legend:\nI - Invalid", "[]", '{"nodes": []}',
                                  '{"nodes": {"x": {}}}', '{"nodes": {"0": 3}}'])
def test_anything_else_is_a_parse_error(text):
    with pytest.raises(ParseError):
        parse_imex_status(text)
