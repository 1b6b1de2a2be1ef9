"""When the gateway probes each replica's health: every replica once per interval, each at its own phase.

Pure: `probe_phase` and `probe_schedule` decide when; `health.HealthProbes.watch` sleeps, probes and ejects.
Probing every replica at the same instant made a burst of connections every interval (500 replicas: 23% of the
control plane's samples and a heartbeat p99 of 2.35 s instead of 0.1 s, docs/scale.md); spread over the interval,
the same probes are a steady trickle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

HEALTH_PROBE_CONCURRENCY = 32
"""Probes in flight at once, at most (Gateway `health_concurrency`). A probe on a healthy replica takes a few ms, so
spread probes of even thousands of replicas every 5 s keep a handful in flight; the limit matters when replicas
hang until the probe's timeout: then later probes wait for a slot instead of piling up connections."""


def probe_phase(replica_id: str, interval: float) -> float:
    """Seconds into each health interval at which `replica_id` is probed, in [0, interval).

    From the first 8 bytes of the SHA-256 of the id: the same in every process and after a restart (Python's
    `hash` of a str is not), and spread evenly over the interval for any set of ids.
    """
    fraction = int.from_bytes(hashlib.sha256(replica_id.encode()).digest()[:8], "big") / 2**64
    return fraction * interval


def probe_schedule(replica_ids: Iterable[str], interval: float) -> list[tuple[float, str]]:
    """The probes of one interval: (seconds after the interval starts, replica id), earliest first, each id once."""
    return sorted((probe_phase(replica_id, interval), replica_id) for replica_id in set(replica_ids))
