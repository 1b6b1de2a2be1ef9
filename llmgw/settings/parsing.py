"""Safe YAML parsing with positions: text in, plain data (dict / list / str / int / float / bool / None) out.

ruamel.yaml only *parses* the text into events (its C parser from ruamel.yaml.clib when installed, about 15x
faster, else its pure-Python one: the same events either way); llmgw composes the nodes, resolves plain
scalars by the YAML 1.2 core schema (`yes` is a string, `0.90` a float) and turns nodes into data itself, so
no tag is ever run. Refused, each as an Issue with `file:line:column`:
tabs in indentation, explicit tags other than YAML's core ones (`!!str`, `!!int`, ...), duplicate keys,
non-scalar keys, recursive aliases, aliases that expand to more than MAX_VALUES values (a "billion laughs"
file fails after MAX_VALUES steps, in milliseconds), nesting deeper than MAX_DEPTH, several documents in one file,
integers outside 64 bits (MIN_INT..MAX_INT: no setting needs more, and a 4,000-digit number made later stages
raise) and numbers that are not finite (`.inf`, `.nan`, `1e400`).
Merge keys (`<<: *defaults`) are supported; explicit keys win over merged ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

try:  # the C parser of ruamel.yaml.clib: same events, much faster
    from _ruamel_yaml import CParser as _CParser
except ImportError:  # pragma: no cover - depends on the installation
    _CParser = None

from llmgw.errors import Issue

MAX_VALUES = 100_000
MAX_DEPTH = 64
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)
_MAX_INT_TEXT = 80  # characters of an integer's text read at all: 64 bits need 64 binary digits, plus "-0b"
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


class Node:
    """A composed YAML node: `kind` "scalar" / "seq" / "map", its resolved `tag`, `value` (text, list of nodes,
    or list of (key, value) node pairs) and 1-based `line` / `column`."""

    __slots__ = ("kind", "tag", "value", "line", "column")

    def __init__(self, kind: str, tag: str, value: Any, mark: Any):
        self.kind, self.tag, self.value = kind, tag, value
        self.line, self.column = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)


def _mark(node: Node) -> tuple[int, int]:
    return (node.line, node.column)


# YAML 1.2 core schema resolution of plain scalars (https://yaml.org/spec/1.2.2/#1032-tag-resolution),
# with "_" digit separators as ruamel.yaml accepts them.
_IMPLICIT = [
    (_CORE + "null", re.compile(r"^(?:~|null|Null|NULL|)$")),
    (_CORE + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")),
    (_CORE + "int", re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$")),
    (_CORE + "float", re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                                 r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")),
    (_CORE + "merge", re.compile(r"^<<$")),
]


def _tag_text(tag: Any) -> str | None:
    return None if tag is None else str(getattr(tag, "value", tag))


def _scalar_tag(event: Any) -> str:
    tag = _tag_text(event.tag)
    if tag is not None and tag != "!":
        return tag
    if tag is None and event.implicit[0]:  # plain scalar
        for candidate, pattern in _IMPLICIT:
            if pattern.match(event.value):
                return candidate
    return _CORE + "str"


def _events(text: str, fast: bool) -> Iterator[Any]:
    if fast and _CParser is not None:
        parser = _CParser(text)
        while True:
            event = parser.get_event()
            yield event
            if type(event).__name__ == "StreamEndEvent":
                return
    yield from YAML(typ="safe", pure=True).parse(text)


def _compose(text: str) -> Node | None:
    """Events -> one Node tree (anchors shared, not copied). Raises _Refused, YAMLError.

    The C parser (libyaml) follows YAML 1.1 in a few corners (`{url: https://x}` is an error there, valid in
    1.2), so a text it refuses is parsed again by the pure-Python parser, whose verdict stands.
    """
    try:
        return _compose_with(text, fast=True)
    except YAMLError:
        if _CParser is None:
            raise
    return _compose_with(text, fast=False)


def _compose_with(text: str, fast: bool) -> Node | None:
    anchors: dict[str, Node] = {}
    stack: list[Node] = []
    root: Node | None = None
    documents = 0
    for event in _events(text, fast):
        name = type(event).__name__
        node: Node | None = None
        if name == "DocumentStartEvent":
            documents += 1
            if documents > 1:
                raise _Refused(Node("scalar", "", "", event.start_mark),
                               "a settings file holds one YAML document; remove the '---' and what follows")
            continue
        if name == "AliasEvent":
            node = anchors.get(event.anchor)
            if node is None:
                raise _Refused(Node("scalar", "", "", event.start_mark), f"alias *{event.anchor} has no anchor &{event.anchor} before it")
        elif name == "ScalarEvent":
            node = Node("scalar", _scalar_tag(event), event.value, event.start_mark)
        elif name in ("SequenceStartEvent", "MappingStartEvent"):
            kind = "seq" if name == "SequenceStartEvent" else "map"
            tag = _tag_text(event.tag)
            node = Node(kind, tag if tag not in (None, "!") else _CORE + kind, [], event.start_mark)
        elif name in ("SequenceEndEvent", "MappingEndEvent"):
            done = stack.pop()
            if done.kind == "map":
                flat = done.value
                done.value = list(zip(flat[0::2], flat[1::2]))
            continue
        else:
            continue
        if name != "AliasEvent" and getattr(event, "anchor", None):
            anchors[event.anchor] = node
        if stack:
            stack[-1].value.append(node)
        else:
            root = node
        if name in ("SequenceStartEvent", "MappingStartEvent"):
            stack.append(node)
    return root


def _shown(text: str) -> str:
    """A scalar's text for a message: whole when short, else its start and its length."""
    return repr(text) if len(text) <= 24 else f"{text[:16]!r}... ({len(text)} characters)"


def _scalar(node: Node) -> Any:
    """The value of a scalar node. Raises: ValueError (text that is not its tag's), _Refused (out of bounds)."""
    tag, text = node.tag, node.value
    if tag == _CORE + "int" and len(text.replace("_", "")) > _MAX_INT_TEXT:
        raise _Refused(node, f"{_shown(text)} is out of range: settings take integers from {MIN_INT} to {MAX_INT}")
    value = _scalar_value(tag, text)
    if isinstance(value, int) and not isinstance(value, bool) and not MIN_INT <= value <= MAX_INT:
        raise _Refused(node, f"{_shown(text)} is out of range: settings take integers from {MIN_INT} to {MAX_INT}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused(node, f"{_shown(text)} is not a finite number; settings take finite numbers (leave a "
                             "limit out for no limit)")
    return value


def _scalar_value(tag: str, text: str) -> Any:
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
        tag = node.tag
        if tag not in _ALLOWED_TAGS:
            raise _Refused(node, f"tag {tag!r} is not allowed; settings hold plain values (remove the tag)")
        self.parsed.values.setdefault(path, _mark(node))
        if node.kind == "scalar":
            try:
                return _scalar(node)
            except ValueError as exc:
                raise _Refused(node, f"{node.value!r} is not a valid {tag[len(_CORE):]}") from exc
        if id(node) in self.active:
            raise _Refused(node, "an alias refers to a value that contains it (recursive alias)")
        self.active.add(id(node))
        try:
            if node.kind == "seq":
                return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
            return self._mapping(node, path, depth)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: Node, path: Path, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        seen: dict[str, tuple[int, int]] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _CORE + "merge":
                sources = value_node.value if value_node.kind == "seq" else [value_node]
                for source in sources:
                    if source.kind != "map":
                        raise _Refused(source, "a merge key (<<) takes a mapping or a list of mappings")
                    for k, v in self._mapping(source, path, depth + 1).items():
                        merged.setdefault(k, v)
                continue
            if key_node.kind != "scalar":
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
    builder = _Builder(parsed)
    try:
        node = _compose(text)
        if node is not None:
            parsed.data = builder.build(node, (), 0)
    except _Refused as exc:
        parsed.data = None
        line, column = _mark(exc.node) if exc.node is not None else (builder.top_key or (0, 0))
        return parsed, [Issue(file, line, column, "", exc.message)]
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
    return parsed, []
