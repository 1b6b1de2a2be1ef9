"""The agent's machine-room sensors: hwmon temperatures and RAPL package power, read from sysfs with each reading.

`SysfsSensors(root).read(seconds)` walks `root/sys/class/hwmon/*` and `root/sys/class/powercap/intel-rapl:*`,
hands the files' text to `llmgw.tools.sensors` and returns a `NodeSensors`. Power is the energy used since the
previous `read()` over the seconds between them, so the first read has none (absent, never 0). A file that cannot
be read (missing, or `energy_uj` kept for root on recent kernels) leaves its value absent; a machine without these
trees (a VM) measures nothing. Blocking but cheap (tens of small files).
"""

from __future__ import annotations

from pathlib import Path

from llmgw.tools.sensors import (
    HwmonChip, NodeSensors, RaplCounter, SensorValue, cpu_package_temperatures, energy_watts, inlet_temperature,
    parse_hwmon_chip, parse_rapl_zone,
)

_HWMON_FILES = ("name",)
_RAPL_FILES = ("name", "energy_uj", "max_energy_range_uj")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:  # missing, unreadable (root only), or the device went away
        return None


def _chip(directory: Path) -> HwmonChip:
    """A hwmon directory's chip; its device is the directory the chip's `hwmon/hwmonN` lies in ("coretemp.0"),
    else the hwmon directory's own name."""
    files: dict[str, str] = {}
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        names = []
    for name in names:
        if name in _HWMON_FILES or (name.startswith("temp") and name.endswith(("_input", "_label"))):
            text = _read(directory / name)
            if text is not None:
                files[name] = text
    real = directory.resolve()  # /sys/devices/platform/coretemp.0/hwmon/hwmon0
    under_device = real.parent.name == "hwmon" and real.parent.parent.name != "class"
    device = real.parent.parent.name if under_device else directory.name
    return parse_hwmon_chip(device, files)


class SysfsSensors:
    """Reads this node's sensors under `root` (the file system root; a test gives an extracted capture). Keeps the
    previous RAPL counters to turn energy into power."""

    def __init__(self, root: Path = Path("/")):
        self.root = root
        self._previous: dict[str, tuple[RaplCounter, float]] = {}

    def chips(self) -> tuple[HwmonChip, ...]:
        """Every hwmon chip, in hwmonN order."""
        base = self.root / "sys" / "class" / "hwmon"
        try:
            entries = [p for p in base.iterdir() if p.name.startswith("hwmon")]
        except OSError:
            return ()
        entries.sort(key=lambda p: (len(p.name), p.name))
        return tuple(_chip(p) for p in entries)

    def counters(self) -> tuple[RaplCounter, ...]:
        """The RAPL package zones' counters now, in zone order."""
        base = self.root / "sys" / "class" / "powercap"
        try:
            zones = sorted(p for p in base.iterdir() if p.name.startswith("intel-rapl:"))
        except OSError:
            return ()
        out = []
        for zone in zones:
            files = {name: text for name in _RAPL_FILES if (text := _read(zone / name)) is not None}
            counter = parse_rapl_zone(zone.name, files)
            if counter is not None:
                out.append(counter)
        return tuple(out)

    def read(self, now: float) -> NodeSensors:
        """The sensors now; `now` in seconds on a monotonic clock (power is over the time since the last read)."""
        chips = self.chips()
        watts = []
        previous, self._previous = self._previous, {}
        for counter in self.counters():
            self._previous[counter.zone] = (counter, now)
            if counter.zone in previous:
                before, then = previous[counter.zone]
                value = energy_watts(before, counter, now - then)
                if value is not None:
                    watts.append(SensorValue(counter.name, counter.zone, value))
        return NodeSensors(cpu_package_temperatures(chips), tuple(watts), inlet_temperature(chips))
