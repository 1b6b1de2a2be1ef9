"""Who may reach the admin listener, and how: TLS or loopback, trusted proxies, the git hook's token.

    check_admin_listener(host, port, tls=False, insecure=False)   refuses plain text off loopback (UsageError)
    proxies = trusted_proxies(["10.0.0.7", "10.1.0.0/24"])          addresses whose X-Forwarded-* headers count
    scope = forwarded_scope(scope, proxies)                         the ASGI scope as the client sent it (pure)
    AdminTls(cert_file, key_file)                                   the certificate the admin listener serves

The admin API and the console carry admin tokens and session cookies: in plain text on an address other machines
reach, anyone on the path reads them. `llmgw server --tls` serves the admin listener with a certificate of the
agents' CA (`<state>/admin-tls/`), `--admin-cert/--admin-key` with one of your own; `--insecure` accepts plain text
on a network where every machine is trusted. A TLS-terminating proxy in front (nginx, haproxy) is named with
`--trusted-proxy ADDRESS` (repeatable; an address or a network): only a request whose peer is one of them has its
`X-Forwarded-Proto` (the scheme: the console's cookie is `Secure` behind an https proxy) and `X-Forwarded-For`
(the client address) believed; any other peer's headers are ignored. The post-receive hook of a local settings
repository sends the token of `llmgw.settings.hook_token` in HOOK_TOKEN_HEADER. Pure but for `write_admin_tls`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw.errors import UsageError
from llmgw.wire.tls import is_loopback

HOOK_TOKEN_HEADER = b"x-llmgw-hook-token"
"""The header the post-receive hook sends its token in."""
ADMIN_TLS_DIR = "admin-tls"
"""Under the state directory: the admin listener's certificate and key issued by the agents' CA (`--tls`)."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class AdminTls:
    """The admin listener's certificate chain and key, as PEM files (`cert_file`, `key_file`). `contexts`: the SSL
    contexts serving them (`serve_admin` adds them), so that `reload` puts a new certificate in place."""

    cert_file: Path
    key_file: Path
    contexts: list[Any] = field(default_factory=list, compare=False)

    def reload(self) -> None:
        """Serve the files' certificate and key as they are now to every new connection (after `llmgw ca rotate`
        retired the CA that signed the old one). Blocking. Raises OSError or ssl.SSLError when they do not load."""
        for context in self.contexts:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))


def check_admin_listener(host: str, port: int, *, tls: bool, insecure: bool) -> None:
    """Refuse a plain-text admin listener that other machines can reach.

    `tls`: the listener serves TLS. `insecure`: the operator accepts plain text (`llmgw server --insecure`). Pure.
    Raises UsageError naming the address and the ways out.
    """
    if tls or insecure or is_loopback(host):
        return
    raise UsageError(
        f"refusing to serve the admin API and the console in plain text on {host or '*'}:{port}: admin tokens and "
        "console session cookies would cross the network readable. Run `llmgw server --tls` (a certificate of the "
        "agents' CA) or give --admin-cert FILE --admin-key FILE, listen on 127.0.0.1 behind a TLS proxy "
        "(--trusted-proxy ADDRESS), or pass --insecure if every machine on that network is trusted."
    )


def trusted_proxies(addresses: Iterable[str]) -> tuple[Network, ...]:
    """The networks of `addresses` ("10.0.0.7", "10.1.0.0/24", "::1"); a bare address is a network of one.

    Raises UsageError naming the entry that is neither an address nor a network.
    """
    networks = []
    for text in addresses:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise UsageError(f"trusted proxy {text!r} is not an IP address or network (e.g. 10.0.0.7 or "
                             "10.0.0.0/24).") from None
    return tuple(networks)


def _among(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    values = [value.decode("latin-1") for key, value in scope.get("headers") or () if key.lower() == name]
    return ",".join(values) if values else None


def forwarded_scope(scope: dict[str, Any], proxies: Sequence[Network]) -> dict[str, Any]:
    """`scope` (an ASGI HTTP scope) as the client sent it, when its peer is one of `proxies`; else `scope` itself.

    From a trusted peer: `X-Forwarded-Proto` (its last value, "http" or "https") becomes `scheme`, and the client
    address is the rightmost `X-Forwarded-For` entry that is not itself a trusted proxy (each proxy appends the
    address it saw). Headers from any other peer are ignored. Pure; returns a new mapping when it changes anything.
    """
    client = scope.get("client") or ("", 0)
    if not proxies or not _among(client[0], proxies):
        return scope
    changed = dict(scope)
    proto = _header(scope, b"x-forwarded-proto")
    if proto:
        last = proto.split(",")[-1].strip().lower()
        if last in ("http", "https"):
            changed["scheme"] = last
    chain = _header(scope, b"x-forwarded-for")
    if chain:
        hops = [hop.strip() for hop in chain.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not _among(hop, proxies):
                try:
                    ipaddress.ip_address(hop)
                except ValueError:
                    break  # not an address: believe nothing further left
                changed["client"] = (hop, 0)
                break
    return changed


def write_admin_tls(directory: Path, cert_pem: bytes, key_pem: bytes) -> AdminTls:
    """Write a certificate and key (PEM) to `directory` (created 0700; the key 0600) for hypercorn, which reads
    files (written again, they replace the old ones). Returns their paths. Raises OSError when the directory cannot
    be written."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert_pem)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key_pem)
    return AdminTls(cert_file, key_file)

