"""What a handler of `dialects.HANDLERS` gets of a request once its key and body are in (`dialects.serve_dialect`)."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.gateway.request_context import Caller
from llmgw.routes import RouteTable


@dataclass(frozen=True, slots=True)
class Incoming:
    """A request to one of the dialects' paths: who sent it (`caller`), the routing table it is admitted under
    (`table`, read once), its `path`, its body as parsed (`body`, a JSON object) and as received (`raw`)."""

    caller: Caller
    table: RouteTable
    path: str
    body: dict
    raw: bytes
