"""What a new settings repository carries for editors: the schemas, and a modeline in every settings file.

`llmgw repo init` lays the schemas llmgw validates with into `.llmgw/schema/<kind>.json` of the first commit and
makes the first line of every settings file `# yaml-language-server: $schema=<relative path to its schema>`, so an
editor with a YAML language server (VS Code's YAML extension, Neovim's yamlls, ...) finds the schema inside any clone
of the repository. The loader reads YAML only, so `.llmgw/` is no settings file. Pure apart from reading the schemas.
Modeline format: https://github.com/redhat-developer/yaml-language-server#using-inlined-schema
"""

from __future__ import annotations

import re

from llmgw.settings.loading import classify
from llmgw.settings.packaged import schema_dir
from llmgw.settings.schemas import SCHEMA_KINDS

EDITOR_SCHEMA_DIR = ".llmgw/schema"
MODELINE_PREFIX = "# yaml-language-server: $schema="
_MODELINE = re.compile(r"# yaml-language-server: \$schema=\S*[ \t]*")


def schema_modeline(path: str, kind: str) -> str:
    """The modeline for settings file `path` ("catalog/m.yaml") of schema `kind` ("model"), pointing at
    `.llmgw/schema/<kind>.json` relative to the file's directory."""
    return f"{MODELINE_PREFIX}{'../' * path.count('/')}{EDITOR_SCHEMA_DIR}/{kind}.json"


def with_modeline(text: str, modeline: str) -> str:
    """`text` with its first line replaced by `modeline` when that line is a yaml-language-server modeline, else
    with `modeline` added before it."""
    first, newline, rest = text.partition("\n")
    if _MODELINE.fullmatch(first.rstrip("\r")):
        return modeline + first[len(first.rstrip("\r")):] + newline + rest
    return modeline + "\n" + text


def editor_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` ("dir/name" -> content) with a modeline in every settings file and the schemas under
    `.llmgw/schema/`. Files that are no settings files are unchanged. Raises OSError when a schema cannot be
    read, UnicodeDecodeError when a settings file is not UTF-8 (a seed that validated always is)."""
    out = dict(files)
    for path, data in files.items():
        kind = classify(path)
        if kind is not None:
            out[path] = with_modeline(data.decode("utf-8"), schema_modeline(path, kind)).encode("utf-8")
    for kind in SCHEMA_KINDS:
        out[f"{EDITOR_SCHEMA_DIR}/{kind}.json"] = (schema_dir() / f"{kind}.json").read_bytes()
    return out
