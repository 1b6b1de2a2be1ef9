"""Per-GPU history for the console's charts: the last hour as one-minute buckets in compact arrays.

Pure: no trio, no I/O, no clock. The caller passes the minute (`int(unix_seconds // 60)`) a reading belongs to.
Each card keeps `MINUTES` buckets of utilisation (percent 0-100), memory used (bytes) and power draw (watts), as
sums and counts in `array` objects: 60 x (3 x 4-byte float + 3 x 2-byte count) = 1080 bytes of data per card, so a
fleet of 1000 nodes with 8 cards each held 14.7 MB with Python's per-object overhead (tracemalloc, here). A reading
the agent could not take (None) counts for nothing; a bucket without readings reads as None, never as 0.

    history = FleetHistory()
    history = history.folded(state.fleet.records(), minute=int(time.time() // 60))
    series = history.node("gpu1").get(0)            # GpuSeries or None
    series.means(now_minute)                        # [(minute, util %, memory bytes, power W) or Nones] x 60
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from llmgw.control.view import GpuSample, NodeRecord

MINUTES = 60
"""How many one-minute buckets a card keeps: the last hour."""

METRICS = ("utilization_percent", "memory_used_bytes", "power_draw_watts")
"""The readings each bucket folds, in array order (see `GpuSeries`)."""


def _zeros(typecode: str) -> array:
    return array(typecode, bytes(array(typecode).itemsize * MINUTES))


@dataclass(frozen=True)
class GpuSeries:
    """One card's last `MINUTES` one-minute buckets, the newest at minute `last_minute` (unix minutes).

    `sums[m]` and `counts[m]` are arrays of `MINUTES` entries for metric m of `METRICS`; slot `minute % MINUTES`
    holds that minute. Treat the arrays as read-only: `fold` returns a new series with new arrays.
    """

    last_minute: int
    sums: tuple[array, array, array]
    counts: tuple[array, array, array]

    @classmethod
    def empty(cls, minute: int) -> GpuSeries:
        return cls(minute, tuple(_zeros("f") for _ in METRICS), tuple(_zeros("H") for _ in METRICS))

    def fold(self, minute: int, reading: GpuSample) -> GpuSeries:
        """A new series with `reading` added to the bucket of `minute` (unix minutes).

        A minute after `last_minute` moves the window forward, emptying the buckets it passes over; a minute
        more than `MINUTES - 1` before `last_minute` is dropped (the series is returned unchanged).
        """
        if minute <= self.last_minute - MINUTES:
            return self
        sums = [array("f", s) for s in self.sums]
        counts = [array("H", c) for c in self.counts]
        last = self.last_minute
        if minute > last:
            for gone in range(last + 1, min(minute, last + MINUTES) + 1):
                for s, c in zip(sums, counts):
                    s[gone % MINUTES] = 0.0
                    c[gone % MINUTES] = 0
            last = minute
        slot = minute % MINUTES
        for s, c, name in zip(sums, counts, METRICS):
            value = getattr(reading, name)
            if value is not None and c[slot] < 0xFFFF:
                s[slot] += float(value)
                c[slot] += 1
        return GpuSeries(last, tuple(sums), tuple(counts))  # type: ignore[arg-type]

    def means(self, now_minute: int) -> list[tuple[int, float | None, float | None, float | None]]:
        """The `MINUTES` minutes ending at `now_minute`, oldest first: (minute, utilisation %, memory bytes,
        power W), each the bucket's mean or None when the bucket holds no reading of it."""
        out = []
        for minute in range(now_minute - MINUTES + 1, now_minute + 1):
            inside = self.last_minute - MINUTES < minute <= self.last_minute
            slot = minute % MINUTES
            values = [
                (s[slot] / c[slot]) if inside and c[slot] else None for s, c in zip(self.sums, self.counts)
            ]
            out.append((minute, *values))
        return out


@dataclass(frozen=True)
class FleetHistory:
    """Every card's series by node id and card index, and the arrival time (`NodeReadings.at`) of the readings of
    each node last folded, so one heartbeat is folded once however often the fleet is sampled."""

    nodes: Mapping[str, Mapping[int, GpuSeries]] = field(default_factory=lambda: MappingProxyType({}))
    seen: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def folded(self, records: Iterable[NodeRecord], minute: int) -> FleetHistory:
        """A new history with each node's readings not folded yet added to `minute`'s buckets (unix minutes).

        Nodes absent from `records` are forgotten (a node removed from the fleet loses its charts); a node whose
        readings did not change since the last fold keeps its series as they are (the same objects).
        """
        nodes: dict[str, Mapping[int, GpuSeries]] = {}
        seen: dict[str, float] = {}
        for record in records:
            node_id = record.node_id
            cards = self.nodes.get(node_id, MappingProxyType({}))
            readings = record.readings
            if readings is not None:
                seen[node_id] = readings.at
                if self.seen.get(node_id) != readings.at:
                    new = dict(cards)
                    for gpu in readings.gpus:
                        new[gpu.index] = new.get(gpu.index, GpuSeries.empty(minute)).fold(minute, gpu)
                    cards = MappingProxyType(new)
            if cards:
                nodes[node_id] = cards
        return FleetHistory(MappingProxyType(nodes), MappingProxyType(seen))

    def node(self, node_id: str) -> dict[int, GpuSeries]:
        """The series of one node's cards by card index, in index order (empty when none)."""
        return dict(sorted(self.nodes.get(node_id, {}).items()))
