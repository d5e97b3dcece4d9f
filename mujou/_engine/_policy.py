"""The scheduling policy of a run: what each thread does next. Pure: no lock, no thread, no clock.

The engine's threads call it with the engine's lock held and act on what it answers outside
the lock; ``tests/test_policy.py`` calls it from one thread, with a fake clock, in every order
a random scheduler picks. Every call that needs the time takes it as an argument: ``now`` in
timer seconds, ``real`` from ``time.perf_counter`` (only for the GIL's hold-back).

Guarantees (checked by ``check`` after every step of the randomized tests):
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

from .._errors import MujouInternalError
from .._schedule import DueQueue
from ._slot import RESTORE, START, STATE, STOP, Job, Slot

FREE = 0  # holder: in no thread's hands
QUEUED_JOB = -1  # holder: a job is queued for the node
# A thread's holder number is > 0: worker w is w + 1; then the dedicated threads, one per
# dedicated node (dedicated_holder); then the state thread (state_holder).

RUN, JOB, SLEEP, WATCH, SPIN, PARK, EXIT = range(7)  # what next_for_* answers

HOLD_BACK = 0.001  # seconds in a hook after which, under the GIL, another worker takes due work
WATCH_DOUBLINGS = 3  # a watching worker waits up to HOLD_BACK * 2**3 (NOTE [ workers under the GIL ])
BURST = 4  # worker updates due together that a worker wakes early for (NOTE [ waking for a burst ])
MAX_LEAD = 0.0005  # seconds: the most a worker wakes early for a burst
FIRST_LEAD = 0.0002  # seconds: the lead before any timed wake-up was measured


class Batch:
    """Worker updates taken together: worker nodes due at one time, run in registration order.

    ``todo`` holds node indices, the next last: the worker that took the batch pops from it
    without the lock, and while the batch is ``shared`` another worker may pop from it under
    the lock (a worker held up in a hook leaves the rest to the others); ``list.pop`` is atomic
    on every build, so each update runs once. ``ran`` holds the slots this worker ran. A
    ``held`` batch is taken but not started: kept, or taken early for a burst.
    """

    __slots__ = ("due", "failed", "held", "ran", "shared", "todo")

    def __init__(self) -> None:
        self.due = math.inf
        self.todo: list[int] = []
        self.ran: list[Slot] = []
        self.held = False
        self.shared = False
        self.failed = False  # an update in ran failed: the failure is reported already


class Policy:
    """The state machine of a run's schedule: queues, batches, jobs, pauses and the stop."""

    __slots__ = (
        "alive",
        "batch",
        "bursts",
        "busy",
        "dedicated",
        "deferred",
        "error",
        "holder",
        "host_pause",
        "in_hook",
        "jobs",
        "keeps",
        "lead",
        "patience",
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
        self.workers = workers
        self.virtual = virtual
        self.scale = scale
        self.dedicated = [slot for slot in self.slots if slot.dedicated]
        self.queue = DueQueue()  # worker nodes waiting for their next update
        self.jobs: deque[tuple[Slot, Job]] = deque()  # one-off jobs of worker nodes
        self.holder = [FREE] * len(self.slots)
        self.running_job: dict[int, tuple[Slot, Job]] = {}  # holder -> the job it runs
        self.batch = [Batch() for _ in range(workers)]  # each worker's
        self.shared: list[Batch] = []  # batches being run that other workers may take from
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
        # NOTE [ workers under the GIL ]: when each worker entered the update it runs
        # (perf_counter; 0.0 for none, or a hook that waits outside the GIL).
        self.in_hook = [0.0] * workers if workers > 1 and gil else None
        # The timer time each idle worker wakes at by itself (inf: parked; -inf: not idle).
        self.until = [-math.inf] * workers
        self.patience = [0] * workers  # times in a row each worker watched
        self.waker = -1  # the worker that wakes for the next due update, and when that is
        self.waker_due = math.inf
        self.lead = FIRST_LEAD  # real seconds a worker wakes early for a burst (learnt)
        self.spinner = -1  # the worker waiting for a burst without sleeping
        self.bursts = len(self.slots) - len(self.dedicated) >= BURST
        self.keeps = workers == 1 and not virtual  # NOTE [ keeping a batch ]

    # -- holders ---------------------------------------------------------------------------

    def dedicated_holder(self, slot: Slot) -> int:
        """The holder number of the thread of dedicated node ``slot``."""
        return self.workers + 1 + slot.index

    def may_start_updates(self) -> bool:
        return self.running and not self.paused and not self.stopping

    def _needed(self) -> bool:
        """Whether a worker is needed for something other than updates: a job, a pause, the stop."""
        return bool(self.jobs) or self.paused or self.stopping

    # -- the host's side -------------------------------------------------------------------

    def queue_jobs(self, jobs: Iterable[tuple[Slot, Job]]) -> None:
        """Queue start or restore jobs, which the host waits for (``pending``)."""
        for slot, job in jobs:
            self.pending += 1
            self._queue(slot, job)

    def start_timer(self) -> None:
        """The timer starts: each node is due at its slot (the origin's, or restored)."""
        self.running = True
        for slot in self.slots:
            slot.due = slot.slot * slot.period
            if not slot.dedicated and self.holder[slot.index] == FREE:
                self.queue.push(slot.due, slot.index)
        self._wake_everyone()

    def start_instant(self) -> None:
        """Virtual timer: the time moved to the next instant; its nodes are due."""
        self.wake = True
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
        due = self.queue.next_due()
        for batch in self.shared:
            if batch.todo and batch.due < due:
                due = batch.due
        for slot in self.dedicated:
            if self.holder[slot.index] == FREE and slot.started and not slot.stopped and slot.due < due:
                due = slot.due
        return due

    def quiescent(self, now: float) -> bool:
        """Virtual timer: every update due at ``now`` has run, and no job is on the way."""
        return self.busy == 0 and not self.pending and self.next_due() > now

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
        if self.deferred is None:
            return False
        _, error = self.deferred
        self.deferred = None
        if self.error is None:
            self.error = error
        self.begin_stop()
        return True

    def begin_stop(self) -> None:
        """No update starts from now; every started node gets its stop job after its hook."""
        if self.stopping:
            return
        self.stopping = True
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
        if self.holder[slot.index] != FREE or not slot.started or slot.stop_queued or slot.stopped:
            return
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

    def _wake_host(self) -> None:
        self.wake = True
        self.wake_host = True

    def delivered(self) -> None:
        """The engine delivered the wake-ups asked for."""
        self.wake = False
        self.wake_workers = 0
        self.wake_nodes = []
        self.wake_worker = -1
        self.wake_host = False

    def _wake_idle(self, due: float) -> None:
        """Wake a worker that sleeps past ``due`` (or parks): updates due then are queued or shared.

        So a hook that blocks never holds up an update another worker could run: the others
        were asleep until later work when these nodes came back or were shared (the watchers'
        longer waits, NOTE [ workers under the GIL ], count as on time).
        """
        if self.virtual or self.wake_worker >= 0:
            return
        late = due + HOLD_BACK * (1 << WATCH_DOUBLINGS) * self.scale
        until = self.until
        for w in range(self.workers):
            if until[w] > late:
                until[w] = -math.inf
                self.wake = True
                self.wake_worker = w
                return

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
            if not slot.dedicated and not self.stopping and self.running:
                self.queue.push(slot.due, slot.index)
            self._update_paused()
        if self.stopping:
            self._queue_stop(slot)
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
            if due <= now:
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
        if self.stopping:
            self._queue_stop(slot)
        if self.busy == 0:
            self._quiet()

    def _quiet(self) -> None:
        """No update is held: the host may be waiting for that (a pause, a virtual instant)."""
        if self.paused or self.virtual:
            self._wake_host()

    # -- workers ---------------------------------------------------------------------------

    def next_for_worker(
        self, w: int, now: float, real: float
    ) -> tuple[int, Batch | tuple[Slot, Job] | float | None]:
        """What worker ``w`` does next, at timer time ``now``: (RUN, batch), (JOB, (slot,
        job)), (SLEEP, real seconds: a timed wait for a due update), (WATCH, real seconds: a
        timed wait that learns nothing), (SPIN, due: yield the CPU until then, the batch
        held), (PARK, None) or (EXIT, None).

        The worker's batch from its last answer goes back first (or is kept, or stays held).
        """
        self.until[w] = -math.inf
        if self.waker == w:
            self.waker, self.waker_due = -1, math.inf
        if self.spinner == w:
            self.spinner = -1
        batch = self.batch[w]
        if batch.held:
            if not self._needed() and self.running and self.queue.next_due() > batch.due:
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
            if due == math.inf:
                return self._idle(w, PARK, math.inf)
            if due > now:
                if self.virtual:
                    return PARK, None
                timeout = (due - now) / self.scale
                if self.in_hook is not None and self.waker_due <= due:
                    # The waker takes it: this one watches (NOTE [ workers under the GIL ]).
                    return self._idle(w, WATCH, timeout + self._watch_delay(w), now)
                self.waker, self.waker_due = w, due
                if self.bursts and self.spinner < 0 and other is None and self._burst_at(due, 0):
                    if timeout - self.lead <= 0.0:  # NOTE [ waking for a burst ]
                        self.waker, self.waker_due = -1, math.inf
                        taken = self._take_queued(w, real)
                        taken.held = True
                        return self._wait_held(w, taken, now)
                    return self._idle(w, SLEEP, timeout - self.lead, now)
                return self._idle(w, SLEEP, timeout, now)
            if self.in_hook is not None:
                hold = self._hold_back(w, real)
                if hold > 0.0:
                    return self._idle(w, WATCH, hold, now)
            if other is None:
                taken = self._take_queued(w, real)
            else:
                found = self._take_one(w, other, real)
                if found is None:  # its worker took the last one meanwhile: other is empty now
                    continue
                taken = found
            if self._share(taken):
                self._wake_idle(taken.due)
            return RUN, taken
        raise MujouInternalError("internal error in Mujou: a worker found no update it could take")

    def _idle(self, w: int, kind: int, wait: float, now: float = 0.0) -> tuple[int, float | None]:
        """Worker ``w`` waits: PARK, or ``wait`` real seconds from timer time ``now``."""
        if kind == PARK:
            self.until[w] = math.inf
            return PARK, None
        self.until[w] = now + wait * self.scale
        return kind, wait

    def _wait_held(self, w: int, batch: Batch, now: float) -> tuple[int, Batch | float]:
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
        return SLEEP, max(timeout, 0.0)

    def _worker_may_exit(self) -> bool:
        """Stopping: whether no worker node may still need a worker (a stop job, or a hook
        running elsewhere after which it gets one)."""
        if self.worker_stops or self.jobs:
            return False
        holder = self.holder
        return not any(holder[slot.index] != FREE for slot in self.slots if not slot.dedicated)

    def _earliest(self) -> tuple[float, Batch | None]:
        """The due time of the earliest update no worker has begun, and the shared batch it is
        in (None: the queue's)."""
        due = self.queue.next_due()
        found: Batch | None = None
        for batch in self.shared:
            if batch.todo and batch.due < due:
                due, found = batch.due, batch
        return due, found

    def _take_queued(self, w: int, real: float) -> Batch:
        """Worker ``w`` takes every node due first in the queue."""
        batch = self.batch[w]
        batch.due = self.queue.dues[0]
        batch.todo = todo = self.queue.pop_all()
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
        batch.due, batch.todo = other.due, [index]
        return batch

    def _share(self, batch: Batch) -> bool:
        """Let the other workers take from ``batch``'s rest while it runs; whether it did."""
        if self.workers > 1 and len(batch.todo) > 1:
            batch.shared = True
            self.shared.append(batch)
            return True
        return False

    def _note_taken(self, w: int, real: float) -> None:
        if self.in_hook is not None:  # NOTE [ workers under the GIL ]
            self.in_hook[w] = real
            self.patience[w] = 0

    def update_failed(self, batch: Batch) -> None:
        """An update of ``batch`` failed and was reported: the batch's worker stops it early."""
        batch.failed = True

    def _put_back(self, w: int, batch: Batch) -> None:
        """The nodes of ``batch`` go back: those that ran, and those left."""
        if self.in_hook is not None:
            self.in_hook[w] = 0.0
        if batch.shared:
            self.shared.remove(batch)
            batch.shared = False
        batch.held = False
        batch.failed = False
        ran, todo, holder = batch.ran, batch.todo, self.holder
        slots = self.slots
        nodes = ran + [slots[index] for index in todo] if todo else ran
        self.busy -= len(nodes)
        if self.stopping:
            for slot in nodes:
                holder[slot.index] = FREE
                self._queue_stop(slot)
        else:
            push = self.queue.push
            for slot in nodes:
                holder[slot.index] = FREE
                push(slot.due, slot.index)
            if nodes and self.workers > 1:
                self._wake_idle(self.queue.dues[0])
        ran.clear()
        todo.clear()
        if self.busy == 0:
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
        host moves the time from the queue.
        """
        ran = batch.ran
        due = ran[0].due  # one worker: it ran at least the first
        if self.queue.next_due() <= due or batch.failed or batch.todo or not self.running or self._needed():
            return False
        for slot in ran:
            if slot.due != due:
                return False
        batch.todo = [slot.index for slot in reversed(ran)]
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

    def _hold_back(self, w: int, real: float) -> float:
        """How long worker ``w`` leaves due work to a worker in a short hook, or 0.0.

        NOTE [ workers under the GIL ]: while the GIL is enabled, one thread runs Python at a
        time, so short hooks run no faster on two workers than on one, and slower for the
        hand-offs. A free worker therefore takes due work at once when every other worker is
        free, or when one of them has been in its hook for HOLD_BACK seconds (blocked, or
        computing in torch outside the GIL: the worker that is about to be free is not the
        only one); otherwise it leaves the work to the worker about to be free. A CUDA node's
        hook waits for its stream outside the GIL: its worker counts as free.

        Finding that out costs a wake-up, which under the GIL slows the worker running hooks,
        so a worker that keeps finding the others in short hooks looks less often: HOLD_BACK
        later, then twice, four and eight times that. And when workers wait for the next due
        update, one of them (``waker``) wakes for it, the others that much later.
        """
        assert self.in_hook is not None
        hold = 0.0
        for other, began in enumerate(self.in_hook):
            if other != w and began:
                left = HOLD_BACK - (real - began)
                if left <= 0.0:
                    return 0.0
                if hold == 0.0 or left < hold:
                    hold = left
        if hold > 0.0:
            hold += self._watch_delay(w) - HOLD_BACK
        return hold

    def _watch_delay(self, w: int) -> float:
        """HOLD_BACK, doubled each time worker ``w`` watched in a row, up to 8 times."""
        patience = self.patience[w]
        self.patience[w] = min(patience + 1, WATCH_DOUBLINGS)
        return HOLD_BACK * (1 << patience)

    # -- threads ending --------------------------------------------------------------------

    def thread_exited(self) -> bool:
        """A thread exited; whether it was the last (the run has ended)."""
        self.alive -= 1
        return self.alive == 0

    def thread_crashed(self, holder: int, error: BaseException) -> bool:
        """Thread ``holder`` died of ``error`` (an internal error): forget what it held, stop.

        The nodes it held get no more hooks, on_stop included: their state is unknown.
        Returns whether it was the last thread.
        """
        if self.error is None:
            self.error = error
        running = self.running_job.pop(holder, None)
        if 0 < holder <= self.workers:
            batch = self.batch[holder - 1]
            if batch.shared:
                self.shared.remove(batch)
                batch.shared = False
            batch.todo, batch.ran, batch.held = [], [], False
            self.workers_alive -= 1
        for slot in self.slots:
            if self.holder[slot.index] != holder:
                continue
            self.holder[slot.index] = FREE
            slot.stopped = True
            if running is not None and slot is running[0]:
                self._forget_job(slot, running[1])
            elif holder == self.state_holder:  # a state job it had not begun
                self._forget_job(slot, Job(STATE))
            else:
                self.busy -= 1
        if self.workers_alive == 0:  # worker jobs would never run
            for slot, job in self.jobs:
                self.holder[slot.index] = FREE
                slot.stopped = True
                self._forget_job(slot, job)
            self.jobs.clear()
        self._update_paused()
        self.begin_stop()
        self._wake_everyone()
        return self.thread_exited()

    def _forget_job(self, slot: Slot, job: Job) -> None:
        """A job that will never run: nobody waits for it."""
        if job.kind == STOP:
            if not slot.dedicated:
                self.worker_stops -= 1
            return
        if job.kind == STATE:
            self.state_jobs -= 1
        self.pending -= 1

    # -- checking --------------------------------------------------------------------------

    def check(self, current: Iterable[tuple[int, int]] = ()) -> list[str]:
        """The broken invariants, for the tests: each node in exactly one place, the counts right.

        ``current`` lists (holder, index) for the updates threads have popped from a batch and
        are running (they are in neither ``todo`` nor ``ran`` meanwhile).
        """
        places: dict[int, list[str]] = {slot.index: [] for slot in self.slots}
        for bucket_due in list(self.queue.dues):
            for index in self.queue._buckets[bucket_due]:
                places[index].append("queue")
        for slot, _ in self.jobs:
            places[slot.index].append("job")
        for slot in self.dedicated:
            for _ in slot.jobs:
                places[slot.index].append("job")
        updates = 0
        for w, batch in enumerate(self.batch):
            for index in batch.todo:
                places[index].append(f"batch{w}")
            for slot in batch.ran:
                places[slot.index].append(f"ran{w}")
            updates += len(batch.todo) + len(batch.ran)
        for holder, index in current:
            places[index].append(f"running{holder}")
            updates += 1
        for holder, (slot, _) in self.running_job.items():
            places[slot.index].append(f"jobrunning{holder}")
        problems: list[str] = []
        for slot in self.slots:
            index, where, held = slot.index, places[slot.index], self.holder[slot.index]
            if slot.dedicated and held == self.dedicated_holder(slot) and not where:
                updates += 1  # in an update on its own thread
                continue
            if held == self.state_holder and not where:
                continue
            if len(where) > 1:
                problems.append(f"node {index} is in {where}")
            elif where == ["queue"] and held != FREE:
                problems.append(f"node {index} is queued but held by {held}")
            elif where == ["job"] and held != QUEUED_JOB:
                problems.append(f"node {index} has a queued job but holder {held}")
            elif where and where[0].startswith(("batch", "ran", "running", "jobrunning")):
                number = int(where[0].lstrip("abcdefghijklmnopqrstuvwxyz"))
                expected = number + 1 if where[0].startswith(("batch", "ran")) else number
                if held != expected:
                    problems.append(f"node {index} is in {where[0]} but held by {held}")
            elif not where and held != FREE:
                problems.append(f"node {index} is nowhere but held by {held}")
            if self.stopping and where == ["queue"]:
                problems.append(f"node {index} is queued while stopping")
        if updates != self.busy:
            problems.append(f"busy is {self.busy}, {updates} updates are held")
        if any(batch.held and batch.shared for batch in self.batch):
            problems.append("a held batch is shared")
        return problems
