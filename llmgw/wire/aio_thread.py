"""grpc.aio's own thread: one asyncio event loop per process, run in a daemon thread, and the ways across to trio.

Why a thread (issue 18, docs/scale.md): grpc.aio's server accepts one RPC at a time (it asks gRPC's core for the next
call only once the previous one reached Python), and a call that waits unaccepted for 30 s
(`grpc.server_max_unrequested_time_in_server`) is cancelled by the core: the agent sees `CANCELLED`. On a trio-asyncio
loop every asyncio callback waited for a turn of trio's scheduler (trio-asyncio runs one callback per turn), so a
control plane whose loop was busy (passes, status documents, the audit) accepted one or two agents a second: 300
agents at once against a loop with 20 ms of work per turn, 60 registered and 240 cancelled after 30 s; now all 300 in
0.8 s (tests/wire/test_accepting.py checks 100 against 50 ms). On its own thread the asyncio loop runs whenever it
gets the GIL, however long trio's turns are.

- `run_aio(fn, *args)` (trio side): run the coroutine function on the loop and wait for its result; cancelling the
  trio caller cancels the asyncio task and waits for it to end.
- `to_trio(token, fn, *args)` (asyncio side): schedule a plain function on the trio run of `token`, without waiting;
  dropped when that run has finished.
- `call_in_trio(token, fn, *args)` (asyncio side): await a plain function run on the trio thread (code that shares
  state with the rest of the control plane runs there, never on the gRPC thread).
- `on_loop(fn, *args)` (either side): schedule a plain function on the loop (thread-safe).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import trio

from llmgw.errors import LlmgwError

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def aio_loop() -> asyncio.AbstractEventLoop:
    """The process's grpc.aio event loop, started on first use in a daemon thread ("llmgw.wire grpc") and kept for
    the life of the process (tests run many trio runs in one process; gRPC binds channels and servers to one loop).
    Thread-safe; not a checkpoint."""
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            threading.Thread(target=_serve, args=(loop, ready), name="llmgw.wire grpc", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def on_loop(fn: Callable[..., Any], *args: Any) -> None:
    """Schedule `fn(*args)` on the gRPC loop's thread (from any thread); its exceptions go to asyncio's handler."""
    aio_loop().call_soon_threadsafe(fn, *args)


def to_trio(token: trio.lowlevel.TrioToken, fn: Callable[..., Any], *args: Any) -> None:
    """From the gRPC thread: run `fn(*args)` on the trio thread of `token` soon, in call order. Dropped when that
    trio run has finished. `fn` must not raise (an exception there crashes the trio run, as trio documents for
    `TrioToken.run_sync_soon`)."""
    try:
        token.run_sync_soon(fn, *args)
    except trio.RunFinishedError:
        pass


async def call_in_trio(token: trio.lowlevel.TrioToken, fn: Callable[..., T], *args: Any) -> T:
    """From the gRPC thread: run `fn(*args)` on the trio thread of `token` and return its result, or raise the
    LlmgwError or OSError it raised (any other exception is a bug and crashes that trio run, as `run_sync_soon`
    does).
    Raises asyncio.CancelledError when that trio run has finished."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            result = fn(*args)
        except (LlmgwError, OSError) as exc:  # handed to the awaiting coroutine, which raises it; the rest are bugs
            loop.call_soon_threadsafe(settle, functools.partial(future.set_exception, exc))
        else:
            loop.call_soon_threadsafe(settle, lambda: future.set_result(result))

    try:
        token.run_sync_soon(run)
    except trio.RunFinishedError:
        future.cancel()
    return await future


async def run_aio(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """From trio: run `await fn(*args)` as a task on the gRPC loop and return its result (or raise its exception).

    A checkpoint. Cancelling the caller cancels the asyncio task and waits (shielded) until it has ended; the caller
    then sees trio.Cancelled whatever the task returned.
    """
    loop = aio_loop()
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    holder: list[asyncio.Task[T]] = []

    def start() -> None:
        task = loop.create_task(fn(*args))
        holder.append(task)
        task.add_done_callback(lambda _: to_trio(token, done.set))

    loop.call_soon_threadsafe(start)
    try:
        await done.wait()
    except BaseException:
        loop.call_soon_threadsafe(lambda: holder[0].cancel())  # after start(): the loop runs callbacks in order
        with trio.CancelScope(shield=True):
            await done.wait()
        raise
    return holder[0].result()
