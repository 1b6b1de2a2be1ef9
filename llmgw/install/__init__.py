"""What llmgw puts on a host and takes off again: the install journal (llmgw.install.journal) and undoing it
(llmgw.install.undoing), and the words of a wipe (llmgw.install.wiping). Imports nothing of llmgw but llmgw.errors
(and llmgw.units, for the wipe's sizes); used by the CLI (`llmgw wipe`, `llmgw node add`) and the agent (WipeNode,
a wipe over its stream: llmgw.agent.wiping)."""

from llmgw.install.journal import (
    JOURNAL_PATH,
    CreatedDirectory,
    CreatedLink,
    CreatedUser,
    Entry,
    FirewallTable,
    InstalledUnit,
    Journal,
    WrittenFile,
    describe,
    sha256_of,
    write_atomically,
)
from llmgw.install.commands import Runner, run_command
from llmgw.install.undoing import Outcome, kept_paths, size_of, sizes, undo
from llmgw.install.users import create_user

__all__ = [
    "JOURNAL_PATH", "CreatedDirectory", "CreatedLink", "CreatedUser", "Entry", "FirewallTable", "InstalledUnit",
    "Journal", "Outcome", "Runner", "WrittenFile", "create_user", "describe", "kept_paths", "run_command", "sha256_of", "size_of", "sizes",
    "undo", "write_atomically",
]
