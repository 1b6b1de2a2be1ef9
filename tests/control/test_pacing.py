"""Routing-table rebuilds paced by their cost: cheap ones at once, costly ones at most a share of the loop's time."""

from __future__ import annotations

from llmgw.control.pacing import Pacer


def test_cheap_rebuilds_run_at_once():
    pacer = Pacer()
    pacer.ran(cost=0.001, ended=10.0)
    assert pacer.now_ok(10.0) and pacer.gap() == 0.0


def test_a_costly_rebuild_waits_so_rebuilds_take_a_tenth_of_the_time():
    pacer = Pacer()
    pacer.ran(cost=0.05, ended=10.0)
    assert not pacer.now_ok(10.2)
    assert pacer.next_at() == 10.0 + 0.45  # 0.05 s of every 0.5 s
    assert pacer.now_ok(10.45)


def test_the_gateway_table_is_never_staler_than_longest():
    pacer = Pacer()
    pacer.ran(cost=0.8, ended=10.0)  # 0.8 s would otherwise wait 7.2 s
    assert pacer.next_at() == 13.0
