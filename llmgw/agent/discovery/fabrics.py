"""InfiniBand adapters and NVIDIA IMEX: what fabrics a node has. A missing tool, directory or file means "none".

Sources: sysfs `/sys/class/infiniband/<ca>/ports/<n>/{state,phys_state,rate,link_layer,lid,sm_lid}` ("4: ACTIVE",
"5: LinkUp", "100 Gb/sec (4X EDR)", "InfiniBand", "0x30"; the layout of leptonai/gpud's
components/accelerator/nvidia/infiniband/class/testdata), and the IMEX configuration directory `/etc/nvidia-imex`.
The `ibstat` parser lives in `llmgw.tools.ibstat`. The H200 capture shows how a
machine without any of them answers (shared/fixtures/nvidia-h200/ibstat.txt, ls-sys-class-infiniband.txt).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw.tools import IbPort, rate_gbps


@dataclass(frozen=True)
class Fabrics:
    """InfiniBand ports found (empty: none) and whether NVIDIA IMEX is configured."""

    infiniband: tuple[IbPort, ...] = ()
    imex: bool = False

    def to_json(self) -> dict:
        return {"infiniband": [p.__dict__ for p in self.infiniband], "imex": self.imex}


def _state_word(text: str) -> str:
    """sysfs writes "4: ACTIVE" / "5: LinkUp": the word after the number, in ibstat's capitalisation."""
    word = text.partition(":")[2].strip() or text.strip()
    return word.title() if word.isupper() else word


def _lid(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


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

            ports.append(IbPort(
                adapter.name, int(port.name), _state_word(read("state")), rate_gbps(read("rate")),
                read("link_layer"), physical_state=_state_word(read("phys_state")), base_lid=_lid(read("lid")),
                sm_lid=_lid(read("sm_lid")),
            ))
    return Fabrics(infiniband=tuple(ports), imex=(etc_root / "nvidia-imex").is_dir())


@dataclass(frozen=True)
class SysfsFabrics:
    """Where a live node's fabrics are read: sysfs under `sys_root` and IMEX's configuration under `etc_root`.
    `llmgw.agent.discovery.captured.CaptureDir` answers the same two calls from a capture directory, so the
    health reading (`llmgw.agent.health.HealthReader`) does not care which it reads."""

    sys_root: Path = Path("/sys")
    etc_root: Path = Path("/etc")

    def fabrics(self) -> Fabrics:
        """`read_fabrics(sys_root, etc_root)`. Blocking (file reads); never raises."""
        return read_fabrics(self.sys_root, self.etc_root)

    def node_guid_text(self, ca: str) -> str:
        """The adapter's sysfs `node_guid` as written ("a088:c203:004f:6000"), "" when unreadable."""
        try:
            return (self.sys_root / "class" / "infiniband" / ca / "node_guid").read_text()
        except OSError:
            return ""
