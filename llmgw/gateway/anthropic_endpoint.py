"""`POST /v1/messages` and `/v1/messages/count_tokens` after the key and the body (`dialects.serve_dialect`).

Messages: checked (`anthropic.check_request`), translated to a chat completion (`anthropic.to_chat`) and admitted
as chat (`Admission.admit`: model, allowlist, quotas with the reserved max_tokens enforced). Then:
- the route's engine serves `/v1/messages` itself (`native.serves_natively`: llama-server b11434, vLLM 0.32): the
  client's body goes to the engine's `/v1/messages` (the reserved `max_tokens` forced when enforced) and its
  answer is relayed by `native_relay.NativeMessagesRelay` (usage from Anthropic's `usage`, the gateway's id and the
  client's model name in the answer);
- otherwise (SGLang, external endpoints, unknown engines) the chat request goes to `/v1/chat/completions` and the
  chat path's answer, stream and refusals are said in Anthropic's shapes by `anthropic_stream.MessagesSend`.
Either way `Gateway._run` forwards and settles: usage, quotas, time to first token, approximate prefix routing, the
drain and a client's disconnect (billed what reached the engine) are chat's. Precise (KV-block) routing needs a
chat body to tokenise: native requests are routed by prefix key only.

count_tokens: checked like a Messages request without `max_tokens`, admitted (quotas reserve the prompt's bound,
nothing for a completion), and passed to the engine's own `/v1/messages/count_tokens` (llama-server b11434 applies
its chat template and counts; an engine without it answers 404, relayed). Counting is not inference: its usage
record bills 0 tokens.
"""

from __future__ import annotations

import dataclasses
import json

import trio

from llmgw.gateway.admission import CLEANUP_SECONDS
from llmgw.gateway.anthropic import COUNT_TOKENS_PATH, MESSAGES_PATH, check_request, message_id, to_chat
from llmgw.gateway.anthropic_stream import MessagesSend
from llmgw.gateway.native import serves_natively
from llmgw.gateway.native_relay import NativeMessagesRelay
from llmgw.gateway.problems import ApiError
from llmgw.gateway.proxying import open_upstream, relay_whole
from llmgw.gateway.dialect_request import Incoming
from llmgw.gateway.request_context import STATUS_CLIENT_CLOSED, Ledger
from llmgw.gateway.validation import validate_request

CHAT_PATH = "/v1/chat/completions"


async def messages(gateway, incoming: Incoming, send, receive) -> None:
    """Serve a Messages request (module docstring). Raises ApiError for a refusal before the forward."""
    caller, table, body = incoming.caller, incoming.table, incoming.body
    check_request(body)
    chat = to_chat(body)
    validate_request(CHAT_PATH, chat)  # the fields passed to the engine as they are meet chat's checks too
    ctx = await gateway.admission.admit(caller, table, CHAT_PATH, chat, json.dumps(chat).encode())
    answer_id = message_id(caller.ids.own)
    if not serves_natively(ctx.route, MESSAGES_PATH):
        await gateway._run(ctx, MessagesSend(send, answer_id, body["model"]), receive)
        return
    sent = {**body, **ctx.overrides}  # the reserved max_tokens, when enforced, has the same name here
    native = dataclasses.replace(ctx, path=MESSAGES_PATH, body=sent, overrides={}, include_usage=False,
                                 raw=incoming.raw if sent == body else json.dumps(sent).encode())
    out = MessagesSend(send, answer_id, body["model"], convert=False)

    def translation():  # the engine answered 404 at /v1/messages: chat, and its answer converted
        out.convert = True
        return ctx, None
    await gateway._run(native, out, receive, NativeMessagesRelay(answer_id, body["model"], translation))


async def count_tokens(gateway, incoming: Incoming, send, receive) -> None:
    """Serve a count_tokens request (module docstring): `{"input_tokens": N}` from the engine, billed nothing."""
    caller, table, body, raw = incoming.caller, incoming.table, incoming.body, incoming.raw
    check_request(body, count=True)
    chat = to_chat(body, count=True)
    # admitted as a request that generates nothing (the embeddings path): the prompt's bound is reserved
    admitted = await gateway.admission.admit(caller, table, "/v1/embeddings", chat, raw)
    ctx = dataclasses.replace(admitted, path=COUNT_TOKENS_PATH, body=body, raw=raw, stream=False,
                              include_usage=False, overrides={})
    ledger = Ledger()
    settled = False

    async def settle() -> None:
        nonlocal settled
        if not settled:
            settled = True
            ledger.prompt_tokens = ledger.completion_tokens = 0  # counting is not inference
            with trio.move_on_after(CLEANUP_SECONDS, shield=True):
                await gateway._settle(ctx, ledger)

    out = MessagesSend(send, message_id(caller.ids.own), body["model"], convert=False)
    try:
        try:
            response = await open_upstream(ctx, gateway.pool, gateway.balancer, ledger)
        except ApiError as error:
            ledger.status = error.status
            raise
        try:
            replica = (b"x-llmgw-replica", ledger.replica.replica_id.encode()) if ledger.replica else None
            await relay_whole(ctx, response, out, ledger, [*caller.ids.headers(), *([replica] if replica else [])],
                              settle)
        finally:
            await response.aclose()
            if ledger.replica is not None:
                gateway.balancer.finished(ledger.replica.replica_id)
    finally:
        if not settled:
            if ledger.status in (0, 200):
                ledger.status = STATUS_CLIENT_CLOSED
            await settle()
