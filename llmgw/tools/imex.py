"""`nvidia-imex-ctl -N -j` (NVIDIA IMEX, the service that shares GPU memory over a multi-node NVLink domain): the
state of the IMEX domain and of each node's daemon and connections. Pure.

Format: JSON, `{"nodes": {"<index>": {"status": "READY" | "UNAVAILABLE" | ..., "host": "<IP>", "hostName": "<name>"
(with -H), "version": "<driver>", "connections": {"<index>": {"host": "<IP>", "status": "CONNECTED" | "INVALID" |
...}}}}, "timestamp": "...", "status": "UP" | "DOWN"}`. No verbatim public capture was found: the shape is the one
quoted in NVIDIA/ai-cloud-validation's imex_domain_test.py (commit 505d262b, "confirmed against a live single-node UP
domain and a live 2-node DOWN domain"), and the `-N`, `-j`, `-H` flags are those of NVIDIA's IMEX guide
(docs.nvidia.com/multi-node-nvlink-systems/imex-guide/cmdservice.html). The hand-made files
tests/fixtures/hand-made/imex-ctl-N-j-*.json are written from it. Peers whose daemon is down are listed from the
node configuration with status UNAVAILABLE and every connection INVALID.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.tools import values
from llmgw.tools.values import ParseError


@dataclass(frozen=True)
class ImexNode:
    """One configured node: `index` in the node configuration, `host` its IP, `hostname` ("" without -H), `status`
    its daemon's ("READY"), `version` the driver's, `connections` ((peer index, peer host, status), ...)."""

    index: int
    host: str
    hostname: str = ""
    status: str = ""
    version: str = ""
    connections: tuple[tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class ImexDomain:
    """The IMEX domain as one node's daemon sees it: `state` "UP" / "DOWN" (as printed), `nodes` by index."""

    state: str
    nodes: tuple[ImexNode, ...] = ()

    def node(self, names: Iterable[str]) -> ImexNode | None:
        """The node whose host or host name is one of `names`, or None."""
        wanted = {n for n in names if n}
        return next((n for n in self.nodes if n.host in wanted or (n.hostname and n.hostname in wanted)), None)


def _index(key: str) -> int:
    value = values.integer(key)
    if value is None:
        raise ParseError("nvidia-imex-ctl -N -j", f"node key {key!r} is not a number")
    return value


def parse_imex_status(text: str) -> ImexDomain:
    """Parse `nvidia-imex-ctl -N -j` output (a capture's "# $ ..." frame tolerated).

    Raises: ParseError when the text is not JSON, not an object, or a node is not shaped as above.
    """
    body = values.command_body(text).strip()
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise ParseError("nvidia-imex-ctl -N -j", f"not JSON ({exc})", 0, body) from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes", {}), dict):
        raise ParseError("nvidia-imex-ctl -N -j", "expected an object with a `nodes` object")
    nodes = []
    for key, node in data.get("nodes", {}).items():
        if not isinstance(node, dict):
            raise ParseError("nvidia-imex-ctl -N -j", f"node {key!r} is not an object")
        connections = node.get("connections") or {}
        if not isinstance(connections, dict):
            raise ParseError("nvidia-imex-ctl -N -j", f"node {key!r}: `connections` is not an object")
        links = tuple(sorted((_index(k), str(c.get("host", "")), str(c.get("status", "")))
                             for k, c in connections.items() if isinstance(c, dict)))
        nodes.append(ImexNode(_index(key), str(node.get("host", "")), str(node.get("hostName", "")),
                              str(node.get("status", "")), str(node.get("version", "")), links))
    return ImexDomain(str(data.get("status", "")), tuple(sorted(nodes, key=lambda n: n.index)))


def imex_ready(domain: ImexDomain, own_names: Iterable[str]) -> tuple[bool, str]:
    """(whether IMEX is up for this node, why not): the domain is UP, this node's daemon (matched by host or host
    name among `own_names`) is READY and connected to every other configured node. When no node matches, the
    domain's state alone decides. The reason names the node and peers at fault ("" when ready)."""
    if domain.state.upper() != "UP":
        return False, f"IMEX domain is {domain.state or 'in an unknown state'} (nvidia-imex-ctl -N)"
    own = domain.node(own_names)
    if own is None:
        return True, ""
    if own.status.upper() != "READY":
        return False, f"this node's IMEX daemon ({own.host}) is {own.status or 'in an unknown state'}"
    down = [f"{host or index} {status}" for index, host, status in own.connections
            if index != own.index and status.upper() != "CONNECTED"]
    if down:
        return False, f"IMEX on {own.host} is not connected to {', '.join(down)}"
    return True, ""
