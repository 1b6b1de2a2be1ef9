"""Backup and restore of a control plane (`llmgw backup`, `llmgw restore`): one archive holding the store (an
online SQLite copy or a `pg_dump`), the CA, the admin token, the secrets and the settings repository's refs, with a
manifest of SHA-256 digests; a restore refuses a damaged archive by member name. See docs/ha.md, "Backup and
restore"."""

from llmgw.backup.manifest import FORMAT_VERSION, Manifest, Member, damaged_members, parse_manifest
from llmgw.backup.restoring import RestoreSummary, restore_backup, verify_archive
from llmgw.backup.writing import BackupSummary, write_backup

__all__ = [
    "FORMAT_VERSION", "BackupSummary", "Manifest", "Member", "RestoreSummary", "damaged_members", "parse_manifest",
    "restore_backup", "verify_archive", "write_backup",
]
