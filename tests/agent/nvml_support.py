"""The NVML stand-in of tests/agent/discovery (built from the real H200 captures), for the agent's own tests."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "discovery"))

from fake_nvml import FakeNvml, h200_dump, load_readings  # noqa: E402

__all__ = ["FakeNvml", "h200_dump", "load_readings", "two_h200s"]


def two_h200s() -> FakeNvml:
    """Two cards as captured on the H200; the second with its own UUID and PCI address, linked over NVLink."""
    cards = [copy.deepcopy(h200_dump()["devices"][0]) for _ in range(2)]
    cards[1].update(uuid="GPU-11111111-2222-3333-4444-555555555555",
                    pci=dict(cards[1]["pci"], busId="00000000:00:07.0"))
    cards[0]["nvlink_states"] = [{"active": 1, "remote": b"00000000:00:07.0"}]
    cards[1]["nvlink_states"] = [{"active": 1, "remote": b"00000000:00:06.0"}]
    return FakeNvml(cards)
