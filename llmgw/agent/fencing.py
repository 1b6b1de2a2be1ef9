"""The agent's fence against deposed leaders: a command from an older leader-lease token than the newest seen is
refused.

Every command a control plane sends carries its leader lease's fencing token (`ControlMessage.fencing_token`, see
`llmgw.store` leases: the token rises with every new holder). A leader that lost its lease (a network partition, a
long pause) may still have commands on their way; the agent answers them with a refusal, so only the newest
leader acts. The newest token is kept in `<state_dir>/fencing-token`, so an agent restarted over the stream still
refuses the old leader. Pure apart from `load_token` / `save_token`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TOKEN_FILE = "fencing-token"

FENCED_COMMANDS = frozenset({"start_shard", "stop_shard", "install_engine", "agent_settings", "restart",
                             "upgrade_agent", "wipe_node", "start_training", "cancel_training"})
"""The ControlMessage bodies that change the node: each is checked against the fence. RequestLogs only reads."""


@dataclass(frozen=True)
class Fence:
    """The newest fencing token this agent has seen (0: none yet)."""

    newest: int = 0

    def admit(self, token: int) -> tuple[Fence, str | None]:
        """The fence after a command carrying `token`, and None when the command may run, or a sentence for its
        CommandResult when it comes from a deposed leader (a token older than `newest`; 0, no token at all, is
        older than any once a token was seen)."""
        if token < self.newest:
            return self, (f"refused: this command carries leader-lease token {token}, older than token {self.newest} "
                          "of the control plane that leads now; it comes from a deposed leader and is not run.")
        return (Fence(token) if token > self.newest else self), None


def load_token(state_dir: Path) -> int:
    """The newest token kept under `state_dir` (0 when none is, or the file is unreadable)."""
    try:
        return int((Path(state_dir) / TOKEN_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def save_token(state_dir: Path, token: int) -> None:
    """Keep `token` under `state_dir` (written to a temporary file, then renamed). Raises OSError."""
    path = Path(state_dir) / TOKEN_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(f"{token}\n")
    os.replace(temporary, path)
