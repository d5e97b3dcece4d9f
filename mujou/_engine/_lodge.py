"""The send that lodges: with one worker, a send hands the node it wakes to its own batch.

NOTE [ the send that lodges ]: under the real-time timer with one worker, the send of a node
``S`` on an output whose planned hand-off (``_Port._hand``: the one node ``N`` it wakes, woken
by ``on`` through that one input, no delay, no min_interval) puts ``N`` last in the worker's
batch without the engine's lock, when ``N`` is free and not due and nothing is due before it:
the lock, ``Engine.sent`` and the policy's checks of cases the plan already fixed were a
third of the path from a send to the update it triggers. It is safe by design, not by a lock:

- Only the worker that holds ``S`` in the batch it runs lodges ``N`` (``lodge`` reads that
  ``S`` is held by worker 0; the run is not stopping, so a worker holds a node only in the
  batch it runs: jobs come before the timer starts and in the stop), and only it writes
  ``N``, its batch and ``N``'s holder meanwhile. No other thread changes a free ``N`` while
  a worker holds ``S``: ``N``'s input has a source, so only ``S``'s sends make it due (the
  host writes inputs without one); the host takes only queued nodes, and ``N`` is not
  queued (not due); a pause takes the states only once nothing is held (``S`` is); and the
  stop leaves ``N``'s stop job to ``S``'s release (``Slot.lodger``, ``Policy._queue_stop``).
- ``busy``, which other threads change under the lock, is not touched: the batch counts
  what it lodged (``Batch.lodged``) and its put-back takes off only what ``busy`` counted.
- Earliest due first (threads.earliest-due-first): ``N`` goes last in the batch, and only
  when nothing in the queue is due at or before the send, read without the lock from the
  queue's heap of due times, which is a heap at every moment (``DueQueue.remove`` replaces
  it in one step); a node the host makes due meanwhile waits for the batch, as one made due
  after the send would. A heap at every moment only where the GIL is held: another thread's
  ``heappop`` (the host's thread taking a due update) is one C call that holds it, while on a
  build without the GIL a read may find the pop's last item moved to the top and not yet
  sifted down, later than an update still due. So a process without the GIL does not lodge
  (``Policy.lodges``): its sends take the locked way.
- The stop (``begin_stop``) and a pause end the batch after the sender's hook, as the runner
  checks after every hook, and the put-back frees ``N`` or queues it at its due time, as
  for a node handed off under the lock (NOTE [ handing off ] in ``_policy``). A lodge that
  read ``lodging`` just before the stop began puts ``N`` in the batch all the same; its
  put-back queues ``N``'s stop job.

Counted with ``bench/trigger_callgrind.py`` (its docstring says how: callgrind on just after
the sender's time stamp, off at the triggered hook's first line, the median of the sends after
the first 10; a 1 s sender; 2-core AMD EPYC, CPython 3.11, torch 2.13): the plain pool 16.5k
instructions (``--pool``), Mujou 25.0k at 3fa933c (1.52x), 19.7k with this (1.19x; the target
1.2x is 19.8k); 19.1k (1.16x) once ``DueQueue.push_all`` makes a bucket of exactly its size
(``list(indices)`` made room for four, so the batch's list shrank as the worker popped the
sender and grew again as the send lodged: two reallocs). Measured before it was built: the
lock taken out of ``Engine.sent`` alone (the claim a policy method, nothing else changed)
22.2k; the claim inlined in ``Engine.sent`` 21.0k; the call from ``Output.send`` through the
slot's ``partial`` into ``Engine.sent`` cost 1.1-1.4k by itself (``--send``: 8.4-8.7k with
``Engine.sent`` returning at once, 7.3k without the call; a ``lambda`` closure in the
``partial``'s place: 25.2k in all, worse). So the claim is a closure the send calls directly,
what it reads bound once, the clock's fields too (fixed once the timer started). In time,
``python -m bench._one mujou trigger_latency '{"seconds": 2, "workers": 1}'`` and the same for
``heap_pool``, 3fa933c and this alternated four rounds (load 5.5-7, the other helpers' work
running): p50 11.0, 10.5, 9.9 and 10.5 us before, 7.3, 7.3, 7.2 and 7.8 us after, the pool
6.3, 6.1, 6.5 and 6.5 us (1.62x before, 1.16x after, medians); ``mujou chain`` 48.4 and 54.5
us before, 46.6 and 44.9 after (5,000 of 5,001 sends lodged).

The compiled build (``MUJOU_COMPILE=1``, setup.py) compiles this module too (2026-12-05): the
lodge runs in every send that wakes a node, and as Python it was the one step of the path
from a send to the triggered hook that the compiled runner left interpreted. So that it can be
compiled, it reads the real time from the clock it is given (``RealClock.source``), which a
test sets, instead of a module global that the tests patched. Counted with
``bench/trigger_callgrind.py`` (caches emptied at each triggered update's end, medians of
sends 11-25, the same machine): pure Python 18.6k instructions, the compiled runner without
this module 17.8k, with it 14.6k (the plain pool 16.9k; D1 misses 571 without it, 502 with
it; indirect jumps mispredicted 331 and 245). In time, ``python -m bench._one mujou
trigger_latency '{"seconds": 2, "workers": 1}'``, the three builds and the plain pool
alternated six rounds (load 0.6-1.3): p50 medians pure 3.70 µs, compiled without it 4.21 µs,
with it 3.47 µs, the pool 2.44 µs (1.52x, 1.73x, 1.42x). The ports' ``send`` and ``read``
stay interpreted: compiled as well (an experiment, their overloaded ``__init__`` taken out,
which mypyc cannot build yet) the path was 13.8k instructions.

Why fewer instructions than the pool still take longer (the same counts with the cache and
branch simulators, the three builds the same hour, 2026-12-05, bench/RESULTS.md): the pool
16.7k instructions, 229 D1 misses, 84 branches mispredicted; pure Python 18.6k, 480, 187;
compiled 14.8k, 513, 174. Both builds touch about 2.2 times the pool's data lines: what the
path reads is spread over the objects of the rules it keeps (slots, cores, contexts, ports,
the batch, the queue), and the compiled code still reads the ports and the node's core as
attributes of interpreted objects, each through the type's cache and a descriptor. Fewer
lines would take the state a send and an update's start read laid out together in one
native object, not fewer instructions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._ports import Output
from ._batches import FREE
from ._clock import RealClock

if TYPE_CHECKING:
    from ._clock import Clock
    from ._policy import Policy
    from ._slot import Slot


def plan(policy: Policy, clock: Clock, slots: Sequence[Slot]) -> None:
    """Give each output with a planned hand-off (``_Port._hand``, set by ``_arrivals.wire``)
    its ``_lodge``, and each node it hands off its ``lodger`` (the sender, whose release
    queues its stop job), when the policy lodges (``Policy.lodges``: one worker, the
    real-time timer, read from a ``RealClock``). Once a run, as its timer starts (``clock``
    started), after ``wire``."""
    for slot in slots:
        slot.lodger = -1
        slot.lodges = ()
    if not policy.lodges or not isinstance(clock, RealClock):
        return
    for sender in slots:
        if sender.dedicated:
            continue
        for port in sender.core.ports.values():
            hand = port._hand
            if hand >= 0 and isinstance(port, Output):  # a host-fed input's is its own node
                slot = slots[hand]
                slot.lodger = sender.index
                sender.lodges = (*sender.lodges, hand)
                port._lodge = lodger(policy, clock, sender, slot)


def lodger(policy: Policy, clock: RealClock, sender: Slot, slot: Slot) -> Callable[[int], bool]:
    """The claim a send of ``sender``'s on its output that hands off ``slot`` makes without
    the lock (NOTE [ the send that lodges ]): ``lodge(number)``, after the message ``number``
    was published, lodges ``slot`` in worker 0's batch and answers True, or changes nothing
    and answers False (the caller goes the locked way, ``Engine.sent``)."""
    holder = policy.holder
    dues = policy.queue.dues  # the queue's heap: never replaced
    origin, scale, source = clock._origin, clock.scale, clock.source  # RealClock.now, inlined
    started = clock._start  # fixed once started, as the rest
    assert started is not None  # planned as the timer starts
    batch = policy.batch[0]
    times, numbers = slot.arrival_times, slot.arrival_numbers
    mine, index = sender.index, slot.index
    inf = math.inf

    def lodge(number: int) -> bool:
        if not policy.lodging or holder[mine] != 1 or holder[index] != FREE or slot.due != inf:
            return False
        now = origin + (source() - started) * scale
        if (dues and dues[0] <= now) or slot.last > now:
            return False  # an update due first (threads.earliest-due-first), or not due yet
        times[0] = slot.due = now  # arrive's note; due at once (no delay, no min_interval)
        numbers[0] = number
        holder[index] = 1
        batch.todo.insert(0, index)  # last: the first of todo are the ones handed off
        batch.lodged += 1
        return True

    return lodge
