"""`sminfo` and `saquery SMIR` (infiniband-diags): the subnet managers of an InfiniBand fabric. Pure parsers.

`sminfo` prints one line for the master SM seen from the local port (rdma-core infiniband-diags/sminfo.c):
"sminfo: sm lid 15 sm guid 0x10e0406d5aa0a0, activity count 26263191 priority 14 state 3 SMINFO_MASTER"; the
GUID is not zero-padded, the state words are SMINFO_NOTACT (0), SMINFO_DISCOVER (1), SMINFO_STANDBY (2) and
SMINFO_MASTER (3). Failures go to stderr as "ibwarn: ..." / "sminfo: iberror: failed: query" lines.

`saquery SMIR` prints one block per SM known to the subnet administrator (rdma-core infiniband-diags/saquery.c,
`dump_sm_info_record`): "SMInfoRecord dump:", then "LID...................1", "GUID..................0x...",
"SM_Key................0x...", "ActCount..............", "Priority..............", "SMState...............3",
each tab-indented with dots. Several SMs listed together belong to one fabric; `fabric_id` names it by the lowest
SM GUID, so a failover of the master keeps the name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.tools import values
from llmgw.tools.values import ParseError

SM_STATES = {0: "not-active", 1: "discovering", 2: "standby", 3: "master"}

_SMINFO = re.compile(
    r"^sminfo: sm lid (?P<lid>[0-9]+) sm guid (?P<guid>0x[0-9a-fA-F]+), activity count (?P<act>[0-9]+) "
    r"priority (?P<prio>[0-9]+) state (?P<state>[0-9]+)(?: (?P<word>\S+))?\s*$")
_SMIR_FIELD = re.compile(r"^\s*(?P<key>[A-Za-z_]+)\.{2,}\s*(?P<value>\S+)\s*$")


@dataclass(frozen=True)
class SubnetManager:
    """One subnet manager: `lid`, `guid` as 16 lower-case hex digits ("0010e0406d5aa0a0", zero-padded so GUIDs
    compare as text), `activity_count`, `priority` (0-15), `state` (3 master, 2 standby, 1 discovering,
    0 not active), `sm_key` ("" when not printed)."""

    lid: int
    guid: str
    activity_count: int
    priority: int
    state: int
    sm_key: str = ""

    @property
    def state_name(self) -> str:
        """"master", "standby", "discovering", "not-active" or "unknown-N"."""
        return SM_STATES.get(self.state, f"unknown-{self.state}")

    @property
    def is_master(self) -> bool:
        return self.state == 3


def guid_hex(text: str) -> str:
    """"0x10e0406d5aa0a0" -> "0010e0406d5aa0a0" (16 lower-case hex digits). Raises ValueError for non-hex text."""
    return f"{int(text, 16):016x}"


def parse_sminfo(text: str) -> SubnetManager:
    """Parse `sminfo` output: the master SM seen from the local port.

    Raises: ParseError when no "sminfo: sm lid ..." line is present (the tool failed, is missing, or the port has
    no SM); the error carries the text's first line, which names the reason.
    """
    body = values.command_body(text)
    for line in body.splitlines():
        match = _SMINFO.match(line.strip())
        if match:
            return SubnetManager(int(match.group("lid")), guid_hex(match.group("guid")), int(match.group("act")),
                                 int(match.group("prio")), int(match.group("state")))
    first = next((line for line in body.splitlines() if line.strip()), "")
    raise ParseError("sminfo", "no 'sminfo: sm lid ...' line", 1 if first else 0, first)


def parse_saquery_smir(text: str) -> tuple[SubnetManager, ...]:
    """Parse `saquery SMIR` output: every SM record, in order. Output without "SMInfoRecord dump:" gives ().

    Raises: ParseError naming the record's line when a record lacks LID, GUID or SMState, or a field holds a
    value that is not a number.
    """
    records: list[tuple[int, dict[str, str]]] = []
    for number, line in enumerate(values.command_body(text).splitlines(), 1):
        if line.strip().startswith("SMInfoRecord dump"):
            records.append((number, {}))
            continue
        match = _SMIR_FIELD.match(line)
        if match and records:
            records[-1][1][match.group("key").lower()] = match.group("value")
    out = []
    for number, fields in records:
        missing = [k for k in ("lid", "guid", "smstate") if k not in fields]
        if missing:
            raise ParseError("saquery SMIR", f"record lacks {', '.join(missing)}", number, "SMInfoRecord dump:")
        try:
            out.append(SubnetManager(
                lid=int(fields["lid"], 0), guid=guid_hex(fields["guid"]),
                activity_count=int(fields.get("actcount", "0"), 0), priority=int(fields.get("priority", "0"), 0),
                state=int(fields["smstate"], 0), sm_key=fields.get("sm_key", ""),
            ))
        except ValueError as exc:
            raise ParseError("saquery SMIR", f"a field is not a number ({exc})", number,
                             "SMInfoRecord dump:") from exc
    return tuple(out)


def fabric_id(managers: Iterable[SubnetManager]) -> str | None:
    """The name of the fabric these SMs run: the lowest SM GUID ("0010e0406d5aa0a0"); None for no SMs."""
    guids = sorted(m.guid for m in managers)
    return guids[0] if guids else None
