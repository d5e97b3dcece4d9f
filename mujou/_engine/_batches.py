"""The workers' side of the scheduling policy: batches, held batches, and when to wake. Pure.

``Workers`` is the base of ``Policy`` (``_policy.py``), which adds the host's side, jobs,
dedicated threads and the stop; it is split off to keep each part readable. Its NOTEs say
how workers wake early for a burst and keep a batch; ``_gil.py`` how they share batches under
the GIL.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .._errors import MujouInternalError
from .._schedule import DueQueue
from ._arrivals import arrivals_due, come_back
from ._gil import HOLD_BACK, WATCH_DOUBLINGS, HoldBack
from ._slot import Job, Slot

FREE = 0  # holder: in no thread's hands
QUEUED_JOB = -1  # holder: a job is queued for the node
HOST = -2  # holder: the host's thread runs its update (Workers.take_for_host)
# A thread's holder number is > 0: worker w is w + 1; then the dedicated threads, one per
# dedicated node (dedicated_holder); then the state thread (state_holder).

# What next_for_* answers; the acts first (kind <= JOB is one). KEEP: sleep the real seconds
# given, then, unless a notify came first, run the batch the worker keeps (NOTE [ keeping a
# batch ]: one worker, so only a notify can change what it should do); after a notify, ask again.
RUN, JOB, SLEEP, WATCH, SPIN, PARK, EXIT, KEEP = range(8)

BURST = 4  # worker updates due together that a worker wakes early for (NOTE [ waking for a burst ])
MAX_LEAD = 0.0005  # seconds: the most a worker wakes early for a burst
FIRST_LEAD = 0.0002  # seconds: the lead before any timed wake-up was measured


_NOT_IDLE = -math.inf  # Workers.until of a worker that is not waiting


class Batch:
    """Worker updates taken together: the worker nodes due when the worker took them, run in
    the order they are due (equal due times in registration order).

    ``todo`` holds node indices, the next last: the worker that took the batch pops from it
    without the lock, and while the batch is ``shared`` another worker may pop from it under
    the lock (a worker held up in a hook leaves the rest to the others); ``list.pop`` is atomic
    on every build, so each update runs once. ``ran`` holds the slots this worker ran. A
    ``held`` batch is taken but not started: kept, or taken early for a burst. The first
    ``handed + lodged`` of ``todo`` (at most) were handed off to it, ``handed`` under the lock
    (Policy._hand_off), ``lodged`` by a send without it and not counted in ``busy`` (NOTE
    [ the send that lodges ] in ``_lodge``): each is due at its own time, the others at
    ``due``, unless ``mixed``: then each at its own due time, ``due`` the earliest (NOTE
    [ taking what is due ]).
    """

    __slots__ = ("due", "failed", "handed", "held", "lodged", "mixed", "ran", "shared", "todo")

    def __init__(self) -> None:
        self.due = math.inf
        self.mixed = False
        self.todo: list[int] = []
        self.handed = 0
        self.lodged = 0
        self.ran: list[Slot] = []
        self.held = False
        self.shared = False
        self.failed = False  # an update in ran failed: the failure is reported already


class Workers:
    """What the workers do next: the due queue, the batches, the GIL's hold-back, bursts, keeping."""

    # No __slots__ here: Policy's list every field, these included (a base with slots of its
    # own could not assign the fields Policy adds).

    # Set by Policy, read here.
    slots: list[Slot]
    workers: int
    virtual: bool
    scale: float
    holder: list[int]
    jobs: deque[tuple[Slot, Job]]
    running_job: dict[int, tuple[Slot, Job]]
    running: bool
    paused: bool
    stopping: bool
    busy: int
    worker_stops: int
    wake: bool
    wake_workers: int
    wake_worker: int
    wake_host: bool

    def __init__(self, workers: int, worker_nodes: int, *, virtual: bool, gil: bool) -> None:
        self.queue = DueQueue()  # worker nodes waiting for their next update
        self.batch = [Batch() for _ in range(workers + 1)]  # each worker's, then the host's
        self.shared: list[Batch] = []  # batches being run that other workers may take from
        self.gil = HoldBack(workers) if workers > 1 and gil else None  # NOTE in _gil.py
        # The timer time each idle worker wakes at by itself (inf: parked; -inf: not idle).
        self.until = [-math.inf] * workers
        self.waker = -1  # the worker that wakes for the next due update, and when that is
        self.waker_due = math.inf
        self.lead = FIRST_LEAD  # real seconds a worker wakes early for a burst (learnt)
        self.spinner = -1  # the worker waiting for a burst without sleeping
        self.bursts = worker_nodes >= BURST
        self.keeps = workers == 1 and not virtual  # NOTE [ keeping a batch ]
        # Whether updates due now may start: always under the real-time timer; under the
        # virtual one, from start_instant to end_instant (Policy).
        self.instant = not virtual

    def _queue_stop(self, slot: Slot) -> None:
        """Queue ``slot``'s stop job if it needs one (the stop protocol: Policy)."""
        raise NotImplementedError

    def _wake_host(self) -> None:
        self.wake = True
        self.wake_host = True

    def _quiet(self) -> None:
        """No update is held: the host may be waiting for that (a pause, a virtual instant)."""
        if self.paused or self.virtual:
            self._wake_host()

    def _wake_idle(self, due: float, *, exact: bool = False, another: bool = False) -> None:
        """Wake a worker that sleeps past ``due`` (or parks): updates due then are queued or shared.

        With ``another`` a worker to wake besides one already asked for makes it wake every
        worker: the arrivals of one message on the inputs of several nodes (``_arrivals``)
        may make each due at its own time, and the worker woken for the first takes only it.

        So a hook that blocks never holds up an update another worker could run: the others
        were asleep until later work when these nodes came back or were shared. The watchers'
        longer waits (NOTE [ workers under the GIL ]) count as on time, unless the engine can
        probe the workers' CPU time: then a watcher wakes to look whether the hook waits.
        """
        if self.virtual or self.wake_workers == 2 or (self.wake_worker >= 0 and not another):
            return
        late = due  # a watcher that can tell a waiting hook (the probe) looks now
        if not exact and (self.gil is None or self.gil.cpu_of is None):
            late += HOLD_BACK * (1 << WATCH_DOUBLINGS) * self.scale
        until = self.until
        for w in range(self.workers):
            if until[w] > late:
                until[w] = -math.inf
                self.wake = True
                if self.wake_worker < 0:
                    self.wake_worker = w
                elif self.wake_worker != w:
                    self.wake_workers = 2
                return

    def next_for_worker(self, w: int, now: float, real: float) -> tuple[int, Any]:
        """What worker ``w`` does next, at timer time ``now``: (RUN, batch), (JOB, (slot,
        job)), (SLEEP, real seconds: a timed wait for a due update), (WATCH, real seconds: a
        timed wait that learns nothing), (SPIN, due: yield the CPU until then, the batch
        held), (PARK, None) or (EXIT, None).

        The worker's batch from its last answer goes back first (or is kept, or stays held).
        The second item's type follows from the first (typed Any: the worker's loop reads it
        without an isinstance check per update).
        """
        self.until[w] = _NOT_IDLE
        if self.waker == w:
            self.waker, self.waker_due = -1, math.inf
            answer = self._answer(w, now, real)
            if answer[0] <= JOB and self.workers > 1:  # it was to wake for the next due update
                self._wake_idle(self._earliest()[0])
            return answer
        return self._answer(w, now, real)

    def _answer(self, w: int, now: float, real: float) -> tuple[int, Any]:
        """next_for_worker's answer, the waker's place given up."""
        if self.spinner == w:
            self.spinner = -1
        batch = self.batch[w]
        if batch.held:
            dues = self.queue.dues
            # Still first, and no job, pause or stop needs the worker.
            if (
                (not dues or dues[0] > batch.due)
                and self.running
                and not (self.jobs or self.paused or self.stopping)
            ):
                return self._wait_held(w, batch, now)
            self._put_back(w, batch)
        elif batch.ran or batch.todo or batch.shared:
            if self.keeps and self._keep(batch):
                return self._wait_held(w, batch, now)
            self._put_back(w, batch)
        if self.jobs:
            slot, job = self.jobs.popleft()
            self.holder[slot.index] = w + 1
            self.running_job[w + 1] = (slot, job)
            return JOB, (slot, job)
        if self.stopping:
            return (EXIT, None) if self._worker_may_exit() else (PARK, None)
        if not self.running or self.paused:
            return PARK, None
        # Each retry follows a shared batch that ran out meanwhile: at most one per batch.
        for _ in range(len(self.shared) + 1):
            due, other = self._earliest()
            ran: Slot | None = None
            if due > now and self.shared:  # nothing due now: a node another batch ran may be first
                due, other, ran = self._earliest_ran(w, due, other)
            if due == math.inf:
                return self._idle(w, PARK, math.inf)
            if due > now or not self.instant:
                if self.virtual:  # until the instant starts (Policy.start_instant)
                    return PARK, None
                timeout = (due - now) / self.scale
                if self.gil is not None and self.waker_due <= due:
                    # The waker takes it: this one watches (NOTE [ workers under the GIL ]).
                    return self._idle(w, WATCH, timeout + self.gil.watch_delay(w), now)
                self.waker, self.waker_due = w, due
                if self.bursts and self.spinner < 0 and other is None and self._burst_at(due, 0):
                    if timeout - self.lead <= 0.0:  # NOTE [ waking for a burst ]
                        self.waker, self.waker_due = -1, math.inf
                        taken = self._take_queued(w, real)
                        taken.held = True
                        return self._wait_held(w, taken, now)
                    return self._idle(w, SLEEP, timeout - self.lead, now)
                return self._idle(w, SLEEP, timeout, now)
            if self.gil is not None:
                hold, waits = self.gil.hold(w, real)
                if hold > 0.0:
                    return self._idle(w, WATCH, hold, now)
                if waits:  # a hook waits outside the GIL: the other watchers take the rest now
                    self.wake_workers = 2
                    self.wake = True
            if ran is not None:
                assert other is not None  # the batch that ran it
                found = self._take_ran(w, other, ran, real)
                if found is None:
                    continue
                taken = found
            elif other is None:
                taken = self._take_queued(w, real, now)
            else:
                found = self._take_one(w, other, real)
                if found is None:  # its worker took the last one meanwhile: other is empty now
                    continue
                taken = found
            if self._share(taken):
                self._wake_idle(taken.due)
            return RUN, taken
        raise MujouInternalError("internal error in Mujou: a worker found no update it could take")

    def take_for_host(self, now: float) -> Batch | None:
        """The update due earliest, if it is due at ``now`` and no thread has begun it, for the
        host's thread to run (its batch: ``batch[workers]``, holder HOST); None when there is
        none, or a job, a pause or the stop needs it first. ``host_done`` puts it back.

        NOTE [ the host lends its thread ]: a host that waits for a message (``run.wait_for``
        after a ``run.write``) waited for two hand-offs between threads, to a worker and back,
        each a wake-up of a sleeping thread: more than the update takes. So while the host
        waits under the real-time timer its thread runs the due updates itself, one at a
        time, taken as a worker takes them (earliest due first), between looks at what it
        waits for. The workers are woken as before, whoever runs the update: the host takes
        only what is due when it looks, and a worker woken for it finds it taken. Under the
        virtual timer the host's thread that moves the time runs each instant's worker
        updates (``take_instant_for_host``), and an instant wakes no lone worker meanwhile
        (``Policy.start_instant``). In bench's dispatch-virtual (100 empty nodes, one worker,
        ``run.sleep(0.01)``: 10 instants) that removes the two wake-ups of each sleep, the
        worker's at its first instant and the host's after its last (the instants between
        chain on the thread that ends one): measured per sleep (p10 over 3 s, load 5-7),
        1.24-1.29 ms before and after alike, so on this machine they cost little beside the
        1,000 updates; what a sleep costs is the updates' own Python (``_update``), and the
        put-back of the batch, which ``_put_back`` now does in runs of one due time
        (1.12-1.15 ms after that).
        """
        if self.virtual or not self.running or self.jobs or self.paused or self.stopping:
            return None
        if not self.shared:  # the common case, in short: the queue's earliest, or none
            queue = self.queue
            dues = queue.dues
            if not dues or dues[0] > now:
                return None
            due = dues[0]
            todo = queue.pop_all()
            index = todo.pop()
            if todo:  # the others stay due, in the queue
                todo.reverse()
                queue.push_all(due, todo)
            self.busy += 1
            self.holder[index] = HOST
            batch = self.batch[self.workers]
            batch.due, batch.todo, batch.handed = due, [index], 0
            return batch
        for _ in range(len(self.shared) + 1):
            due, other = self._earliest()
            if due > now:
                return None
            if other is None:
                todo = self.queue.pop_all()
                index = todo.pop()
                if todo:  # the others stay due, in the queue
                    todo.reverse()
                    self.queue.push_all(due, todo)
                self.busy += 1
            else:  # counted in busy already, as its batch's
                try:
                    index = other.todo.pop()
                except IndexError:  # its worker took the last one meanwhile
                    continue
                if other.todo:
                    self._wake_idle(other.due)  # for the rest, in case both hooks block
            self.holder[index] = HOST
            batch = self.batch[self.workers]
            batch.due, batch.todo, batch.handed = due, [index], 0
            return batch
        return None

    def claim(self, slot: Slot, now: float, holder: int) -> bool:
        """The short paths' one claim: ``slot`` (``Slot.one_input``, not dedicated) has a
        message on its input that its updates have not seen and ``arrive`` has not noted;
        when the node is free and not due, the timer runs and the run is not stopping, and
        the update that message makes due (``due_after``) is due at ``now`` with nothing due
        at or before it (``_first``: threads.earliest-due-first), the arrival is noted and
        ``holder`` holds the node for that update (counted in ``busy``); whether it did
        (False: nothing changed). The caller puts the node in the holder's batch.

        ``claim_for_host`` (the receiving host thread) and ``Policy.received_to_free`` (the
        worker that took a record) are this and a batch; ``Policy.sent_handed`` (a send on
        a worker) is this with the sender's worker as the holder, inlined there as it runs
        in every send (NOTE [ the send that hands off ] in ``_policy``).
        """
        index = slot.index
        if self.holder[index] != FREE or slot.due != math.inf or slot.stopped:
            return False
        if self.stopping or not self.running or self.virtual:
            return False
        # unseen_number, due_after and _first, inlined: each path of a message runs them.
        port = slot.trigger_inputs[0]
        source = port._source
        latest = (port if source is None else source)._latest
        seen = port._seen
        numbers = slot.arrival_numbers
        if latest is None or latest[4] == seen or numbers[0] > seen:
            return False
        last = slot.last  # an arrival before the last start counts as it
        due = (now if now > last else last) + slot.delay
        earliest = last + slot.min_interval
        if earliest > due:
            due = earliest
        if due > now:
            return False
        dues = self.queue.dues
        if (dues and dues[0] <= due) or (self.shared and self._earliest()[0] <= due):
            return False  # an update due first (threads.earliest-due-first)
        slot.arrival_times[0] = now  # arrive's note
        numbers[0] = latest[4]
        slot.due = due
        self.holder[index] = holder
        self.busy += 1
        return True

    def _first(self, due: float) -> bool:
        """Whether nothing queued or in a shared batch is due at or before ``due``: a node due
        then may run next without breaking earliest due first."""
        dues = self.queue.dues
        return not (dues and dues[0] <= due) and not (self.shared and self._earliest()[0] <= due)

    def claim_for_host(self, slot: Slot, now: float) -> Batch | None:
        """``_arrivals.arrive``, ``arrival``, ``take_for_host`` and ``wake_after_received`` in
        one, for a message from another host that the receiving thread made visible at ``now``
        on the input of ``slot`` (``Slot.one_input``): ``claim`` for the host's batch (holder
        HOST, as ``take_for_host`` gives it) when no job or pause needs the thread first;
        None otherwise, with nothing changed (the caller goes the general way).

        NOTE [ the receiver claims its update ]: the same decision as the general way's, whose
        queue push, queue search and wake checks only took back what was just decided: 60 of
        the 170 lines of Python from a message's arrival to its update's start, run cold on a
        thread that slept (``_engine._lend.Lender.received``). Every condition of theirs that
        could make the answer differ is here; what they then wake is nothing (nothing else due).
        """
        if self.jobs or self.paused or not slot.one_input or not self.claim(slot, now, HOST):
            return None
        batch = self.batch[self.workers]
        batch.due, batch.todo, batch.handed = slot.due, [slot.index], 0
        return batch

    def take_instant_for_host(self, now: float) -> Batch | None:
        """Virtual timer: the worker updates due at the instant ``now`` that no thread has begun,
        taken as a worker takes them (every one due, or one from a batch another worker
        shares), for the host's thread (``batch[workers]``, holder HOST); None when there is
        none, or a job, a pause or the stop needs it first. ``host_done`` puts it back.

        Under the virtual timer what an update sees depends on its instant alone, so the host
        running the instant instead of a worker changes no message and no state: it saves the
        wake-up of a worker and that of the host once the instant is done.
        """
        if not self.instant or not self.running or self.jobs or self.paused or self.stopping:
            return None
        batch = self.batch[self.workers]
        for _ in range(len(self.shared) + 1):
            due, other = self._earliest()
            if due > now:
                return None
            if other is None:
                batch.due = due
                batch.todo = todo = self.queue.pop_until(now)
                batch.mixed = todo[0] != todo[-1] and self.slots[todo[0]].due != due
                self.busy += len(todo)
            else:  # counted in busy already, as its batch's
                try:
                    index = other.todo.pop()
                except IndexError:  # its worker took the last one meanwhile
                    continue
                batch.due, batch.todo, batch.mixed = self.slots[index].due, [index], False
            batch.handed = 0
            for index in batch.todo:
                self.holder[index] = HOST
            self._share(batch)  # more workers: they may take from it (woken by the instant)
            return batch
        return None

    def take_alone(self, w: int, now: float) -> Batch | None:
        """Virtual timer, the instant at ``now`` begun, for the one thread that runs its worker
        updates (NOTE [ an instant run alone ] in ``_instants``): every worker node due by
        ``now``, held by that thread in batch ``w`` (a worker's, or the host's: ``w ==
        workers``, holder HOST), as ``take_instant_for_host`` takes them; the batch with
        nothing to do where none is due; None where the general way decides (a batch shared,
        a job, a pause, the stop, batch ``w`` not empty). ``done_alone`` puts it back."""
        batch = self.batch[w]
        if (
            self.shared
            or not self.instant
            or not self.running
            or self.jobs
            or self.paused
            or self.stopping
            or batch.todo
            or batch.ran
            or batch.held
        ):
            return None
        dues = self.queue.dues
        if not dues or dues[0] > now:
            return batch
        batch.due = due = dues[0]
        batch.todo = todo = self.queue.pop_until(now)
        batch.mixed = todo[0] != todo[-1] and self.slots[todo[0]].due != due
        batch.handed = 0
        holder = self.holder
        mark = HOST if w == self.workers else w + 1
        for index in todo:
            holder[index] = mark
        self.busy += len(todo)
        return batch

    def host_done(self) -> None:
        """The host's thread ran (or began) the update ``take_for_host`` gave it: it goes back,
        and a worker sleeping past the next due update wakes for it, besides one woken
        already: the host asks no more, as a worker that puts its batch back does."""
        if not self._back_one(self.workers):
            self._put_back(self.workers, self.batch[self.workers])
        elif self.busy == 0:
            self._quiet()
        if self.virtual:  # _wake_idle wakes none: the instants wake the workers
            return
        due = self._earliest()[0]
        if due < math.inf:
            self._wake_idle(due, exact=True, another=True)

    def wake_after_received(self, now: float, taken: bool) -> None:
        """After an arrival that woke no worker (``host_defers``), on a thread that then took
        the update due now for itself (``taken``) or took none: a worker wakes for an update
        due now besides it, and, where the thread took none, for the one due earliest."""
        due = self._earliest()[0]
        if due <= now or (not taken and due < math.inf):
            self._wake_idle(due, exact=True, another=True)

    def _idle(self, w: int, kind: int, wait: float, now: float = 0.0) -> tuple[int, Any]:
        """Worker ``w`` waits: PARK, or ``wait`` real seconds from timer time ``now``."""
        if kind == PARK:
            self.until[w] = math.inf
            return PARK, None
        self.until[w] = now + wait * self.scale
        return kind, wait

    def _wait_held(self, w: int, batch: Batch, now: float) -> tuple[int, Any]:
        """The answer for a worker holding ``batch``, not begun: run it once due, else wait."""
        due = batch.due
        if now >= due:
            batch.held = False
            if self._share(batch):
                self._wake_idle(due)  # the others saw none of it while it was held
            return RUN, batch
        timeout = (due - now) / self.scale
        if self.bursts and self._burst_at(due, len(batch.todo)):
            timeout -= self.lead
            if timeout <= 0.0 and self.spinner < 0:
                self.spinner = w
                return SPIN, due
        elif self.keeps:
            self.until[w] = due  # idle till then: a trigger may make other work due first
            return KEEP, timeout
        timeout = max(timeout, 0.0)
        self.until[w] = now + timeout * self.scale
        return SLEEP, timeout

    def run_kept(self, w: int, now: float) -> Batch | None:
        """After a KEEP's sleep that no notify ended: the kept batch to run at ``now``, or None
        (the sleep ended a little early: ask again)."""
        self.until[w] = _NOT_IDLE
        batch = self.batch[w]
        if now < batch.due:
            return None
        batch.held = False
        return batch

    def _worker_may_exit(self) -> bool:
        """Stopping: whether no worker node may still need a worker (a stop job, or a hook
        running elsewhere after which it gets one)."""
        if self.worker_stops or self.jobs:
            return False
        holder = self.holder
        return not any(holder[slot.index] != FREE for slot in self.slots if not slot.dedicated)

    def _earliest(self) -> tuple[float, Batch | None]:
        """The due time of the earliest update no worker has begun, and the shared batch it is
        in (None: the queue's). A shared batch's next update is the last of its ``todo``,
        due at the batch's due time, or later for a node handed off (Policy._hand_off)."""
        due = self.queue.next_due()
        found: Batch | None = None
        slots = self.slots
        for batch in self.shared:
            todo = batch.todo
            try:
                first = slots[todo[-1]].due
            except IndexError:  # run out (its worker pops without the lock)
                continue
            if first < due:
                due, found = first, batch
        return due, found

    def _take_queued(self, w: int, real: float, now: float = -math.inf) -> Batch:
        """Worker ``w`` takes every node due first in the queue, and those due by ``now``.

        NOTE [ taking what is due ]: nodes of different periods, or late ones (a skip puts a
        node on the first slot after its start), fall due at times of their own; taking only
        those of the first due time made a saturated worker go back to the policy, with a
        put-back and a take, after nearly every update. So a worker takes every node due by
        the time it takes them, and runs them in the order they are due: the order is the
        one they would have had taken one at a time (threads.earliest-due-first), and the
        bookkeeping is paid once per batch.
        """
        batch = self.batch[w]
        queue = self.queue
        batch.due = queue.dues[0]
        batch.todo = todo = queue.pop_until(now)
        batch.mixed = todo[0] != todo[-1] and self.slots[todo[0]].due != batch.due
        batch.handed = 0
        holder = self.holder
        mark = w + 1
        for index in todo:
            holder[index] = mark
        self.busy += len(todo)
        self._note_taken(w, real)
        return batch

    def _take_one(self, w: int, other: Batch, real: float) -> Batch | None:
        """Worker ``w`` takes one update from the rest of ``other``, or None when it ran out."""
        try:
            index = other.todo.pop()
        except IndexError:
            return None
        self.holder[index] = w + 1
        self._note_taken(w, real)
        if other.todo:
            self._wake_idle(other.due)  # for the rest, in case both hooks block
        batch = self.batch[w]
        batch.due, batch.todo, batch.handed, batch.mixed = self.slots[index].due, [index], 0, False
        return batch

    def _earliest_ran(
        self, w: int, due: float, other: Batch | None
    ) -> tuple[float, Batch | None, Slot | None]:
        """``due`` and ``other`` (``_earliest``'s), or, when it is due before them, the node
        another worker's shared batch already ran and still holds (NOTE [ a batch's nodes that
        ran ]), its batch and its slot."""
        found: Slot | None = None
        mine = self.batch[w]
        for batch in self.shared:
            if batch is mine:
                continue
            for slot in batch.ran:  # its worker appends without the lock: a copy is not needed
                if slot.due < due:
                    due, other, found = slot.due, batch, slot
        return due, other, found

    def _take_ran(self, w: int, other: Batch, slot: Slot, real: float) -> Batch | None:
        """Worker ``w`` takes ``slot``, which ``other``'s worker ran and still holds (NOTE [ a
        batch's nodes that ran ]); None when it is no longer there.

        NOTE [ a batch's nodes that ran ]: a worker puts the nodes of its batch back once the
        batch ends, so a node that ran early in a batch stays held while the worker runs the
        rest. Where a later hook of the batch blocks, that node fell due again and no worker
        could take it: it waited for the blocking hook (threads.blocking-holds-worker says its
        worker only; a stress loop of conformance's two-worker blocking test stalled once in
        20 to 60 runs on two busy cores). So a free worker with nothing due sleeps until such
        a node is due, and takes it then as it takes the rest of a batch: after the hold-back
        (``_gil``). Looked at only when nothing else is due, not on each look."""
        try:
            other.ran.remove(slot)
        except ValueError:
            return None
        index = slot.index
        self.holder[index] = w + 1
        if slot.arrived:  # an arrival while it ran, as _put_back does
            slot.arrived = False
            arrived = arrivals_due(slot)
            if arrived < slot.due:
                slot.due = arrived
        self._note_taken(w, real)
        batch = self.batch[w]
        batch.due, batch.todo, batch.handed, batch.mixed = slot.due, [index], 0, False
        return batch

    def _share(self, batch: Batch) -> bool:
        """Let the other workers take from ``batch``'s rest while it runs; whether it did."""
        if self.workers > 1 and len(batch.todo) > 1:
            batch.shared = True
            self.shared.append(batch)
            return True
        return False

    def _note_taken(self, w: int, real: float) -> None:
        if self.gil is not None:
            self.gil.taken(w, real)

    def update_failed(self, batch: Batch) -> None:
        """An update of ``batch`` failed and was reported: the batch's worker stops it early."""
        batch.failed = True

    def _back_one(self, w: int) -> bool:
        """``_put_back`` of batch ``w`` in short, where its one update ran and nothing else is
        in it (the common case of the host's batch, and of an instant run alone), but for its
        wake of the host once no update is held (``_quiet``), the caller's; whether it was that
        case (else nothing changed)."""
        batch = self.batch[w]
        ran = batch.ran
        if (
            len(ran) != 1
            or batch.todo
            or batch.shared
            or batch.held
            or batch.lodged
            or self.stopping
            or (self.gil is not None and w < self.workers)  # the hold-back's note: _put_back
        ):
            return False
        slot = ran[0]
        ran.clear()
        self.holder[slot.index] = FREE
        self.busy -= 1
        if slot.arrived:  # an arrival while it ran: _slot.come_back, inlined
            slot.arrived = False
            arrival = arrivals_due(slot)
            if arrival < slot.due:
                slot.due = arrival
        self.queue.push(slot.due, slot.index)
        if self.workers > 1 and self.queue.dues:
            self._wake_idle(self.queue.dues[0])
        batch.failed = False
        batch.handed = 0
        batch.mixed = False
        return True

    def _put_back(self, w: int, batch: Batch, *, quiet: bool = True) -> None:
        """The nodes of ``batch`` go back: those that ran, and those left; with ``quiet``, the
        host is woken if no update is held now (``_quiet``)."""
        if self.gil is not None and w < self.workers:  # the host's batch has no hold-back
            self.gil.in_hook[w] = 0.0
        if batch.shared:
            self.shared.remove(batch)
            batch.shared = False
        batch.held = False
        batch.failed = False
        ran, todo, holder = batch.ran, batch.todo, self.holder
        lodged = batch.lodged  # handed off without the lock: not counted in busy
        batch.lodged = 0
        self.busy -= len(ran) + len(todo) - lodged
        if self.stopping:
            slots = self.slots
            for slot in ran + [slots[index] for index in todo]:
                holder[slot.index] = FREE
                come_back(slot)  # no update starts, but the state tree shows its due time
                self._queue_stop(slot)
        else:
            push, slots = self.queue.push, self.slots
            # Back in runs of one due time, ascending (a batch's nodes due again together, as
            # most are): one push_all each instead of a push per node.
            run_due = math.nan
            run: list[int] = []
            for slot in ran:
                index = slot.index
                holder[index] = FREE
                if slot.arrived:  # an arrival while it ran: _slot.come_back, inlined
                    slot.arrived = False
                    due = arrivals_due(slot)
                    if due < slot.due:
                        slot.due = due
                if slot.due == run_due and index > run[-1]:
                    run.append(index)
                else:
                    self.queue.push_all(run_due, run)
                    run_due, run = slot.due, [index]
            self.queue.push_all(run_due, run)
            went_back = bool(ran or todo)
            if todo:  # not begun: still due at batch.due, the first in registration order last
                for index in todo:
                    holder[index] = FREE
                handed = min(batch.handed + lodged, len(todo))  # first in todo: the others pop from the end
                if handed:
                    for index in todo[:handed]:
                        come_back(slots[index])
                        push(slots[index].due, index)
                    del todo[:handed]
                if batch.mixed:  # each at its own due time (NOTE [ taking what is due ])
                    for index in todo:
                        come_back(slots[index])  # its update, still to come, reads what arrived
                        push(slots[index].due, index)
                else:
                    todo.reverse()
                    for index in [index for index in todo if slots[index].arrived]:
                        come_back(slots[index])  # its update, still to come, reads what arrived
                        if slots[index].due != batch.due:
                            todo.remove(index)
                            push(slots[index].due, index)
                    self.queue.push_all(batch.due, todo)
            if went_back and self.workers > 1 and self.queue.dues:  # none: all due never
                self._wake_idle(self.queue.dues[0])
        ran.clear()
        todo.clear()
        batch.handed = 0
        batch.mixed = False
        if quiet and self.busy == 0:
            self._quiet()

    def _keep(self, batch: Batch) -> bool:
        """After ``batch`` ran: keep its nodes, held, if they fall due again together before any
        other update.

        NOTE [ keeping a batch ]: a lone node, or nodes of one period, fall due again together
        before anything else, and putting them back into the queue only to take them out
        after the sleep was a third of the Python an idle wake-up ran, cold. So the only
        worker keeps them: they stay held while it sleeps, and a job, a pause or the stop
        makes it put them back. ``keeps`` is set for one worker under the real-time timer:
        with more, another worker may hold a node due then, and under the virtual timer the
        host moves the time from the queue. A node due only by a trigger is not kept: it
        never falls due by itself, and its next arrival would put it back first.
        """
        ran = batch.ran
        due = ran[0].due  # one worker: it ran at least the first
        dues = self.queue.dues
        if (
            due == math.inf  # due only by a trigger, whose arrival would put it back at once
            or (dues and dues[0] <= due)  # first, as it is what ends a saturated worker's batches
            or batch.failed
            or batch.todo
            or batch.lodged  # a node lodged without the lock goes back, as busy did not count it
            or not self.running
            or self.jobs  # a job, a pause or the stop needs the worker
            or self.paused
            or self.stopping
        ):
            return False
        todo = []
        for slot in reversed(ran):
            if slot.due != due:
                return False
            # An arrival while it ran that makes it due before the kept update: the queue
            # moves it. One due then or later stays marked: the kept update reads it, and it
            # is decided again when the node comes back (come_back).
            if slot.arrived and arrivals_due(slot) < due:
                return False
            todo.append(slot.index)
        batch.todo = todo
        batch.handed = 0
        batch.mixed = False
        ran.clear()
        batch.due = due
        batch.held = True
        return True

    def _burst_at(self, due: float, taken: int) -> bool:
        """Whether BURST or more worker updates are due within ``lead`` of ``due`` (the earliest),
        counting ``taken`` ones due then that are out of the queue.

        NOTE [ waking for a burst ]: a timed wait wakes late, by 0.05 to 0.5 ms depending on the
        machine, and every update of a burst due at once inherits that lateness. So when BURST
        or more worker updates are due together, one worker wakes ``lead`` early (the lateness
        of recent timed wake-ups, learnt by the engine: ``learn_lateness``), takes them and
        yields the CPU until they are due. Fewer updates sleep to their due time: a lone
        node's spin would cost more CPU than the lateness it saves.
        """
        last = due + self.lead * self.scale  # the lead is in real seconds
        return taken + self.queue.count_until(last, BURST) >= BURST

    def learn_lateness(self, late: float) -> None:
        """A timed wait for a due update woke ``late`` real seconds after its deadline."""
        # A moving average of the last few, doubled: most wake-ups come before the lead.
        self.lead = min(MAX_LEAD, 0.875 * self.lead + 0.125 * 2.0 * max(0.0, late))
