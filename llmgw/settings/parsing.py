"""Safe YAML parsing with positions: text in, plain data (dict / list / str / int / float / bool / None) out.

The text is only *composed* by ruamel.yaml (events to nodes, which carry line and column); llmgw turns the
nodes into data itself, so no tag is ever run. Refused, each as an Issue with `file:line:column`:
tabs in indentation, explicit tags other than YAML's core ones (`!!str`, `!!int`, ...), duplicate keys,
non-scalar keys, recursive aliases, aliases that expand to more than MAX_VALUES values (a "billion laughs"
file fails after MAX_VALUES steps, in milliseconds), nesting deeper than MAX_DEPTH, several documents in one file.
Merge keys (`<<: *defaults`) are supported; explicit keys win over merged ones.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmgw.errors import Issue

MAX_VALUES = 100_000
MAX_DEPTH = 64
_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")}
_TAB_INDENT = re.compile(r"^( *)\t", re.MULTILINE)

Path = tuple[str | int, ...]


@dataclass
class Parsed:
    """A parsed file: `data` (None for an empty file), and 1-based (line, column) positions.

    `values[path]` is where the value at `path` starts; `keys[path]` where the key naming it starts (mapping
    entries only). Paths are tuples of keys and list indices, () for the whole document.
    """

    data: Any = None
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def position(self, path: Path, *, of_key: bool = False) -> tuple[int, int]:
        """The position of `path` (its key when `of_key`), else of its nearest ancestor that has one; (1, 1) last."""
        probe = tuple(path)
        while True:
            if of_key and probe in self.keys:
                return self.keys[probe]
            if probe in self.values:
                return self.values[probe]
            if not probe:
                return (1, 1)
            probe = probe[:-1]


class _Refused(Exception):
    def __init__(self, node: Node | None, message: str):
        self.node = node
        self.message = message


def _mark(node: Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _scalar(node: ScalarNode) -> Any:
    tag, text = node.tag, node.value
    if tag == _CORE + "null":
        return None
    if tag == _CORE + "bool":
        return text.lower() in ("true", "yes", "on")
    if tag == _CORE + "int":
        digits = text.replace("_", "")
        sign = -1 if digits.startswith("-") else 1
        digits = digits.lstrip("+-")
        if digits[:2] in ("0x", "0X"):
            return sign * int(digits[2:], 16)
        if digits[:2] in ("0o", "0O"):
            return sign * int(digits[2:], 8)
        if digits[:2] in ("0b", "0B"):
            return sign * int(digits[2:], 2)
        return sign * int(digits, 10)
    if tag == _CORE + "float":
        lowered = text.lower().replace("_", "")
        if lowered in (".inf", "+.inf"):
            return math.inf
        if lowered == "-.inf":
            return -math.inf
        if lowered == ".nan":
            return math.nan
        return float(lowered)
    return text  # str, timestamp (kept as written)


class _Builder:
    def __init__(self, parsed: Parsed):
        self.parsed = parsed
        self.count = 0
        self.active: set[int] = set()
        self.top_key: tuple[int, int] | None = None

    def build(self, node: Node, path: Path, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise _Refused(None if self.top_key else node, f"aliases expand to more than {MAX_VALUES} values (a YAML bomb?); "
                                 "write the values out or use fewer aliases")
        if depth > MAX_DEPTH:
            raise _Refused(node, f"nesting is deeper than {MAX_DEPTH} levels")
        tag = node.tag if isinstance(node.tag, str) else getattr(node.tag, "value", str(node.tag))
        if tag not in _ALLOWED_TAGS:
            raise _Refused(node, f"tag {tag!r} is not allowed; settings hold plain values (remove the tag)")
        self.parsed.values.setdefault(path, _mark(node))
        if isinstance(node, ScalarNode):
            try:
                return _scalar(node)
            except ValueError as exc:
                raise _Refused(node, f"{node.value!r} is not a valid {tag[len(_CORE):]}") from exc
        if id(node) in self.active:
            raise _Refused(node, "an alias refers to a value that contains it (recursive alias)")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
            if isinstance(node, MappingNode):
                return self._mapping(node, path, depth)
            raise _Refused(node, "unexpected YAML node")  # pragma: no cover - composer makes only these
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: MappingNode, path: Path, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        seen: dict[str, tuple[int, int]] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key_tag = key_node.tag if isinstance(key_node.tag, str) else getattr(key_node.tag, "value", "")
            if key_tag == _CORE + "merge":
                sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for source in sources:
                    if not isinstance(source, MappingNode):
                        raise _Refused(source, "a merge key (<<) takes a mapping or a list of mappings")
                    for k, v in self._mapping(source, path, depth + 1).items():
                        merged.setdefault(k, v)
                continue
            if not isinstance(key_node, ScalarNode):
                raise _Refused(key_node, "a key must be a plain scalar, not a list or mapping")
            key = key_node.value
            if key in seen:
                line, _ = seen[key]
                raise _Refused(key_node, f"duplicate key {key!r} (first at line {line}); each key may appear once")
            seen[key] = _mark(key_node)
            if depth == 0:
                self.top_key = seen[key]
            self.parsed.keys.setdefault(path + (key,), _mark(key_node))
            result[key] = self.build(value_node, path + (key,), depth + 1)
        for k, v in merged.items():
            result.setdefault(k, v)
        return result


def parse_yaml(file: str, text: str) -> tuple[Parsed, list[Issue]]:
    """Parse `text` (the content of `file`, for messages) into data with positions.

    Returns (Parsed, issues). On any issue `Parsed.data` is None and the issues say why, each with the
    line and column. An empty file (or only comments) gives data None and no issue: the caller decides.
    """
    parsed = Parsed()
    tabs = [Issue(file, text.count("\n", 0, m.end()) + 1, len(m.group(1)) + 1, "",
                  "tab character in indentation; YAML indents with spaces")
            for m in _TAB_INDENT.finditer(text)]
    if tabs:
        return parsed, tabs
    yaml = YAML(typ="safe", pure=True)
    try:
        node = yaml.compose(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = exc.problem or exc.context or "not valid YAML"
        if "\\t" in reason or "'\\t'" in reason:
            reason = "tab character where YAML expects a token; use spaces"
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        return parsed, [Issue(file, line, column, "", f"not valid YAML: {reason}")]
    except (YAMLError, RecursionError) as exc:
        reason = "nesting is too deep" if isinstance(exc, RecursionError) else str(exc).splitlines()[0]
        return parsed, [Issue(file, 0, 0, "", f"not valid YAML: {reason}")]
    if node is None:
        return parsed, []
    builder = _Builder(parsed)
    try:
        parsed.data = builder.build(node, (), 0)
    except _Refused as exc:
        parsed.data = None
        line, column = _mark(exc.node) if exc.node is not None else (builder.top_key or (0, 0))
        return parsed, [Issue(file, line, column, "", exc.message)]
    return parsed, []
