"""Which agents a control plane serves during an upgrade: its own version and older, never a newer one. Pure.

An upgrade goes control planes first, then agents (docs/operations.md "Mixed versions during an upgrade"): an older
agent is sent only what it lists it can do (`llmgw.control.capabilities`); an agent newer than the control plane
(its `Register.agent_version`, or the protocol of its messages) may expect what this control plane does not know,
so it is refused with a sentence saying what to do, sent to it in `Registered.refusal` (its log and its exit say
it) and logged here.
"""

from __future__ import annotations

import re

_RELEASE = re.compile(r"^v?(\d+(?:\.\d+)*)([^+]*)(?:\+.*)?$")


def version_key(text: str) -> tuple[tuple[int, ...], int, str] | None:
    """An order of llmgw version strings: the release numbers (1.2 == 1.2.0), then a final release above its
    pre-releases and dev builds ("0.2.0" > "0.2.0rc1" > "0.1.0"; suffixes among themselves by their text), a local
    part ("+g1234") ignored. None for text that does not start with a number. Pure."""
    match = _RELEASE.match(text.strip())
    if match is None:
        return None
    numbers = tuple(int(n) for n in match.group(1).split("."))
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers = numbers[:-1]
    suffix = match.group(2)
    return numbers, 0 if suffix else 1, suffix


def newer_agent_refusal(node_id: str, agent_version: str, agent_protocol: int, own_version: str,
                        own_protocol: int) -> str | None:
    """Why this control plane (llmgw `own_version`, wire protocol `own_protocol`) refuses the agent of `node_id`
    (llmgw `agent_version`, protocol `agent_protocol`): a sentence naming both versions and what to do, when the
    agent is newer by its protocol or by its version (`version_key`: 0.2.0 > 0.2.0rc1 > 0.1.0); None otherwise,
    also for a version either side does not state or that `version_key` cannot order (nothing to compare)."""
    if agent_protocol > own_protocol:
        newer = f"speaks wire protocol {agent_protocol}, newer than this control plane's {own_protocol}"
    else:
        theirs, ours = version_key(agent_version), version_key(own_version)
        if theirs is None or ours is None or theirs <= ours:
            return None
        newer = f"runs llmgw agent {agent_version}, newer than this control plane's llmgw {own_version}"
    return (f"node {node_id} {newer}; upgrade the control plane first (llmgw {agent_version or 'of that agent'} "
            f"or newer), then start the agent again: control planes go first in an upgrade.")
