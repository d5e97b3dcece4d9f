"""Due times: the fixed-rate arithmetic and the heap of worker nodes. Pure: no threads, no clock.

A node's k-th update (k = 1, 2, ...) is due at ``k * period`` of timer time, always computed
that way (never by adding periods up), so that a run and its resumed copy compute the same
floating-point due times. See :ref:`sched.first-due` and :ref:`sched.fixed-rate`.
"""

from __future__ import annotations

import heapq
import math


def due_time(slot: int, period: float) -> float:
    """The due time of update number ``slot`` of a node with this period."""
    return slot * period


def next_slot(slot: int, period: float, start: float) -> tuple[int, int]:
    """The slot after ``slot``, whose update started at ``start``, and how many slots it skips.

    Slots whose due time is already before ``start`` are skipped rather than run in a burst
    (see :ref:`sched.skip`): the next update is due at the first slot at or after ``start``.
    """
    following = slot + 1
    if due_time(following, period) >= start:
        return following, 0
    first = max(following, math.ceil(start / period))
    while due_time(first, period) < start:  # ceil of a float quotient can land one short
        first += 1
    return first, first - following


def first_slot_at_or_after(time: float, period: float) -> int:
    """The first slot (>= 1) due at or after ``time``: where a node with a new period resumes."""
    slot = max(1, math.ceil(time / period))
    while due_time(slot, period) < time:
        slot += 1
    return slot


class DueHeap:
    """Worker nodes waiting for their next update, earliest due first.

    Entries are ``(due, index)``: equal due times go in registration order (the index), a
    deterministic tie-breaker (see :ref:`threads.earliest-due-first`). Each node is in the
    heap at most once; a node that is running is not in it.
    """

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due: float, index: int) -> None:
        """Add a node that is next due at ``due``."""
        heapq.heappush(self._heap, (due, index))

    def next_due(self) -> float:
        """The earliest due time in the heap, or infinity when it is empty."""
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> int:
        """Remove and return the index of the earliest node if it is due at ``now``, else -1."""
        heap = self._heap
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)[1]
        return -1

    def clear(self) -> None:
        """Forget every node (the run is stopping)."""
        self._heap.clear()
