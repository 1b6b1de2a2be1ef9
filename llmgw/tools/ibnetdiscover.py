"""`ibnetdiscover` (infiniband-diags): the map of an InfiniBand fabric, switches, adapters and the cables between
them. Pure parser; what the map means (switch tiers, rails) is decided by its callers.

Format (rdma-core infiniband-diags/ibnetdiscover.c, `out_switch`, `out_ca`, `out_switch_port`, `out_ca_port`;
the documented example in infiniband-diags/man/common/sec_topology-file.rst): "#" comment lines, then one block per
node: "vendid=0x2c9", "devid=0xb924", "sysimgguid=0x...", "switchguid=0x...(portguid)" or "caguid=0x..." /
"rtguid=0x...", then the node line

    Switch  24 "S-005442ba00003080"   # "ISR9024 Voltaire" base port 0 lid 6 lmc 0
    Ca      2 "H-0008f10403960984"    # "MT23108 InfiniHost Mellanox Technologies"

and one line per connected port, a switch's

    [22]    "H-0008f10403961354"[1](8f10403961355)   # "MT23108 InfiniHost ..." lid 4 4xSDR

or an adapter's (its own port GUID in parentheses after the port number, then its LID and LMC)

    [1](8f10403960985)  "S-0008f10400410015"[6]      # lid 16 lmc 1 "SW-6IB4 Voltaire" lid 3 4xSDR

Node names are the type letter and the 16-digit GUID ("S-", "H-", "R-"); GUIDs in parentheses are not zero-padded.
The link's width and speed are one token, "4xEDR" ("1x", "2x", "4x", "8x", "12x"; SDR DDR QDR FDR10 FDR EDR HDR NDR
XDR, "???" when unknown): a degraded cable shows only there ("1xSDR" beside "4xSDR" in the example). With `-g`,
"Chassis", "Non-Chassis Nodes", "Hostname:" and "[ext N]" appear; with `-f`, " s=.. w=.. v=.." is appended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.tools import values
from llmgw.tools.values import ParseError

# Data rate per lane in Gb/s, as `ibstat`'s Rate counts it (4x EDR = 100).
LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0, "HDR": 50.0,
             "NDR": 100.0, "XDR": 200.0}

_NODE = re.compile(r'^(?P<kind>Switch|Ca|Rt)\s+(?P<ports>[0-9]+)\s+"(?P<name>[A-Za-z?]+-[0-9a-fA-F]+)"'
                   r'\s*#\s*"(?P<desc>.*?)"'
                   r'(?:\s+(?P<port0>base|enhanced) port 0 lid (?P<lid>[0-9]+) lmc [0-9]+)?')
_LINK = re.compile(
    r'^\[(?P<port>[0-9]+)\](?:\[ext [0-9]+\])?(?:\((?P<portguid>[0-9a-fA-F]+)\))?\s*'
    r'"(?P<peer>[A-Za-z?]+-[0-9a-fA-F]+)"\[(?P<peerport>[0-9]+)\](?:\[ext [0-9]+\])?\s*'
    r'(?:\((?P<peerguid>[0-9a-fA-F]+)\))?\s*#\s*(?:lid (?P<lid>[0-9]+) lmc [0-9]+\s+)?'
    r'"(?P<desc>.*)"\s+lid (?P<peerlid>[0-9]+)\s+(?P<width>[0-9]+x)(?P<speed>[A-Za-z0-9?]+)')
_ID = re.compile(r"^(?P<key>vendid|devid|sysimgguid|switchguid|caguid|rtguid)=(?P<value>0x[0-9a-fA-F]+)")
_SKIP = re.compile(r"^(#|Non-Chassis Nodes|Chassis\b|Hostname:)")


@dataclass(frozen=True)
class IbNode:
    """One node: `kind` "switch", "ca" or "router"; `guid` 16 lower-case hex digits; `ports` the port count;
    `description` its NodeDescription ("MT4123 ConnectX6 Mellanox Technologies", or the host name and adapter,
    "node01 mlx5_0", on hosts that set it); `lid` a switch's port-0 LID (None for adapters); `system_guid` its
    system image GUID ("" when not printed): the adapters of one host often share it."""

    kind: str
    guid: str
    ports: int
    description: str
    lid: int | None = None
    system_guid: str = ""


@dataclass(frozen=True)
class IbLink:
    """One connected port, seen from `guid`'s side: `port` to `peer_guid`'s `peer_port`. `width` "4x", `speed`
    "EDR" as printed; `peer_lid` the peer's LID (a switch's port-0 LID); `peer_description`. Each cable appears
    twice in a map, once from each end."""

    guid: str
    port: int
    peer_guid: str
    peer_port: int
    width: str
    speed: str
    peer_lid: int | None = None
    peer_description: str = ""

    @property
    def lanes(self) -> int | None:
        """4 for "4x"; None when the width is unreadable."""
        return values.integer(self.width.rstrip("x"))

    @property
    def rate_gbps(self) -> float | None:
        """Lanes times the lane rate (4xHDR = 200.0); None for an unknown speed ("???")."""
        lane = LANE_GBPS.get(self.speed.upper())
        return lane * self.lanes if lane is not None and self.lanes is not None else None


@dataclass(frozen=True)
class IbFabricMap:
    """What one `ibnetdiscover` run saw: nodes in printed order, and every port line as a link."""

    nodes: tuple[IbNode, ...] = ()
    links: tuple[IbLink, ...] = ()

    def node(self, guid: str) -> IbNode | None:
        """The node with this GUID ("0x5442ba00003080", any zero padding, either case), or None (also for text
        that is not a GUID)."""
        want = _guid_or_none(guid)
        return next((n for n in self.nodes if n.guid == want), None)

    def links_of(self, guid: str) -> tuple[IbLink, ...]:
        """The links printed under node `guid`, in port order as printed; () for an unknown GUID."""
        want = _guid_or_none(guid)
        return tuple(link for link in self.links if link.guid == want)

    @property
    def switches(self) -> tuple[IbNode, ...]:
        return tuple(n for n in self.nodes if n.kind == "switch")

    @property
    def adapters(self) -> tuple[IbNode, ...]:
        return tuple(n for n in self.nodes if n.kind == "ca")


def _guid(text: str) -> str:
    """16 lower-case hex digits from "S-0008f1...", "0x8f1..." or "8f1..." (the callers' regexes admit only hex)."""
    return f"{int(text.split('-')[-1], 16):016x}"


def _guid_or_none(text: str) -> str | None:
    try:
        return _guid(text)
    except ValueError:
        return None


_KINDS = {"Switch": "switch", "Ca": "ca", "Rt": "router"}


def parse_ibnetdiscover(text: str) -> IbFabricMap:
    """Parse `ibnetdiscover` output (with or without `-g`, `-f`). Empty output gives an empty map.

    Raises: ParseError naming the line when a line is none of the forms above, or a port line comes before any
    node line.
    """
    nodes: list[IbNode] = []
    links: list[IbLink] = []
    current: str | None = None
    system_guid = ""
    for number, raw in enumerate(values.command_body(text).splitlines(), 1):
        line = raw.strip()
        if not line or _SKIP.match(line):
            continue
        match = _ID.match(line)
        if match:
            if match.group("key") == "vendid":
                system_guid = ""
            elif match.group("key") == "sysimgguid":
                system_guid = _guid(match.group("value"))
            continue
        match = _NODE.match(line)
        if match:
            current = _guid(match.group("name"))
            lid = match.group("lid")
            nodes.append(IbNode(_KINDS[match.group("kind")], current, int(match.group("ports")),
                                match.group("desc"), int(lid) if lid is not None else None, system_guid))
            continue
        match = _LINK.match(line)
        if match:
            if current is None:
                raise ParseError("ibnetdiscover", "a port line before any Switch/Ca line", number, raw)
            links.append(IbLink(current, int(match.group("port")), _guid(match.group("peer")),
                                int(match.group("peerport")), match.group("width"), match.group("speed"),
                                int(match.group("peerlid")), match.group("desc")))
            continue
        raise ParseError("ibnetdiscover", "not a node, port, id or comment line", number, raw)
    return IbFabricMap(tuple(nodes), tuple(links))
