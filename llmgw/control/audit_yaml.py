"""The audit's status.yaml as text, dumped in proportion to what changed since the previous commit.

A large fleet's status document is mostly its `nodes` and `replicas` mappings, one entry per node and per replica,
and between two audit commits few of them change. Dumping the whole document with ruamel.yaml (pure Python) was 46%
of the control plane's CPU while 1,000 agents joined (docs/scale.md). `StatusYaml.dump(doc)` keeps the text of each
entry of those sections from its previous dump and dumps again only the entries whose value changed (compared as
plain data, in C), so a commit costs what changed plus one comparison per entry.

The bytes are exactly `dump_yaml(doc)`'s: each entry is dumped inside its section (`{section: {key: value}}`, the
section's own line dropped), where ruamel lays it out at the same column and line width as in the whole document;
tests/control/test_audit_yaml.py checks that on seeded random documents.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from ruamel.yaml import YAML

SECTIONED = ("nodes", "replicas")
"""Top-level keys of a status document whose entries are dumped and kept one by one."""


def _yaml() -> YAML:
    yaml = YAML()
    yaml.default_flow_style = False
    return yaml


def _text(yaml: YAML, doc: Mapping[str, Any]) -> str:
    out = io.StringIO()
    yaml.dump(_plain(doc), out)
    return out.getvalue()


def dump_yaml(doc: Mapping[str, Any]) -> bytes:
    """`doc` as block-style YAML (UTF-8), in the order of its keys."""
    return _text(_yaml(), doc).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class StatusYaml:
    """Dumps successive status documents, reusing the text of unchanged `SECTIONED` entries of the previous one.

    Not thread-safe: one writer dumps one document at a time (the audit writer's, in its worker thread). Values of a
    dumped document must not be changed afterwards (the control plane builds a new document for each pass).
    `dumped` / `reused` count the entries dumped again and the entries whose text was kept.
    """

    def __init__(self) -> None:
        self._yaml = _yaml()
        self._entries: dict[str, dict[str, tuple[Any, str]]] = {}
        self.dumped = 0
        self.reused = 0

    def dump(self, doc: Mapping[str, Any]) -> bytes:
        """`doc` as `dump_yaml(doc)` would write it (UTF-8)."""
        parts: list[str] = []
        kept: dict[str, dict[str, tuple[Any, str]]] = {}
        for key, value in doc.items():
            if key not in SECTIONED or not isinstance(value, Mapping) or not value:
                parts.append(_text(self._yaml, {key: value}))
                continue
            before = self._entries.get(str(key), {})
            now: dict[str, tuple[Any, str]] = {}
            parts.append(f"{key}:\n")
            for name, entry in value.items():
                previous = before.get(str(name))
                if previous is not None and previous[0] == entry:
                    text = previous[1]
                    self.reused += 1
                else:
                    text = _text(self._yaml, {key: {name: entry}}).split("\n", 1)[1]
                    self.dumped += 1
                now[str(name)] = (entry, text)
                parts.append(text)
            kept[str(key)] = now
        self._entries = kept
        return "".join(parts).encode()
