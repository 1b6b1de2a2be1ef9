"""`llmgw node doctor --installable`: whether this node can install its engines and weights now, without
discovering the rest of the node (quick: `llmgw node add` polls it after the node connected).

What a node installs from is told by the control plane in its agent settings (`mirrors:` of agents/), which the
agent keeps in its state directory (`llmgw.agent.config.save_agent_settings`). So, in order:

- no agent settings kept yet: fail ("the agent has not had its settings from the control plane yet");
- each mirror must be a directory the agent can read; what it holds is named: weights files (`sha256/<digest>`) and
  engine builds (`<engine>/<version>/bin/<program>`, the layout the agent copies llama-server from);
- no mirror: info (engines and weights are downloaded, or llama.cpp built, when a replica needs them; reaching
  those sources is not checked).

Blocking (small reads). Pure but for those reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.agent.config import load_agent_settings
from llmgw.agent.doctor import Check
from llmgw.agent.doctor_health import FAIL, INFO, OK
from llmgw.errors import UsageError


def _engine_builds(mirror: Path) -> list[str]:
    """The engine builds a mirror holds, "engine@version" for each `<engine>/<version>/bin/` with a file in it."""
    found = []
    for version_dir in sorted(mirror.glob("*/*/bin")):
        if version_dir.is_dir() and any(p.is_file() for p in version_dir.iterdir()):
            found.append(f"{version_dir.parent.parent.name}@{version_dir.parent.name}")
    return found


def mirror_check(mirror: Path) -> Check:
    """One mirror: fail when it is not a readable directory, else what it holds."""
    if not mirror.is_dir() or not os.access(mirror, os.R_OK | os.X_OK):
        return Check("install", FAIL, f"the mirror {mirror} that the agent settings name is not a directory this node "
                                      "can read: mount or copy it there, or change agents/ `mirrors:`")
    weights = mirror / "sha256"
    count = sum(1 for p in weights.iterdir() if p.is_file()) if weights.is_dir() else 0
    engines = _engine_builds(mirror)
    return Check("install", OK, f"mirror {mirror}: {count} weights file{'s' if count != 1 else ''}, engines "
                                f"{', '.join(engines) if engines else 'none'}")


def install_checks(state_dir: Path) -> list[Check]:
    """The checks of the module docstring for the agent whose state directory is `state_dir`."""
    try:
        settings = load_agent_settings(state_dir)
    except UsageError as exc:
        return [Check("install", FAIL, str(exc))]
    if settings is None:
        return [Check("install", FAIL, f"the agent has not had its settings from the control plane yet (none kept in "
                                       f"{state_dir}): it learns there where engines and weights come from")]
    if not settings.mirrors:
        return [Check("install", INFO, "no mirror in the agent settings: engines and weights are downloaded (or "
                                       "llama.cpp built) when a replica needs them")]
    return [mirror_check(Path(mirror)) for mirror in settings.mirrors]


def render(checks: list[Check]) -> str:
    """As `DoctorReport.render`: one line per check, then "node doctor: installable" or how many failed."""
    failed = sum(c.status is FAIL for c in checks)
    lines = [f"{c.status.value:<5} {c.name}  {c.detail}" for c in checks]
    lines.append("node doctor: " + ("installable" if not failed else f"{failed} check(s) failed"))
    return "\n".join(lines)
