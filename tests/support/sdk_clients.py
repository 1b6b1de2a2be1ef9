"""A client of the gateway as an application writes one: the official openai SDK with retries off, sending chat
completions one after the other until told to stop, streamed or not; for the tests of a roll or a restart that must
lose nothing (tests/control/test_replica_drain.py, test_replica_drain_real.py, tests/up/test_up.py,
tests/gateway/test_gateway_workers.py). `SdkClients` runs such clients from a synchronous test."""

from __future__ import annotations

import itertools
import threading
import time

import httpx
import openai
import trio

_IDS = itertools.count()

REFUSAL_CODES = frozenset({"system_stopped", "model_not_ready", "gateway_draining"})
"""The codes of a 503 with `Retry-After` that refuses a request before any engine saw it: the system is stopped, no
replica of the model is ready yet, the gateway drains (llmgw.gateway.admission, llmgw.gateway.draining)."""

REFUSED_PAUSE = 0.25
"""Seconds a client of `SdkClients` waits after a refusal or failure before its next request (a closed port answers
at once)."""

THINK_TIME = 0.25
"""Seconds a client of `SdkClients` waits after an answer before its next request, as an application's user reads
the answer: 16 clients still keep requests in flight through every restart, drain and handover these tests make
(each lasts a second or more), at a fraction of the load (1 s cut the CPU further but lengthened the tests that wait
for a number of answers: docs/testing.md). Without it the clients asked as fast as they were
answered (about 15,000 requests in tests/install/test_upgrade_control_planes.py), and a test's load took the CPU of
the tests beside it (docs/testing.md, "The SDK clients' think time")."""


def refusal(exc: BaseException) -> bool:
    """Whether `exc` says the request never started: the connection was refused (no gateway listens: between the two
    images of a restart, or stopped), or a 503 with `Retry-After` and one of `REFUSAL_CODES`."""
    # by name: the SDK may run on an httpx of its own (a fork), whose ConnectError is not httpx.ConnectError
    if isinstance(exc, openai.APIConnectionError) and any(
            kind.__name__ == "ConnectError" for kind in type(exc.__cause__).__mro__):
        return True
    return (isinstance(exc, openai.APIStatusError) and exc.status_code == 503 and "retry-after" in exc.response.headers
            and isinstance(exc.body, dict) and exc.body.get("code") in REFUSAL_CODES)


def disconnected_unanswered(exc: BaseException) -> bool:
    """Whether `exc` says the gateway closed the connection without answering a request sent on it: HTTP/1.1's
    keep-alive race (RFC 9112, 9.3.1), where a server closes an idle connection as the client sends on it (a FIN, or
    a RST when the request's bytes arrive after the close: seen once each in full runs). Whether
    that request started is told by the store: a request the gateway took has a usage row (`billing_problems`)."""
    if not isinstance(exc, openai.APIConnectionError):
        return False
    names = {kind.__name__ for kind in type(exc.__cause__).__mro__}
    said = str(exc.__cause__)
    # closed with a FIN: "Server disconnected without sending a response"; with a RST (the request's bytes arrived
    # after the close, so the kernel resets): "Connection reset by peer" (ECONNRESET) on reading the answer
    return ("RemoteProtocolError" in names and "without sending a response" in said) or \
        ("ReadError" in names and "Connection reset by peer" in said)


async def sdk_client(client: openai.AsyncOpenAI, n: int, done: trio.Event, answered: list[str], failed: list[str],
                     refused: list[str] | None = None, disconnected: list[str] | None = None, think: float = 0.0,
                     **ask) -> None:
    """Send chat completions through `client` (`ask`: model, max_tokens, ...), streamed when `n` is odd, until
    `done` is set. Each carries its own `x-request-id` ("client-<n>-<k>"), added to `answered` once answered in full
    (a stream with its finish reason), else to `failed` with the error (with retries off, a 502 or 503 is one).
    With `refused` given, a request refused before it started (`refusal`) goes there instead of to `failed`; with
    `disconnected` given, the id of a request whose connection closed without an answer (`disconnected_unanswered`)
    goes there, for `billing_problems` to tell whether it had started. After each answer the client waits `think`
    seconds (`THINK_TIME`) before asking again."""
    messages = [{"role": "user", "content": f"Client {n} asks: name a colour."}]
    while not done.is_set():
        request_id = f"client-{n}-{next(_IDS)}"
        try:
            reply = await client.chat.completions.create(messages=messages, stream=bool(n % 2),
                                                         extra_headers={"x-request-id": request_id}, **ask)
            if n % 2:
                finish = None
                async with reply as stream:
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
            else:
                finish = reply.choices[0].finish_reason if reply.choices[0].message.content is not None else None
        except (openai.APIError, httpx.HTTPError) as exc:
            if disconnected is not None and disconnected_unanswered(exc):
                disconnected.append(request_id)
                await trio.sleep(REFUSED_PAUSE)
            elif refused is not None and refusal(exc):
                code = exc.body.get("code") if isinstance(getattr(exc, "body", None), dict) else None
                refused.append(f"{request_id}: {type(exc).__name__}" + (f" ({code})" if code else "") + f": {exc}")
                await trio.sleep(REFUSED_PAUSE)
            else:
                cause = f" ({exc.__cause__!r})" if exc.__cause__ is not None else ""
                failed.append(f"{request_id}: {type(exc).__name__}: {exc}{cause}")
                if refused is not None:
                    await trio.sleep(REFUSED_PAUSE)
            continue
        if finish is None:
            failed.append(f"{request_id}: answered without a finish reason or without text")
            continue
        answered.append(request_id)
        if think:
            await trio.sleep(think)


class SdkClients:
    """`count` `sdk_client` loops against `base_url` (odd ones stream), refusals kept apart, each waiting `think`
    seconds after an answer, run by trio in a thread of their own from `start()` until `stop()`: for synchronous
    tests that drive `llmgw` processes meanwhile."""

    def __init__(self, base_url: str, api_key: str, count: int = 16, think: float = THINK_TIME, **ask):
        self.base_url, self.api_key, self.count, self.think, self.ask = base_url, api_key, count, think, ask
        self.answered: list[str] = []
        self.failed: list[str] = []
        self.refused: list[str] = []
        self.disconnected: list[str] = []  # ids of requests whose connection closed unanswered (`sdk_client`)
        self._token: trio.lowlevel.TrioToken | None = None
        self._done: trio.Event | None = None
        self._running = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._run,), daemon=True)

    async def _run(self) -> None:
        self._token, self._done = trio.lowlevel.current_trio_token(), trio.Event()
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0,
                                      timeout=120) as client:
            async with trio.open_nursery() as nursery:
                for n in range(self.count):
                    nursery.start_soon(lambda n=n: sdk_client(client, n, self._done, self.answered, self.failed,
                                                              self.refused, self.disconnected, self.think, **self.ask))
                self._running.set()

    def start(self) -> SdkClients:
        self._thread.start()
        assert self._running.wait(30), "the clients did not start"
        return self

    def answers_after(self, count: int, seconds: float, what: str) -> None:
        """Wait (polling) until `count` more requests than now are answered; fails after `seconds`."""
        target, deadline = len(self.answered) + count, time.monotonic() + seconds
        while len(self.answered) < target:
            assert time.monotonic() < deadline, (f"{count} answers {what} not within {seconds} s: "
                                                 f"{len(self.answered)} answered, failed {self.failed[-3:]}, "
                                                 f"refused {self.refused[-3:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Let each client finish its request in flight, then end them."""
        assert self._token is not None and self._done is not None
        trio.from_thread.run_sync(self._done.set, trio_token=self._token)
        self._thread.join(timeout=150)
        assert not self._thread.is_alive(), "a client's request did not end within 150 s"

    def figures(self) -> str:
        return f"{self.requests} requests: {len(self.answered)} answered, {len(self.failed)} failed, " \
               f"{len(self.refused)} refused before they started, {len(self.disconnected)} closed unanswered"

    @property
    def requests(self) -> int:
        return len(self.answered) + len(self.failed) + len(self.refused) + len(self.disconnected)


CLIENT_ROWS = "SELECT client_request_id, status FROM usage WHERE client_request_id LIKE 'client-%'"
"""The usage rows of the requests `SdkClients` sent (their x-request-id starts "client-"), for `billing_problems`."""


def billing_problems(clients: SdkClients, rows: list[tuple[str, int]]) -> list[str]:
    """What is wrong with the usage rows `rows` ((client request id, status) of each row whose x-request-id was sent
    by `clients`): an answered request without exactly one row of status 200, any request with more than one row, or
    a request whose connection closed unanswered although the gateway had taken it (it has a row: it started, and
    was lost). [] when every request is billed once at most, every answered one exactly once, and every unanswered
    one never reached the gateway."""
    count: dict[str, int] = {}
    for client_id, status in rows:
        count[client_id] = count.get(client_id, 0) + 1
    problems = [f"{rid}: {n} rows" for rid, n in count.items() if n > 1]
    ok = {client_id for client_id, status in rows if status == 200}
    problems += [f"{rid}: answered, no row of status 200" for rid in clients.answered if rid not in ok]
    problems += [f"{rid}: closed without an answer after the gateway took it ({count[rid]} row)"
                 for rid in clients.disconnected if rid in count]
    return problems
