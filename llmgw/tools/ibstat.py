"""`ibstat` (infiniband-diags): each InfiniBand/RoCE adapter port's state, rate, link layer, LIDs and GUIDs. Pure.

Format (rdma-core infiniband-diags/ibstat.c, the printf calls in `ca_dump` and `port_dump`): a "CA 'mlx5_0'" line,
then tab-indented "CA type:", "Number of ports:", "Firmware version:", "Hardware version:", "Node GUID: 0x...",
"System image GUID:", then per port "Port 1:" with a deeper indent and "State: Active" (Down, Initializing,
Armed, Active), "Physical state: LinkUp" (Polling, Disabled, ...), "Rate: 100" (Gb/s; "Rate: 40 (FDR10)",
"Rate: 2.5"), "Base lid:", "LMC:", "SM lid:", "Capability mask:", "Port GUID:", "Link layer: InfiniBand" or
"Ethernet" (RoCE). Real captures: tests/fixtures/ibstat/README.md. A machine without the tool or adapters answers
with "command not found" or nothing (tests/fixtures/nvidia-h200/ibstat.txt): that parses as no ports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.tools.values import ParseError

_CA = re.compile(r"^CA '([^']+)'\s*$")
_PORT = re.compile(r"^\s+Port (\d+):\s*$")
_FIELD = re.compile(r"^\s+([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$")
_RATE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)")


@dataclass(frozen=True)
class IbPort:
    """One adapter port.

    `ca` "mlx5_0", `port` 1, `state` "Active" (or Down, Initializing, Armed), `rate_gbps` the signalling rate in
    Gb/s (100.0; None when unknown), `link_layer` "InfiniBand" or "Ethernet". The rest is "" / None when the
    source did not say: `physical_state` "LinkUp", `base_lid`, `sm_lid` (the master subnet manager's LID: 0 on
    RoCE), `port_guid` / `node_guid` / `system_guid` as printed ("0x248a07030049aee0"), `ca_type` "MT4123",
    `firmware` "20.31.1014".
    """

    ca: str
    port: int
    state: str
    rate_gbps: float | None
    link_layer: str
    physical_state: str = ""
    base_lid: int | None = None
    sm_lid: int | None = None
    port_guid: str = ""
    node_guid: str = ""
    system_guid: str = ""
    ca_type: str = ""
    firmware: str = ""

    @property
    def active(self) -> bool:
        """True when the port passes traffic: state Active (and, when known, physical state LinkUp)."""
        return self.state.lower() == "active" and self.physical_state.lower() in ("", "linkup")


def rate_gbps(text: str) -> float | None:
    """The leading number of a rate ("100", "40 (FDR10)", "100 Gb/sec (4X EDR)") in Gb/s; None if there is none."""
    match = _RATE.match(text.strip())
    return float(match.group(1)) if match else None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def parse_ibstat(text: str) -> tuple[IbPort, ...]:
    """Parse `ibstat` output into ports, in the order printed.

    Output without any "CA '...'" line (tool missing, no adapter, "ibpanic: ...") is `()`.
    Raises: ParseError naming the line when a CA block holds a port without a number, or a line that is neither a
    "key: value" field nor a port header (a different tool's output, or text cut mid-line).
    """
    ports: list[IbPort] = []
    ca: str | None = None
    ca_fields: dict[str, str] = {}
    port_fields: dict[str, str] | None = None

    def flush() -> None:
        if ca is None or port_fields is None:
            return
        ports.append(IbPort(
            ca=ca, port=int(port_fields["#"]), state=port_fields.get("state", ""),
            rate_gbps=rate_gbps(port_fields.get("rate", "")), link_layer=port_fields.get("link layer", ""),
            physical_state=port_fields.get("physical state", ""), base_lid=_int(port_fields.get("base lid")),
            sm_lid=_int(port_fields.get("sm lid")), port_guid=port_fields.get("port guid", ""),
            node_guid=ca_fields.get("node guid", ""), system_guid=ca_fields.get("system image guid", ""),
            ca_type=ca_fields.get("ca type", ""), firmware=ca_fields.get("firmware version", ""),
        ))

    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _CA.match(line)
        if match:
            flush()
            ca, ca_fields, port_fields = match.group(1), {}, None
            continue
        if ca is None:
            continue  # before the first adapter: a warning or "command not found"
        match = _PORT.match(line)
        if match:
            flush()
            port_fields = {"#": match.group(1)}
            continue
        match = _FIELD.match(line)
        if not match:
            raise ParseError("ibstat", "expected 'Field: value', 'Port N:' or \"CA 'name'\"", number, line)
        key, value = match.group(1).lower(), match.group(2)
        (port_fields if port_fields is not None else ca_fields)[key] = value
    flush()
    return tuple(ports)
