"""The run's timers: real time (optionally scaled) and virtual time.

A timer only tells the time; the scheduler decides what to run. The virtual timer's
time is moved by the host's calls on the run (see :ref:`timers.virtual`).
"""

from __future__ import annotations

import time
from typing import final

from ._numbers import positive

_monotonic = time.monotonic  # bound once: the scheduler reads the time several times per update


class Timer:
    """The clock of a run: :class:`RealTimeTimer` or :class:`VirtualTimer`.

    Pass one to ``mujou.run(net, timer=...)``. A timer is used by one run at a time.
    """

    def __init__(self) -> None:
        if type(self) is Timer:
            raise TypeError("mujou.Timer is abstract; use mujou.RealTimeTimer() or mujou.VirtualTimer()")

    @property
    def virtual(self) -> bool:
        """Whether the time advances only when the host asks it to."""
        return isinstance(self, VirtualTimer)


@final
class RealTimeTimer(Timer):
    """Timer seconds that follow the monotonic clock, ``scale`` of them per real second.

    See :ref:`timers.realtime`.
    """

    def __init__(self, *, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = positive("scale", scale, unit="")  # run.number-arguments

    def __repr__(self) -> str:
        return f"RealTimeTimer(scale={self.scale!r})"


@final
class VirtualTimer(Timer):
    """Time that advances only inside the host's ``sleep``, ``wait_for`` and ``join``.

    The run jumps from one due update to the next as fast as the machine allows, and its
    results do not depend on the machine or the number of workers. See
    :ref:`timers.virtual` and :ref:`sched.virtual-deterministic`.
    """

    def __repr__(self) -> str:
        return "VirtualTimer()"


class Clock:
    """The run's view of its timer: ``now()`` in timer seconds, from ``origin``."""

    def __init__(self, timer: Timer, origin: float) -> None:
        self.virtual = timer.virtual
        self.scale = timer.scale if isinstance(timer, RealTimeTimer) else 1.0
        self._origin = origin
        self._start: float | None = None  # real time does not count before the timer starts
        self.virtual_now = origin

    def set_origin(self, origin: float) -> None:
        """Start from ``origin`` instead (a restored run's time); before the timer starts."""
        self._origin = origin
        self.virtual_now = origin

    def start(self) -> None:
        """Start counting real time from now (the run's timer starts)."""
        self._start = time.monotonic()

    def now(self) -> float:
        """The timer time in seconds: the origin until the timer starts."""
        if self.virtual or self._start is None:
            return self.virtual_now
        return self._origin + (_monotonic() - self._start) * self.scale

    def real_seconds(self, timer_seconds: float) -> float:
        """How long ``timer_seconds`` of this timer last in real time."""
        return timer_seconds / self.scale
