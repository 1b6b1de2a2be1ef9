"""The keys llmgw writes into each generated `Key=Value` file, and the reader's check of a rendered file. Pure.

The sets are the renderers' own keys (`llmgw.plan.slurm_conf`): the one writer (`llmgw.plan.conf_lines.conf_line`)
refuses a key outside the set of the file it writes, so a renderer cannot write one, and `rendered_problem` lets an
agent refuse a file it received with any other key (an `Include`, a `Prolog=`, an `Epilog=`...) before writing it.
They live here, below both the planner and the agent, so both read the same sets.

Format of the files (Slurm 22.05, slurm.schedmd.com/slurm.conf.html, gres.conf.html, slurmdbd.conf.html): one line
per entry, blank lines and lines starting with `#` ignored, each line `Key=Value` pairs separated by one space; a
value is one token without whitespace, `"` or `#`, or text in double quotes (`Reason="llmgw: not lent"`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SLURM_CONF_KEYS = frozenset({
    "ClusterName", "SlurmctldHost", "SlurmctldPort", "SlurmdPort", "SlurmctldParameters", "AuthType", "CredType",
    "AuthInfo", "SlurmUser", "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
    "SlurmctldLogFile", "SlurmdLogFile", "ProctrackType", "TaskPlugin", "SchedulerType", "SelectType",
    "SelectTypeParameters", "ReturnToService", "MpiDefault", "MailProg", "JobAcctGatherType",
    "AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort", "AccountingStorageEnforce",
    "AccountingStoragePass", "GresTypes", "AccountingStorageTRES",
    "NodeName", "NodeAddr", "NodeHostname", "CPUs", "RealMemory", "Gres", "State", "Reason",
    "PartitionName", "Nodes", "Default", "MaxTime",
})
"""Every key `llmgw.plan.slurm_conf.render_slurm` writes into slurm.conf (no Prolog, Epilog, Include...)."""

GRES_CONF_KEYS = frozenset({"NodeName", "Name", "Type", "File"})
"""Every key `render_slurm` writes into gres.conf."""

SLURMDBD_CONF_KEYS = frozenset({
    "AuthType", "AuthInfo", "DbdHost", "DbdAddr", "DbdPort", "SlurmUser", "PidFile", "LogFile", "StorageType",
    "StorageHost", "StoragePort", "StorageUser", "StoragePass", "StorageLoc",
})
"""Every key `llmgw.plan.slurm_conf.render_slurmdbd_conf` writes into slurmdbd.conf."""

_KEY = r"[A-Za-z][A-Za-z0-9]*"
_VALUE = r'(?:"[^"#]*"|[^\s"#]+)'
_LINE = re.compile(rf"{_KEY}={_VALUE}(?: {_KEY}={_VALUE})*")
_PAIR = re.compile(rf"(?:^| )({_KEY})={_VALUE}")


def rendered_problem(name: str, text: str, keys: Iterable[str]) -> str | None:
    """Why the rendered file `name` (its `text`) must not be written, or None when it may.

    Refused: a character that is not printable (control characters, Unicode line separators) other than the
    newlines between lines; a line that is not `Key=Value` pairs as the module's docstring describes (an `Include`
    line, a comment after a value, a stray quote); a key outside `keys` (e.g. SLURM_CONF_KEYS). The sentence names
    the file, the line number and what was found.
    """
    allowed = frozenset(keys)
    for number, line in enumerate(text.split("\n"), 1):
        if not line or line.startswith("#"):
            if not line.isprintable():
                return f"{name} line {number} holds a control character; it was not written"
            continue
        if not line.isprintable() or not _LINE.fullmatch(line):
            return f"{name} line {number} is not Key=Value pairs ({line[:80]!r}); it was not written"
        unexpected = [key for key in _PAIR.findall(line) if key not in allowed]
        if unexpected:
            return (f"{name} line {number} sets {', '.join(unexpected)}, which llmgw never writes there; the file "
                    "was not written (is the control plane a newer or a tampered one?)")
    return None
