"""The manifest of a backup archive: what it holds and the SHA-256 of every member, and the pure checks of an
archive read back against it.

The archive (`llmgw backup`) is a gzip'd tar whose first member is `manifest.json`:

    {"format": 1, "llmgw_version": "0.1.0", "created": "2026-12-04T21:00:00Z", "holds_ca_key": true,
     "store": {"kind": "sqlite"} | {"kind": "postgresql", "schema": "llmgw"},
     "branch": "main",
     "members": {"store/llmgw.sqlite3": {"sha256": "<64 hex>", "size": 1234}, "ca/ca.key": {...}, ...}}

Member names are relative POSIX paths under the fixed roots of `ROOTS`, never absolute, never with "..": a
restore writes each under its new state directory and nowhere else. Pure: no I/O here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.errors import BackupError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SQLITE_MEMBER = "store/llmgw.sqlite3"
PGDUMP_MEMBER = "store/llmgw.pgdump"
BUNDLE_MEMBER = "settings.bundle"
ADMIN_TOKEN_MEMBER = "admin-token"
ROOTS = ("store/", "ca/", "secrets/", BUNDLE_MEMBER, ADMIN_TOKEN_MEMBER)
"""Where a member may live: a file under store/, ca/ or secrets/, the settings bundle or the admin token."""
CA_KEY_MEMBER = "ca/ca.key"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Member:
    """One file of the archive: its name (see the module), SHA-256 (64 hex) and size in bytes."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """What an archive holds (see the module). `store_kind` "sqlite" or "postgresql"; `schema` the PostgreSQL
    schema the dump holds ("" for SQLite); `branch` the settings branch; `created` ISO 8601 UTC."""

    llmgw_version: str
    created: str
    store_kind: str
    branch: str
    members: tuple[Member, ...] = field(default_factory=tuple)
    schema: str = ""
    format: int = FORMAT_VERSION

    @property
    def holds_ca_key(self) -> bool:
        return any(member.name == CA_KEY_MEMBER for member in self.members)

    def to_json(self) -> str:
        store: dict[str, str] = {"kind": self.store_kind}
        if self.schema:
            store["schema"] = self.schema
        return json.dumps({
            "format": self.format, "llmgw_version": self.llmgw_version, "created": self.created,
            "holds_ca_key": self.holds_ca_key, "store": store, "branch": self.branch,
            "members": {m.name: {"sha256": m.sha256, "size": m.size} for m in self.members},
        }, indent=1, sort_keys=True) + "\n"


def check_member_name(name: str) -> str:
    """`name` when it is a member name a restore may write (module docstring); raises BackupError otherwise."""
    parts = name.split("/")
    if (not any(name == root or (root.endswith("/") and name.startswith(root)) for root in ROOTS)
            or not all(_PART.match(part) for part in parts) or len(parts) > 2):
        raise BackupError(f"the archive names a member {name!r} that no llmgw backup writes; it is not an llmgw "
                          "backup or it was altered: use another copy.")
    return name


def parse_manifest(text: bytes) -> Manifest:
    """The manifest in `text` (the bytes of manifest.json). Raises BackupError naming what is wrong: not JSON, a
    format this llmgw does not read, a field missing, a member name outside `ROOTS`, a digest that is no 64 hex."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        version = data.get("format")
        if version != FORMAT_VERSION:
            raise BackupError(f"the archive's manifest has format {version!r}; this llmgw reads format "
                              f"{FORMAT_VERSION} only: restore it with the llmgw version that wrote it "
                              f"({data.get('llmgw_version', 'unknown')}).")
        members = []
        for name, entry in sorted(data["members"].items()):
            digest = str(entry["sha256"])
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"member {name!r} has no valid sha256")
            members.append(Member(check_member_name(name), digest, int(entry["size"])))
        store = data["store"]
        return Manifest(llmgw_version=str(data["llmgw_version"]), created=str(data["created"]),
                        store_kind=str(store["kind"]), schema=str(store.get("schema", "")),
                        branch=str(data.get("branch", "main")), members=tuple(members))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BackupError(f"the archive's {MANIFEST_NAME} is damaged ({exc}); use another copy.") from exc


def damaged_members(manifest: Manifest, found: Mapping[str, str]) -> list[str]:
    """Sentences, one per member that does not match the manifest: `found` maps each member read from the archive
    (manifest.json excluded) to its SHA-256. Empty when every member is there with its digest and no other is."""
    problems = []
    for member in manifest.members:
        digest = found.get(member.name)
        if digest is None:
            problems.append(f"member {member.name} is missing")
        elif digest != member.sha256:
            problems.append(f"member {member.name} is damaged: its sha256 is {digest[:16]}..., the manifest says "
                            f"{member.sha256[:16]}...")
    listed = {member.name for member in manifest.members}
    problems.extend(f"member {name} is not in the manifest" for name in sorted(set(found) - listed))
    return problems
