"""What Linux's /proc says about processes and the node: pure parsers plus thin readers.

Formats: proc(5) (https://man7.org/linux/man-pages/man5/proc.5.html): `/proc/<pid>/stat` (fields numbered from 1;
field 2 `comm` is in parentheses and may itself hold spaces or parentheses, so fields are split after the last
")"), `/proc/stat` (first line "cpu  user nice system idle iowait irq softirq steal ..." in clock ticks),
`/proc/meminfo` ("Name:   1234 kB"), `/proc/loadavg`. Times are in clock ticks (`os.sysconf("SC_CLK_TCK")`),
resident memory in pages (`os.sysconf("SC_PAGE_SIZE")`); the readers convert to seconds and bytes.
A value that cannot be read is None, never 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    """The fields of `/proc/<pid>/stat` llmgw uses.

    `state` one letter ("R", "S", "Z", ...), `pgrp` the process group, `utime`/`stime` CPU time in clock ticks,
    `start_time` ticks after boot (field 22: with the pid it names one process for the life of the machine),
    `rss_pages` resident pages (field 24).
    """

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    utime: int
    stime: int
    start_time: int
    rss_pages: int


def parse_proc_stat(text: str) -> ProcStat | None:
    """Parse one `/proc/<pid>/stat` line; None when it is truncated or not that format."""
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        return None
    rest = text[close_paren + 1:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3].
    if len(rest) < 22:
        return None
    try:
        return ProcStat(
            pid=int(text[:open_paren].strip()),
            comm=text[open_paren + 1:close_paren],
            state=rest[0],
            ppid=int(rest[1]),
            pgrp=int(rest[2]),
            utime=int(rest[11]),
            stime=int(rest[12]),
            start_time=int(rest[19]),
            rss_pages=int(rest[21]),
        )
    except ValueError:
        return None


def parse_cpu_times(text: str) -> tuple[int, int] | None:
    """From `/proc/stat`, return (busy ticks, total ticks) of the aggregate "cpu" line; None if absent.

    Idle is `idle + iowait`; guest time is already inside user time, so it is not added again.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                values = [int(v) for v in parts[1:9]]
            except ValueError:
                return None
            if len(values) < 4:
                return None
            total = sum(values)
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return total - idle, total
    return None


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse `/proc/meminfo` into {name: bytes}; values in "kB" are KiB. Lines that do not parse are skipped."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            number = int(parts[0])
        except ValueError:
            continue
        values[name.strip()] = number * 1024 if len(parts) > 1 and parts[1] == "kB" else number
    return values


def parse_loadavg(text: str) -> float | None:
    """The one-minute load average from `/proc/loadavg`; None when unreadable."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def _read(path: Path | str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def read_proc_stat(pid: int, proc: Path = Path("/proc")) -> ProcStat | None:
    """`/proc/<pid>/stat` of a live process, or None when there is no such process."""
    text = _read(proc / str(pid) / "stat")
    return parse_proc_stat(text) if text else None


def process_start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Start time of `pid` in clock ticks after boot (stat field 22), or None if it is gone or a zombie."""
    stat = read_proc_stat(pid, proc)
    if stat is None or stat.state in ("Z", "X"):
        return None
    return stat.start_time


def iter_proc_stats(proc: Path = Path("/proc")) -> Iterable[ProcStat]:
    """Every live process's stat; processes that vanish while reading are skipped."""
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            stat = read_proc_stat(int(name), proc)
            if stat is not None:
                yield stat


def read_cmdline(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """argv of `pid` (empty when gone or a kernel thread)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


@dataclass(frozen=True)
class GroupUsage:
    """CPU time (clock ticks, summed over the group's live processes) and resident bytes of one process group."""

    cpu_ticks: int
    resident_bytes: int
    processes: int


def group_usage(stats: Iterable[ProcStat], pgids: Iterable[int]) -> dict[int, GroupUsage]:
    """Sum CPU ticks and resident memory per process group, for the groups in `pgids` (absent: no process left)."""
    wanted = set(pgids)
    ticks: dict[int, int] = {}
    pages: dict[int, int] = {}
    count: dict[int, int] = {}
    for stat in stats:
        if stat.pgrp in wanted and stat.state not in ("Z", "X"):
            ticks[stat.pgrp] = ticks.get(stat.pgrp, 0) + stat.utime + stat.stime
            pages[stat.pgrp] = pages.get(stat.pgrp, 0) + stat.rss_pages
            count[stat.pgrp] = count.get(stat.pgrp, 0) + 1
    return {g: GroupUsage(ticks[g], pages[g] * PAGE_SIZE, count[g]) for g in ticks}


@dataclass(frozen=True)
class NodeSample:
    """Node-wide measurements at one moment: CPU ticks (busy, total), load, memory in bytes. None: unreadable."""

    cpu_busy_ticks: int | None
    cpu_total_ticks: int | None
    load1: float | None
    memory_total_bytes: int | None
    memory_available_bytes: int | None


def read_node_sample(proc: Path = Path("/proc")) -> NodeSample:
    """Read /proc/stat, /proc/loadavg and /proc/meminfo once."""
    cpu = parse_cpu_times(_read(proc / "stat") or "")
    meminfo = parse_meminfo(_read(proc / "meminfo") or "")
    return NodeSample(
        cpu_busy_ticks=cpu[0] if cpu else None,
        cpu_total_ticks=cpu[1] if cpu else None,
        load1=parse_loadavg(_read(proc / "loadavg") or ""),
        memory_total_bytes=meminfo.get("MemTotal"),
        memory_available_bytes=meminfo.get("MemAvailable"),
    )


def cpu_percent_between(before: NodeSample, after: NodeSample) -> float | None:
    """Node CPU use in percent of all cores (0-100) between two samples; None when either lacks CPU ticks."""
    if None in (before.cpu_busy_ticks, before.cpu_total_ticks, after.cpu_busy_ticks, after.cpu_total_ticks):
        return None
    total = after.cpu_total_ticks - before.cpu_total_ticks  # type: ignore[operator]
    if total <= 0:
        return None
    busy = after.cpu_busy_ticks - before.cpu_busy_ticks  # type: ignore[operator]
    return max(0.0, min(100.0, 100.0 * busy / total))
