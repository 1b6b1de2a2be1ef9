"""llmgw.groups.expect_leaves: one split of nursery errors that never drops a cancellation."""

from __future__ import annotations

import pytest
import trio

from llmgw.errors import UsageError, WireError
from llmgw.groups import expect_leaves


def _catch(group: BaseExceptionGroup, kinds) -> list[BaseException]:
    try:
        raise group
    except BaseExceptionGroup as caught:
        return expect_leaves(caught, kinds)


def test_a_group_of_the_expected_kinds_gives_its_leaves_flattened_in_order():
    a, b, c = WireError("a"), WireError("b"), OSError("c")
    group = BaseExceptionGroup("x", [a, BaseExceptionGroup("y", [b, c])])
    assert _catch(group, (WireError, OSError)) == [a, b, c]


def test_a_leaf_of_another_kind_re_raises_the_group_whole():
    group = BaseExceptionGroup("x", [WireError("a"), KeyError("bug")])
    with pytest.raises(BaseExceptionGroup) as info:
        _catch(group, WireError)
    assert info.value is group


async def test_a_cancellation_beside_our_error_reaches_its_cancel_scope_and_our_error_still_surfaces():
    async def fail_when_cancelled():
        try:
            await trio.sleep_forever()
        finally:
            raise UsageError("cleanup failed")

    after = []
    with pytest.raises(BaseExceptionGroup) as info:
        with trio.CancelScope() as scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fail_when_cancelled)
                    await trio.lowlevel.checkpoint()
                    scope.cancel()
                    await trio.sleep_forever()
            except BaseExceptionGroup as group:
                assert group.subgroup(trio.Cancelled) is not None  # the case this test is about
                expect_leaves(group, UsageError)
                after.append("the cancellation was dropped")
    assert after == [] and scope.cancelled_caught
    assert info.group_contains(UsageError)


def test_a_cancelled_leaf_re_raises_even_beside_expected_errors():
    cancelled = _make_cancelled()
    group = BaseExceptionGroup("x", [WireError("link"), cancelled])
    with pytest.raises(BaseExceptionGroup) as info:
        _catch(group, WireError)
    assert info.value is group


def _make_cancelled() -> trio.Cancelled:
    """A real trio.Cancelled (it has no public constructor): the one a cancelled scope raises."""
    async def main():
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                return exc
    return trio.run(main)
