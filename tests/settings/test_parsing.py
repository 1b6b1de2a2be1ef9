"""Safe YAML: values and positions come out right; tags, duplicates, bombs and deep nesting are refused."""

from __future__ import annotations

import time

import pytest

from llmgw.settings import parsing
from llmgw.settings.parsing import parse_yaml


@pytest.fixture(params=["c", "pure"], autouse=True)
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with ruamel.yaml.clib's C parser and with the pure-Python one: same results."""
    if request.param == "pure":
        monkeypatch.setattr(parsing, "_CParser", None)
    else:
        assert parsing._CParser is not None, "ruamel.yaml.clib is a dependency: install it"
    return request.param

VALUES = [
    ("a: 1", {"a": 1}),
    ("a: 0x10", {"a": 16}),
    ("a: 1_000", {"a": 1000}),
    ("a: 0.90", {"a": 0.9}),
    ("a: 9223372036854775807", {"a": 2**63 - 1}),
    ("a: -9223372036854775808", {"a": -(2**63)}),
    ("a: 1.5e308", {"a": 1.5e308}),
    ("a: true", {"a": True}),
    ("a: no", {"a": "no"}),                    # no "Norway problem"
    ("a: 010", {"a": 10}),                     # YAML 1.2: decimal, not octal
    ("a: 0o10", {"a": 8}),
    ("a: 1e3", {"a": 1000.0}),
    ("a: 'true'", {"a": "true"}),
    ("a: ! 12", {"a": "12"}),
    ("a: |\n  two\n  lines", {"a": "two\nlines\n"}),
    ("? |\n  x\n: 1", {"x\n": 1}),
    ("a: {url: https://example.com/a.zip}", {"a": {"url": "https://example.com/a.zip"}}),  # YAML 1.2 flow colon
    ("a: yes", {"a": "yes"}),                  # YAML 1.2: yes is a string, not a boolean
    ("a: ~", {"a": None}),
    ("a: 2024-01-01", {"a": "2024-01-01"}),    # timestamps stay text
    ("a: !!str 123", {"a": "123"}),            # core tags are allowed
    ("a: '16Gi'", {"a": "16Gi"}),
    ("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3", {"base": {"x": 1, "y": 2}, "d": {"y": 3, "x": 1}}),
    ("- 1\n- [2, 3]", [1, [2, 3]]),
    ("# only a comment", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), VALUES)
def test_plain_values_come_out_as_written(text: str, expected: object) -> None:
    parsed, issues = parse_yaml("f.yaml", text + "\n")
    assert issues == []
    assert parsed.data == expected


REFUSED = [
    ("a: !!python/object/apply:os.system ['touch /tmp/pwned']\n", 1, 4, "is not allowed"),
    ("a: !!binary aGVsbG8=\n", 1, 4, "is not allowed"),
    ("a: !env HOME\n", 1, 4, "tag '!env' is not allowed"),
    ("a: 1\nb: 2\na: 3\n", 3, 1, "duplicate key 'a' (first at line 1)"),
    ("a:\n  b: 1\n  b: 1\n", 3, 3, "duplicate key 'b'"),
    ("a:\n\tb: 1\n", 2, 1, "tab character in indentation"),
    ("a: &x [1, *x]\n", 1, 4, "recursive alias"),
    ("? [1]\n: 2\n", 1, 3, "a key must be a plain scalar"),
    ("a: [1, 2\n", 2, 1, "not valid YAML"),
    ("a: 1\n---\nb: 2\n", 2, 1, "holds one YAML document"),
    ("a: *nowhere\n", 1, 4, "alias *nowhere has no anchor"),
    ("a: 1\n b: 2\n", 2, 3, "not valid YAML"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", 1, 68, "nesting is deeper than"),
    ("a: 9223372036854775808\n", 1, 4, "is out of range: settings take integers from -9223372036854775808 to"),
    ("a:\n  b: " + "9" * 4000 + "\n", 2, 6, "'9999999999999999'... (4000 characters) is out of range"),
    ("a: 0x" + "f" * 4000 + "\n", 1, 4, "(4002 characters) is out of range"),
    ("a: [1, -" + "9" * 30 + "]\n", 1, 8, "is out of range"),
    ("a: .inf\n", 1, 4, "'.inf' is not a finite number"),
    ("a: -.inf\n", 1, 4, "is not a finite number"),
    ("a: .nan\n", 1, 4, "is not a finite number"),
    ("a: 1e400\n", 1, 4, "'1e400' is not a finite number"),
]


@pytest.mark.parametrize(("text", "line", "column", "reason"), REFUSED)
def test_unsafe_or_broken_yaml_is_refused_at_its_line_and_column(text: str, line: int, column: int, reason: str) -> None:
    parsed, issues = parse_yaml("f.yaml", text)
    assert parsed.data is None
    assert len(issues) == 1
    assert (issues[0].line, issues[0].column) == (line, column), str(issues[0])
    assert reason in issues[0].message


def test_a_billion_laughs_file_fails_in_well_under_a_second() -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[level]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    started = time.process_time()  # CPU seconds: a whole run on 2 shared cores took 1.09 s of wall time once
    parsed, issues = parse_yaml("bomb.yaml", "\n".join(lines) + "\n")
    assert time.process_time() - started < 1.0
    assert parsed.data is None and "aliases expand to more than" in issues[0].message


def test_positions_point_at_keys_and_values() -> None:
    parsed, _ = parse_yaml("f.yaml", "top:\n  list:\n    - x\n    - {k: v}\n")
    assert parsed.keys[("top", "list")] == (2, 3)
    assert parsed.values[("top", "list", 1, "k")] == (4, 11)
    assert parsed.position(("top", "list", 7)) == (3, 5)   # missing index: nearest ancestor, the list
