"""A listener given on the command line moves the address only: llmgw.yaml's gateway workers stay (a fresh user's
`llmgw up --gateway HOST:PORT` quietly dropped `workers: 2`)."""

from __future__ import annotations

from llmgw.control.plane import listening_on
from llmgw.settings.model import Listener


def test_an_address_given_on_the_command_line_keeps_the_configured_workers() -> None:
    configured = Listener(host="0.0.0.0", port=8080, workers="auto")
    assert listening_on(Listener(host="127.0.0.1", port=0), configured) == Listener("127.0.0.1", 0, "auto")
    assert listening_on(None, configured) is configured
