"""The names a control plane's server certificates carry when no `--tls-hostname` is given (`certificate_names`).

A listener on a wildcard address (0.0.0.0, `::`: the default of `llmgw server init`) is reached at any address of
the machine, so its certificate names the machine's host name and every non-loopback address it has, beside
localhost and 127.0.0.1; a listener on one address names that address. The addresses are read from the network
namespace the control plane runs in (`machine_names`: /proc/net/fib_trie for IPv4, /proc/net/if_inet6 for IPv6;
link-local IPv6 addresses are left out, a certificate cannot name their zone).

    certificate_names("0.0.0.0", ("cp1", ["10.0.0.1"]))  # ("cp1", "10.0.0.1", "localhost", "127.0.0.1")
    certificate_names("10.0.0.1", ("cp1", ["10.0.0.1"]))  # ("10.0.0.1", "localhost", "127.0.0.1")
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from pathlib import Path

WILDCARDS = ("", "0.0.0.0", "::", "[::]")
"""Listener hosts that mean every address of the machine."""

LOCAL = ("localhost", "127.0.0.1")


def certificate_names(listen_host: str, machine: tuple[str, Sequence[str]]) -> tuple[str, ...]:
    """The server certificate's names for a listener on `listen_host`, given `machine` = (host name, addresses)
    as `machine_names` returns them: the listener's host, or for a wildcard the host name and the addresses;
    then localhost and 127.0.0.1. Each once, in that order; never a wildcard."""
    if listen_host in WILDCARDS:
        hostname, addresses = machine
        first = [hostname, *addresses]
    else:
        first = [listen_host.strip("[]")]
    return tuple(dict.fromkeys(name for name in (*first, *LOCAL) if name and name not in WILDCARDS))


def ipv4_local_addresses(fib_trie: str) -> list[str]:
    """The IPv4 addresses of this network namespace in the text of /proc/net/fib_trie (a "|-- ADDRESS" line followed
    by "/32 host LOCAL"), loopback ones left out; each once, in the file's order."""
    found: list[str] = []
    previous = ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text == "/32 host LOCAL" and previous.startswith("|-- "):
            address = previous[4:].strip()
            if not ipaddress.ip_address(address).is_loopback and address not in found:
                found.append(address)
        previous = text
    return found


def ipv6_addresses(if_inet6: str) -> list[str]:
    """The global IPv6 addresses in the text of /proc/net/if_inet6 (32 hex digits, interface index, prefix length,
    scope, flags, name per line): loopback (scope 0x10) and link-local (0x20) ones left out; compressed form."""
    found: list[str] = []
    for line in if_inet6.splitlines():
        fields = line.split()
        if len(fields) < 4 or len(fields[0]) != 32 or fields[3] in ("10", "20"):
            continue
        address = str(ipaddress.IPv6Address(int(fields[0], 16)))
        if address not in found:
            found.append(address)
    return found


def machine_names(proc: Path = Path("/proc/net")) -> tuple[str, list[str]]:
    """(this machine's host name, its non-loopback IPv4 then IPv6 addresses) in the current network namespace.
    A /proc file that cannot be read gives no addresses of its family (never raises for it)."""
    def read(name: str) -> str:
        try:
            return (proc / name).read_text()
        except OSError:
            return ""

    return socket.gethostname(), [*ipv4_local_addresses(read("fib_trie")), *ipv6_addresses(read("if_inet6"))]
