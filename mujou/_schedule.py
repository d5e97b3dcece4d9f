"""Due times: the fixed-rate arithmetic and the queue of worker nodes. Pure: no threads, no clock.

A node's k-th update (k = 1, 2, ...) is due at ``k * period`` of timer time, always computed
that way (never by adding periods up), so that a run and its resumed copy compute the same
floating-point due times. See :ref:`sched.first-due` and :ref:`sched.fixed-rate`.
"""

from __future__ import annotations

import math
from bisect import insort
from heapq import heapify, heappop, heappush

_INF = math.inf
_ceil = math.ceil


def due_time(slot: int, period: float) -> float:
    """The due time of update number ``slot`` of a node with this period."""
    return slot * period


def next_slot(slot: int, period: float, start: float) -> tuple[int, int]:
    """The slot after ``slot``, whose update started at ``start``, and how many slots it skips.

    Slots whose due time is already before ``start`` are skipped rather than run in a burst
    (see :ref:`sched.skip`): the next update is due at the first slot at or after ``start``.
    """
    following = slot + 1
    if following * period >= start:  # due_time, inlined: a late worker calls this per update
        return following, 0
    first = _ceil(start / period)  # an overloaded worker skips at each update: no max() call
    if first < following:
        first = following
    while first * period < start:  # ceil of a float quotient can land one short
        first += 1
    return first, first - following


def first_slot_at_or_after(time: float, period: float) -> int:
    """The first slot (>= 1) due at or after ``time``: where a node with a new period resumes."""
    slot = max(1, math.ceil(time / period))
    while due_time(slot, period) < time:
        slot += 1
    return slot


class DueQueue:
    """Worker nodes waiting for their next update: earliest due first, then registration order.

    Equal due times go in registration order (the node's index), a deterministic tie-breaker
    (see :ref:`threads.earliest-due-first`). Each node is in the queue at most once; a node
    that is running is not in it.

    Nodes of one period fall due at the same instants, so the queue keeps the nodes due at
    one time in one bucket, and a heap of the distinct due times: the nodes due earliest are
    taken together, as one list, instead of one sift through a heap of every node each.
    ``dues[0]`` is the earliest due time; read it, do not change it.
    """

    __slots__ = ("_buckets", "dues")

    def __init__(self) -> None:
        self.dues: list[float] = []  # a heap of the due times that have a bucket
        # Each bucket holds the indices in ascending order: nodes put back in registration
        # order, as a batch puts them back, are appended.
        self._buckets: dict[float, list[int]] = {}

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())

    def push(self, due: float, index: int) -> None:
        """Add node ``index``, next due at ``due``; a node due never (inf: one that only a
        trigger updates, none pending) stays out, so a trigger only pushes it."""
        if due == _INF:
            return
        bucket = self._buckets.get(due)
        if bucket is None:
            self._buckets[due] = [index]
            heappush(self.dues, due)
        else:
            insort(bucket, index)

    def push_all(self, due: float, indices: list[int]) -> None:
        """Add the nodes ``indices``, in ascending order, all next due at ``due``.

        One merge instead of an insertion each: the rest of a batch goes back in O(n). Nodes
        due never stay out, as in ``push``.
        """
        if not indices or due == _INF:
            return
        bucket = self._buckets.get(due)
        if bucket is None:
            # A copy of exactly its size: a worker that takes it as its batch and pops its one
            # node then lodges another (NOTE [ the send that lodges ]) neither shrinks nor
            # grows the list (``list(indices)`` made room for 4: two reallocs, 0.6k instructions).
            self._buckets[due] = indices.copy()
            heappush(self.dues, due)
        else:
            bucket += indices
            bucket.sort()  # two ascending runs: timsort merges them in linear time

    def remove(self, due: float, index: int) -> None:
        """Take node ``index``, due at ``due``, out of the queue (a trigger moves it earlier).

        O(bucket + distinct due times): both are small, the due times one per period.
        """
        if due == _INF:  # never pushed
            return
        bucket = self._buckets[due]
        bucket.remove(index)
        if not bucket:
            del self._buckets[due]
            # A heap at every moment, for a worker's send reads ``dues[0]`` without the lock
            # (NOTE [ the send that lodges ] in the engine's _lodge): replaced in one step.
            rest = [other for other in self.dues if other != due]
            heapify(rest)
            self.dues[:] = rest

    def pop_all(self) -> list[int]:
        """Remove the nodes due earliest, all due at ``dues[0]``; the queue must not be empty.

        Returns their indices with the first in registration order last, ready to ``pop()``.
        """
        bucket = self._buckets.pop(heappop(self.dues))
        bucket.reverse()
        return bucket

    def pop_until(self, time: float) -> list[int]:
        """Remove the nodes due at or before ``time`` (at least those due earliest; the queue
        must not be empty), in the order they are due: earliest first, equal due times in
        registration order. Returns their indices with the first last, ready to ``pop()``.
        """
        dues, buckets = self.dues, self._buckets
        taken = buckets.pop(heappop(dues))
        while dues and dues[0] <= time:
            taken += buckets.pop(heappop(dues))
        taken.reverse()
        return taken

    def next_due(self) -> float:
        """The earliest due time, or infinity when the queue is empty."""
        return self.dues[0] if self.dues else math.inf

    def count_until(self, time: float, limit: int) -> int:
        """How many nodes are due at or before ``time``, counting up to ``limit``."""
        dues, found, todo = self.dues, 0, [0]
        while todo and found < limit:  # the due times up to ``time`` are a subtree at the root
            i = todo.pop()
            if i < len(dues) and dues[i] <= time:
                found += len(self._buckets[dues[i]])
                todo += (2 * i + 1, 2 * i + 2)
        return min(found, limit)

    def clear(self) -> None:
        """Forget every node (the run is stopping)."""
        self.dues.clear()
        self._buckets.clear()
