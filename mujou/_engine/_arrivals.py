"""Arrivals: a message made visible on an input that a trigger names wakes the input's node.

At the start of a run ``wire`` tells each port which triggered nodes its messages wake
(``_Port._wakes``). An arrival is then a publish on such a port: the engine calls ``arrive``
for each woken node, with the lock held, under the real-time timer as the send returns and
under the virtual timer when the tag's messages are committed. ``arrive`` reads the message
numbers the node's last update started with (``Input._fresh_next``) and asks the policy for an
update by the due time the Triggers page gives (trigger.due). See the "Triggers" page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._port import _Port
    from ._policy import Policy
    from ._slot import Slot


def wire(slots: Sequence[Slot]) -> None:
    """Set every port's ``_wakes`` for a run of ``slots``."""
    for slot in slots:
        for port in slot.core.ports.values():
            port._wakes = ()
    for slot in slots:
        for port in slot.trigger_inputs:
            source = port if port._source is None else port._source
            if slot not in source._wakes:
                source._wakes = (*source._wakes, slot)


def arrive(policy: Policy, slot: Slot, now: float, by: Slot | None = None) -> None:
    """An arrival at timer time ``now`` on an input of ``slot`` that its trigger names.

    With the engine's lock held. When the trigger's condition holds (trigger.any,
    trigger.all, trigger.all-timeout), ``slot`` is due by ``max(s + delay, last +
    min_interval)`` (trigger.due); an earlier due time stands (``Policy.trigger``). ``by``:
    the node whose update sent, if any. It runs in every send to a triggered node: kept to
    plain loops.
    """
    if slot.trigger_all:
        fresh = [port._fresh_next() for port in slot.trigger_inputs]
        if all(fresh):
            at = now
        elif any(fresh):
            at = now + slot.timeout  # inf without a timeout: the policy keeps the due time
        else:
            return
    else:
        for port in slot.trigger_inputs:
            if port._fresh_next():
                break
        else:
            return  # the node's update began meanwhile and saw the message
        at = now
    due = at + slot.delay
    if slot.last + slot.min_interval > due:  # last: the run's start before a first update
        due = slot.last + slot.min_interval
    policy.trigger(slot, due, by if due <= now else None)


def arrived(policy: Policy, port: _Port, now: float, by: Slot | None = None) -> None:
    """A message became visible on ``port`` at ``now`` (sent by ``by``'s update, if any):
    every node it wakes gets ``arrive``."""
    for slot in port._wakes:
        arrive(policy, slot, now, by)
