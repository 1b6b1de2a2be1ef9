"""docs/settings.md is generated from the schemas and never stale."""

from __future__ import annotations

import re

from llmgw.settings import docs
from llmgw.settings.schemas import SCHEMA_KINDS, load_schema


def test_the_settings_page_matches_the_schemas() -> None:
    assert docs.docs_path().read_text(encoding="utf-8") == docs.render(), (
        "docs/settings.md is stale: run `python -m llmgw.settings.docs`")
    assert docs.main(["--check"]) == 0


def test_every_key_of_every_schema_has_a_row() -> None:
    page = docs.render()
    for kind in SCHEMA_KINDS:
        schema = load_schema(kind)
        for key in schema.get("properties", {}):
            assert re.search(rf"^\| `{re.escape(key)}` \|", page, re.MULTILINE), f"{kind}: {key} missing"
    assert "| `resources.memory` | size |" in page
    assert "| `reconcile.poll_interval` | duration | `\"2s\"` |" in page
