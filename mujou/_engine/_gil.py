"""The GIL's hold-back: when a free worker leaves due work to a worker in a hook. Pure.

NOTE [ workers under the GIL ]: while the GIL is enabled, one thread runs Python at a time,
so short hooks run no faster on two workers than on one, and slower for the hand-offs. A free
worker therefore takes due work at once when every other worker is free, or when one of them
waits outside the GIL (blocked in I/O or a sleep, or a CUDA node's hook waiting for its
stream) or has been in its hook for HOLD_BACK seconds (computing in torch outside the GIL: the
worker that is about to be free is not the only one); otherwise it leaves the work to the
worker about to be free.

A worker waits when its thread used under WAITING of the time since the last look at it: the
engine's probe (``cpu_of``, the thread's CPU clock) is read only here, under the engine's lock,
and only when a worker considers holding back. A look with no recent window to judge by (none
since the worker took its batch, or one older than PROBE_MAX) starts one and looks again PROBE
later, so a waiting hook holds up the others for about PROBE, not HOLD_BACK. Without a probe
(a platform with no thread CPU clock) only HOLD_BACK tells.

Finding that out costs a wake-up, which under the GIL slows the worker running hooks, so a
worker that keeps finding the others in short hooks looks less often: HOLD_BACK later, then
twice, four and eight times that. And when workers wait for the next due update, one of them
(``Workers.waker``) wakes for it, the others that much later.
"""

from __future__ import annotations

import math
from collections.abc import Callable

HOLD_BACK = 0.001  # seconds in a hook after which another worker takes due work
WATCH_DOUBLINGS = 3  # a watching worker waits up to HOLD_BACK * 2**3
PROBE = 0.0001  # the shortest window over which a worker's CPU time tells a wait
PROBE_MAX = 0.01  # a longer window is stale: it may say more of the last hook than of this one
WAITING = 0.25  # a worker whose thread ran less than this share of a window waits outside the GIL
_NO_WINDOW: tuple[float, float, bool | None] = (-math.inf, 0.0, None)


class HoldBack:
    """What the hold-back knows of each worker: when it entered its hook, how often its
    watchers looked in a row, and the window of the last look at its CPU time."""

    __slots__ = ("cpu_of", "cpu_seen", "in_hook", "patience")

    def __init__(self, workers: int) -> None:
        # When each worker entered the update it runs (perf_counter; 0.0 for none, or a hook
        # that waits outside the GIL). Its worker writes it, without the lock, as it begins
        # each update; the policy reads it under the lock.
        self.in_hook = [0.0] * workers
        self.patience = [0] * workers  # times in a row each worker watched
        # The CPU seconds a worker's thread has used (the engine's probe; None: none here).
        self.cpu_of: Callable[[int], float] | None = None
        # Per worker: (real, cpu) at the start of the window of the last look, and what the
        # window before it said (None: nothing yet).
        self.cpu_seen = [_NO_WINDOW] * workers

    def taken(self, w: int, real: float) -> None:
        """Worker ``w`` took a batch at ``real``: it is in a hook, and a window on it begins
        after this (the time it was idle says nothing of its hooks)."""
        self.in_hook[w] = real
        self.patience[w] = 0
        self.cpu_seen[w] = _NO_WINDOW

    def hold(self, w: int, real: float) -> tuple[float, bool]:
        """How long free worker ``w`` leaves due work to a worker in a short hook (0.0: it takes
        it now), and whether it takes it because a hook waits outside the GIL."""
        hold = 0.0
        probing = False
        for other, began in enumerate(self.in_hook):
            if other != w and began:
                left = HOLD_BACK - (real - began)
                if left <= 0.0:
                    return 0.0, False
                if self.cpu_of is not None:
                    waits = self._waits(other, real)
                    if waits is None:
                        probing = True
                    elif waits:
                        return 0.0, True
                if hold == 0.0 or left < hold:
                    hold = left
        if hold > 0.0:
            if probing:
                return min(hold, PROBE), False
            hold += self.watch_delay(w) - HOLD_BACK
        return hold, False

    def _waits(self, other: int, real: float) -> bool | None:
        """Whether worker ``other``'s thread waits outside the GIL, by its CPU time since the
        last look (None: no window to judge by; this look starts one)."""
        assert self.cpu_of is not None
        seen_real, seen_cpu, said = self.cpu_seen[other]
        window = real - seen_real
        if window < PROBE:  # the window goes on; what the one before it said stands
            return said
        cpu = self.cpu_of(other)
        waits = None if window > PROBE_MAX else cpu - seen_cpu < WAITING * window
        self.cpu_seen[other] = (real, cpu, waits)
        return waits

    def watch_delay(self, w: int) -> float:
        """HOLD_BACK, doubled each time worker ``w`` watched in a row, up to 8 times."""
        patience = self.patience[w]
        self.patience[w] = min(patience + 1, WATCH_DOUBLINGS)
        return HOLD_BACK * (1 << patience)
