"""`ignore_gpus` of the agent settings: the GPUs this agent leaves alone (neither reported, sampled nor offered).

Pure: discovery's `GpuReport` and the entries in, what the agent reports and samples out. An entry names a GPU by
its index ("3"), its UUID ("GPU-7f3c...", any case), or its device id (a MIG instance's "MIG-..." UUID):

- a card's index or UUID ignores the card and every MIG instance on it;
- a MIG instance's UUID ignores that instance only (the card is still sampled: its other instances serve).

Format of the ids: NVML (`nvmlDeviceGetUUID`) and `nvidia-smi -q -x`, as in tests/fixtures/nvidia-h200.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from llmgw.agent.discovery import GpuDevice, GpuReport


def _normalised(entries: Iterable[str]) -> frozenset[str]:
    return frozenset(e.strip().lower() for e in entries if e.strip())


def _names(gpu: GpuDevice) -> set[str]:
    """What an ignore_gpus entry may call `gpu`: its card's index and UUID, its own UUID and device id."""
    names = {str(gpu.index), gpu.device_id, gpu.uuid, gpu.parent_uuid}
    return {n.lower() for n in names if n}


def is_ignored(gpu: GpuDevice, ignore: Collection[str]) -> bool:
    """True when an entry of `ignore` names `gpu` (or, for a MIG instance, its card)."""
    wanted = _normalised(ignore)
    return bool(wanted) and not wanted.isdisjoint(_names(gpu))


def offered_gpus(report: GpuReport, ignore: Collection[str]) -> GpuReport:
    """`report` less the ignored devices, with a note per device left out and a warning per entry that names no
    device of this node. NVLink peers that are ignored are dropped from the others' `nvlink_peers`.
    `report` itself when `ignore` is empty."""
    wanted = _normalised(ignore)
    if not wanted:
        return report
    kept = [g for g in report.gpus if wanted.isdisjoint(_names(g))]
    left_out = [g for g in report.gpus if not wanted.isdisjoint(_names(g))]
    gone = {g.device_id for g in left_out}
    kept = [replace(g, nvlink_peers=tuple(p for p in g.nvlink_peers if p not in gone)) if gone & set(g.nvlink_peers)
            else g for g in kept]
    named = set().union(*(_names(g) for g in report.gpus)) if report.gpus else set()
    notes = [f"GPU {g.device_id} ({g.uuid or 'no UUID'}) is left alone: agent settings ignore_gpus" for g in left_out]
    warnings = [f"ignore_gpus entry {entry!r} names no GPU of this node (known: indices, GPU-/MIG- UUIDs)"
                for entry in sorted(wanted - named)]
    return replace(report, gpus=tuple(kept), notes=(*report.notes, *notes), warnings=(*report.warnings, *warnings))


def ignored_cards(report: GpuReport, ignore: Collection[str]) -> frozenset[int]:
    """Indices of the whole cards `ignore` names: their telemetry is not read at all."""
    wanted = _normalised(ignore)
    return frozenset(g.index for g in report.gpus
                     if not g.is_mig_instance and not wanted.isdisjoint(_names(g)))
