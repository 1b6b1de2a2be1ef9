"""The JSON Schemas of the settings files (schema/*.json, draft 2020-12) and validation against them.

`validate_data(kind, file, parsed)` checks one parsed file and returns one Issue per violation, each at the
line and column of the offending key or value. Unknown keys are reported at the key itself; a missing key at
the mapping that lacks it. A schema may carry an `x-error` message template (`{value!r}`) for readable
pattern failures (units, digests, names). llmgw's own keyword `x-unit` ("size" or "duration") bounds a size to
MAX_SIZE_BYTES and a duration to MAX_DURATION_SECONDS, so every later stage gets numbers it can hold (a 64-bit
protobuf field, a trio deadline).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from llmgw.errors import Issue, SettingsError
from llmgw.settings.packaged import schema_dir as _packaged_schema_dir
from llmgw.settings.parsing import MAX_INT, Parsed
from llmgw.units import format_duration, parse_duration, parse_size

SCHEMA_KINDS = ("llmgw", "model", "engines", "agent", "projects", "firewall", "slurm")
MAX_SIZE_BYTES = MAX_INT
MAX_DURATION_SECONDS = 100 * 365 * 86400.0


def schema_dir() -> Path:
    """The directory holding schema/*.json: the installed wheel's package data, else `schema/` of the source tree
    (see `llmgw.settings.packaged`)."""
    return _packaged_schema_dir()


@cache
def load_schema(kind: str) -> dict[str, Any]:
    """The schema of `kind` (one of SCHEMA_KINDS) as a dict. Raises: SettingsError when the file is missing."""
    path = schema_dir() / f"{kind}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"the settings schema {path} cannot be read ({exc}); reinstall llmgw") from exc


def _unit(validator: Any, unit: str, instance: Any, schema: dict[str, Any]) -> Any:
    """The `x-unit` keyword: a size or duration that parses must not exceed what llmgw can hold."""
    if not isinstance(instance, str):
        return
    try:
        value = parse_size(instance) if unit == "size" else parse_duration(instance)
    except ValueError:
        return  # `pattern` reports it
    if unit == "size" and value > MAX_SIZE_BYTES:
        yield ValidationError(f"{instance!r} is larger than the largest size settings take ({MAX_SIZE_BYTES} "
                              "bytes, 8Ei)")
    elif unit == "duration" and value > MAX_DURATION_SECONDS:
        yield ValidationError(f"{instance!r} is longer than the longest duration settings take "
                              f"({format_duration(MAX_DURATION_SECONDS)})")


_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"x-unit": _unit})


@cache
def _validator(kind: str) -> Any:
    return _Validator(load_schema(kind))


def format_path(path: tuple[str | int, ...] | list[str | int]) -> str:
    """("weights", 0, "sha256") -> "weights[0].sha256"."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _issue_for(file: str, parsed: Parsed, error: ValidationError) -> list[Issue]:
    path = tuple(error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(schema.get("properties", {}))
        extras = [key for key in error.instance if key not in allowed]
        known = ", ".join(sorted(allowed)) or "none"
        return [Issue(file, *parsed.position(path + (key,), of_key=True), format_path(path + (key,)),
                      f"unknown key {key!r} (allowed here: {known})") for key in extras]
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else ""
        return [Issue(file, *parsed.position(path), format_path(path + (missing,)) if missing else format_path(path),
                      f"missing required key {missing!r}")]
    parent = parsed_value(parsed, path)
    if "propertyNames" in error.relative_schema_path or "propertyNames" in error.schema_path:
        if isinstance(parent, dict) and isinstance(error.instance, str) and error.instance in parent:
            key_path = path + (error.instance,)
            return [Issue(file, *parsed.position(key_path, of_key=True), format_path(key_path),
                          f"{error.instance!r} is not allowed as a key here: {error.message}")]
    template = schema.get("x-error") if error.validator != "x-unit" else None
    message = template.format(value=error.instance) if template else error.message
    if schema.get("type") == "string" and isinstance(error.instance, (int, float, bool)) and error.validator in ("type", "pattern"):
        read_as = "a boolean" if isinstance(error.instance, bool) else "a number"
        message = f"{error.instance!r} is not a string: YAML read the value as {read_as}; put it in quotes"
    if error.validator in ("anyOf", "oneOf"):
        message = f"{error.instance!r} is not valid here ({'; '.join(sorted({c.message for c in error.context}))})"
    return [Issue(file, *parsed.position(path), format_path(path), message)]


def parsed_value(parsed: Parsed, path: tuple[str | int, ...]) -> Any:
    """The value at `path` in `parsed.data`, or None when there is none."""
    value = parsed.data
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def validate_data(kind: str, file: str, parsed: Parsed) -> list[Issue]:
    """Validate `parsed.data` of `file` against the schema of `kind`; every violation as an Issue (sorted by line)."""
    issues: list[Issue] = []
    for error in _validator(kind).iter_errors(parsed.data):
        issues.extend(_issue_for(file, parsed, error))
    issues.sort(key=lambda i: (i.line, i.column, i.key_path))
    return issues
