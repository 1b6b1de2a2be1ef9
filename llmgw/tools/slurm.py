"""Slurm's own tools: `slurmd -C`, `scontrol show node` and `sacct --parsable2`. Pure parsers.

Formats (Slurm 22.05, Debian's slurm-wlm, and slurm.schedmd.com's man pages of scontrol, sacct and slurmd):

- `slurmd -C` prints the node as slurm.conf would describe it, one `Key=Value` line, then `UpTime=D-HH:MM:SS`:
  "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"; with GPUs
  found through NVML it adds "Gres=gpu:h100:8" (several kinds comma separated). RealMemory is in MiB.
- `scontrol show node [NAME]` prints one block per node, blocks separated by a blank line, each `Key=Value` pairs
  over several indented lines (`-o`: one line per node). Traps: `OS=` and `Reason=` values hold spaces
  ("Reason=maintenance by admin [root@2026-11-30T10:00:00]" runs to the end of its line); `State=` is compound
  ("IDLE+DRAIN", "MIXED+DRAIN", "DOWN*+NOT_RESPONDING"; a trailing `*` means not responding); `Gres=` carries
  socket bindings ("gpu:a100:4(S:0-1)"); absent values read "(null)" or "N/A".
- `sacct --parsable2 --format=...` prints a header line, then one line per job and per step, fields joined by `|`
  with no trailing `|`. Traps: steps `123.batch`, `123.extern`, `123.0` repeat the job (count the job line
  only); array tasks are "5054326_1" (a pending array "5054326_[2-5%2]"); `State` may read "CANCELLED by 7547";
  `AllocTRES` lists GPUs typed and untyped at once ("gres/gpu:a100=2,gres/gpu=2": two GPUs, not four).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.tools.values import ParseError, command_body

_PAIR = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=")
_REST_OF_LINE = frozenset({"Reason"})


def _pairs(line: str) -> list[tuple[str, str]]:
    """`Key=Value` pairs of one line; a value runs until the next ` Key=`; Reason= to the end of its line."""
    out: list[tuple[str, str]] = []
    matches = list(_PAIR.finditer(line))
    for index, match in enumerate(matches):
        key = match.group(1)
        if out and out[-1][0] in _REST_OF_LINE:
            break
        end = matches[index + 1].start() if index + 1 < len(matches) else len(line)
        if key in _REST_OF_LINE:
            end = len(line)
        out.append((key, line[match.end():end].strip()))
    return out


def _int(tool: str, key: str, value: str, line: int, text: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ParseError(tool, f"{key}={value!r} is not a whole number", line, text) from None


def parse_gres(text: str) -> dict[str, int]:
    """Slurm's GRES list ("gpu:h100:8,gpu:a100:2(S:0-1)", "gpu:4", "(null)") -> {"h100": 8, "a100": 2} for GPUs.

    Untyped GPUs are counted under "". Other kinds (mps, shard) are left out. Returns {} for "(null)"/"N/A"/"".
    Raises: ParseError for a count that is not a number.
    """
    out: dict[str, int] = {}
    if text in ("", "(null)", "N/A"):
        return out
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            kind, count = "", "1"
        elif len(parts) == 2:
            kind, count = ("", parts[1]) if parts[1].isdigit() else (parts[1], "1")
        else:
            kind, count = parts[1], parts[2]
        if not count.isdigit():
            raise ParseError("gres", f"GPU count {count!r} in {item!r} is not a number", 0, text)
        out[kind] = out.get(kind, 0) + int(count)
    return out


@dataclass(frozen=True)
class SlurmdConfig:
    """`slurmd -C`: the node as slurmd sees it. `memory_mib` is RealMemory (MiB); `gpus` by type ("" untyped)."""

    node_name: str
    cpus: int
    boards: int
    sockets_per_board: int
    cores_per_socket: int
    threads_per_core: int
    memory_mib: int
    gpus: dict[str, int]


def parse_slurmd_config(text: str) -> SlurmdConfig:
    """Parse `slurmd -C` output. Raises: ParseError when NodeName, CPUs or RealMemory is missing or not a number."""
    body = command_body(text)
    for number, line in enumerate(body.splitlines(), 1):
        pairs = dict(_pairs(line))
        if "NodeName" not in pairs:
            continue
        for key in ("CPUs", "RealMemory"):
            if key not in pairs:
                raise ParseError("slurmd -C", f"{key}= is missing", number, line)

        def get(key: str, default: str = "1") -> int:
            return _int("slurmd -C", key, pairs.get(key, default), number, line)

        return SlurmdConfig(pairs["NodeName"], get("CPUs"), get("Boards"), get("SocketsPerBoard"),
                            get("CoresPerSocket"), get("ThreadsPerCore"), get("RealMemory"),
                            parse_gres(pairs.get("Gres", "")))
    raise ParseError("slurmd -C", "no NodeName= line", 0, body)


@dataclass(frozen=True)
class SlurmNodeState:
    """One node of `scontrol show node`. `state` the base state in lower case ("idle", "allocated", "mixed",
    "down"); `flags` the rest ("drain", "not_responding", ...); `drain` True when DRAIN is among them (draining or
    drained); `responding` False for a trailing `*`. `reason` "" when none. `memory_mib` RealMemory, `gpus` by
    type from Gres=, `partitions` as listed, `version` slurmd's ("" when unknown)."""

    name: str
    state: str
    flags: tuple[str, ...]
    responding: bool
    reason: str
    cpus: int
    cpus_allocated: int
    memory_mib: int
    gpus: dict[str, int]
    partitions: tuple[str, ...]
    version: str

    @property
    def drain(self) -> bool:
        return "drain" in self.flags


def parse_scontrol_nodes(text: str) -> tuple[SlurmNodeState, ...]:
    """Parse `scontrol show node` (blocks or `-o` lines), in the order printed.

    "No nodes in the system" gives (). Raises: ParseError for a block without State= or a non-numeric CPUTot.
    """
    blocks: list[tuple[int, dict[str, str]]] = []
    for number, line in enumerate(command_body(text).splitlines(), 1):
        if not line.strip():
            continue
        pairs = _pairs(line)
        if pairs and pairs[0][0] == "NodeName":
            blocks.append((number, {}))
        if not blocks:
            if line.strip().lower().startswith("no nodes"):
                continue
            raise ParseError("scontrol show node", "text before the first NodeName=", number, line)
        blocks[-1][1].update(pairs)
    nodes = []
    for number, pairs in blocks:
        if "State" not in pairs:
            raise ParseError("scontrol show node", f"node {pairs['NodeName']!r} has no State=", number)
        words = pairs["State"].split("+")
        responding = not any(w.endswith("*") for w in words)
        words = [w.rstrip("*~#!%$@^-").lower() for w in words]
        reason = pairs.get("Reason", "")
        partitions = pairs.get("Partitions", "")
        nodes.append(SlurmNodeState(
            name=pairs["NodeName"], state=words[0], flags=tuple(words[1:]), responding=responding,
            reason="" if reason in ("(null)", "N/A") else reason,
            cpus=_int("scontrol show node", "CPUTot", pairs.get("CPUTot", "0"), number, ""),
            cpus_allocated=_int("scontrol show node", "CPUAlloc", pairs.get("CPUAlloc", "0"), number, ""),
            memory_mib=_int("scontrol show node", "RealMemory", pairs.get("RealMemory", "0"), number, ""),
            gpus=parse_gres(pairs.get("Gres", "")),
            partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),
            version=pairs.get("Version", "").replace("N/A", ""),
        ))
    return tuple(nodes)


SACCT_FIELDS = ("JobID", "JobName", "Partition", "Account", "User", "State", "ElapsedRaw", "AllocCPUS",
                "AllocTRES", "Start", "End")
"""The fields llmgw asks sacct for: `sacct --parsable2 --format=` + ",".join(SACCT_FIELDS)."""


@dataclass(frozen=True)
class SacctJob:
    """One job of `sacct` (its steps folded in). `job_id` as printed ("5054326_1" for an array task), `array_job`
    the array's id ("5054326", "" when not an array), `state` the first word in lower case ("completed",
    "cancelled", "failed", "timeout", "running", ...), `elapsed_seconds`, `cpus`, `gpus` (typed and untyped
    counted once), `gpu_types` {"a100": 2} when typed, `start`/`end` as printed ("Unknown" kept as "")."""

    job_id: str
    array_job: str
    name: str
    partition: str
    account: str
    user: str
    state: str
    elapsed_seconds: int
    cpus: int
    gpus: int
    gpu_types: dict[str, int]
    start: str
    end: str

    @property
    def ended(self) -> bool:
        return self.state not in ("running", "pending", "requeued", "resizing", "suspended", "")


def _tres_gpus(tres: str) -> tuple[int, dict[str, int]]:
    """GPUs of an AllocTRES string: the untyped `gres/gpu=N` when given, else the sum of the typed ones."""
    untyped: int | None = None
    typed: dict[str, int] = {}
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if not key.startswith("gres/gpu") or not value.isdigit():
            continue
        if key == "gres/gpu":
            untyped = int(value)
        elif key.startswith("gres/gpu:"):
            typed[key.split(":", 1)[1]] = typed.get(key.split(":", 1)[1], 0) + int(value)
    return (untyped if untyped is not None else sum(typed.values())), typed


def parse_sacct(text: str) -> tuple[SacctJob, ...]:
    """Parse `sacct --parsable2` output with a header line (any field order; SACCT_FIELDS at least JobID and State).

    One SacctJob per job (steps dropped: ".batch", ".extern", ".N" lines), in the order printed; a job seen twice
    (requeued, or listed by several clusters) is kept once, its last line winning. Raises: ParseError for a line
    with another number of fields than the header, a missing JobID/State column, or a non-numeric count.
    """
    lines = [line for line in command_body(text).splitlines() if line.strip()]
    if not lines:
        return ()
    header = lines[0].split("|")
    for needed in ("JobID", "State"):
        if needed not in header:
            raise ParseError("sacct", f"the header has no {needed} column (run with --parsable2 and a header)",
                             1, lines[0])
    jobs: dict[str, SacctJob] = {}
    for number, line in enumerate(lines[1:], 2):
        values = line.split("|")
        if len(values) != len(header):
            raise ParseError("sacct", f"{len(values)} fields where the header has {len(header)}", number, line)
        row = dict(zip(header, values))
        job_id = row["JobID"]
        if "." in job_id:
            continue
        gpus, typed = _tres_gpus(row.get("AllocTRES", ""))

        def count(key: str) -> int:
            value = row.get(key, "") or "0"
            return _int("sacct", key, value, number, line)

        jobs[job_id] = SacctJob(
            job_id=job_id, array_job=job_id.split("_", 1)[0] if "_" in job_id else "",
            name=row.get("JobName", ""), partition=row.get("Partition", ""), account=row.get("Account", ""),
            user=row.get("User", ""), state=(row["State"].split() or [""])[0].lower(),
            elapsed_seconds=count("ElapsedRaw"), cpus=count("AllocCPUS"), gpus=gpus, gpu_types=typed,
            start=row.get("Start", "").replace("Unknown", ""), end=row.get("End", "").replace("Unknown", ""),
        )
    return tuple(jobs.values())


def drain_verdict(node: SlurmNodeState, lent: bool, ours: str) -> str | None:
    """What llmgw should do to `node` in Slurm: "resume" (lent, drained by llmgw), "drain" (not lent, not drained),
    or None (nothing: already right, or drained by someone else: a drain whose reason is not `ours` is an
    administrator's and is never touched, lent or not)."""
    if node.drain:
        return "resume" if lent and node.reason.split(" [", 1)[0] == ours else None
    return None if lent else "drain"


@dataclass(frozen=True)
class SlurmAssociation:
    """One line of `sacctmgr -nP show assoc format=Cluster,Account,User,ParentName`: `user` "" for the account's
    own association, `parent` "" when not printed (user associations)."""

    cluster: str
    account: str
    user: str
    parent: str


@dataclass(frozen=True)
class SlurmAccount:
    """One line of `sacctmgr -nP show account format=Account,Description,Organization`."""

    name: str
    description: str
    organization: str


def _sacctmgr_rows(text: str, fields: int, what: str) -> list[list[str]]:
    rows = []
    for number, line in enumerate(command_body(text).splitlines(), 1):
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != fields:
            raise ParseError(f"sacctmgr show {what}", f"{len(values)} fields where {fields} were asked for", number, line)
        rows.append(values)
    return rows


def parse_sacctmgr_assocs(text: str) -> tuple[SlurmAssociation, ...]:
    """Parse `sacctmgr -nP show assoc format=Cluster,Account,User,ParentName` (no header, `|` separated).

    Raises: ParseError for a line with another number of fields."""
    return tuple(SlurmAssociation(*row) for row in _sacctmgr_rows(text, 4, "assoc"))


def parse_sacctmgr_accounts(text: str) -> tuple[SlurmAccount, ...]:
    """Parse `sacctmgr -nP show account format=Account,Description,Organization` (no header, `|` separated).

    Raises: ParseError for a line with another number of fields."""
    return tuple(SlurmAccount(*row) for row in _sacctmgr_rows(text, 3, "account"))
