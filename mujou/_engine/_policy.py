"""The scheduling policy of a run: what each thread does next. Pure: no lock, no thread, no clock.

The engine's threads call it with the engine's lock held and act on what it answers outside
the lock; ``tests/test_policy.py`` calls it from one thread, with a fake clock, in every order
a random scheduler picks. Every call that needs the time takes it as an argument: ``now`` in
timer seconds, ``real`` from ``time.perf_counter`` (only for the GIL's hold-back).

Guarantees (checked by ``_invariant.check`` after every step of the randomized tests):
- Each node is in exactly one place (``holder``): free (in the due queue, waiting on its own
  thread for its due time, or out of the run), in a job queue (``QUEUED_JOB``), or held by one
  thread (a worker's batch, an update or a job on its own thread, the state thread's jobs). So
  its hooks never overlap, and the lock hand-off between two of its hooks makes each see what
  the previous one wrote (threads.hooks-exclusive).
- A free worker takes a queued job first, else the update due earliest, equal due times in
  registration order (threads.earliest-due-first): the worker nodes due at one time, as one
  ``Batch``. Under the GIL it may leave due updates to a worker about to be free (NOTE
  [ workers under the GIL ]).
- From every state some thread can act: no call loops without progress, and every change
  that gives a parked thread something to do asks for its wake-up (``wake_*``).
- Under the virtual timer, what runs at an instant is decided by the instant alone: a failure
  stops the run once every update due then has run (sched.virtual-failure).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

from ._arrivals import arrivals_due, come_back, due_after, unseen_number
from ._batches import EXIT, FREE, JOB, PARK, QUEUED_JOB, RUN, SLEEP, Batch
from ._ending import Ending
from ._slot import RESTORE, START, STATE, STOP, Job, Slot


class Policy(Ending):
    """The state machine of a run's schedule: queues, batches, jobs, pauses and the stop."""

    __slots__ = (
        "alive",
        "batch",
        "bursts",
        "busy",
        "dedicated",
        "deferred",
        "error",
        "gil",
        "holder",
        "host_defers",
        "host_lends",
        "host_pause",
        "instant",
        "jobs",
        "keeps",
        "lead",
        "lodges",
        "lodging",
        "paused",
        "pending",
        "queue",
        "running",
        "running_job",
        "scale",
        "shared",
        "slots",
        "spinner",
        "state_holder",
        "state_jobs",
        "stopping",
        "until",
        "virtual",
        "wake",
        "wake_host",
        "wake_nodes",
        "wake_worker",
        "wake_workers",
        "waker",
        "waker_due",
        "worker_stops",
        "workers",
        "workers_alive",
    )

    def __init__(
        self, slots: Sequence[Slot], workers: int, *, virtual: bool, scale: float, gil: bool
    ) -> None:
        self.slots = list(slots)
        self.dedicated = [slot for slot in self.slots if slot.dedicated]
        super().__init__(workers, len(self.slots) - len(self.dedicated), virtual=virtual, gil=gil)
        self.workers = workers
        self.virtual = virtual
        self.scale = scale
        self.jobs: deque[tuple[Slot, Job]] = deque()  # one-off jobs of worker nodes
        self.holder = [FREE] * len(self.slots)
        self.running_job: dict[int, tuple[Slot, Job]] = {}  # holder -> the job it runs
        self.state_holder = workers + len(self.slots) + 1
        self.running = False  # the timer started: updates may start
        self.host_pause = False  # the host takes the state
        self.state_jobs = 0  # state_dict jobs not done; updates wait for them too
        self.paused = False  # host_pause or state_jobs
        self.stopping = False
        self.busy = 0  # nodes held for updates: in a batch, or in a dedicated update
        self.pending = 0  # jobs the host waits for (start, restore, state)
        self.worker_stops = 0  # stop jobs of worker nodes not done yet
        self.alive = workers + len(self.dedicated)  # threads that have not exited
        self.workers_alive = workers
        self.error: BaseException | None = None  # the run's error, the first one
        self.deferred: tuple[int, BaseException] | None = None  # virtual: stops at the instant's end
        # Wake-ups the engine delivers after the call: ``wake`` says whether there is any.
        self.wake = False
        self.wake_workers = 0  # 0 none, 1 one (the last parked), 2 every worker
        self.wake_nodes: list[Slot] = []  # dedicated nodes whose thread has something to do
        self.wake_worker = -1  # a parked worker to wake (one that has no timeout)
        self.wake_host = False
        # Set by the engine during a host write's arrivals only: they wake no worker, as idle
        # workers look often meanwhile (NOTE [ the host lends its thread ] in _batches).
        self.host_defers = False
        # Virtual timer: a host thread runs the instants' worker updates while it advances
        # the time (``_lend.Lender.lend_instants``): an instant wakes no worker when one would
        # be all (NOTE [ the host lends its thread ] in _batches).
        self.host_lends = False
        # One worker under the real-time timer, with the GIL: a send may lodge the node it
        # wakes in the worker's batch without the lock while ``lodging`` (the timer runs, not
        # stopping; NOTE [ the send that lodges ] in _lodge).
        self.lodges = workers == 1 and not virtual and gil
        self.lodging = False

    # -- holders ---------------------------------------------------------------------------

    def dedicated_holder(self, slot: Slot) -> int:
        """The holder number of the thread of dedicated node ``slot``."""
        return self.workers + 1 + slot.index

    def may_start_updates(self) -> bool:
        return self.running and not self.paused and not self.stopping

    # -- the host's side -------------------------------------------------------------------

    def queue_jobs(self, jobs: Iterable[tuple[Slot, Job]]) -> None:
        """Queue start or restore jobs, which the host waits for (``pending``).

        Once the run is stopping they are dropped, as ``begin_stop`` drops those not begun:
        those nodes never start, and the workers may have exited already.
        """
        if self.stopping:
            return
        for slot, job in jobs:
            self.pending += 1
            self._queue(slot, job)

    def start_timer(self) -> None:
        """The timer starts: each node is due at its slot (the origin's, or restored)."""
        self.running = True
        self.lodging = self.lodges
        for slot in self.slots:
            slot.due = slot.slot * slot.period
            come_back(slot)
            if not slot.dedicated and self.holder[slot.index] == FREE:
                self.queue.push(slot.due, slot.index)
        self._wake_everyone()

    def start_instant(self, *, alone: bool = False) -> None:
        """Virtual timer: the time moved to the next instant; its nodes are due. While a host
        thread lends itself (``host_lends``) it is woken instead of a lone worker. ``alone``:
        the thread that starts it runs its worker updates alone and no node is dedicated
        (``_instants``' NOTE [ an instant run alone ]): nobody to wake."""
        self.instant = True
        if alone:
            return
        self.wake = True
        if self.host_lends:
            self.wake_host = True
            self.wake_workers = 2 if self.workers > 1 else 0
        else:
            self.wake_workers = 2
        self.wake_nodes = list(self.dedicated)

    def pause(self) -> None:
        """No update starts until ``release_pause``: the host is about to take the state."""
        self.host_pause = True
        self.paused = True
        self._wake_everyone()  # a worker holding a batch puts it back

    def take_states(self) -> list[tuple[Slot, Job]]:
        """With updates paused and none running, queue a state job for every node.

        Returns the worker nodes' jobs, which the state thread runs (``state_holder``);
        dedicated nodes' run on their own threads. The host waits for ``pending``.
        """
        assert self.paused and self.busy == 0 and not self.stopping
        while self.queue.dues:  # out of the queue while the state thread holds them
            self.queue.pop_all()
        on_state_thread: list[tuple[Slot, Job]] = []
        for slot in self.slots:
            job = Job(STATE)
            self.pending += 1
            self.state_jobs += 1
            if slot.dedicated:
                self._queue(slot, job)
            else:
                self.holder[slot.index] = self.state_holder
                on_state_thread.append((slot, job))
        if on_state_thread:
            self.alive += 1  # the state thread
        return on_state_thread

    def release_pause(self) -> None:
        """The host is done with the state; updates resume once every state job is done."""
        self.host_pause = False
        self._update_paused()

    def _update_paused(self) -> None:
        paused = self.host_pause or self.state_jobs > 0
        if self.paused and not paused:
            self.paused = False
            self._wake_everyone()
        self.paused = paused

    def next_due(self) -> float:
        """The earliest due time of an update not begun (infinity for none)."""
        due = self._earliest()[0]
        for slot in self.dedicated:
            if self.holder[slot.index] == FREE and slot.started and not slot.stopped and slot.due < due:
                due = slot.due
        return due

    def quiescent(self, now: float) -> bool:
        """Virtual timer: every update due at ``now`` has run, and no job is on the way.

        Between instants (before the first, and after ``end_instant``) an update due at
        ``now`` (a trigger's, trigger.tags) waits for the next instant at that time.
        """
        return self.busy == 0 and not self.pending and (not self.instant or self.next_due() > now)

    def done_alone(self, w: int, now: float) -> bool:
        """Batch ``w`` from ``take_alone`` goes back (``_put_back``, in short where one update
        ran, the host woken only for a pause: the caller is the thread that waits for the
        instant's end); whether the instant at ``now`` has no worker update left: none held,
        none shared, none due by ``now``, no job on the way: ``quiescent`` where no node is
        dedicated, which the caller checks."""
        batch = self.batch[w]
        if (batch.ran or batch.todo) and not self._back_one(w):
            self._put_back(w, batch, quiet=False)
        if self.paused and not self.busy:  # _quiet's wake for a pause: the caller waits for
            self._wake_host()  # the instant's end itself (NOTE [ an instant run alone ])
        dues = self.queue.dues
        return not (self.busy or self.pending or self.shared or (dues and dues[0] <= now))

    def fail(self, slot: Slot, error: BaseException) -> None:
        """``slot``'s hook failed with ``error`` (a HookError): the run stops.

        Under the virtual timer an update's failure stops the run once the instant's updates
        have run, and of the failures of one instant the earliest registered node's is the
        run's error: both then depend on the instant alone (sched.virtual-failure).
        """
        if self.virtual and self.running and not self.stopping and slot.hook == "on_update":
            if self.deferred is None or slot.index < self.deferred[0]:
                self.deferred = (slot.index, error)
            return
        if self.error is None:
            self.error = error
        self.begin_stop()

    def end_instant(self) -> bool:
        """Virtual timer, at the end of an instant: stop for a failure of it; whether it did."""
        self.instant = False
        if self.deferred is None:
            return False
        _, error = self.deferred
        self.deferred = None
        if self.error is None:
            self.error = error
        self.begin_stop()
        return True

    def abort(self, error: BaseException) -> None:
        """Stop the run with ``error`` (the engine's, not a hook's: trigger.microstep-cap)."""
        if self.error is None:
            self.error = error
        self.begin_stop()

    def begin_stop(self) -> None:
        """No update starts from now; every started node gets its stop job after its hook."""
        if self.stopping:
            return
        self.stopping = True
        self.lodging = False
        while self.queue.dues:  # a worker node goes back to the queue only while not stopping
            self.queue.pop_all()
        # Start and restore jobs not begun are dropped: those nodes never started.
        kept: deque[tuple[Slot, Job]] = deque()
        for slot, job in self.jobs:
            if job.kind in (START, RESTORE):
                self._drop(slot)
            else:
                kept.append((slot, job))
        self.jobs = kept
        for slot in self.dedicated:
            for job in slot.jobs:
                if job.kind in (START, RESTORE):
                    self._drop(slot)
            slot.jobs = deque(job for job in slot.jobs if job.kind not in (START, RESTORE))
        for slot in self.slots:
            self._queue_stop(slot)
        self._wake_everyone()

    def _drop(self, slot: Slot) -> None:
        self.holder[slot.index] = FREE
        self.pending -= 1
        if self.pending == 0:
            self._wake_host()

    def _queue_stop(self, slot: Slot) -> None:
        """Queue ``slot``'s stop job if it needs one, and those of the nodes whose stop
        waited for its release (``Slot.lodges``): a node a send may lodge without the lock
        gets its stop job only once no worker holds its sender, which lodges it only in the
        update it runs (NOTE [ the send that lodges ] in _lodge)."""
        self._queue_own_stop(slot)
        for index in slot.lodges:
            self._queue_own_stop(self.slots[index])

    def _queue_own_stop(self, slot: Slot) -> None:
        if self.holder[slot.index] != FREE or not slot.started or slot.stop_queued or slot.stopped:
            return
        lodger = slot.lodger
        if lodger >= 0 and 0 < self.holder[lodger] <= self.workers:
            return  # its sender's worker may lodge it meanwhile: the sender's release queues it
        slot.stop_queued = True
        if not slot.dedicated:
            if self.workers_alive == 0:  # nobody left to run it (an internal error)
                slot.stopped = True
                return
            self.worker_stops += 1
        self._queue(slot, Job(STOP))

    def _queue(self, slot: Slot, job: Job) -> None:
        self.holder[slot.index] = QUEUED_JOB
        self.wake = True
        if slot.dedicated:
            slot.jobs.append(job)
            self.wake_nodes.append(slot)
        else:
            self.jobs.append((slot, job))
            if self.wake_workers == 0:
                self.wake_workers = 1

    def _wake_everyone(self) -> None:
        self.wake = True
        self.wake_workers = 2
        self.wake_nodes = list(self.dedicated)
        self.wake_host = True

    def delivered(self) -> None:
        """The engine delivered the wake-ups asked for."""
        self.wake = False
        self.wake_workers = 0
        self.wake_nodes = []
        self.wake_worker = -1
        self.wake_host = False

    # -- jobs ------------------------------------------------------------------------------

    def job_done(self, slot: Slot, job: Job, holder: int) -> None:
        """The thread ``holder`` ran ``job`` on ``slot`` (its error, if any, is reported apart)."""
        self.running_job.pop(holder, None)
        self.holder[slot.index] = FREE
        kind = job.kind
        if kind == START:
            slot.started = job.error is None
        elif kind == STOP:
            slot.stopped = True
            if not slot.dedicated:
                self.worker_stops -= 1
                if self.worker_stops == 0:  # the workers may exit now
                    self.wake = True
                    self.wake_workers = 2
        elif kind == STATE:
            self.state_jobs -= 1
            come_back(slot)
            if not slot.dedicated and not self.stopping and self.running:
                self.queue.push(slot.due, slot.index)
            self._update_paused()
        if self.stopping:
            self._queue_stop(slot)
            if not slot.dedicated and self._worker_may_exit():
                self._wake_everyone()  # the parked workers were waiting for this node
        if kind != STOP:
            self.pending -= 1
            if self.pending == 0:
                self._wake_host()

    def begin_state_job(self, slot: Slot, job: Job) -> None:
        """The state thread begins ``job`` of ``slot``, which it holds."""
        self.running_job[self.state_holder] = (slot, job)

    # -- dedicated threads -----------------------------------------------------------------

    def next_for_dedicated(self, slot: Slot, now: float) -> tuple[int, float | Job | None]:
        """What the thread of dedicated ``slot`` does next: (JOB, job), (RUN, start time),
        (SLEEP, real seconds), (PARK, None) or (EXIT, None)."""
        if slot.jobs:
            holder = self.dedicated_holder(slot)
            self.holder[slot.index] = holder
            job = slot.jobs.popleft()
            self.running_job[holder] = (slot, job)
            return JOB, job
        if self.stopping:
            if slot.stopped or not slot.started:
                return EXIT, None
            return PARK, None
        if self.running and not self.paused and slot.started:
            due = slot.due
            if due <= now and self.instant:
                self.holder[slot.index] = self.dedicated_holder(slot)
                self.busy += 1
                return RUN, now
            if not self.virtual:
                return SLEEP, (due - now) / self.scale
        return PARK, None

    def update_done(self, slot: Slot) -> None:
        """The update of dedicated ``slot`` is done."""
        self.holder[slot.index] = FREE
        self.busy -= 1
        come_back(slot)
        if self.stopping:
            self._queue_stop(slot)
        if self.busy == 0:
            self._quiet()

    def arrival(self, slot: Slot, now: float, by: Slot | None = None) -> None:
        """An arrival at ``now`` on an input ``slot``'s trigger names (noted on the slot by
        ``_arrivals.arrive``), sent by node ``by``'s update (None: the host, or a commit).

        A node nobody holds becomes due as the arrivals say (``arrivals_due``), an earlier
        due time standing: in the queue it moves there, and a worker that would sleep past it
        wakes (under the real-time timer; under the virtual timer the engine calls this
        between two instants, which ``next_due`` then sees). A held node (updating, in a
        batch, in a job) or one before the timer starts is only marked (``Slot.arrived``):
        it is decided when the node comes back (``come_back``), against what its update read
        meanwhile, so the arrivals before an update starts make that one update
        (trigger.coalesce). A batch taken early and not begun (kept, or for a burst) goes back
        first, so the node is free. A dedicated node's thread wakes. The worker whose update
        sent runs the node next without asking again, when nothing is due before it (NOTE
        [ handing off ]).
        """
        if slot.stopped or self.stopping:
            return
        holders = self.holder
        holder = holders[slot.index]
        if holder != FREE:
            if 0 < holder <= self.workers and self.batch[holder - 1].held:
                # Taken early (kept, or for a burst), not begun: back to the queue, to move;
                # its worker waits for the batch's due time without being idle, so it is told.
                self._put_back(holder - 1, self.batch[holder - 1])
                if self.wake_worker < 0:
                    self.wake = True
                    self.wake_worker = holder - 1
            if holders[slot.index] != FREE:
                slot.arrived = True
                return
        if not self.running:
            slot.arrived = True
            return
        due = arrivals_due(slot)
        was = slot.due
        if due >= was:
            return
        if slot.dedicated:
            slot.due = due
            if not self.virtual:
                self.wake = True
                self.wake_nodes.append(slot)
            return
        if was != math.inf:  # a triggered-only node with none pending is not in the queue
            self.queue.remove(was, slot.index)
        slot.due = due
        if by is not None and due <= now and self._hand_off(slot, by):
            return
        self.queue.push(due, slot.index)
        if not self.virtual and not (by is None and self.host_defers):
            self._wake_idle(due, exact=True, another=True)

    def sent_to_free(self, slot: Slot, now: float, by: Slot | None) -> bool:
        """``arrive`` and ``arrival`` in one, for the common send to a triggered node: ``slot``
        (``Slot.one_input``: one trigger input, ``on``, not dedicated), free and not due, just
        got a message its updates have not seen, sent by ``by``'s update at ``now`` (None: it
        came from another process, ``_processes._inbox``, or the host wrote it, and then it
        wakes no worker while ``host_defers``, as ``arrival``); whether it took it (False:
        nothing decided, the caller calls ``arrive``).

        The same decision as theirs, without their loops over the trigger inputs and their
        checks of a held or queued node: a third of ``Engine.sent``'s time (NOTE [ the cost
        of an update ] in ``_update``).
        """
        if by is not None:  # the sender's worker claims it when due now and first (NOTE [ handing off ])
            w = self.holder[by.index] - 1
            if 0 <= w < self.workers and self.claim(slot, now, w + 1):
                self._join(w, slot)
                return True
        index = slot.index
        if self.holder[index] != FREE or slot.due != math.inf or slot.stopped:
            return False
        if self.stopping or not self.running:
            return False
        number = unseen_number(slot)
        if number is None:
            return False
        slot.arrival_times[0] = now  # arrive's note
        slot.arrival_numbers[0] = number
        due = due_after(slot, now)
        slot.due = due
        self.queue.push(due, index)
        if not self.virtual and not (by is None and self.host_defers):
            self._wake_idle(due, exact=True, another=True)
        return True

    def host_wrote(self, index: int, now: float, defers: bool) -> bool:
        """``sent_to_free`` of a host write at ``now`` on an input that wakes one node,
        ``index`` (``Lender.write_arrived``), in one call: when that node is
        ``Slot.one_input``, free and not due, and the latest message on its input is one its
        updates have not seen and no arrival noted, the arrival is noted, the node queued at
        its due time and, unless the host's writes wake no worker (``defers``), a worker
        woken for it; whether it did (False: nothing changed, the caller calls
        ``_arrivals.sent_arrived``).

        The same decision as ``sent_arrived`` then ``sent_to_free`` with no sender (each
        condition of theirs is here), without their loop, calls and the sender's case: the
        host's round trip runs it once per write (NOTE [ the host's round trip ] in ``_run``).
        """
        slot = self.slots[index]
        if (
            not slot.one_input
            or self.holder[index] != FREE
            or slot.due != math.inf
            or slot.stopped
            or self.stopping
            or not self.running
            or self.virtual
        ):
            return False
        port = slot.trigger_inputs[0]
        source = port._source
        latest = (port if source is None else source)._latest
        seen = port._seen
        numbers = slot.arrival_numbers
        if latest is None or latest[4] == seen or numbers[0] > seen:  # unseen_number, inlined
            return False
        slot.arrival_times[0] = now  # arrive's note
        numbers[0] = latest[4]
        last = slot.last  # due_after, inlined: an arrival before the last start counts as it
        due = (now if now > last else last) + slot.delay
        earliest = last + slot.min_interval
        if earliest > due:
            due = earliest
        slot.due = due
        self.queue.push(due, index)
        if not defers:
            self._wake_idle(due, exact=True, another=True)
        return True

    def sent_handed(self, index: int, number: int, now: float, by: Slot) -> bool:
        """``sent_to_free`` and ``_hand_off`` in one, for a send under the real-time timer by
        ``by``'s update on a worker, of the message ``number``, on an output whose ``_hand``
        is ``index`` (the one node it wakes, ``Slot.one_input`` with no delay and no
        min_interval: ``_arrivals.wire``): when that node is free, not due, and due now by
        this arrival, and nothing is due before it, it goes last in the sender's batch, the
        arrival noted; whether it did (False: nothing changed, the caller calls
        ``_arrivals.sent_arrived``).

        NOTE [ the send that hands off ]: the same decision as ``sent_to_free`` then
        ``_hand_off`` (each condition of theirs is here), in one call that reads each field
        once and writes only once it holds: ``Engine.sent`` went through ``sent_arrived``,
        ``sent_to_free`` and ``_hand_off``, three calls and the checks of a case this one is
        not. Measured (2-core AMD EPYC, CPython 3.11, torch 2.13, the other helpers' work
        running, load 4.6-6.5) with bench's trigger-latency net in a script, base (0257045)
        and this alternated: with ``perf_counter_ns`` stamps at each step, from the lock taken
        to the decision 3.3-3.6 us before, 2.6-3.1 us after (3.9-4.6 against 3.6-3.9 at load
        1.4-2.5); without stamps, send to start p50 15.7, 19.3, 17.8 and 16.1 us before
        against 14.6, 17.3, 17.5 and 15.6 after at load 4.6-6, but 14.7, 15.6, 11.7 and 15.1
        before against 14.7, 15.7, 16.9 and 15.6 after at load 1.4-2.5: about 0.5 us, below
        what the bench can tell on this machine. The
        rest of the path (stamped, 16 us in all): the send before ``Engine.sent`` 2.4, the
        lock 0.8, leaving ``Engine.sent`` and the sender's hook 2.3, the runner between the
        two hooks 2.0, ``begin_update`` 1.6, the triggered hook's call 0.9 (each with a
        stamp's 0.3): the per-update path of ``_update`` and ``Output.send``, which NOTE
        [ the cost of an update ] in ``_update`` counts. Since then ``Workers.claim`` (the
        one claim step of the short paths) is inlined here with ``due_after`` and ``_first``,
        and ``Engine.sent`` reads the clock in place: with the runner's ``begin_update`` in
        place, send to start 107.3k instructions before, 103.0k after (callgrind; how, in
        that NOTE).

        Issue 24 (trigger to start <= 1.2x the plain pool's). No thread is woken between a
        send and the update it triggers: with one worker, the worker's voluntary context
        switches are one a send (its sleep until the sender is due, as the pool's worker),
        the host's 0.002 (``/proc/<pid>/task/*/status`` over 2 s of bench's trigger-latency
        net, on this 2-core machine and on the GPU machine's quiet 16 cores alike; the
        futex calls, counted with ``strace -f -c``, the pool's too). The quiet machine's
        worse ratio is the longer path run cold after the worker's 1 ms sleep: there, stamped
        in place, 3.1 us from the send to ``Engine.sent``, 4.4 us in it, 5.3 us from its
        return to the triggered hook (13 us against the pool's 5.6-6.8 us in those minutes).
        Counted with callgrind (instrumentation on just before ``Output.send``, off at the
        triggered hook's first line, each send dumped on its own, the median of 27-31; a
        200 ms sender, one worker; CPython 3.11, torch 2.13; each count holds about 2.3k of
        the two ctypes calls that switch callgrind): the plain pool 16.6k instructions,
        Mujou 25.7k at 942ff87, of which ``Engine.sent`` 9.1k (inclusive) and the sender's
        return to the triggered hook 11.4k. Now the run's wiring plans the hand-off
        (``_Port._hand``) and this call no longer checks what the plan fixed (one input, no
        delay nor min_interval, one node woken, the virtual timer, under which ``Engine.sent``
        never runs): 24.9k. On the quiet 16 cores (CPython 3.12, torch 2.11), ``python -m
        bench._one mujou trigger_latency '{"seconds": 2, "workers": 1}'``, 942ff87's engine
        and this one alternated with the plain pool, four rounds: p50 15.8, 16.3, 15.4 and
        13.2 us before, 12.0, 13.4, 10.7 and 14.2 us after, the pool 10.6, 8.0, 9.4 and 8.3
        us (medians 1.77x before, 1.44x after; the gain the count gives is 3 %, the rest is
        the rounds' spread). Two prototypes, measured the same way as the counts: this call's decision
        inlined into ``Engine.sent`` under the lock, 23.5k; the claim without the lock (the
        design NOTE [ the cost of an update ] names), 22.0k, 1.33x the pool's, so that the
        lock and the policy call are not what keeps the ratio above 1.2x (19.9k): the send's
        own 5k and the runner's rules between two hooks are. The claim without the lock is
        also not safe as the policy stands: ``busy`` is a read-modify-write that the host's
        ``take_for_host`` makes under the lock meanwhile, and ``begin_stop``, on any thread,
        queues the stop job of a node it sees free (``_queue_stop``), which a claim between
        its reads and its writes would hold as well. Since then, with one worker, the send
        lodges the node without the lock, safe by design: ``busy`` is not touched and the
        stop leaves such a node's stop job to its sender's release (NOTE [ the send that
        lodges ] in ``_lodge``); this call is the way when that claim does not hold.
        """
        slot = self.slots[index]
        holder = self.holder
        w = holder[by.index] - 1
        if (
            w < 0
            or w >= self.workers
            or holder[index] != FREE
            or slot.due != math.inf
            or slot.stopped
            or self.stopping
            or not self.running
        ):
            return False
        seen = slot.trigger_inputs[0]._seen
        numbers = slot.arrival_numbers
        # Workers.claim from here, inlined (with due_after and _first): it runs in every send.
        # No delay and no min_interval (``_hand``): due at ``now``, or at the last start if
        # that came later (an arrival before it counts as it), which is not due now.
        if number == seen or numbers[0] > seen or slot.last > now:
            return False
        dues = self.queue.dues
        if (dues and dues[0] <= now) or (self.shared and self._earliest()[0] <= now):
            return False  # an update due first (threads.earliest-due-first)
        slot.arrival_times[0] = now  # arrive's note
        numbers[0] = number
        slot.due = now
        holder[index] = w + 1
        self.busy += 1
        batch = self.batch[w]
        batch.todo.insert(0, index)
        batch.handed += 1
        if self.workers > 1:
            if not batch.shared:
                batch.shared = True
                self.shared.append(batch)
            self._wake_idle(now, exact=True)
        return True

    def _hand_off(self, slot: Slot, by: Slot) -> bool:
        """Put ``slot``, free, out of the queue and due now, last in the batch of the worker
        whose update ``by`` sent to it; whether it did.

        NOTE [ handing off ]: the update a send triggers is the sending worker's next one
        whenever nothing else is due before it: going back to the policy to take it from the
        queue was half of the Python from the send to its start. With more workers the batch
        is shared and an idle worker woken, as for a queued node: a hook that blocks after its
        send does not hold the node up, since another worker takes it from the batch
        (``_earliest`` sees a shared batch's next node at its own due time). A batch that
        ends first puts the node back at its own due time (``_put_back``).
        """
        # While the timer runs and the run is not stopping (trigger checked), a worker holds a
        # node only in the batch it runs, and no job is queued: jobs come before the timer
        # starts and in the stop. A pause makes the batch end before the node begins.
        if self.virtual:
            return False
        w = self.holder[by.index] - 1
        if not 0 <= w < self.workers or not self._first(slot.due):  # earliest due first
            return False
        self.holder[slot.index] = w + 1
        self.busy += 1
        self._join(w, slot)
        return True

    def _join(self, w: int, slot: Slot) -> None:
        """``slot``, held by worker ``w`` for its update due now, goes last in that worker's
        batch (NOTE [ handing off ]); with more workers the batch is shared."""
        batch = self.batch[w]
        batch.todo.insert(0, slot.index)
        batch.handed += 1
        if self.workers > 1:
            if not batch.shared:
                batch.shared = True
                self.shared.append(batch)
            self._wake_idle(slot.due, exact=True)

    def received_to_free(self, slot: Slot, now: float, w: int) -> Batch | None:
        """``sent_to_free`` for a message from another process that worker ``w``, waiting,
        took (``_processes._inbox``): when no job or pause needs the worker and its batch is
        empty, ``claim`` with ``w`` as the holder, its batch, which ``w`` runs at once, from
        ``now``, before it asks again (as a RUN answer's); None: nothing decided, the caller
        goes the general way.

        NOTE [ claiming a received update ]: the worker that read the record is the one the
        update should run on (no hand-off to another thread); pushing the node on the queue,
        the wake logic and ``next_for_worker``'s search of the queue only to take it back
        cost that worker about 10 µs of cold Python per message, and going back through its
        wait and its loop to the policy to run a batch held for it cost as much again. The
        claim decides under the lock what ``next_for_worker`` would (nothing due first, no
        job, pause or stop needs the worker, the node free), and the worker acts on it right
        after the lock, as on a RUN answer: the rules of a queued node hold. With the GIL's
        hold-back (several workers) the general way decides.
        """
        batch = self.batch[w] if 0 <= w < self.workers else None
        if batch is None or batch.held or batch.todo or batch.ran or batch.shared:
            return None
        if not slot.one_input or self.gil is not None or self.paused or self.jobs:
            return None
        if not self.claim(slot, now, w + 1):
            return None
        batch.due, batch.todo, batch.handed, batch.mixed = slot.due, [slot.index], 0, False
        self.until[w] = -math.inf  # not idle: no wake-up is aimed at it
        return batch
