"""Secrets written inside URLs of the settings: refused, since the settings live in git where every clone reads them.

    url_secret("postgresql://llmgw:pw@db/llmgw")          -> "a password"
    url_secret("https://gitlab.example/x?private_token=t") -> "a token (query parameter private_token)"
    url_secret("https://ghp_abc@github.com/org/repo")      -> "a token (the user part of an https URL)"
    list(urls_with_secrets({"store": {"url": ...}}))       -> [(("store", "url"), "a password")]

A URL's authority is read up to its LAST "@" (a password written unquoted may hold "@"). A password in the user part
of any URL, a user part at all in an http(s) URL (forges take a token there: `https://TOKEN@github.com`,
`https://oauth2:TOKEN@gitlab...`), and a query parameter of TOKEN_QUERY_PARAMETERS are secrets. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

TOKEN_QUERY_PARAMETERS = frozenset({
    "password", "passwd", "private_token", "access_token", "token", "api_key", "apikey", "client_secret", "secret",
    "sig", "signature", "x-amz-signature", "x-amz-security-token",
})
"""Query parameters that carry a secret (libpq's password, GitLab's private_token, OAuth's access_token, signed
URLs' signatures), compared lower-case. Redaction (`llmgw.settings.redact_url`) hides the same ones."""

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>\S*)$")


def url_secret(text: str) -> str | None:
    """What secret the URL `text` carries ("a password", "a token (...)"), or None for none (or no URL)."""
    match = _URL.match(text.strip())
    if match is None:
        return None
    scheme, rest = match.group("scheme").lower(), match.group("rest")
    authority = rest.partition("/")[0]  # the authority ends at the first "/"; its last "@" ends the user part
    userinfo, at, _host = authority.rpartition("@")
    if at:
        if ":" in userinfo and userinfo.partition(":")[2]:
            return "a password"
        if scheme in ("http", "https") and userinfo:
            return f"a token (the user part of an {scheme} URL)"
    query = rest.partition("?")[2].partition("#")[0]
    for pair in re.split(r"[&;]", query):  # no urllib in llmgw.settings (an import contract): the names are plain
        name, _, value = pair.partition("=")
        if name.lower() in TOKEN_QUERY_PARAMETERS and value:
            return f"a token (query parameter {name})"
    return None


def urls_with_secrets(data: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(key path, what `url_secret` found) for every string in `data` (parsed YAML: mappings, lists, scalars) that is
    a URL carrying a secret, in document order."""
    if isinstance(data, str):
        found = url_secret(data)
        if found:
            yield path, found
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from urls_with_secrets(value, (*path, str(key)))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from urls_with_secrets(value, (*path, index))


def secret_in_url_message(path: tuple[str | int, ...], what: str) -> str:
    """The sentence for a URL at `path` carrying `what` (the value itself is never shown)."""
    where = ("store.password_secret names the secret holding the store's password"
             if tuple(path[-2:]) == ("store", "url") else
             "the store's password goes to store.password_secret, a source's token to its `secret:`")
    return (f"holds {what} inside a URL (not shown): settings live in git, where every clone reads them. Put it in a "
            f"secret (<secrets dir>/NAME or LLMGW_SECRET_NAME on each control plane) and name that secret: {where}.")
