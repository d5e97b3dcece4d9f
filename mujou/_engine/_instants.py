"""The virtual timer's instants: committing a tag's messages, starting the next instant (or
microstep), and the host's ``advance`` through them.

Part of ``Engine`` (its base); everything here runs with the engine's lock held, between
instants, when no hook runs (visibility.virtual, trigger.tags).

NOTE [ an instant run alone ]: a tag of a run with processes (``_processes._member.Member.instant``)
is run on one thread of each process: the host's ``mujou-lockstep``, lent to the instants
(``_lend.Lender``), and a process's command thread, worker 0 while it waits
(``_threads.Lent``). Where that thread is the only one that runs the process's worker updates
(one worker at most, none dedicated: the common case), the general way asked more than the
tag needs: the instant's start woke the host (that thread), then the lender's loop looked
whether the instant was over, took the updates, ran them, gave them back and looked again;
worker 0's loop asked the policy twice, its second answer putting the batch back to park.
Seven clock reads and five searches of the queue for one update. Run alone (``run_alone`` of
each), the start wakes nobody (``Policy.start_instant(alone=True)``), the thread takes every
worker update due by the instant in one batch (``Workers.take_alone``), runs it through the
same runner as a worker (``_update.batch_runner``: the node's context and generator, the
checks, the statistics, earliest due first), and gives it back (``Policy.done_alone``), which
says whether the instant is over. The rules are the policy's as before: it holds the nodes
while they run, so another thread that asks meanwhile (a worker woken for a job) finds them
held; and where something is left (a job, a pause, the stop, an update due that another
thread holds), the general way goes on from there. ``tests/test_instant_alone.py`` checks the
two ways give the same hooks in the same order, messages, state and statistics.

Measured in instructions a tag (callgrind; ``bench/instant_callgrind.py`` says how, the general
way with ``--general``; CPython 3.11, torch 2.13): the instant of one node that reads its last
message and sends the next, the host's side 121.9k the general way, 100.7k alone; the process's
132.3k, 98.7k. Of an empty node: 76.9k and 55.8k, 86.8k and 53.6k. The put-back then woke the
host's waits as the instant's updates ended (``_quiet``), for the thread that waits for the
instant's end, which here is the caller itself: ``done_alone`` wakes them only for a pause (a
state taken from another thread waits for no update to be held): the empty node's 48.6k and
44.9k, the other's 93.3k and 90.0k. In the whole tag of bench's tags-virtual-2p
(``bench/tags_callgrind.py``, per thread): the host's lockstep thread 210.6k before (5ddbd5d),
189.2k, then 182.1k; the process 220.3k, 186.1k, then 177.0k. What the short way still spends
around an empty node's update (host's side, each measured by taking it out): the runner's
update of an empty hook about 11k, the host thread's settings after it
(threads.host-thread-settings: five reads of torch's thread state, the thread counted as a
hook's) 5.3k, the rest (the lock, the instant's start and commit, the take and the put-back,
the next due time) about 32k.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._ports import Output
from ._arrivals import arrived, note_flows
from ._clock import RealClock, VirtualClock
from ._collect import stopping_now
from ._policy import Policy
from ._slot import Slot

if TYPE_CHECKING:
    from .._port import Staged, _Port
    from ._lend import Lender

# Microsteps at one time of the virtual timer, in one host call, at most: the backstop for
# triggers that keep waking each other (trigger.microstep-cap); start refuses a cycle of them.
MICROSTEPS_MAX = 10_000


def nothing_can_happen() -> RuntimeError:
    """The error of a virtual-timer wait that no update and no message can ever end."""
    return RuntimeError(
        "nothing can happen in this run: every node is triggered only and no "
        "message is on the way, so the virtual time would never move; write "
        "an input (run.write) first, or give the wait a timeout"
    )


class Instants:
    """The instants of the virtual timer; the fields and the wake-ups are Engine's."""

    # Set by Engine, read here.
    lock: threading.Lock
    policy: Policy
    clock: RealClock | VirtualClock
    slots: Sequence[Slot]
    staged: list[Staged]
    advance_until: float | None
    microstep: int
    call_microsteps: int
    ended: bool
    tracing: bool
    lender: Lender | None
    # The last instant's time and its whole nanoseconds (NOTE [ tags in whole nanoseconds ]),
    # so that the next instant rounds its own time only.
    _nanos: tuple[float, int] = (math.nan, 0)

    def deliver(self) -> bool:
        raise NotImplementedError

    def host_wait(self, done: Callable[[], bool], *, lend: bool = False) -> None:
        raise NotImplementedError

    def _next_instant(self) -> bool:
        """Virtual timer, the host sleeping to ``advance_until``: when the instant is over, move
        to the next one from here, without waking the host. Whether it did."""
        policy, clock = self.policy, self.clock
        assert isinstance(clock, VirtualClock) and self.advance_until is not None
        if policy.stopping or not policy.quiescent(clock.time):
            return False
        self._commit()
        if policy.end_instant():
            self.deliver()
            return True
        due = policy.next_due()
        if due > self.advance_until:
            return False
        self._start_instant(due)
        return True

    def _start_instant(self, due: float, *, alone: bool = False) -> None:
        """Virtual timer, the instant over and committed: start the next, at ``due``. ``alone``:
        the calling thread runs its worker updates alone, no node is dedicated (NOTE [ an
        instant run alone ]): none to wake."""
        clock = self.clock
        assert isinstance(clock, VirtualClock)
        if due <= clock.time:  # a microstep: triggered updates at the same time (trigger.tags)
            self.microstep += 1
            self.call_microsteps += 1
            if self.call_microsteps > MICROSTEPS_MAX:
                names = [slot.name for slot in self.slots if min(slot.due, slot.pending) <= clock.time]
                self.policy.abort(
                    RuntimeError(
                        f"the run stopped at time {clock.time!r}: triggered nodes woke each other "
                        f"more than {MICROSTEPS_MAX} times without the time moving "
                        f"(due again: {', '.join(map(repr, names))}); give one of them delay= "
                        "or min_interval=, so that the time moves between their updates"
                    )
                )
                self.deliver()
                return
        else:
            self.call_microsteps = 0
            # NOTE [ tags in whole nanoseconds ]: a recording keeps times in whole nanoseconds
            # (round(t * 1e9)), and float sums make instants a hair apart (0.06 + 0.01 and
            # 7 * 0.01); an instant in the same nanosecond as the one before counts as its next
            # microstep, so that every instant of a run keeps a tag of its own on disk.
            nanos = round(due * 1e9)
            at, before = self._nanos  # the last instant's, unless the clock moved since
            if at != clock.time:
                before = round(clock.time * 1e9)
            self.microstep = self.microstep + 1 if nanos == before else 0
            self._nanos = (due, nanos)
        clock.set(due)
        policy = self.policy
        policy.start_instant(alone=alone)
        if policy.wake:
            self.deliver()

    def _commit(self) -> None:
        """Publish the messages the instant sent (virtual timer; no hook runs)."""
        staged = self.staged  # the nodes append to this list: keep it, empty
        if not staged:
            return
        woken: list[_Port] = []
        for port, message, version, leaves, stamp in staged:
            port._publish(message, version, leaves, stamp)
            if port._wakes:
                woken.append(port)
        staged.clear()
        now = self.clock.now()
        for port in woken:  # after every publish: an on_all trigger sees the tag's messages
            arrived(self.policy, port, now)
            if self.tracing and isinstance(port, Output) and port._slot is not None:
                sender = port._slot.traced_at  # where the sender's update, just ended, ran
                if sender is not None:
                    note_flows(self.slots, port, sender)

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Virtual timer: run every update due up to ``until`` (or forever), instant by instant.

        Stops early when ``done()`` (run on the host's thread, outside the lock) is true after
        an instant. Returns whether it did. Without ``done``, the thread that ends an instant
        starts the next one up to ``until`` itself, so the host is not woken between instants.
        """
        clock, policy = self.clock, self.policy
        assert isinstance(clock, VirtualClock)
        with self.lock:
            # The calling thread runs the instants' worker updates (NOTE [ the host lends its
            # thread ] in _batches), when it may.
            lender = self.lender
            lends = lender is not None and lender.begin_instants()
            self.advance_until = until if done is None and until is not None else None
            self.call_microsteps = 0  # the cap counts within one host call (trigger.microstep-cap)
            try:
                while True:
                    self.host_wait(lambda: policy.stopping or policy.quiescent(clock.time), lend=lends)
                    if policy.stopping:
                        self.host_wait(lambda: self.ended)
                        break
                    self._commit()
                    if policy.end_instant():
                        self.deliver()
                        continue
                    # ``done`` is looked at between whole instants only: not while a later
                    # microstep of this time is due (trigger.tags: the host never sees an
                    # instant half done).
                    if done is not None and policy.next_due() > clock.time:
                        self.lock.release()
                        try:
                            if done():
                                return True
                        finally:
                            self.lock.acquire()
                        if stopping_now(policy) or not policy.quiescent(clock.time):
                            continue  # another host thread moved on meanwhile
                    due = policy.next_due()
                    if until is not None and due > until:
                        clock.set(until)
                        return False
                    if due == math.inf:
                        raise nothing_can_happen()
                    self._start_instant(due)
            finally:
                self.advance_until = None
                if lends:
                    assert lender is not None
                    lender.end_instants()
        return done() if done is not None else False
