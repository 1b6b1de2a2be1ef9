"""Explaining why a request body failed OpenAI's schema, in the words OpenAI's API answers with.

Pure: data in, a `Problem` out. Runs only for a body the validator refused; it walks jsonschema-rs's error tree (native,
so explaining a large refused body costs about as little as checking it) and picks one error the way a reader would:

- in a union (`anyOf`) whose branches are objects told apart by one property with a fixed value (`role` of a message,
  `type` of a content part or tool), the branch named by that property; an absent property is a missing parameter,
  an unknown value an invalid value listing the supported ones;
- otherwise the branches whose type fits the value; none: an invalid type listing the expected ones; several: the
  one whose first error lies deepest.

Messages, params and codes follow OpenAI's answers as users have quoted them (e.g. "Invalid type for 'max_tokens':
expected an integer, but got a string instead.", "Missing required parameter: 'messages[0].role'.", "Invalid
'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", code
`empty_array`; openai-python, CopilotKit#529, ServiceNow/TapeAgents#66).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
import jsonschema_rs

TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
              "object": "an object", "array": "an array", "null": "null"}


@dataclass(frozen=True)
class Problem:
    """What is wrong, as OpenAI's error object says it: `param` ("messages[0].role", None for the body), `code`."""

    param: str | None
    code: str | None
    message: str


def param_name(path: Sequence) -> str:
    """A JSON path as OpenAI writes params: `messages[0].content[1].type`."""
    out = ""
    for item in path:
        out += f"[{item}]" if isinstance(item, int) else (f".{item}" if out else str(item))
    return out


def _got(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _expected(kinds: Sequence[str]) -> str:
    words = [TYPE_WORDS.get(k, k) for k in dict.fromkeys(kinds) if k != "null"] or ["null"]
    return words[0] if len(words) == 1 else "one of " + ", ".join(words[:-1]) + " or " + words[-1]


def _quoted_list(values: Sequence) -> str:
    quoted = [f"'{v}'" for v in values if v is not None]
    if len(quoted) <= 1:
        return "".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def explain(validator: jsonschema_rs.Draft7Validator, schema: Mapping, body) -> Problem | None:
    """The first thing wrong with `body` under `schema` (draft 7, `definitions` at its top; `validator` compiled from
    it), or None if it is valid."""
    first = next(iter(validator.iter_errors(body)), None)
    if first is None:
        return None
    return _describe(first, schema)


def _at(schema: Mapping, path: Sequence):
    """The part of `schema` at a jsonschema-rs schema path (references already followed by the validator)."""
    node = schema
    for step in path:
        if isinstance(node, Mapping):
            node = node.get(step, {})
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        else:
            return {}
    return node


def _resolve(schema, definitions: Mapping):
    seen = 0
    while isinstance(schema, Mapping) and "$ref" in schema and seen < 32:
        schema = definitions.get(schema["$ref"].rsplit("/", 1)[-1], {})
        seen += 1
    if isinstance(schema, Mapping) and "allOf" in schema and "type" not in schema:
        merged: dict = {}
        for part in schema["allOf"]:
            part = _resolve(part, definitions)
            for key, value in part.items():
                if key == "properties":
                    merged.setdefault("properties", {}).update(value)
                elif key == "required":
                    merged["required"] = [*merged.get("required", []), *value]
                else:
                    merged.setdefault(key, value)
        return merged
    return schema


def _types(schema, definitions: Mapping) -> list[str] | None:
    """The JSON types a schema accepts at its top, or None when it does not say (accepts any)."""
    schema = _resolve(schema, definitions)
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return list(kind)
    if "anyOf" in schema or "oneOf" in schema:
        found: list[str] = []
        for branch in schema.get("anyOf", schema.get("oneOf", [])):
            sub = _types(branch, definitions)
            if sub is None:
                return None
            found += sub
        return found
    if "enum" in schema:
        return None
    return None


def _fits(kinds: list[str] | None, value) -> bool:
    if kinds is None:
        return True
    actual = _got(value)
    for kind in kinds:
        if TYPE_WORDS.get(kind) == actual or (kind == "number" and actual in ("an integer", "a decimal")):
            return True
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            return True
    return False


def _tag(schema, definitions: Mapping) -> tuple[str, list] | None:
    """(property, values) when an object schema fixes one required property to a few values (a discriminator)."""
    schema = _resolve(schema, definitions)
    if not isinstance(schema, Mapping):
        return None
    for name in schema.get("required", ()):
        sub = _resolve(schema.get("properties", {}).get(name, {}), definitions)
        if isinstance(sub, Mapping) and "enum" in sub:
            return name, list(sub["enum"])
    return None


def _describe(error, schema: Mapping) -> Problem:
    definitions = schema.get("definitions", {})
    while type(error.kind).__name__ == "AnyOf" and error.kind.context:
        path = list(error.instance_path)
        value = error.instance
        branches = _at(schema, list(error.schema_path))
        branches = branches if isinstance(branches, list) else []
        by_branch = list(error.kind.context)
        tags = [_tag(b, definitions) for b in branches]
        names = {t[0] for t in tags if t is not None}
        if isinstance(value, dict) and len(names) == 1 and sum(t is not None for t in tags) > 1:
            name = names.pop()
            if name not in value:
                return _missing([*path, name])
            chosen = [i for i, t in enumerate(tags) if t is not None and value[name] in t[1]]
            if not chosen:
                supported = [v for t in tags if t is not None for v in t[1]]
                return _invalid_value([*path, name], value[name], supported)
            pick = chosen[0]
        else:
            fitting = [i for i, b in enumerate(branches) if _fits(_types(b, definitions), value)]
            if not fitting:
                kinds = [k for b in branches for k in (_types(b, definitions) or [])]
                return Problem(param_name(path), "invalid_type",
                               f"Invalid type for '{param_name(path)}': expected {_expected(kinds)}, "
                               f"but got {_got(value)} instead.")
            pick = max(fitting, key=lambda i: max((len(e.instance_path) for e in by_branch[i]), default=-1)
                       if i < len(by_branch) else -1)
        inner = by_branch[pick] if pick < len(by_branch) else []
        if not inner:
            break
        error = max(inner, key=lambda e: len(e.instance_path))
    return _leaf(error, schema)


def _missing(path: list) -> Problem:
    name = param_name(path)
    return Problem(name, "missing_required_parameter", f"Missing required parameter: '{name}'.")


def _invalid_value(path: list, value, supported: Sequence) -> Problem:
    shown = value if isinstance(value, str) else repr(value)
    return Problem(param_name(path), "invalid_value",
                   f"Invalid value: '{str(shown)[:100]}'. Supported values are: {_quoted_list(supported)}.")


def _leaf(error, schema: Mapping) -> Problem:
    path = list(error.instance_path)
    name = param_name(path)
    value, kind = error.instance, error.kind
    rule = type(kind).__name__
    if rule == "Type":
        return Problem(name, "invalid_type",
                       f"Invalid type for '{name}': expected {_expected(list(kind.types))}, but got {_got(value)} "
                       "instead.")
    if rule == "Required":
        return _missing([*path, kind.property])
    if rule == "Enum":
        return _invalid_value(path, value, list(kind.options))
    if rule in ("Minimum", "Maximum"):
        declared = _at(schema, list(error.schema_path)[:-1])
        declared = declared.get("type") if isinstance(declared, Mapping) else None
        declared = [declared] if isinstance(declared, str) else (declared or [])
        number = "integer" if "integer" in declared or ("number" not in declared and isinstance(value, int)) \
            else "decimal"
        side, sign = ("below minimum", ">=") if rule == "Minimum" else ("above maximum", "<=")
        code = f"{number}_{'below_min' if rule == 'Minimum' else 'above_max'}_value"
        return Problem(name, code, f"Invalid '{name}': {number} {side} value. Expected a value {sign} "
                                   f"{_number(kind.limit)}, but got {_number(value)} instead.")
    if rule == "MinItems":
        if len(value) == 0:
            return Problem(name, "empty_array", f"Invalid '{name}': empty array. Expected an array with minimum "
                                                f"length {kind.limit}, but got an empty array instead.")
        return Problem(name, "array_below_min_length", f"Invalid '{name}': array too short. Expected an array with "
                                                       f"minimum length {kind.limit}, but got an array with length "
                                                       f"{len(value)} instead.")
    if rule == "MaxItems":
        return Problem(name, "array_above_max_length", f"Invalid '{name}': array too long. Expected an array with "
                                                       f"maximum length {kind.limit}, but got an array with length "
                                                       f"{len(value)} instead.")
    if rule == "MaxLength":
        return Problem(name, "string_above_max_length", f"Invalid '{name}': string too long. Expected a string with "
                                                        f"maximum length {kind.limit}, but got a string with length "
                                                        f"{len(value)} instead.")
    if rule == "MinLength":
        return Problem(name, "string_below_min_length", f"Invalid '{name}': string too short. Expected a string with "
                                                        f"minimum length {kind.limit}, but got a string with length "
                                                        f"{len(value)} instead.")
    return Problem(name or None, "invalid_value", f"Invalid '{name or 'body'}': {error.message[:300]}.")
