"""The run's clocks: the time in timer seconds, real (optionally scaled) or virtual.

The engine asks ``make_clock`` once which clock a timer gives; after that it only reads
``now()`` and converts waits with ``real_seconds``. The virtual clock owns virtual time: the
engine moves it (``set``) between instants, when no hook runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from .._timer import RealTimeTimer, Timer


class Clock(Protocol):
    """What the engine needs of a clock."""

    virtual: bool
    scale: float

    def now(self) -> float:
        """The timer time in seconds."""
        ...

    def start(self, origin: float | None = None) -> None:
        """The timer starts: real time counts from now (or from the monotonic time ``origin``)."""
        ...

    def set_origin(self, origin: float) -> None:
        """Start from ``origin`` (a restored run's time); before the timer starts."""
        ...

    def real_seconds(self, timer_seconds: float) -> float:
        """How long ``timer_seconds`` last in real time."""
        ...


class RealClock:
    """Timer seconds that follow the monotonic clock, ``scale`` of them per real second."""

    virtual = False

    def __init__(self, scale: float, source: Callable[[], float] = time.monotonic) -> None:
        self.scale = scale
        # The real time it follows: ``time.monotonic``, or a test's stand-in. What reads the
        # time in place of ``now`` reads it from here too (the send that lodges, Engine.sent);
        # the batch runner reads it in place only where perf_counter is this clock.
        self.source = source
        self._origin = 0.0
        self._start: float | None = None  # real time does not count before the timer starts

    def set_origin(self, origin: float) -> None:
        self._origin = origin

    def start(self, origin: float | None = None) -> None:
        self._start = self.source() if origin is None else origin

    def now(self) -> float:
        start = self._start
        if start is None:
            return self._origin
        return self._origin + (self.source() - start) * self.scale

    def real_seconds(self, timer_seconds: float) -> float:
        return timer_seconds / self.scale


class VirtualClock:
    """Time that moves only when the engine sets it: from one instant to the next."""

    virtual = True
    scale = 1.0

    def __init__(self) -> None:
        self.time = 0.0

    def set_origin(self, origin: float) -> None:
        self.time = origin

    def start(self, origin: float | None = None) -> None:
        pass

    def now(self) -> float:
        return self.time

    def set(self, time: float) -> None:
        """Move to ``time`` (never back)."""
        if time > self.time:
            self.time = time

    def real_seconds(self, timer_seconds: float) -> float:
        return timer_seconds


def make_clock(timer: Timer) -> RealClock | VirtualClock:
    """The clock of ``timer``: the one place the engine tells the two timers apart."""
    if isinstance(timer, RealTimeTimer):
        return RealClock(timer.scale)
    return VirtualClock()
