"""What a request is billed from its ledger (what the relay learned): the engine's usage when it came, else the
prompt estimate once the prompt reached an engine and the content chunks relayed, else nothing."""

from __future__ import annotations

import pytest

from llmgw.gateway.request_context import Ledger

ESTIMATE = 40


@pytest.mark.parametrize(("ledger", "billed"), [
    (Ledger(prompt_tokens=12, completion_tokens=30, counted_chunks=29), (12, 30)),   # the engine's usage
    (Ledger(prompt_tokens=12, counted_chunks=29), (12, 29)),                         # usage without completion
    (Ledger(started_response=True, counted_chunks=7), (ESTIMATE, 7)),                # client left mid-stream
    (Ledger(sent_to_engine=True), (ESTIMATE, 0)),                                    # left before the answer
    (Ledger(counted_chunks=3), (ESTIMATE, 3)),                                       # chunks came, no head flag
    (Ledger(), (0, 0)),                                                              # nothing reached an engine
    (Ledger(status=502, prompt_tokens=0, completion_tokens=0), (0, 0)),              # the engine refused (4xx)
])
def test_a_request_is_billed_its_usage_else_its_estimate_once_an_engine_took_it(ledger, billed):
    assert ledger.billed_tokens(ESTIMATE) == billed


def test_a_ledger_has_only_its_named_fields():
    ledger = Ledger()
    with pytest.raises(AttributeError):
        ledger.tokens = 3  # a misspelt field is an error, not a silent new attribute (slots)
