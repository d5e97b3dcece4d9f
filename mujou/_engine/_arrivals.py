"""Arrivals: a message made visible on an input that a trigger names wakes the input's node.

At the start of a run ``wire`` tells each port which triggered nodes its messages wake
(``_Port._wakes``). An arrival is then a publish on such a port: the engine calls ``arrived``,
with the lock held, under the real-time timer as the send returns and under the virtual timer
when the tag's messages are committed. ``arrive`` notes the arrival's time on the node's
inputs (``Slot.arrival_times``) and tells the policy (``Policy.arrival``), which decides when the
node is due with ``arrivals_due``: at once for a node nobody holds, and for a held one when
it comes back, against the message numbers and the start time of the update it ran
meanwhile (trigger.coalesce). See the "Triggers" page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._port import _Port
    from ._slot import Slot

_INF = math.inf


class Policy(Protocol):
    """What an arrival tells: the scheduling policy (``_policy.Policy``)."""

    @property
    def slots(self) -> Sequence[Slot]:
        """The run's nodes, by index."""
        ...

    def arrival(self, slot: Slot, now: float, by: Slot | None = None) -> None:
        """An arrival at ``now`` on an input ``slot``'s trigger names, sent by ``by``'s update."""
        ...

    def sent_to_free(self, slot: Slot, now: float, by: Slot | None) -> bool:
        """``arrive`` and ``arrival`` in one for a free ``Slot.one_input`` node; whether it
        took the arrival (False: the caller calls ``arrive``)."""
        ...


def wire(slots: Sequence[Slot]) -> None:
    """Set every port's ``_wakes`` for a run of ``slots``, and ``_hand``: the one node a port
    wakes when an arrival makes it due at once, so that a send may hand it to the sender's
    worker (``Slot.one_input``, no delay, no min_interval: ``Policy.sent_handed``)."""
    for slot in slots:
        for port in slot.core.ports.values():
            port._wakes = ()
            port._hand = -1
            port._lodge = None  # _lodge.plan sets it where the policy lodges
    for slot in slots:
        for port in slot.trigger_inputs:
            source = port if port._source is None else port._source
            if slot.index not in source._wakes:
                source._wakes = (*source._wakes, slot.index)
    for slot in slots:
        if slot.one_input and slot.delay == 0 and slot.min_interval == 0:
            port = slot.trigger_inputs[0]
            source = port if port._source is None else port._source
            if source._wakes == (slot.index,):
                source._hand = slot.index


def arrive(policy: Policy, slot: Slot, now: float, by: Slot | None = None) -> None:
    """An arrival at timer time ``now`` on an input of ``slot`` that its trigger names.

    With the engine's lock held. Each such input with a message the node's updates have not
    seen, and no noted arrival they have not seen, gets this arrival noted: its time and the
    message's number. (Every input, not only the one that arrived: a commit publishes a tag's
    messages before their arrivals, so an on_all sees them together.) ``by``: the node whose
    update sent, if any. It runs in every send to a triggered node: kept to plain loops.
    """
    times, numbers = slot.arrival_times, slot.arrival_numbers
    for i, port in enumerate(slot.trigger_inputs):
        source = port._source
        latest = (port if source is None else source)._latest
        if latest is None:
            continue
        number, seen = latest[4], port._seen
        if number != seen and numbers[i] <= seen:  # the first arrival the node has not seen
            times[i] = now
            numbers[i] = number
    policy.arrival(slot, now, by)


def arrivals_due(slot: Slot) -> float:
    """The due time the arrivals on ``slot``'s trigger inputs give it now (infinity: none),
    against the messages its last update read and that update's start ``last`` (trigger.due).

    The condition holds as trigger.any, trigger.all and trigger.all-timeout say, at the time
    ``s`` of the arrival that made it hold: per input, the first arrival since the last
    update started, as noted by ``arrive``. The node is due by ``max(s + delay, last +
    min_interval)``. An arrival since that start is never before it: a noted time before
    ``last`` counts as ``last``, and so does an arrival not noted (the node's update began
    as it was noted, and the note is of a message the update read). A restored fresh flag
    is noted at ``-inf``: not an arrival (trigger.arrival); the tree gave its due time.
    """
    last = slot.last
    times, numbers = slot.arrival_times, slot.arrival_numbers
    first = _INF
    latest = -_INF
    every = True
    for i, port in enumerate(slot.trigger_inputs):
        source = port._source
        message = (port if source is None else source)._latest
        seen = port._seen
        if message is None or message[4] == seen:
            every = False
            continue
        s = times[i] if numbers[i] > seen else last
        if s == -_INF:
            continue
        if s < last:
            s = last
        if s < first:
            first = s
        if s > latest:
            latest = s
    if first == _INF:
        return _INF  # nothing fresh (the node's update began meanwhile and read it)
    at = first
    if slot.trigger_all:  # the last of all, or the first plus the timeout (inf: none)
        at = latest if every else first + slot.timeout
    due = at + slot.delay
    earliest = last + slot.min_interval  # last: the run's start before a first update
    return earliest if earliest > due else due


def unseen_number(slot: Slot) -> int | None:
    """The number of the latest message on a ``Slot.one_input`` node's input, where it is one
    the node's updates have not seen and ``arrive`` has not noted; else None."""
    port = slot.trigger_inputs[0]
    source = port._source
    latest = (port if source is None else source)._latest
    seen = port._seen
    if latest is None or latest[4] == seen or slot.arrival_numbers[0] > seen:
        return None
    number: int = latest[4]
    return number


def due_after(slot: Slot, now: float) -> float:
    """``arrivals_due`` of a ``Slot.one_input`` node whose one arrival since its last start
    is at ``now``: the short paths' (``Policy.sent_to_free`` and its kin) due time."""
    last = slot.last  # an arrival before the last start counts as it
    due = (now if now > last else last) + slot.delay
    earliest = last + slot.min_interval
    return earliest if earliest > due else due


MAX_FLOWS_IN = 256
"""The flows kept for one update at most: a node whose trigger does not hold (an on_all still
missing an input) keeps the first ones, not one per send for as long as the run runs."""


def note_flows(slots: Sequence[Slot], port: _Port, source: tuple[str, float]) -> None:
    """Tracing: a message made visible on ``port`` was sent in the slice at ``source`` (its
    thread's name, a time in it); each node of ``slots`` (the run's) it wakes keeps it for the
    trace's flow into its next update (observe.trace-flows). With the engine's lock held."""
    for index in port._wakes:
        slot = slots[index]
        if len(slot.flows_in) < MAX_FLOWS_IN:
            slot.flows_in.append(source)


def arrived(policy: Policy, port: _Port, now: float, by: Slot | None = None) -> None:
    """A message became visible on ``port`` at ``now`` (sent by ``by``'s update, if any):
    every node it wakes gets ``arrive``."""
    slots = policy.slots
    for index in port._wakes:
        arrive(policy, slots[index], now, by)


def sent_arrived(policy: Policy, port: _Port, now: float, by: Slot | None) -> None:
    """A message an update sent became visible on ``port`` at ``now``, under the real-time
    timer (``by``: the sending node's, None for an update in another process,
    ``_processes._inbox``, or a host write, ``_lend.Lender.write_arrived``): ``arrived``, with
    the short path ``Policy.sent_to_free`` for each node woken through one input
    (``Slot.one_input``)."""
    slots = policy.slots
    for index in port._wakes:
        slot = slots[index]
        if not (slot.one_input and policy.sent_to_free(slot, now, by)):
            arrive(policy, slot, now, by)


def come_back(slot: Slot) -> None:
    """``slot`` is back with the policy (or the timer starts): a restored trigger, and the
    arrivals that came while it was held, take effect, the earlier due time standing.

    The arrivals are decided now, not when they came: an update that began meanwhile read
    them, and then they make no update (trigger.coalesce, trigger.periodic-and-triggered);
    one that came after its start makes one, at most ``min_interval`` after it
    (trigger.min-interval).
    """
    if slot.pending < slot.due:
        slot.due = slot.pending
    slot.pending = math.inf
    if slot.arrived:
        slot.arrived = False
        due = arrivals_due(slot)
        if due < slot.due:
            slot.due = due
