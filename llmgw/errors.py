"""The one error tree of llmgw.

    LlmgwError                      base of every error llmgw raises on purpose
    ├── SettingsError               bad settings input; never retried; carries the issues found
    ├── TemporaryError              worth retrying after `delay` seconds (network, busy store, ...)
    ├── UpstreamError               an engine or external endpoint failed (mapped from httpx at the boundary)
    ├── EngineError                 an engine could not be installed, built, verified or started
    ├── WeightsError                weights could not be fetched or verified
    ├── StoreError                  the runtime store failed or holds unexpected data
    ├── WireError                   the agent <-> control plane protocol failed
    ├── GeneratedFileError          a value refused by the writer of generated files (llmgw.plan.conf_lines)
    ├── InstallError                a host's install journal could not be read, written or undone (llmgw.install)
    ├── ReleaseError                a release could not be built, signed or verified (llmgw.release)
    ├── BackupError                 a backup could not be written, or an archive is damaged or cannot be restored
    └── UsageError                  a command line or API call was used wrongly (what to do instead is in the message)

A replica that cannot be placed is no error: the plan lists it with its reasons (`Plan.unplaced`).
A lower layer's exceptions never leak past that layer: they are caught at the boundary and re-raised as one
of these with `raise ... from exc`. `str(error)` is a sentence for a person: what is wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class LlmgwError(Exception):
    """Base of every error llmgw raises on purpose; `str()` is meant for a person to read."""


@dataclass(frozen=True)
class Issue:
    """One problem found in settings input.

    `file` is the path relative to the settings root (e.g. "catalog/gemma.yaml"), `line` and `column` are
    1-based (0 when unknown), `key_path` is the dotted key ("resources.gpus", "" for the whole file),
    `message` the reason. `severity` is "error" or "warning".
    """

    file: str
    line: int
    column: int
    key_path: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.column}" if self.column else f":{self.line}"
        key = f" {self.key_path}:" if self.key_path else ""
        prefix = "warning: " if self.severity == "warning" else ""
        if not where:  # a sentence that names its own file (e.g. one relayed by the admin API)
            return f"{key.strip()} {prefix}{self.message}".lstrip()
        return f"{where}:{key} {prefix}{self.message}"


class SettingsError(LlmgwError):
    """Settings that do not load or validate. `issues` holds every error found (not only the first)."""

    def __init__(self, issues: Iterable[Issue] | str):
        if isinstance(issues, str):
            issues = [Issue("", 0, 0, "", issues)]
        self.issues: tuple[Issue, ...] = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class TemporaryError(LlmgwError):
    """A failure worth retrying after `delay` seconds (None: the retrier's own growing backoff)."""

    def __init__(self, message: str, delay: float | None = None):
        self.delay = delay
        super().__init__(message)


class UpstreamError(LlmgwError):
    """An engine or external endpoint failed. `status` is the HTTP status to answer with (502 or 504)."""

    def __init__(self, message: str, status: int = 502):
        self.status = status
        super().__init__(message)


class EngineError(LlmgwError):
    """An engine could not be installed, built, verified or started."""


class WeightsError(LlmgwError):
    """Weights could not be fetched or verified."""


class StoreError(LlmgwError):
    """The runtime store failed or holds unexpected data."""


class WireError(LlmgwError):
    """The agent <-> control plane protocol failed (connection, version, certificate)."""


class AgentRefused(LlmgwError):
    """A control plane refused this agent for good (one newer than the control plane: upgrade the control plane
    first); not a link failure, so the agent ends instead of reconnecting. The message says what to do."""


class GeneratedFileError(LlmgwError, ValueError):
    """A value that cannot be written into a generated file (slurm.conf, gres.conf, ...) as one value: it would
    change the file's meaning (a newline, `#`, `=`, whitespace in a token). The message names the key and value."""


class InstallError(LlmgwError):
    """What llmgw installed on a host could not be recorded, read back or undone: the message names the journal or
    the path and what to do (see llmgw.install)."""


class ReleaseError(LlmgwError):
    """A release that could not be built, signed or verified, or a key that could not be read. `paths`: the files
    of the release at fault, relative to its directory (a digest that differs, a file not in the manifest); `key_id`:
    the signing key at fault (16 hex digits as minisign prints it), when the fault is the key."""

    def __init__(self, message: str, *, paths: tuple[str, ...] = (), key_id: str | None = None):
        self.paths = paths
        self.key_id = key_id
        super().__init__(message)


class BackupError(LlmgwError):
    """A backup could not be written, or an archive is damaged or cannot be restored (`llmgw.backup`); the
    message names the member, file or tool."""


class UsageError(LlmgwError):
    """A command or API call was used wrongly; the message says what to do instead."""
