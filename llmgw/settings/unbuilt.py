"""Keys of capabilities not built yet: accepted by the schemas, not acted on, and said so.

UNBUILT is the one table of them. Each row names a key of one settings file (in docs/settings.md's notation: `a.b`,
`list[].key`, `map.<name>.key`), when a value of it is not acted on (any value given, or one value such as
`postgresql`), and what llmgw does instead. `unbuilt_warnings` turns every such key of a parsed file into a
warning "accepted, not acted on yet: ..." at the key's line and column; `llmgw validate` prints them, its --json
output lists them, and the pre-receive hook shows them to the pusher. docs/settings.md marks the same rows
(`unbuilt_note`). When a capability lands, delete its row here: the warning and the docs note go with it.

How the rows were found: each key of docs/settings.md was followed to where llmgw reads it (grep of llmgw/ for the
Settings field); a key read by nothing, or read but not used for what its description says, is a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llmgw.errors import Issue
from llmgw.settings.parsing import Parsed
from llmgw.settings.schemas import format_path

NOT_ACTED_ON = "accepted, not acted on yet"
ANY = "[]"  # a path segment: every item of a list
NAME = "<name>"  # a path segment: every key of a mapping

KeyPath = tuple[str, ...]


def _given(value: Any) -> bool:
    """Any value but an empty list or mapping (which means the same as leaving the key out)."""
    return value not in ([], {}, None)


@dataclass(frozen=True)
class UnbuiltKey:
    """One key not acted on: in files of schema `kind` at `path`, when `applies(value)`; `when` says so in words
    for the docs ("" for any value), `instead` what llmgw does instead (a sentence without a final period)."""

    kind: str
    path: KeyPath
    instead: str
    when: str = ""
    applies: Callable[[Any], bool] = _given

    @property
    def key(self) -> str:
        """The key in docs/settings.md's notation: ("llama.cpp", "[]", "python_packages") -> "llama.cpp[].python_packages"."""
        out = ""
        for part in self.path:
            out += part if part == ANY else ("." if out else "") + part
        return out


_NO_INSTALL = {
    "llama.cpp": "agents install llama.cpp from archives, an sdist or a mirror; no Python environment is made for it",
    "vllm": "agents install vLLM as a virtual environment of its `python_packages` only",
    "sglang": "agents install SGLang as a virtual environment of its `python_packages` only",
}

UNBUILT: tuple[UnbuiltKey, ...] = (
    UnbuiltKey("engines", ("llama.cpp", ANY, "python_packages"), _NO_INSTALL["llama.cpp"]),
    *(UnbuiltKey("engines", (engine, ANY, key), _NO_INSTALL[engine])
      for engine in ("vllm", "sglang") for key in ("archives", "sdist", "mirror", "build_args")),
    UnbuiltKey("agent", ("fabrics",), "nothing reads this key: agents report the interconnects they discover"),
)


def _matches(data: Any, path: KeyPath, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every (concrete path, value) in `data` that `path` (with ANY and NAME segments) names, in document order."""
    if not path:
        yield prefix, data
        return
    head, rest = path[0], path[1:]
    if head == ANY:
        if isinstance(data, list):
            for index, item in enumerate(data):
                yield from _matches(item, rest, prefix + (index,))
    elif isinstance(data, dict):
        for key in (data if head == NAME else [head] if head in data else []):
            yield from _matches(data[key], rest, prefix + (key,))


def unbuilt_warnings(kind: str, file: str, parsed: Parsed) -> list[Issue]:
    """A warning for every key of `file` (schema `kind`, schema-valid `parsed`) that UNBUILT says is not acted on.

    Each is at the key's line and column, names the key path, and reads "accepted, not acted on yet: <instead>".
    """
    issues = []
    for row in UNBUILT:
        if row.kind != kind:
            continue
        for where, value in _matches(parsed.data, row.path):
            if row.applies(value):
                issues.append(Issue(file, *parsed.position(where, of_key=True), format_path(where),
                                    f"{NOT_ACTED_ON}: {row.instead}", "warning"))
    return issues


def unbuilt_note(kind: str, key: str) -> str | None:
    """What docs/settings.md says after the meaning of `key` (docs notation) of schema `kind`, or None."""
    for row in UNBUILT:
        if row.kind == kind and row.key == key:
            when = f" (when {row.when})" if row.when else ""
            return f"**{NOT_ACTED_ON.capitalize()}**{when}: {row.instead}."
    return None


def is_not_acted_on(issue: Issue) -> bool:
    """True for a warning made by `unbuilt_warnings`."""
    return issue.severity == "warning" and issue.message.startswith(NOT_ACTED_ON + ":")
