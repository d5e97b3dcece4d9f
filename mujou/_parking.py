"""Where idle workers wait: a condition variable with a lock of its own for each worker.

``threading.Condition`` allocates a lock for every wait and wakes its waiters in the order
they came. A worker waits many times a second (once per due time when it is ahead), so here
each worker parks on its own lock, made once, and ``notify`` wakes the worker that parked
last: its caches are the warmest, and the others sleep on.
"""

from __future__ import annotations

import threading

_TIMEOUT_MAX = threading.TIMEOUT_MAX


class Parking:
    """Parked workers, by number; every method is called with ``lock`` held."""

    __slots__ = ("_gates", "_lock", "_parked")

    def __init__(self, lock: threading.Lock, workers: int) -> None:
        self._lock = lock
        self._gates = [threading.Lock() for _ in range(workers)]  # held while nobody opened it
        for gate in self._gates:
            gate.acquire()
        self._parked: list[int] = []  # the parked workers, the latest last

    def wait(self, number: int, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify or ``timeout`` seconds, take the lock back.

        Returns whether a notify woke the worker (False when the time ran out).
        """
        gate = self._gates[number]
        self._parked.append(number)
        self._lock.release()
        try:
            notified = gate.acquire(True, -1 if timeout is None else min(max(timeout, 0.0), _TIMEOUT_MAX))
        finally:
            self._lock.acquire()
        if not notified:
            if number in self._parked:  # notify_all replaces the list: read it again
                self._parked.remove(number)
            else:  # notified after the time ran out, before the lock was back: the gate is open
                gate.acquire()
                notified = True
        return notified

    def notify(self) -> None:
        """Wake one parked worker, the one that parked last."""
        if self._parked:
            self._gates[self._parked.pop()].release()

    def notify_all(self) -> None:
        """Wake every parked worker."""
        parked, self._parked = self._parked, []
        for number in parked:
            self._gates[number].release()
