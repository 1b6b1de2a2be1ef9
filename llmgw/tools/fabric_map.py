"""What an `ibnetdiscover` map means for placement: the switch tiers, and the leaf switch each adapter port is cabled
to, so a replica spread over nodes can keep every node's Nth adapter under the same leaf (rails aligned). Pure; the
map is `llmgw.tools.parse_ibnetdiscover`'s.

Tiers: a leaf is a switch cabled to at least one adapter (Ca); a spine is a switch cabled to a leaf and to no
adapter; every other switch (cabled only to spines or other non-leaves) is core. This is the fat-tree reading of the
topology (NVIDIA's DGX SuperPOD reference architectures: rail-optimised leaves under spines under cores); a switch
that is both (adapters and other leaves) counts as a leaf.
"""

from __future__ import annotations

from llmgw.tools.ibnetdiscover import IbFabricMap


def switch_tiers(fabric: IbFabricMap) -> dict[str, str]:
    """{switch GUID: "leaf" | "spine" | "core"} for every switch of the map (16 hex digits, lower case)."""
    kinds = {n.guid: n.kind for n in fabric.nodes}
    switches = [n.guid for n in fabric.switches]
    peers: dict[str, set[str]] = {guid: set() for guid in switches}
    for link in fabric.links:
        if link.guid in peers:
            peers[link.guid].add(link.peer_guid)
        if link.peer_guid in peers:
            peers[link.peer_guid].add(link.guid)
    leaves = {s for s in switches if any(kinds.get(p) == "ca" for p in peers[s])}
    tiers = {}
    for guid in switches:
        if guid in leaves:
            tiers[guid] = "leaf"
        elif peers[guid] & leaves:
            tiers[guid] = "spine"
        else:
            tiers[guid] = "core"
    return tiers


def adapter_leaves(fabric: IbFabricMap) -> dict[tuple[str, int], str]:
    """{(adapter node GUID, port): GUID of the leaf switch that port is cabled to}, for every adapter port the map
    shows cabled to a switch (an adapter cabled straight to another adapter has no leaf). GUIDs are 16 lower-case
    hex digits, as sysfs's `node_guid` ("1070:fd03:00c0:0001") reads once its colons are dropped."""
    kinds = {n.guid: n.kind for n in fabric.nodes}
    out = {}
    for link in fabric.links:
        if kinds.get(link.guid) == "ca" and kinds.get(link.peer_guid) == "switch":
            out[(link.guid, link.port)] = link.peer_guid
        elif kinds.get(link.guid) == "switch" and kinds.get(link.peer_guid) == "ca":
            out.setdefault((link.peer_guid, link.peer_port), link.guid)
    return out


def node_guid(sysfs_text: str) -> str:
    """sysfs's `node_guid` ("1070:fd03:00c0:0001\\n") as a map's GUID ("1070fd0300c00001"); "" when not 16 hex
    digits."""
    digits = sysfs_text.strip().replace(":", "").lower()
    return digits if len(digits) == 16 and all(c in "0123456789abcdef" for c in digits) else ""
