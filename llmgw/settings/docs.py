"""docs/settings.md, generated from schema/*.json: one section per file kind, one table row per key.

Run `python -m llmgw.settings.docs` to rewrite docs/settings.md, or `--check` to exit 1 when it is stale
(the test suite does the same). Nothing in this page is written by hand: change the schemas instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from llmgw.settings.schemas import SCHEMA_KINDS, load_schema, schema_dir
from llmgw.settings.unbuilt import unbuilt_note

_ORDER = ("llmgw", "model", "engines", "agent", "projects", "firewall", "slurm")
_HEADER = """# Settings reference

<!-- Generated from schema/*.json by `python -m llmgw.settings.docs`; do not edit by hand. -->

A settings repository holds the files below; each is checked against its JSON Schema (draft 2020-12) in
`schema/`, which editors use through the YAML language server (the first line of each example file).
Unknown keys are errors. Sizes are strings such as `512Mi`, `16Gi`, `1.5T` (binary `Ki Mi Gi Ti Pi`,
decimal `k M G T P`, optional trailing `B`); durations are strings such as `500ms`, `2s`, `5m`, `1.5h`, `1d`.
`llmgw validate` reports every error as `file:line:column: key.path: reason`; see `examples/cluster-repo/`.
Numbers are finite; integers lie between -2^63 and 2^63-1, sizes up to 8Ei, durations up to 36500d.
Keys of capabilities not built yet are accepted but do nothing: their rows say **Accepted, not acted on yet**,
and `llmgw validate` warns `accepted, not acted on yet` at each such key a settings tree sets.
"""


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return {**schema["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type(schema: dict[str, Any], node: dict[str, Any]) -> str:
    ref = node.get("$ref", "")
    if ref.endswith("/size"):
        return "size"
    if ref.endswith("/duration"):
        return "duration"
    node = _resolve(schema, node)
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type(schema, n) for n in node["anyOf"])
    kind = node.get("type", "any")
    if isinstance(kind, list):  # e.g. replicas: a number or a {min, max} range
        return " or ".join(kind)
    if kind == "array":
        return f"list of {_type(schema, node.get('items', {}))}"
    if kind == "object" and "properties" not in node:
        return "mapping"
    if kind == "string" and "pattern" in node:
        return f"string (`{node['pattern']}`)".replace("|", "\\|")
    return kind


def _rows(schema: dict[str, Any], node: dict[str, Any], prefix: str, required: bool, kind: str) -> list[str]:
    ref = node.get("$ref", "")
    node = _resolve(schema, node)
    rows: list[str] = []
    if prefix:
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ("required" if required else "")
        limits = []
        if "minimum" in node:
            limits.append(f"min {node['minimum']}")
        if "maximum" in node:
            limits.append(f"max {node['maximum']}")
        description = node.get("description", "").replace("|", "\\|").replace("\n", " ")
        if limits:
            description += f" ({', '.join(limits)})"
        note = unbuilt_note(kind, prefix)
        if note:
            description += " " + note
        shown = "size" if ref.endswith("/size") else "duration" if ref.endswith("/duration") else _type(schema, node)
        rows.append(f"| `{prefix}` | {shown} | {default} | {description} |")
    if node.get("type") == "object" or "object" in (node.get("type") or ()) and "properties" in node:
        needed = set(node.get("required", ()))
        for key, child in node.get("properties", {}).items():
            rows += _rows(schema, child, f"{prefix}.{key}" if prefix else key, key in needed, kind)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and _resolve(schema, extra).get("type") == "object":
            rows += _rows(schema, extra, f"{prefix}.<name>" if prefix else "<name>", False, kind)
    if node.get("type") == "array":
        items = _resolve(schema, node.get("items", {}))
        if items.get("type") == "object":
            for key, child in items.get("properties", {}).items():
                rows += _rows(schema, child, f"{prefix}[].{key}", key in set(items.get("required", ())), kind)
    return rows


def render() -> str:
    """The whole of docs/settings.md as text, from the schemas on disk."""
    parts = [_HEADER]
    for kind in _ORDER:
        schema = load_schema(kind)
        parts.append(f"\n## `{schema['title']}`\n\nSchema: `schema/{kind}.json`. {schema['description']}\n")
        parts.append("| key | type | default | meaning |\n| --- | --- | --- | --- |")
        parts.extend(_rows(schema, schema, "", True, kind))
    return "\n".join(parts) + "\n"


def docs_path() -> Path:
    """Where the generated page lives: docs/settings.md beside schema/."""
    return schema_dir().parent / "docs" / "settings.md"


def main(argv: list[str] | None = None) -> int:
    """Write docs/settings.md (exit 0), or with --check exit 1 when it differs from what the schemas give."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    path = docs_path()
    if "--check" in args:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is stale; run: python -m llmgw.settings.docs", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return 0


assert set(_ORDER) == set(SCHEMA_KINDS)

if __name__ == "__main__":
    sys.exit(main())
