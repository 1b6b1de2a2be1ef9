"""The admin API from the command line: where it is, which token to use, and a small blocking client.

Where: `--url`, else `$LLMGW_ADMIN_URL`, else `<state>/admin-url` (written by `llmgw server` / `llmgw up`).
Token: `--token`, else `$LLMGW_ADMIN_TOKEN`, else `<state>/admin-token`. The state directory is `--state`,
else `$LLMGW_STATE`, else `.state` (as `llmgw up` uses). An https admin API is verified with `$LLMGW_ADMIN_CA`, else
the agents' CA `<state>/ca/ca.crt` when there is one (`llmgw server --tls`), else the system's CAs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from llmgw.errors import LlmgwError, SettingsError, TemporaryError, UsageError
from llmgw.http_trust import default_verify


def default_state_dir() -> Path:
    """`$LLMGW_STATE`, else `.state` (the directory `llmgw up` uses by default)."""
    return Path(os.environ.get("LLMGW_STATE") or ".state")


def resolve_admin(url: str | None, token: str | None, state_dir: Path | None) -> tuple[str, str]:
    """(admin URL, admin token) from the flags, the environment or the state directory.

    Raises: UsageError saying what to pass when either cannot be found.
    """
    state = Path(state_dir) if state_dir else default_state_dir()
    url = url or os.environ.get("LLMGW_ADMIN_URL")
    if not url and (state / "admin-url").is_file():
        url = (state / "admin-url").read_text().strip()
    if not url:
        raise UsageError(f"where is the admin API? pass --url http://HOST:PORT, set LLMGW_ADMIN_URL, or --state DIR "
                         f"of a running `llmgw server` / `llmgw up` ({state}/admin-url does not exist).")
    token = token or os.environ.get("LLMGW_ADMIN_TOKEN")
    if not token and (state / "admin-token").is_file():
        token = (state / "admin-token").read_text().strip()
    if not token:
        raise UsageError(f"an admin token is needed: pass --token, set LLMGW_ADMIN_TOKEN, or --state DIR holding "
                         f"admin-token ({state}/admin-token does not exist).")
    return url.rstrip("/"), token


def admin_ca_file(state_dir: Path | None) -> str | None:
    """The CA certificate file an https admin API is verified with: `$LLMGW_ADMIN_CA`, else `<state>/ca/ca.crt`
    when it exists, else None (the system's CAs)."""
    if os.environ.get("LLMGW_ADMIN_CA"):
        return os.environ["LLMGW_ADMIN_CA"]
    ca = (Path(state_dir) if state_dir else default_state_dir()) / "ca" / "ca.crt"
    return str(ca) if ca.is_file() else None


class AdminClient:
    """Blocking calls to the admin API at `url` with `token`. Timeouts in seconds.

    Every method raises: TemporaryError when nothing answers at `url`; UsageError for a refused token (401),
    a person's role that does not allow the request (403), an unknown node (409) or a bad request; SettingsError (400 "settings") with the issues as sent;
    LlmgwError for anything else the server reports.
    """

    def __init__(self, url: str, token: str, timeout: float = 30.0, ca_file: str | None = None):
        import ssl

        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                    timeout=httpx.Timeout(timeout, read=None),
                                    verify=ssl.create_default_context(cafile=ca_file) if ca_file else default_verify())

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {"message": response.text.strip() or response.reason_phrase}
        message = error.get("message") or f"HTTP {response.status_code}"
        if response.status_code == 401:
            raise UsageError(f"the admin API at {self.url} refused the token: {message}")
        if error.get("type") == "settings":
            raise SettingsError(message)
        if response.status_code in (400, 403, 404, 409, 413):  # 403: a person's role does not allow it
            raise UsageError(message)
        if response.status_code == 503:
            raise TemporaryError(message)
        raise LlmgwError(f"the admin API answered {response.status_code}: {message}")

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise TemporaryError(f"no control plane answers at {self.url} ({exc}); is `llmgw server` or "
                                 f"`llmgw up` running?") from exc
        self._check(response)
        return response

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """GET `path` (e.g. "/api/v1/status") with query `params`; the JSON answer."""
        params = {k: v for k, v in params.items() if v is not None}
        return self._request("GET", path, params=params).json()

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST `body` as JSON to `path`; the JSON answer."""
        return self._request("POST", path, json=body or {}).json()

    def post_bytes(self, path: str, content: bytes, content_type: str, **params: Any) -> dict[str, Any]:
        """POST `content` (a file's bytes, of `content_type`) to `path` with query `params`; the JSON answer."""
        return self._request("POST", path, content=content, params=params,
                             headers={"content-type": content_type}).json()

    def stream(self, path: str, body: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """POST `body` to `path` and yield each NDJSON line of the answer as it arrives."""
        try:
            with self._client.stream("POST", path, json=body or {}) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response)
                for line in response.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as exc:
            raise TemporaryError(f"the connection to {self.url} broke ({exc}); run `llmgw status` to see where "
                                 f"the fleet stands.") from exc
