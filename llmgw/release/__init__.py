"""llmgw.release: signed releases of llmgw that a node installs without a registry (docs/install.md, "Releases").

Keys (`keys`): `keygen(dir, passphrase=None) -> (secret key path, public key path)` in minisign's formats;
`parse_public_key`, `read_public_key`, `read_secret_key`, `PublicKey`, `SecretKey`. Signatures (`signatures`):
`sign(data, key, trusted_comment) -> text`, `verify(data, text, trusted) -> Signature`, minisign-compatible.
Releases: `build_release(out_dir, secret_key, python, platform) -> Path` (`building`), `verify_release(dir,
trusted_keys) -> Manifest` (`manifest`). What a node runs: `installed_release() -> InstalledRelease | None`
(`installed`: the record `llmgw node add` keeps in the venv). Offline bundles (`bundle`): `create_bundle`,
`verify_bundle`, `import_bundle` (a signed directory laid out as the agents' mirror). Every failure is a `llmgw.errors.ReleaseError` saying what failed.
"""

from llmgw.release.building import DEFAULT_PLATFORM, DEFAULT_PYTHON, build_release, default_source, target_platforms
from llmgw.release.keys import (
    MEMLIMIT_INTERACTIVE, OPSLIMIT_INTERACTIVE, PASSPHRASE_ENV, PUBLIC_KEY_FILE, SECRET_KEY_FILE, PublicKey,
    SecretKey, format_key_id, keygen, parse_public_key, parse_secret_key, read_public_key, read_secret_key,
)
from llmgw.release.manifest import (
    MANIFEST, SIGNATURE, Manifest, ReleaseFile, file_sha256, parse_manifest, trusted_public_keys, verify_release,
)
from llmgw.release.signatures import Signature, sign, signature_key_id, verify
from llmgw.release.installed import RECORD_DIR, InstalledRelease, installed_release
from llmgw.release.bundle import (
    Bundle, create_bundle, import_bundle, imported_bundle, tree_entries, verify_bundle, write_tarball,
)

__all__ = [
    "DEFAULT_PLATFORM", "DEFAULT_PYTHON", "build_release", "default_source", "target_platforms",
    "MEMLIMIT_INTERACTIVE", "OPSLIMIT_INTERACTIVE", "PASSPHRASE_ENV", "PUBLIC_KEY_FILE", "SECRET_KEY_FILE",
    "PublicKey", "SecretKey", "format_key_id", "keygen", "parse_public_key", "parse_secret_key", "read_public_key",
    "read_secret_key",
    "MANIFEST", "SIGNATURE", "Manifest", "ReleaseFile", "file_sha256", "parse_manifest", "trusted_public_keys",
    "verify_release",
    "Signature", "sign", "signature_key_id", "verify",
    "RECORD_DIR", "InstalledRelease", "installed_release",
    "Bundle", "create_bundle", "import_bundle", "imported_bundle", "tree_entries", "verify_bundle",
    "write_tarball",
]
