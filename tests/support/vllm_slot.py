"""The one real vLLM a test run may have up at a time: vLLM takes minutes and most of the memory and cores of a
2-core machine to start, so two at once would starve both.

`VllmSlot.take(holder, start)` enters `start()` (a context manager that starts a vLLM and yields what its tests
use) unless `holder` holds the slot already; any other holder's vLLM is stopped first (its context exited). The
session fixture `vllm_slot` (tests/conftest.py) releases it at the end of the run. Holders: `vllm_server`
(tests/gateway/conftest.py: the harness's vLLM, shared by the gateway's real-vLLM tests) and the `llmgw up` test
that serves the example catalog's gemma-3-270m-vllm through the agent (tests/up/test_vllm_through_up.py), which
pytest runs after the gateway's tests (tests/gateway sorts before tests/up), so each starts once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any


class VllmSlot:
    """Who runs the one real vLLM now (`holder`, None when nobody) and what its start yielded (`value`)."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.value: Any = None
        self.starts: list[str] = []  # every holder that started one, in order (the run's vLLM start budget)
        self._stack: ExitStack | None = None

    def take(self, holder: str, start: Callable[[], AbstractContextManager[Any]]) -> Any:
        """What `holder`'s vLLM yielded, starting it (after stopping another holder's) when it is not up."""
        if self.holder == holder:
            return self.value
        self.release()
        stack = ExitStack()
        self.value = stack.enter_context(start())
        self._stack, self.holder = stack, holder
        self.starts.append(holder)
        return self.value

    def release(self) -> None:
        """Stop the vLLM that holds the slot, if any (its context's exit: the process and its log)."""
        stack, self._stack, self.holder, self.value = self._stack, None, None, None
        if stack is not None:
            stack.close()
