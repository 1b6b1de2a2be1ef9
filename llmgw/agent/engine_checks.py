"""The periodic check of installed engines: an install that worked once may break later (a shared library removed
by a package upgrade, the binary deleted or overwritten), and a node must not advertise an engine it cannot run.

`EngineChecks.run(config)` re-verifies every llama.cpp install under `<engines_dir>/llama.cpp/` that carries the
install marker, with `llmgw.engines.check_installed` (every shared library found by `ldd`, `--version` exits 0),
and every `engine_binaries` override (the file is still there and executable). A broken install loses its marker
(so InstallEngine redoes it) and leaves `engines_installed` in the next Heartbeat and Register; each newly broken
engine is logged once as a warning with the reason. The agent runs it at start and every
`AgentConfig.engine_check_interval` seconds (default 600).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from llmgw.agent.config import AgentConfig, engine_binary
from llmgw.engines import check_installed, install_dir
from llmgw.engines import python_env
from llmgw.engines.installing import MARKER
from llmgw.identity import engine_key, split_engine_key

log = logging.getLogger("llmgw.agent")


def find_broken_engines(config: AgentConfig) -> dict[str, str]:
    """{"engine@version": reason} for each marked install or override that no longer works. Blocking (runs `ldd`
    and `--version` per install: tens of milliseconds each). A broken install's marker is removed."""
    broken: dict[str, str] = {}
    root = config.engines_path / "llama.cpp"
    homes = sorted(root.iterdir()) if root.is_dir() else []
    for home in homes:
        key = engine_key("llama.cpp", home.name)
        if home.name.startswith(".") or not home.is_dir() or key in config.engine_binaries:
            continue
        marker = home / MARKER
        if not marker.is_file():
            continue  # not an install (or one already found broken and unmarked)
        binary = install_dir(config.engines_path, home.name) / "bin" / "llama-server"
        if not binary.is_file():
            marker.unlink(missing_ok=True)
            broken[key] = f"{binary} is missing"
            continue
        reason = check_installed(config.engines_path, home.name)
        if reason and not binary.is_file():  # deleted while `--version` ran: say what the operator did
            marker.unlink(missing_ok=True)
            reason = f"{binary} is missing"
        if reason:
            broken[key] = reason
    for engine in python_env.PYTHON_ENGINES:
        for version in python_env.installed_versions(config.engines_path, engine):
            key = engine_key(engine, version)
            if key not in config.engine_binaries:
                reason = python_env.check_installed(config.engines_path, engine, version)
                if reason:
                    broken[key] = reason
    for key, path in config.engine_binaries.items():
        binary = Path(path)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            broken[key] = f"{binary} (given for {key}) is missing or not executable"
    return broken


class EngineChecks:
    """What the last check found broken, so `usable()` can leave those engines out and each is warned about once."""

    def __init__(self) -> None:
        self.broken: dict[str, str] = {}
        self.checks = 0

    def run(self, config: AgentConfig) -> dict[str, str]:
        """Check every engine (blocking; see `find_broken_engines`); returns the engines newly found broken."""
        found = find_broken_engines(config)
        self.checks += 1
        new = {key: reason for key, reason in found.items() if self.broken.get(key) != reason}
        for key, reason in sorted(new.items()):
            log.warning("engine %s no longer works and is left out of engines_installed: %s; "
                        "install it again (InstallEngine, engines.yaml) or fix the node", key, reason)
        for key in sorted(set(self.broken) - set(found)):
            engine, version = split_engine_key(key)
            if engine_binary(config, engine, version) is not None:
                log.info("engine %s works again", key)
            else:  # unmarked by an earlier check and not installed again: still out, already warned about
                found[key] = self.broken[key]
        self.broken = found
        return new

    def usable(self, keys: Iterable[str]) -> list[str]:
        """`keys` less the engines the last check found broken, in their order."""
        return [key for key in keys if key not in self.broken]
