"""The machine room's side of a node from sysfs: CPU package and board inlet temperatures (hwmon) and CPU package
power (RAPL's energy counters). Pure: the agent (`llmgw.agent.sensors`) reads the files, these functions judge
their text. Nothing here raises; a value that cannot be read or judged is absent (None or left out), never 0.

Formats (the kernel's Documentation/hwmon/sysfs-interface.rst and Documentation/power/powercap/powercap.rst; real
trees in tests/fixtures/node_exporter and tests/fixtures/procfs, from prometheus/node_exporter and prometheus/procfs):
- hwmon: one directory per chip (`/sys/class/hwmon/hwmonN`, a link into the chip's device), `name` the driver
  ("coretemp", "k10temp", "nct6779"), `tempN_input` in millidegrees Celsius, `tempN_label` where the driver names
  the input ("Package id 0", "Physical id 0" on older kernels, "Core 0", "Tctl", "SYSTIN"). A label may be absent;
  an input that reads garbage (or an error) is left out.
- RAPL: `/sys/class/powercap/intel-rapl:N` a package zone (`name` "package-N"), `intel-rapl:N:M` its sub-zones
  (core, uncore, dram: not counted again); `energy_uj` microjoules since some start, wrapping to 0 past
  `max_energy_range_uj`; recent kernels let only root read `energy_uj`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_TEMP_INPUT = re.compile(r"^temp([0-9]+)_input$")
_PACKAGE_LABEL = re.compile(r"^(package|physical) id [0-9]+$", re.IGNORECASE)
CPU_CHIPS = ("coretemp", "k10temp", "zenpower")
"""hwmon drivers of the CPU's own sensors: Intel's coretemp, AMD's k10temp (and the out-of-tree zenpower)."""
_AMD_DIE = ("tdie", "tctl")  # k10temp: Tdie where the driver gives it (Tctl may carry an offset), else Tctl
INLET_LABELS = (re.compile(r"\binlet\b", re.I), re.compile(r"\bintake\b", re.I), re.compile(r"\bambient\b", re.I),
                re.compile(r"^systin$", re.I))
"""Labels of a board's inlet (air entering the chassis) temperature, in order of preference: servers' "Inlet Temp"
or "Ambient", a Super I/O's system input (nct6775-family "SYSTIN", on the board near the intake)."""


@dataclass(frozen=True)
class HwmonTemp:
    """One temperature input of a chip: `label` as the driver names it ("tempN" where it does not), degrees C."""

    label: str
    celsius: float


@dataclass(frozen=True)
class HwmonChip:
    """One hwmon chip: `device` the kernel's name of the device it hangs from ("coretemp.0", "nct6775.656",
    "0000:00:18.3"; the hwmon directory's name where there is none), `driver` its `name` file ("" when absent),
    `temps` its readable temperature inputs in input order."""

    device: str
    driver: str
    temps: tuple[HwmonTemp, ...] = ()


@dataclass(frozen=True)
class SensorValue:
    """One measured value: `sensor` the chip or zone it comes from ("coretemp.0", "package-0"), `label` what the
    kernel calls the input ("Package id 0", "intel-rapl:0"), `value` in the unit its field names."""

    sensor: str
    label: str
    value: float


@dataclass(frozen=True)
class NodeSensors:
    """What a node measured of the machine room: `cpu_package_celsius` one value per CPU package temperature,
    `cpu_package_watts` one per RAPL package zone (power over the period since the previous reading),
    `inlet_celsius` the board's inlet temperature. Empty / None: not measured here (a VM, no driver, no root)."""

    cpu_package_celsius: tuple[SensorValue, ...] = ()
    cpu_package_watts: tuple[SensorValue, ...] = ()
    inlet_celsius: SensorValue | None = None

    @property
    def measured(self) -> bool:
        """True when at least one value is present."""
        return bool(self.cpu_package_celsius or self.cpu_package_watts or self.inlet_celsius)

    def to_json(self) -> dict:
        """JSON-ready: lists of {sensor, label, value}; `inlet_celsius` None when not measured."""
        def one(v: SensorValue) -> dict:
            return {"sensor": v.sensor, "label": v.label, "value": v.value}

        return {"cpu_package_celsius": [one(v) for v in self.cpu_package_celsius],
                "cpu_package_watts": [one(v) for v in self.cpu_package_watts],
                "inlet_celsius": one(self.inlet_celsius) if self.inlet_celsius is not None else None}


def _integer(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def parse_hwmon_chip(device: str, files: Mapping[str, str]) -> HwmonChip:
    """A chip from its directory's files ({file name: text}: `name`, `tempN_input`, `tempN_label`; others are
    ignored). Millidegrees become degrees; an input whose text is not an integer is left out, a missing label
    reads "tempN"."""
    driver = (files.get("name") or "").strip()
    temps = []
    for name in sorted(files, key=lambda n: (len(n), n)):
        match = _TEMP_INPUT.match(name)
        if match is None:
            continue
        milli = _integer(files[name])
        if milli is None:
            continue
        index = match.group(1)
        label = (files.get(f"temp{index}_label") or "").strip() or f"temp{index}"
        temps.append(HwmonTemp(label, milli / 1000.0))
    return HwmonChip(device, driver, tuple(temps))


def cpu_package_temperatures(chips: Iterable[HwmonChip]) -> tuple[SensorValue, ...]:
    """One temperature per CPU package, in chip order: coretemp's "Package id N" ("Physical id N" before Linux
    3.x), k10temp's Tdie (else Tctl). Chips are told apart by their device, not by the label: two packages may
    both say "Physical id 0" (node_exporter's capture does)."""
    out = []
    for chip in chips:
        if chip.driver not in CPU_CHIPS:
            continue
        by_label = {t.label.lower(): t for t in chip.temps}
        found = next((t for t in chip.temps if _PACKAGE_LABEL.match(t.label)), None)
        if found is None:
            found = next((by_label[word] for word in _AMD_DIE if word in by_label), None)
        if found is not None:
            out.append(SensorValue(chip.device, found.label, found.celsius))
    return tuple(out)


def inlet_temperature(chips: Iterable[HwmonChip]) -> SensorValue | None:
    """The board's inlet temperature: the first input whose label matches `INLET_LABELS`, the most preferred pattern
    first; None when no chip labels one (an unlabelled input is never guessed to be the inlet)."""
    chips = tuple(chips)
    for pattern in INLET_LABELS:
        for chip in chips:
            for temp in chip.temps:
                if pattern.search(temp.label):
                    return SensorValue(chip.device, temp.label, temp.celsius)
    return None


@dataclass(frozen=True)
class RaplCounter:
    """One RAPL package zone's energy counter: `zone` its directory ("intel-rapl:0"), `name` ("package-0"),
    `energy_uj` microjoules (None: unreadable, e.g. not root), `max_energy_range_uj` where it wraps (None:
    unknown)."""

    zone: str
    name: str
    energy_uj: int | None
    max_energy_range_uj: int | None


_PACKAGE_ZONE = re.compile(r"^intel-rapl:[^:]+$")


def parse_rapl_zone(zone: str, files: Mapping[str, str]) -> RaplCounter | None:
    """The counter of a package zone directory named `zone` from its files ({"name", "energy_uj",
    "max_energy_range_uj"}); None for a sub-zone ("intel-rapl:0:0", counted in its package) or a zone not named
    "package-*" (psys, the platform's: it would count the packages twice)."""
    name = (files.get("name") or "").strip()
    if not _PACKAGE_ZONE.match(zone) or not name.startswith("package"):
        return None
    return RaplCounter(zone, name, _integer(files.get("energy_uj")), _integer(files.get("max_energy_range_uj")))


def energy_watts(before: RaplCounter, after: RaplCounter, seconds: float) -> float | None:
    """Mean power in watts between two readings of one zone `seconds` apart: the energy used over the time.

    The counter wraps to 0 past `max_energy_range_uj`: a reading lower than the one before counts the rest of the
    range then the new value (one wrap; a period long enough to wrap twice cannot be told: both captures' range,
    262 kJ, lasts about 20 minutes at 200 W, against readings seconds apart). None when either reading is absent,
    the time is not positive, or the counter went back with no known range."""
    if before.energy_uj is None or after.energy_uj is None or seconds <= 0:
        return None
    used = after.energy_uj - before.energy_uj
    if used < 0:
        wrap = after.max_energy_range_uj or before.max_energy_range_uj
        if not wrap or before.energy_uj > wrap:
            return None
        used = wrap - before.energy_uj + after.energy_uj
    return used / 1e6 / seconds
