"""Waiting for the next message on a connection under the virtual timer: poll a while first.

Under the virtual timer the processes run in lockstep, and every tag is a command and its
reply for each process (proc.virtual). A thread blocked in a read wakes tens of microseconds
after the data came on a busy machine, more than a small tag takes, and the writer's write
takes as long, waking it. So before it blocks, a read under the virtual timer polls, yielding
the CPU between looks, for up to ``SPIN`` real seconds: the next command or reply of a running
lockstep comes within that, and a process whose host is busy elsewhere blocks soon after.
Only a thread that has its process's GIL to itself meanwhile polls so (a process's command
thread, the host's lockstep thread once its own updates of the tag are done): another thread
of the process would wait for the GIL it takes between looks.

NOTE [ a busy machine ]
A yield returns at once on an idle core, and only after another thread's time slice (up to
milliseconds) where others wait for the core. Polling on then put a tag's command or reply
behind other work each look, while a blocked read is woken as soon as the data comes. So a
poll stops at the first yield that took more than ``BUSY`` and the thread blocks. Measured
in bench's tags-virtual-2p at load 7-9 on 2 cores, the same run's floor at 21,000-30,000
tags/s: 2,400-3,000 tags/s with it, 1,400-1,700 without.
"""

from __future__ import annotations

import math
import os
import select
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

SPIN = 0.001  # real seconds a read under the virtual timer polls before it blocks
BUSY = 50e-6  # real seconds: a yield that took longer found the core busy (NOTE [ a busy machine ])

_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))  # releases the GIL


class Poller:
    """Looks whether any of some connections has something to read, without blocking."""

    __slots__ = ("_poll",)

    def __init__(self, connections: Sequence[Connection]) -> None:
        self._poll = select.poll()
        for connection in connections:
            self._poll.register(connection.fileno(), select.POLLIN)

    @staticmethod
    def available() -> bool:
        return hasattr(select, "poll")  # not on Windows: reads there block at once

    def wait(self, seconds: float) -> list[int]:
        """Return once a connection has data or has ended, or after ``seconds``: the
        descriptors that have (none when the time ran out). A yield that took longer than
        ``BUSY`` ends it early: another thread had the core (NOTE [ a busy machine ])."""
        poll, clock = self._poll.poll, time.perf_counter
        deadline = clock() + seconds
        while not (ready := poll(0)):
            now = clock()
            if now >= deadline:
                return []
            _yield_cpu()
            if clock() - now > BUSY:
                return []
        return [fd for fd, _ in ready]

    def block(self, seconds: float | None) -> list[int]:
        """As ``wait``, blocked instead of polling (forever for None): without the selector
        ``multiprocessing.connection.wait`` and ``Connection.poll`` make each call."""
        ready = self._poll.poll(None if seconds is None else max(0, math.ceil(seconds * 1000)))
        return [fd for fd, _ in ready]


def poller(connections: Sequence[Connection], virtual: bool) -> Poller | None:
    """The poller of connections read under the virtual timer, where polling is available."""
    return Poller(connections) if virtual and Poller.available() else None
