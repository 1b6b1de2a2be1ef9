"""InfiniBand adapters and NVIDIA IMEX: what fabrics a node has. A missing tool, directory or file means "none".

Sources: sysfs `/sys/class/infiniband/<ca>/ports/<n>/{state,rate,link_layer}` ("4: ACTIVE", "100 Gb/sec (4X EDR)",
"InfiniBand"), the `ibstat` text format (FORMATS.md: "CA 'mlx5_0'" / "Port 1:" / "State: Active" / "Rate: 100" /
"Link layer: InfiniBand"), and the IMEX configuration directory `/etc/nvidia-imex`. The H200 capture shows how a
machine without any of them answers (shared/fixtures/nvidia-h200/ibstat.txt, ls-sys-class-infiniband.txt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class IbPort:
    """One adapter port: `ca` "mlx5_0", `port` 1, `state` "Active", `rate_gbps` (None if unknown), `link_layer`."""

    ca: str
    port: int
    state: str
    rate_gbps: float | None
    link_layer: str


@dataclass(frozen=True)
class Fabrics:
    """InfiniBand ports found (empty: none) and whether NVIDIA IMEX is configured."""

    infiniband: tuple[IbPort, ...] = ()
    imex: bool = False

    def to_json(self) -> dict:
        return {"infiniband": [p.__dict__ for p in self.infiniband], "imex": self.imex}


def _rate(text: str) -> float | None:
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", text)
    return float(match.group(1)) if match else None


def parse_ibstat(text: str) -> tuple[IbPort, ...]:
    """Parse `ibstat` output into ports; output without "CA '...'" blocks (command not found, no adapter) is ()."""
    ports: list[IbPort] = []
    ca = None
    current: dict[str, str] | None = None

    def flush() -> None:
        if ca is not None and current is not None and "port" in current:
            ports.append(IbPort(ca, int(current["port"]), current.get("state", ""),
                                _rate(current.get("rate", "")), current.get("link layer", "")))

    for line in text.splitlines():
        match = re.match(r"^CA '([^']+)'", line)
        if match:
            flush()
            ca, current = match.group(1), None
            continue
        match = re.match(r"^\s+Port (\d+):\s*$", line)
        if match and ca is not None:
            flush()
            current = {"port": match.group(1)}
            continue
        key, sep, value = line.strip().partition(":")
        if sep and current is not None:
            current[key.strip().lower()] = value.strip()
    flush()
    return tuple(ports)


def read_fabrics(sys_root: Path = Path("/sys"), etc_root: Path = Path("/etc")) -> Fabrics:
    """Read InfiniBand ports from sysfs and look for IMEX's configuration. Never raises; absent means none."""
    ports: list[IbPort] = []
    base = sys_root / "class" / "infiniband"
    try:
        adapters = sorted(p for p in base.iterdir())
    except OSError:
        adapters = []
    for adapter in adapters:
        try:
            port_dirs = sorted((adapter / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        for port in port_dirs:
            if not port.name.isdigit():
                continue

            def read(name: str, port: Path = port) -> str:
                try:
                    return (port / name).read_text().strip()
                except OSError:
                    return ""

            state = read("state").partition(":")[2].strip().title() or read("state")
            ports.append(IbPort(adapter.name, int(port.name), state, _rate(read("rate")), read("link_layer")))
    return Fabrics(infiniband=tuple(ports), imex=(etc_root / "nvidia-imex").is_dir())
