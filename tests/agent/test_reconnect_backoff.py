"""How long an agent waits before reconnecting to a control plane: short, capped, and spread (jitter), so a control
plane started again has its agents back within seconds and they do not knock in step."""

from __future__ import annotations

import random

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.runtime import reconnect_delay


@pytest.mark.parametrize(
    "previous, maximum, fraction, step, wait",
    [
        (0.0, 5.0, 0.0, 0.5, 0.25),    # the first attempt after a working link: a quarter to half a second
        (0.0, 5.0, 0.999, 0.5, 0.49975),
        (0.5, 5.0, 0.5, 1.0, 0.75),
        (2.0, 5.0, 0.0, 4.0, 2.0),
        (4.0, 5.0, 0.0, 5.0, 2.5),     # capped
        (5.0, 5.0, 0.999, 5.0, 4.9975),
        (0.0, 0.2, 0.0, 0.2, 0.1),     # a cap below the first step wins
    ],
)
def test_the_reconnect_wait_doubles_to_its_cap_and_is_drawn_from_the_upper_half(previous, maximum, fraction, step,
                                                                                 wait):
    assert reconnect_delay(previous, maximum, fraction) == pytest.approx((step, wait))


def test_an_agent_down_for_a_minute_retries_at_least_every_five_seconds_by_default():
    rng = random.Random(7)
    step, waits = 0.0, []
    while sum(waits) < 60:
        step, wait = reconnect_delay(step, AgentConfig().reconnect_backoff_max, rng.random())
        waits.append(wait)
    assert max(waits) <= 5.0 and len(waits) >= 12
    assert len({round(w, 3) for w in waits[4:]}) > 5  # capped waits still differ from one attempt to the next
