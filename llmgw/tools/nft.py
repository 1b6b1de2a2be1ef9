"""llmgw's nftables table: its name, the one-transaction scripts that swap or remove it, the check an agent makes
of a table it is sent, and a parser of `nft -j list ruleset`. Pure; shared by the renderer (llmgw.plan.firewall)
and the agent (llmgw.agent.firewall).

A script for `nft -f` is one transaction: `table inet llmgw` (declare: creates it when absent, changes nothing
otherwise), `delete table inet llmgw`, then the new table's block. Either all of it loads or none of it does, so
the previous table stays when the new one fails; no other table is named, so none is touched.
Format: the nft(8) manual page and libnftables-json(5), nftables 1.0.6 (Debian 12).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re

TABLE = "inet llmgw"
"""The one table llmgw writes (family inet: IPv4 and IPv6)."""

REMOVE_SCRIPT = f"table {TABLE}\ndelete table {TABLE}\n"
"""The nft -f script removing llmgw's table; a no-op when it is absent."""

FABRIC_SETS = (("ip", "fabric_test4"), ("ip6", "fabric_test6"))
"""The table's sets of (client address, TCP port) a running fabric test lets in, by address family; their elements
carry a timeout, so a test's hole closes by itself."""

_OPENING = f"table {TABLE} {{\n"
_FORBIDDEN = re.compile(r"^\s*(table|delete|flush|destroy|add|create|insert|replace|reset|include|define|list|"
                        r"monitor|rename)\b", re.MULTILINE)


def replace_script(text: str) -> str:
    """The nft -f script swapping llmgw's table for `text` (one `table inet llmgw { ... }` block) at once."""
    return f"table {TABLE}\ndelete table {TABLE}\n{text}"


def table_refusal(text: str) -> str | None:
    """Why an agent refuses table `text`, or None when it is one block of table `inet llmgw` and nothing more: it
    opens with `table inet llmgw {`, ends with `}`, and no line inside starts a statement that names a table or
    acts on the ruleset (table, delete, flush, add, include, ...). A sentence for the control plane's status."""
    if not text.startswith(_OPENING) or not text.rstrip().endswith("}"):
        return f"the firewall table sent is not one block of table {TABLE}: refused, nothing changed"
    found = _FORBIDDEN.search(text[len(_OPENING):])
    if found:
        return (f"the firewall table sent holds a {found.group(1)!r} statement, which could reach beyond table "
                f"{TABLE}: refused, nothing changed")
    if "\x00" in text or not all(c.isprintable() or c in "\n\t" for c in text):
        return "the firewall table sent holds a control character: refused, nothing changed"
    return None


def ruleset_tables(text: str) -> list[tuple[str, str]]:
    """(family, name) of every table in `nft -j list ruleset` output, in its order ([] for an empty ruleset).
    Raises ValueError when `text` is not that JSON."""
    document = json.loads(text)
    return [(item["table"]["family"], item["table"]["name"]) for item in document["nftables"] if "table" in item]


def ruleset_rules(text: str, family: str, table: str) -> list[dict]:
    """The `rule` objects of table `family` `table` in `nft -j list ruleset` output, in order: each a mapping with
    "chain", "expr" (the rule's expressions as libnftables-json) and "comment" when it has one."""
    document = json.loads(text)
    return [item["rule"] for item in document["nftables"]
            if "rule" in item and item["rule"]["family"] == family and item["rule"]["table"] == table]


def fabric_element(address: str, port: int, seconds: float) -> str:
    """The nft -f script letting `address` (IPv4 or IPv6) reach TCP `port` for `seconds` (at least 1): one element of
    the fabric test's set of its family. Raises ValueError when `address` is not an IP address."""
    ip = ipaddress.ip_address(address.strip("[]"))
    name = dict(FABRIC_SETS)["ip" if ip.version == 4 else "ip6"]
    return f"add element {TABLE} {name} {{ {ip} . {int(port)} timeout {max(1, math.ceil(seconds))}s }}\n"
