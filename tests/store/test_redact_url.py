"""A store URL as llmgw shows it (llmgw.store.postgres.redact_url, url_password): the password alone is starred,
everything else is left as written. The property over drawn secrets is tests/core/test_redaction_properties.py."""

from __future__ import annotations

import pytest

from llmgw.store.postgres import redact_url, url_password


@pytest.mark.parametrize("url, shown", [
    ("postgresql://alice@db/llmgw", "postgresql://alice@db/llmgw"),  # no password: nothing to star
    ("postgresql://alice:s3cret@db:5432/llmgw", "postgresql://alice:***@db:5432/llmgw"),
    ("postgresql://alice:p@ss@db/llmgw", "postgresql://alice:***@db/llmgw"),
    # a query without a password is kept as written, not re-encoded
    ("postgresql://db/llmgw?options=-c%20search_path%3Dx&application_name=",
     "postgresql://db/llmgw?options=-c%20search_path%3Dx&application_name="),
    # with one, the blank parameters stay
    ("postgresql://db/llmgw?password=s3cret&application_name=", "postgresql://db/llmgw?password=***&application_name="),
])
def test_a_store_url_is_shown_with_its_password_starred_and_the_rest_as_written(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize("url, password", [
    ("postgresql://alice:s%40cret@db/llmgw", "s@cret"),
    ("postgresql://db/llmgw?application_name=&password=s3cret", "s3cret"),
    ("postgresql://db/llmgw?password=", None),
    ("postgresql://alice@db/llmgw", None),
])
def test_the_password_of_a_store_url_is_read_from_the_user_part_or_the_query(url, password):
    assert url_password(url) == password
