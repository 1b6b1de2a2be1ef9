"""The systemd units llmgw installs (`llmgw server init`, `llmgw node add`): `deploy/systemd/` of the source tree, or
package data beside this module in a wheel (`_systemd/`, copied there by the build: setup.py). Only looks at files."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def units_dir() -> Path:
    """The directory holding `llmgw-server.service` and `llmgw-agent.service`: the wheel's package data, else
    `deploy/systemd/` of the source tree (and of an editable install)."""
    packaged = _HERE / "_systemd"
    return packaged if packaged.is_dir() else _HERE.parents[1] / "deploy" / "systemd"
