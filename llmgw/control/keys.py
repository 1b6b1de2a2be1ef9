"""Keys the control plane derives or looks up: replica keys, named secrets, the admin token, webhook signatures.

- A replica key is the bearer key the gateway sends to a replica's engine (the engine gets it in its environment):
  HMAC-SHA256(store secret "engine-key", replica id), hex. Any control plane sharing the store computes the same
  key for the same replica, so the gateway of one can reach the engines started by another. (The store secret
  keeps its stored name "engine-key" so keys of running engines stay valid across upgrades.)
- A named secret (`secret: hf-token` in settings) is read from `<secrets_dir>/<name>` (surrounding whitespace
  stripped), else from the environment variable `LLMGW_SECRET_<NAME>` (upper case, `-` and `.` as `_`).
- A forge's webhook is signed like GitHub's: header `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`
  (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from llmgw.errors import UsageError

REPLICA_KEY_SECRET = "engine-key"  # the stored name, kept: renaming it would change every replica key
WEBHOOK_SECRET = "webhook"


def replica_key(secret: bytes, replica_id: str) -> str:
    """The replica key of `replica_id`: 64 hex characters of HMAC-SHA256(secret, replica id)."""
    return hmac.new(secret, replica_id.encode("utf-8"), hashlib.sha256).hexdigest()


def sign_webhook(secret: bytes, body: bytes) -> str:
    """The `X-Hub-Signature-256` value for `body`: "sha256=" + hex digest."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def webhook_signature_valid(secret: bytes, body: bytes, header: bytes | str | None) -> bool:
    """True when `header` is the right `X-Hub-Signature-256` for `body` (constant-time compare of bytes).

    `header` is the raw header value; any bytes (non-ASCII ones too) are compared, never decoded, so a
    malformed header is a wrong signature, not an error. A `str` is encoded as UTF-8.
    """
    if not header or not secret:
        return False
    presented = header.encode("utf-8") if isinstance(header, str) else bytes(header)
    return hmac.compare_digest(sign_webhook(secret, body).encode("ascii"), presented.strip())


def token_matches(expected: str, authorization: str | None) -> bool:
    """True when an `Authorization: Bearer <token>` header carries `expected` (constant-time compare)."""
    if not authorization or not expected:
        return False
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), expected.encode())


class ReplicaKeys:
    """Replica keys by replica id under the store's "engine-key" secret (`secret`, set once the store is open),
    each kept once computed (every routing-table build asks for every ready replica's)."""

    def __init__(self, secret: bytes = b""):
        self.secret = secret
        self._keys: dict[str, str] = {}

    def get(self, replica_id: str) -> str:
        """`replica_key(secret, replica_id)`, from the cache when computed before."""
        key = self._keys.get(replica_id)
        if key is None:
            key = self._keys[replica_id] = replica_key(self.secret, replica_id)
        return key


class SecretResolver:
    """Looks up named secrets in a directory, then the environment. Values are never logged or committed."""

    def __init__(self, secrets_dir: Path | None, environ: dict[str, str] | None = None):
        self.secrets_dir = secrets_dir
        self.environ = os.environ if environ is None else environ

    def get(self, name: str) -> str | None:
        """The secret called `name`, or None when neither the directory nor the environment has it."""
        if self.secrets_dir is not None:
            path = self.secrets_dir / name
            if "/" not in name and path.is_file():
                return path.read_text().strip()
        env = "LLMGW_SECRET_" + name.upper().replace("-", "_").replace(".", "_")
        return self.environ.get(env)

    def require(self, name: str) -> str:
        """The secret called `name`; raises UsageError saying where to put it when it is missing."""
        value = self.get(name)
        if value is None:
            where = f"{self.secrets_dir}/{name}" if self.secrets_dir else "the secrets directory"
            raise UsageError(
                f"secret {name!r} is named in the settings but not found: write it to {where} "
                f"or set LLMGW_SECRET_{name.upper().replace('-', '_').replace('.', '_')}"
            )
        return value
