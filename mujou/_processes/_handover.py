"""The sender's core, handed to the reader its send woke (NOTE [ the core handed to the reader ]).

NOTE [ the core handed to the reader ]
Under the real-time timer a send to a reader in another process ends with a wake-up record on
that process's pipe (``_wire.Pipe``). Linux wakes a reader blocked on a pipe as a *sync*
wake-up: the writer is expected to block soon, so the reader is often queued on the writer's
own core, and, the writer not having used up its share, it waits there until the writer
blocks. Mujou's sender does not block at once: its update goes on (the hook's return, the
busy time, the checks, the batch's end, the wait for the next due time), about 13 µs on this
2-core machine, all of it on the way from the send to the read. A floor that writes and then
sleeps has none of it.

So the sending thread hands its core over once, with ``sched_yield``, after the message is
whole in the ring and its records are written: a reader queued on this core runs now, and the
sender's update ends after it. Where nothing else waits for the core, the call returns at once
(about 1 µs with the two clock reads); where the reader went to another core, it costs the
same and changes nothing.

A yield also lets every other thread queued on the core run before the sender, for as long as
the scheduler gives them (Linux's EEVDF moves the yielding thread's deadline a whole slice
on, a millisecond or more): on a busy core a yield a send would make the sender's own updates
late. So a yield that kept the thread off its core for more than ``BUDGET`` stops the yields
of this process for ``PAUSE`` times as long as it took; then they are tried again. The yields
over the budget thus cost the senders at most about 1 % of their time, however busy the core,
and a single long one on a quiet core (1.5 ms, once in a few thousand here) stops them for a
fraction of a second only: a pause of a whole second after each, tried first, left half of a
2 s hand-off run without yields now and then (p50 77 µs instead of 55 at 64 KiB). A reader
whose update is that long stops them the same way. A shorter one is waited for: the time off
the core is spent inside the sender's hook, and counts in its busy time as any other wait
there (the spec says so).

Measured (2026-12-05, this 2-core machine, ``python -m bench._one mujou_processes
cross_process '{"nbytes": N, "seconds": 2}'`` and the floor's, each p50 in µs, rounds
alternated with the code before; bench/RESULTS.md has every round): quiet, 256 B 59.8-61.9
before, 43.4-45.1 after (1.48-1.54x the floor's 29.2-29.3); 64 KiB 74.0-79.5 before,
58.7 and 59.5 after, and 88.8 in a third round that a yield over the budget paused for a
second, as the pause first was (the floor 37.2-37.6). In the bench runner's table (``bench/run.py --quick
--repeats 3``), four runs: 256 B 1.38-1.73x the floor, 64 KiB 1.43-1.61x (2.15x and 1.93x
before). Split (``python -m bench.handoff_steps steps mujou 256``): the reader woken 11.8 µs
after the record instead of 31.3, the whole 49.0 µs instead of 71.9 with the probes; the
sender's ``send()`` returns after the reader's update (81.8 µs after the record). A yield
before the copy instead of after it was worse than none (70 µs): the reader then found the
slot still being written and waited for the sender.

The yields' own length, quiet: p50 68.5 µs, p99 114, the longest 332 of 2,000 (the reader's
path until it waits again). With two CPU-bound processes on the two cores: 70 µs at the
median but 2.0-4.8 ms for the slowest tenth, and a yield after every send let the sender make
1,110 of its 2,000 updates (p99 3.3 ms) against 1,923 without, hence ``BUDGET``; with it,
under the same load, the p50 is as without the yield (28.6-33.6 µs against 30.7-33.8) and the
sender makes 1,840-1,982 updates. In the Python-bound fleet over two processes
(``fleet_processes``), where both processes are always busy, 800 and 1,600 yields recorded on
its two sides in 1.5 s: p50 1.5 µs, p99 84-104 µs, about 9 ms in all on each; its ratio of
two processes to one stayed within its spread (before 1.60, 1.68, 1.66; after 1.69, 1.61,
1.58). The same yield after the send of the data plane between hosts (``_hosts._plane``)
changed nothing there (five rounds alternated, p50 118-134 µs either way): that hand-off's
reader is woken on the other core.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

BUDGET = 1e-3  # seconds off the core past which a yield stops the yields for a while
PAUSE = 100  # a yield over BUDGET stops the yields for this many times its own length
_SCHED_YIELD: Callable[[], object] | None = getattr(os, "sched_yield", None)  # None on Windows


class Handover:
    """Called by a sending thread once its message is out: yields the core once, unless a
    recent yield cost more than ``BUDGET``: then not for ``PAUSE`` times as long as that one
    took (NOTE [ the core handed to the reader ]). Shared by the senders of one process; its
    one field is a float that each store replaces whole."""

    __slots__ = ("_clock", "_give", "_until")

    def __init__(
        self,
        give: Callable[[], object] | None = _SCHED_YIELD,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._give = give  # None where the platform has no sched_yield (Windows): no yield
        self._clock = clock
        self._until = 0.0  # no yield before this time (clock's seconds)

    def __call__(self) -> None:
        give = self._give
        if give is None:
            return
        clock = self._clock
        began = clock()
        if began < self._until:
            return
        give()
        took = clock() - began
        if took > BUDGET:
            self._until = began + PAUSE * took
