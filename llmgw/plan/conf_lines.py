"""The one writer of lines of generated `Key=Value` files (slurm.conf, gres.conf, slurmdbd.conf; later the files
other issues add). Pure.

Every value written into a generated file goes through `conf_line`, which refuses what would change the file's
meaning rather than its value: a control character (newline, carriage return, NUL, a Unicode line separator...),
`#` (a comment to the end of the line), `=` (a key of its own), `"`, and whitespace in a value that must be one
token. A refusal raises GeneratedFileError naming the key and the value. The key must be one of the file's keys
(`llmgw.tools.conf_keys`: the renderers' own keys, the set an agent checks a received file against).

Values: a `str` or `int` is one token (`NodeAddr=10.0.0.9`); `Quoted(text)` is text in double quotes that may hold
spaces (`Reason="llmgw: not lent"`); `Options(pairs)` is `k=v,k=v` (`AuthInfo=socket=/run/munge.socket`), each
name a word and each value a token without `,`. Format: slurm.schedmd.com/slurm.conf.html (Slurm 22.05).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.errors import GeneratedFileError

_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_TOKEN_FORBIDDEN = frozenset('#="')


@dataclass(frozen=True)
class Quoted:
    """A value written in double quotes: may hold spaces, never `"`, `#`, `=` or a control character."""

    text: str


@dataclass(frozen=True)
class Options:
    """A value written as `name=value,name=value` (Slurm's AuthInfo): names are words, values tokens without `,`."""

    pairs: tuple[tuple[str, str], ...]


Value = str | int | Quoted | Options


def _refuse(key: str, value: object, why: str) -> GeneratedFileError:
    return GeneratedFileError(f"refusing to write {key}={value!r} into a generated file: {why}. A node's address "
                              "or a name with such characters cannot be written there; correct it at its source")


def _token(key: str, text: str, shown: object, extra: frozenset[str] = frozenset()) -> str:
    if not text:
        raise _refuse(key, shown, "the value is empty")
    if not text.isprintable():
        raise _refuse(key, shown, "the value holds a control character (newline, carriage return, NUL, ...)")
    if any(c.isspace() for c in text):
        raise _refuse(key, shown, "the value must be one token and holds whitespace")
    bad = sorted((_TOKEN_FORBIDDEN | extra) & set(text))
    if bad:
        raise _refuse(key, shown, f"the value holds {' and '.join(repr(c) for c in bad)}")
    return text


def conf_value(key: str, value: Value) -> str:
    """`value` as written after `key=`. Raises GeneratedFileError naming `key` and `value` (see the module)."""
    if isinstance(value, Quoted):
        text = value.text
        if not text.isprintable():
            raise _refuse(key, text, "the value holds a control character (newline, carriage return, NUL, ...)")
        bad = sorted(_TOKEN_FORBIDDEN & set(text))
        if bad:
            raise _refuse(key, text, f"the value holds {' and '.join(repr(c) for c in bad)}")
        return f'"{text}"'
    if isinstance(value, Options):
        parts = []
        for name, option in value.pairs:
            if not _KEY.fullmatch(name):
                raise _refuse(key, f"{name}={option}", f"{name!r} is not an option name")
            parts.append(f"{name}={_token(key, str(option), option, frozenset(','))}")
        if not parts:
            raise _refuse(key, "", "the value is empty")
        return ",".join(parts)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _refuse(key, value, f"a {type(value).__name__} is not a value")
    return _token(key, str(value), value)


def conf_line(keys: Iterable[str], *pairs: tuple[str, Value]) -> str:
    """One line of a generated file: `Key=Value` for each of `pairs`, separated by one space (no newline).

    `keys`: the keys the file may hold (`llmgw.tools.conf_keys`); a key outside them is refused too.
    Raises GeneratedFileError naming the key and value that cannot be written.
    """
    allowed = frozenset(keys)
    if not pairs:
        raise GeneratedFileError("refusing to write an empty line of Key=Value pairs into a generated file")
    written = []
    for key, value in pairs:
        if key not in allowed or not _KEY.fullmatch(key):
            raise _refuse(key, value, f"{key!r} is not a key this file may hold")
        written.append(f"{key}={conf_value(key, value)}")
    return " ".join(written)
