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
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

SPIN = 0.001  # real seconds a read under the virtual timer polls before it blocks

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

    def wait(self, seconds: float) -> None:
        """Return once a connection has data or has ended, or after ``seconds``."""
        poll, clock = self._poll.poll, time.perf_counter
        deadline = clock() + seconds
        while not poll(0):
            if clock() >= deadline:
                return
            _yield_cpu()


def poller(connections: Sequence[Connection], virtual: bool) -> Poller | None:
    """The poller of connections read under the virtual timer, where polling is available."""
    return Poller(connections) if virtual and Poller.available() else None
