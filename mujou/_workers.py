"""The engine of a run: the worker pool, the dedicated threads and the scheduler that feeds them.

One lock (``Engine._lock``) guards the schedule and every node's bookkeeping between hooks;
hooks run outside it.

Guarantees:
- A node is in exactly one place at a time: in the due queue, queued as a job, or taken by one
  thread, to run or running (``Engine._taken``). So its hooks never overlap, and the lock
  hand-off between two of its hooks makes each see what the previous one wrote
  (threads.hooks-exclusive).
- A free worker takes a queued job first (start, restore, state, stop), else the update due
  earliest, equal due times in registration order (threads.earliest-due-first). Under the
  GIL it may leave a due update to a worker about to be free (NOTE [ workers under the GIL ]).
- Worker nodes due at one time are taken together (``Batch``) and run in registration order;
  putting back one batch and taking the next is one lock acquisition, not one per update.
  A worker held up in a hook leaves the rest of its batch to the others. Idle workers park
  on a lock of their own (``Parking``) and a notify wakes one, the last to park.
- Under the real-time timer, a worker sleeps to the next due time, and wakes a little early
  and yields the CPU until then when a burst of updates falls due (NOTE [ waking for a burst ]).
- Under the virtual timer, time moves only within the host's ``advance``, and only when no
  hook is running and nothing is due: messages sent at time t are committed then, so updates
  due at t never see each other's messages (visibility.virtual). The host moves it, or, while
  the host sleeps to a set time, the thread that ends a batch does (``_next_batch``).
- Only the GIL-independent guarantees of ``threading`` are relied on, so the engine is the
  same on free-threaded builds; messages are published by replacing one reference.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import time
import warnings
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ._cpus import gil_enabled
from ._cuda import NodeStreams
from ._errors import GlobalRandomWarning, HookError, LeakedSettingWarning, MujouInternalError
from ._parking import Parking
from ._ports import Output
from ._routing import OutputSpec, plan_routes
from ._schedule import DueQueue, due_time, next_slot
from ._stats import LATENESS_WINDOW
from ._timer import Clock
from ._trace import TraceRecorder

if TYPE_CHECKING:
    from ._node import Node, NodeCore
    from ._ports import Input, _Port

START, RESTORE, STATE, STOP = "start", "restore", "state", "stop"
HOLD_BACK = 0.001  # seconds in a hook after which, under the GIL, another worker takes due work
BURST = 4  # worker updates due together that a worker wakes early for (NOTE [ waking for a burst ])
MAX_LEAD = 0.0005  # seconds: the most a worker wakes early for a burst
_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))  # releases the GIL
# Bound once: they run around every hook.
_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_initial_seed = torch.default_generator.initial_seed
# torch.autograd.profiler's own flag, set by any thread's profiler (the C++ check is per
# thread); .get() as it may not exist in every torch we support.
_profiler_flags = vars(torch.autograd.profiler)
_T = TypeVar("_T")
_HOOK_OF_JOB = {START: "on_start", RESTORE: "load_state_dict", STATE: "state_dict", STOP: "on_stop"}


class HookThread(threading.Thread):
    """A thread that runs hooks: a worker, a dedicated node thread or the state thread."""


def in_hook_thread() -> bool:
    """Whether the calling thread is one of Mujou's hook threads."""
    return isinstance(threading.current_thread(), HookThread)


class Job:
    """A one-off hook call on a node: start, restore, state or stop."""

    __slots__ = ("arg", "error", "kind", "result")

    def __init__(self, kind: str, arg: Any = None) -> None:
        self.kind = kind
        self.arg = arg
        self.result: Any = None
        self.error: BaseException | None = None


class Batch:
    """Worker updates taken together: worker nodes due at one time, run in registration order.

    ``todo`` holds node indices, the next last: the worker that took the batch pops from it
    without the lock, and under the lock another worker may pop from it too (the rest of a
    batch whose worker is held up in a hook: NOTE [ workers under the GIL ]); ``list.pop`` is
    atomic on every build, so each update runs once. ``ran`` holds the nodes this worker ran.
    Each worker has one Batch, which it fills again at each take.
    """

    __slots__ = ("due", "failed", "ran", "shared", "todo")

    def __init__(self) -> None:
        self.due = math.inf
        self.todo: list[int] = []
        self.ran: list[Slot] = []
        self.failed: BaseException | None = None  # how the last update in ran failed
        self.shared = False  # in Engine._batches, where other workers may take from it


class Slot:
    """One node's place in the run: its schedule, its flags and its statistics."""

    __slots__ = (
        "busy_seconds",
        "cond",
        "core",
        "dedicated",
        "dt_max",
        "dt_min",
        "dt_sum",
        "due",
        "hook",
        "index",
        "jobs",
        "last",
        "lateness",
        "lateness_max",
        "name",
        "node",
        "now",
        "period",
        "skipped",
        "slot",
        "started",
        "stop_queued",
        "stopped",
        "updates",
        "warned",
    )

    def __init__(self, node: Node, core: NodeCore, index: int, lock: threading.Lock) -> None:
        self.node = node
        self.core = core
        self.index = index
        self.name = node.name
        self.period = core.period
        self.dedicated = core.dedicated
        self.slot = 1  # the number of the next update; it is due at slot * period
        self.due = 0.0  # due_time(slot, period), set when the timer starts and at each update
        self.last = 0.0  # the start time of the previous update (or of the run)
        self.started = False
        self.stop_queued = False
        self.stopped = False
        self.jobs: deque[Job] = deque()  # dedicated nodes only; worker jobs share one queue
        self.cond = threading.Condition(lock) if self.dedicated else None
        self.updates = 0
        self.skipped = 0
        self.busy_seconds = 0.0
        self.dt_min = math.inf
        self.dt_max = 0.0
        self.dt_sum = 0.0
        self.lateness = array("d")  # the last LATENESS_WINDOW latenesses, a ring once full
        self.lateness_max = 0.0
        self.hook = ""  # the hook running now, while core.hook_thread is set
        self.now: tuple[float, float, float] | None = None  # the running update's t, dt, lateness
        self.warned: set[str] = set()


class Engine:
    """Runs the hooks of a net's nodes on workers and dedicated threads, on a clock."""

    __slots__ = (
        "_advance_until",
        "_alive",
        "_batch",
        "_batches",
        "_bursts",
        "_busy",
        "_dedicated",
        "_due",
        "_ended",
        "_host",
        "_in_hook",
        "_jobs",
        "_keeps",
        "_lead",
        "_lock",
        "_patience",
        "_paused",
        "_pending",
        "_running",
        "_seen_seed",
        "_spinning",
        "_staged",
        "_stopping",
        "_taken",
        "_threads",
        "_waker",
        "_waker_due",
        "_wakers",
        "_warnings",
        "_work",
        "_worker_stops",
        "clock",
        "end_real",
        "end_time",
        "error",
        "finishers",
        "real_start",
        "slots",
        "trace",
        "worker_busy",
        "workers",
    )

    def __init__(
        self, nodes: Sequence[Node], workers: int, clock: Clock, trace: TraceRecorder | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._work = Parking(self._lock, workers)  # idle workers wait here
        self._host = threading.Condition(self._lock)  # the host waits here
        self.clock = clock
        self.slots = [Slot(node, node._mujou, i, self._lock) for i, node in enumerate(nodes)]
        self._dedicated = [slot for slot in self.slots if slot.dedicated]
        self._due = DueQueue()  # worker nodes waiting for their next update
        self._batches: list[Batch] = []  # the batches being run that other workers may take from
        self._batch = [Batch() for _ in range(workers)]  # each worker's
        self._jobs: deque[tuple[Slot, Job]] = deque()  # one-off jobs of worker nodes
        self._running = False  # updates may start (after the start and the restore)
        self._paused = False  # the host is taking the state: no update may start
        self._stopping = False
        self._ended = False
        self._busy = 0  # updates running now, or taken in a batch
        # 1 for each node out of the queue: in a hook, or taken in a batch. A bytearray, not
        # a flag on the Slot: taking a batch then touches no node's memory.
        self._taken = bytearray(len(self.slots))
        self._pending = 0  # jobs the host waits for
        self._worker_stops = 0  # stop jobs of worker nodes not yet done
        # Virtual timer: sent, not yet visible; each with its version counter at the send.
        self._staged: list[tuple[_Port, torch.Tensor, int]] = []
        self._advance_until: float | None = None  # the host's sleep target, while it sleeps
        self._wakers: list[Callable[[], None]] = []  # called once when the run ends
        self.error: HookError | None = None
        self.end_time = 0.0
        self.end_real = 0.0
        self.trace = trace
        self.finishers: list[Callable[[], None]] = []  # run once the run has ended and stopped
        if trace is not None:
            self.finishers.append(trace.write)
        self.worker_busy = [0.0] * workers  # real seconds each worker spent in hooks
        # When each worker entered the update it runs (0.0: none), where workers hold back
        # under the GIL: see NOTE [ workers under the GIL ].
        self._in_hook = [0.0] * workers if workers > 1 and gil_enabled() else None
        self._patience = [0] * workers  # times in a row each worker watched: _watch_delay
        # Under the GIL, the worker that wakes for the next due update (-1: none) and when
        # that is due: NOTE [ workers under the GIL ].
        self._waker = -1
        self._waker_due = math.inf
        self.real_start = 0.0  # perf_counter() when the timer started, 0.0 before
        self._lead = 0.0002  # seconds a worker wakes early for a burst: NOTE [ waking for a burst ]
        self._spinning = False  # a worker is waiting for a burst without sleeping
        self._bursts = len(self.slots) - len(self._dedicated) >= BURST  # bursts are possible
        self._keeps = workers == 1 and not clock.virtual  # NOTE [ keeping a batch ]
        self._seen_seed = torch.initial_seed()
        self._warnings: list[tuple[type[Warning], str]] = []
        self.workers = workers
        self._threads: list[threading.Thread] = [
            HookThread(target=self._worker_main, args=(i,), name=f"mujou-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self._threads += [
            HookThread(
                target=self._dedicated_main,
                args=(slot,),
                name=f"mujou-node-{slot.name}",
                daemon=True,
            )
            for slot in self._dedicated
        ]
        self._alive = len(self._threads)

    # -- the host's side -------------------------------------------------------------------

    def start(self, restore: Sequence[Any] | None) -> list[tuple[Slot, BaseException]]:
        """Start the threads, run every on_start, then the restore; return the restore errors.

        Raises the HookError of a failed on_start after stopping the started nodes.
        """
        plan = plan_routes(
            {slot.name: slot.core.device for slot in self.slots},
            [
                OutputSpec(port.name, slot.name, tuple(reader.node.name for reader in port._readers))
                for slot in self.slots
                for port in slot.core.ports.values()
                if isinstance(port, Output)
            ],
        )
        for slot in self.slots:
            core = slot.core
            core.engine = self
            core.context = contextvars.Context()  # empty at the start of each run (threads.context)
            core.staged = self._staged if self.clock.virtual else None
            core.streams = (
                NodeStreams(core.device, plan, slot.name) if slot.name in plan.touches_cuda else None
            )
            for port in core.ports.values():
                if isinstance(port, Output):
                    port._route = plan.routes[port.name]
        for thread in self._threads:
            thread.start()
        self._run_jobs([(slot, Job(START)) for slot in self.slots])
        if self.error is not None:
            self.stop()
            raise self.error
        problems: list[tuple[Slot, BaseException]] = []
        if restore is not None:
            jobs = [(slot, Job(RESTORE, state)) for slot, state in zip(self.slots, restore, strict=True)]
            self._run_jobs(jobs)
            problems = [(slot, job.error) for slot, job in jobs if job.error is not None]
        return problems

    def go(self) -> None:
        """Start the timer: updates begin."""
        with self._lock:
            self.clock.start()
            self.real_start = time.perf_counter()
            for slot in self.slots:  # slot.slot and slot.last are the origin's, or restored
                slot.due = due_time(slot.slot, slot.period)
                if not slot.dedicated:
                    self._due.push(slot.due, slot.index)
            self._running = True
            self._wake_all()

    def _run_jobs(self, jobs: list[tuple[Slot, Job]]) -> None:
        with self._lock:
            for slot, job in jobs:
                self._pending += 1
                self._queue(slot, job)
            while self._pending:
                self._host.wait()

    def _queue(self, slot: Slot, job: Job) -> None:
        if slot.dedicated:
            assert slot.cond is not None
            slot.jobs.append(job)
            slot.cond.notify()
        else:
            self._jobs.append((slot, job))
            self._work.notify()

    def collect_states(self, build: Callable[[float, list[Any]], _T]) -> _T:
        """Take every node's state_dict between updates, and ``build`` the tree from them.

        While the run runs, updates pause, worker nodes' state_dict runs on a thread of its
        own and dedicated nodes' on theirs; once the run has ended, on the calling thread.
        ``build(time, states)`` runs before updates resume, so the copies it makes, the
        ports' messages and the schedules it reads are those of the same moment.
        See state.consistent-snapshot.
        """
        with self._lock:
            if self._stopping:
                while not self._ended:
                    self._host.wait()
            else:
                self._paused = True
                self._work.notify_all()  # a worker keeping a batch puts it back
                while self._busy:
                    self._host.wait()
            now = self.clock.now()
        if self._ended:
            states = []
            for slot in self.slots:
                result, exc = self._call(slot, "state_dict", slot.node.state_dict)
                if exc is not None:
                    raise HookError(slot.name, "state_dict", now, exc) from exc
                states.append(result)
            return build(now, states)
        try:
            jobs = [(slot, Job(STATE)) for slot in self.slots]
            worker_jobs = [(slot, job) for slot, job in jobs if not slot.dedicated]
            with self._lock:
                for slot, job in jobs:
                    self._pending += 1
                    if slot.dedicated:
                        self._queue(slot, job)
                    else:
                        self._taken[slot.index] = 1
            collector = HookThread(
                target=self._state_main, args=(worker_jobs,), name="mujou-state", daemon=True
            )
            collector.start()
            collector.join()
            with self._lock:
                while self._pending:
                    self._host.wait()
            self.raise_error()
            return build(now, [job.result for _, job in jobs])
        finally:
            with self._lock:
                self._paused = False
                self._wake_all()

    def _state_main(self, jobs: list[tuple[Slot, Job]]) -> None:
        for slot, job in jobs:
            self._run_job(slot, job)
            with self._lock:
                self._finish_job(slot, job)

    def stop(self) -> None:
        """Stop the run and wait until every started node's on_stop ran and threads ended."""
        with self._lock:
            self._begin_stop()
            while not self._ended:
                self._host.wait()
            finishers, self.finishers = self.finishers, []
        for thread in self._threads:
            thread.join()
        for finish in finishers:  # once, on the first stop() that returns
            finish()

    def raise_error(self) -> None:
        """Raise the run's HookError if a hook failed."""
        if self.error is not None:
            raise self.error

    def flush_warnings(self, stacklevel: int) -> None:
        """Issue the warnings hooks caused, on the calling (host) thread. See rules.warnings-on-host."""
        while self._warnings:
            category, message = self._warnings.pop(0)
            warnings.warn(message, category, stacklevel=stacklevel + 1)

    @property
    def ended(self) -> bool:
        return self._ended

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker`` when the run ends (at once if it has)."""
        with self._lock:
            if not self._ended:
                self._wakers.append(waker)
                return
        waker()

    def notify_host(self) -> None:
        """Wake the host's real-time waits (a message it waits for arrived)."""
        with self._lock:
            self._host.notify_all()

    def wait_real(self, until: float | None, done: Callable[[], bool]) -> bool:
        """Real-time timer: wait until ``done()``, the timer reaches ``until``, or the run ends.

        Returns whether ``done()`` became true.
        """
        with self._lock:
            while True:
                if done():
                    return True
                if self._ended or self.error is not None:
                    return False
                if until is None:
                    self._host.wait()
                    continue
                remaining = until - self.clock.now()
                if remaining <= 0:
                    return False
                self._host.wait(self.clock.real_seconds(remaining))

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Virtual timer: run every update due up to ``until`` (or forever), batch by batch.

        Stops early when ``done()`` is true after a batch. Returns whether it did. Without
        ``done``, the thread that ends a batch starts the next one up to ``until`` itself,
        so the host is not woken between batches.
        See the module docstring on visibility under the virtual timer.
        """
        with self._lock:
            self._advance_until = until if done is None else None
            try:
                return self._advance(until, (lambda: False) if done is None else done)
            finally:
                self._advance_until = None

    def _advance(self, until: float | None, done: Callable[[], bool]) -> bool:
        """The body of advance(), with the lock held."""
        clock = self.clock
        while True:
            while not (self._stopping or self._quiescent()):
                self._host.wait()
            if self._stopping:
                while not self._ended:
                    self._host.wait()
                return done()
            self._commit()
            if done():
                return True
            due = self._next_due()
            if until is not None and due > until:
                clock.virtual_now = max(clock.virtual_now, until)
                return False
            if due == math.inf:
                raise MujouInternalError("internal error in Mujou - no node is scheduled")
            clock.virtual_now = due
            self._wake_all()

    def _next_batch(self) -> bool:
        """Under the host's ``advance`` to a time, start the next batch from here if it is due.

        Called with the lock held by the thread that ended a batch: it does what the host
        would (commit, then move time to the next due update), without waking the host.
        """
        until = self._advance_until
        if until is None or self._stopping:
            return False
        due = self._next_due()
        if due > until:
            return False
        self._commit()
        self.clock.virtual_now = due
        self._wake_all()
        return True

    def _quiescent(self) -> bool:
        now = self.clock.virtual_now
        return self._busy == 0 and not self._pending and self._next_due() > now

    def _next_due(self) -> float:
        due = self._due.next_due()
        for slot in self._dedicated:
            if not self._taken[slot.index] and not slot.stopped:
                due = min(due, slot.due)
        return due

    def _commit(self) -> None:
        """Publish the messages the batch sent (virtual timer; no hook runs)."""
        staged = self._staged  # the nodes append to this list: keep it, empty
        for port, message, version in staged:
            port._publish(message, version)
        staged.clear()

    def host_write(self, port: Input, message: torch.Tensor) -> None:
        """The host's message: visible to the updates that start after this returns.

        No lock: publishing replaces one reference, and under the virtual timer the host
        writes only between batches, when no hook runs.
        """
        port._publish(message)

    def _wake_all(self) -> None:
        self._work.notify_all()
        for slot in self._dedicated:
            assert slot.cond is not None
            slot.cond.notify()

    # -- stopping --------------------------------------------------------------------------

    def _begin_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._due.clear()  # a worker node is put back only while the run is not stopping
        # Start and restore jobs not begun are dropped: those nodes never started.
        kept = [(slot, job) for slot, job in self._jobs if job.kind not in (START, RESTORE)]
        self._pending -= len(self._jobs) - len(kept)
        self._jobs = deque(kept)
        for slot in self._dedicated:
            kept_jobs = [job for job in slot.jobs if job.kind not in (START, RESTORE)]
            self._pending -= len(slot.jobs) - len(kept_jobs)
            slot.jobs = deque(kept_jobs)
        for slot in self.slots:
            self._queue_stop(slot)
        self._wake_all()
        self._host.notify_all()

    def _queue_stop(self, slot: Slot) -> None:
        if self._taken[slot.index] or not slot.started or slot.stop_queued:
            return
        slot.stop_queued = True
        if not slot.dedicated:
            self._worker_stops += 1
        self._queue(slot, Job(STOP))

    def _fail(self, slot: Slot, hook: str, at: float, exc: BaseException) -> None:
        if self.error is None:
            error = HookError(slot.name, hook, at, exc)
            error.__cause__ = exc
            self.error = error
        self._begin_stop()

    def _thread_exited(self) -> None:
        self._alive -= 1
        if self._alive == 0:
            self.end_time = self.clock.now()
            self.end_real = time.perf_counter()
            self._ended = True
            for slot in self.slots:
                slot.core.engine = None
            self._host.notify_all()
            wakers, self._wakers = self._wakers, []
            for waker in wakers:
                waker()

    # -- the threads' side -----------------------------------------------------------------

    def _worker_main(self, number: int) -> None:
        lock, clock, dues, busy = self._lock, self.clock, self._due.dues, self.worker_busy
        batch: Batch | None = None  # the updates this worker ran last
        slot: Slot | None = None
        job: Job | None = None
        while True:
            with lock:
                if batch is not None and self._keeps and (kept := self._keep(batch, number)) is not None:
                    now = kept
                else:
                    if batch is not None:
                        self._put_back(batch, number)
                    # What _next_for_worker does in the common case, in short: updates may
                    # start, the queue's first are due, no job is queued, no batch is left to
                    # take from, and there is no other worker to leave it to (no GIL, or no
                    # update running: NOTE [ workers under the GIL ]).
                    if (
                        self._running
                        and not self._paused
                        and not self._stopping
                        and dues
                        and dues[0] <= (now := clock.now())
                        and not self._jobs
                        and not self._batches
                        and (self._in_hook is None or self._busy == 0)
                    ):
                        batch = self._take_queued(number)
                    else:
                        batch, slot, job, now = self._next_for_worker(number)
                    if batch is None and job is None:
                        self._thread_exited()
                        return
            if batch is not None:
                busy[number] += self._run_batch(batch, number, now)
            else:
                assert slot is not None and job is not None
                before = slot.busy_seconds  # _call measures each hook's time there
                self._run_job(slot, job)
                with lock:
                    self._finish_job(slot, job)
                busy[number] += slot.busy_seconds - before
                slot = job = None  # drop the references while idle, as concurrent.futures does

    def _next_for_worker(self, number: int) -> tuple[Batch | None, Slot | None, Job | None, float]:
        """With the lock held, wait for the next thing a worker does: updates or a job.

        Returns (batch, None, None, the timer time now), (None, slot, job, ...), or
        (None, None, None, ...) when the worker exits.
        """
        dues = self._due.dues
        while True:
            if self._jobs:
                slot, job = self._jobs.popleft()
                self._taken[slot.index] = 1
                return None, slot, job, 0.0
            if self._stopping:
                # A worker node still in a hook (a start, or the state thread's state_dict)
                # may yet need its on_stop run by a worker: stay until none is.
                if self._worker_stops == 0 and not any(
                    self._taken[slot.index] for slot in self.slots if not slot.dedicated
                ):
                    return None, None, None, 0.0
                self._work.wait(number)
                continue
            timeout: float | None = None
            due = self._earliest() if self._batches else dues[0] if dues else math.inf
            if self._running and not self._paused and due < math.inf:
                now = self.clock.now()
                if due > now:
                    if not self.clock.virtual:
                        timeout = self.clock.real_seconds(due - now)
                        if self._in_hook is not None and self._waker_due <= due:
                            # The waker takes it: this one watches (NOTE [ workers under the GIL ]).
                            timeout += self._watch_delay(number)
                        else:
                            self._waker, self._waker_due = number, due
                            if self._bursts and not self._spinning and self._burst_at(due):
                                timeout -= self._lead  # NOTE [ waking for a burst ]
                                if timeout <= 0.0:
                                    burst = self._take_queued(number)
                                    start = self._wait_for(burst, number)  # it spins
                                    self._waker, self._waker_due = -1, math.inf
                                    if start is None:
                                        self._put_back(burst, number)
                                        continue
                                    return burst, None, None, start
                        self._wait_timed(number, timeout)
                        if self._waker == number:
                            self._waker, self._waker_due = -1, math.inf
                        continue
                elif self._in_hook is None or (timeout := self._hold_back(number)) == 0.0:
                    taken = self._take(number, due) if self._batches else self._take_queued(number)
                    if taken is not None:
                        return taken, None, None, now
                    continue  # the batch it was to take from ran out meanwhile
            self._work.wait(number, timeout)

    def _needed(self) -> bool:
        """Whether a worker is needed for something other than updates: a job, a pause, the stop."""
        return bool(self._jobs) or self._paused or self._stopping

    def _earliest(self) -> float:
        """With the lock held, the due time of the earliest update that no worker has begun."""
        due = self._due.dues[0] if self._due.dues else math.inf
        for batch in self._batches:
            if batch.todo and batch.due < due:
                due = batch.due
        return due

    def _take(self, number: int, due: float) -> Batch | None:
        """With the lock held, worker ``number`` takes the updates due at ``due``, the earliest.

        From the queue, every node due then; else one update from the rest of a batch another
        worker runs, or None when that batch ran out meanwhile.
        """
        if self._due.dues and self._due.dues[0] == due:
            return self._take_queued(number)
        other = next(batch for batch in self._batches if batch.due == due)
        try:
            index = other.todo.pop()
        except IndexError:  # its worker took the last one
            return None
        self._note_taken(number)
        batch = self._batch[number]
        batch.due, batch.todo, batch.shared = due, [index], False
        return batch

    def _take_queued(self, number: int) -> Batch:
        """With the lock held, worker ``number`` takes every node due first in the queue."""
        batch = self._batch[number]
        batch.due = self._due.dues[0]
        batch.todo = todo = self._due.pop_all()
        taken = self._taken
        for index in todo:
            taken[index] = 1
        self._busy += len(todo)
        if self.workers > 1:
            batch.shared = len(todo) > 1
            if batch.shared:
                self._batches.append(batch)
            self._note_taken(number)
        return batch

    def _note_taken(self, number: int) -> None:
        """Worker ``number`` took updates: it counts as in a hook from now."""
        if self._in_hook is not None:  # NOTE [ workers under the GIL ]
            self._in_hook[number] = _perf_counter()
            self._patience[number] = 0

    def _run_batch(self, batch: Batch, number: int, start: float) -> float:
        """Run ``batch``'s updates in turn, the first at ``start``, no lock held; return the
        seconds spent in hooks.

        Ends early, leaving the rest to ``_put_back``: when the engine needs the worker (a
        job, a pause, the stop), when an update fails, and when a node that ran is due again
        (from the queue, another worker may take it: threads.earliest-due-first).
        """
        clock, slots, todo, ran, in_hook = self.clock, self.slots, batch.todo, batch.ran, self._in_hook
        spent = 0.0
        again = math.inf  # the earliest next due time of the nodes that ran
        while True:
            try:
                slot = slots[todo.pop()]
            except IndexError:  # another worker took the last one
                break
            if in_hook is not None:
                in_hook[number] = _perf_counter()
            dt = self._begin_update(slot, start)
            before = slot.busy_seconds
            failed = self._call(slot, "on_update", slot.node.on_update, dt)[1]
            spent += slot.busy_seconds - before
            ran.append(slot)
            if failed is not None:
                batch.failed = failed
                break
            if slot.due < again:
                again = slot.due
            if not todo or self._jobs or self._paused or self._stopping:  # _needed(), inlined
                break
            start = clock.now()
            if start >= again:
                break
        return spent

    def _put_back(self, batch: Batch, number: int) -> None:
        """With the lock held, the nodes of ``batch`` go back: those that ran, and those left."""
        if self._in_hook is not None:
            self._in_hook[number] = 0.0
        if batch.shared:
            self._batches.remove(batch)
        if batch.failed is not None:
            failed = batch.ran[-1]
            self._fail(failed, "on_update", failed.last, batch.failed)
        ran, todo = batch.ran, batch.todo  # no other worker takes from todo now: it left _batches
        if todo:
            ran += [self.slots[index] for index in todo]
            todo.clear()
        taken = self._taken
        self._busy -= len(ran)
        if self._stopping:
            for slot in ran:
                taken[slot.index] = 0
                self._queue_stop(slot)
            self._work.notify_all()
        else:
            push = self._due.push
            for slot in ran:
                taken[slot.index] = 0
                push(slot.due, slot.index)
        ran.clear()
        batch.failed = None
        if self._busy == 0 and (self._paused or self.clock.virtual):
            self._updates_done()

    def _keep(self, batch: Batch, number: int) -> float | None:
        """With the lock held, after ``batch`` ran: keep its nodes for the next batch if they
        fall due again together before any other update, and wait until then.

        Returns the timer time to run them at, or None: the worker puts them back.

        NOTE [ keeping a batch ]: a lone node, or nodes of one period, fall due again together
        before anything else, and putting them back into the queue only to take them out
        after the sleep was a third of the Python an idle wake-up ran, cold (812 opcodes per
        wake-up of a lone node before, 578 after). So the only worker keeps them: they stay
        taken while it sleeps, and a notify (a job, a pause, the stop) makes it put them
        back. ``_keeps`` is set for one worker under the real-time timer: with more, another
        worker may hold a node due then, and under the virtual timer the host moves the
        time from the queue.
        """
        ran, dues = batch.ran, self._due.dues
        due = ran[0].due  # one worker: it ran at least the first
        if (
            (dues and dues[0] <= due)  # first, as it is what ends a saturated worker's batches
            or batch.failed is not None
            or batch.todo
            or not self._running
            or self._needed()
        ):
            return None
        todo = batch.todo
        for slot in reversed(ran):
            if slot.due != due:
                todo.clear()
                return None
            todo.append(slot.index)
        ran.clear()
        batch.due = due
        return self._wait_for(batch, number)

    def _wait_for(self, batch: Batch, number: int) -> float | None:
        """With the lock held, wait until ``batch``, taken, is due: sleep, or for a burst sleep
        and then yield the CPU (NOTE [ waking for a burst ]).

        Returns the timer time to start it at, or None when the engine needs the worker for
        something else first.
        """
        clock, due = self.clock, batch.due
        while (now := clock.now()) < due:
            timeout = clock.real_seconds(due - now)
            if self._bursts and self._burst_at(due, len(batch.todo)):
                timeout -= self._lead
                if timeout <= 0.0:
                    self._spin_until(due, batch)
                    if self._needed():  # it came while the lock was free
                        return None
                    continue
            if self._wait_timed(number, timeout) or self._needed():
                return None
        return now

    def _burst_at(self, due: float, taken: int = 0) -> bool:
        """Whether BURST or more worker updates are due within ``_lead`` of ``due`` (the earliest),
        counting ``taken`` ones due then that are out of the queue."""
        last = due + self._lead * self.clock.scale  # the lead is in real seconds
        return taken + self._due.count_until(last, BURST) >= BURST

    def _wait_timed(self, number: int, timeout: float) -> bool:
        """Wait for work or ``timeout`` real seconds; learn how late timed wake-ups come.

        Returns whether a notify woke the worker.
        """
        if not self._bursts:  # nothing to learn for
            return self._work.wait(number, timeout)
        deadline = _perf_counter() + timeout
        if self._work.wait(number, timeout):
            return True
        late = _perf_counter() - deadline
        # A moving average of the last few, doubled: most wake-ups come before the lead.
        self._lead = min(MAX_LEAD, 0.875 * self._lead + 0.125 * 2.0 * max(0.0, late))
        return False

    def _spin_until(self, due: float, burst: Batch) -> None:
        """Wait for the timer to reach ``due`` without sleeping, the lock released meanwhile;
        warm the CPU's caches for ``burst``, taken, due then.

        NOTE [ waking for a burst ]: a timed wait wakes late, by 0.05 to 0.5 ms depending on
        the machine, and every update of a burst due at once inherits that lateness. So when
        BURST or more worker updates are due together, one worker wakes ``_lead`` early (the
        lateness of recent timed wake-ups, learnt in ``_wait_timed``), takes them as a batch
        and yields the CPU in a loop until they are due. After a sleep the CPU's caches are
        cold, and work costs several times what it does warm: so the batch is taken before
        the due time rather than after, and while it waits the worker reads what the first
        updates will read (``_warm``). Fewer updates sleep to their due time: a lone node's
        spin would cost more CPU than the lateness it saves.
        """
        self._spinning = True
        self._lock.release()
        try:
            clock = self.clock
            self._warm(burst, due)
            while clock.now() < due:
                _yield_cpu()
        finally:
            self._lock.acquire()
            self._spinning = False

    def _warm(self, burst: Batch, due: float) -> None:
        """Read each node's bookkeeping and the objects in its ``__dict__`` (its ports, the
        Python objects of its tensors), the first to run first, until the timer reaches ``due``.

        Only reads: the nodes are taken, so no hook of theirs runs meanwhile.
        """
        slots, clock = self.slots, self.clock
        for count, index in enumerate(reversed(burst.todo)):  # shared: it may shrink meanwhile
            if count % 16 == 0 and clock.now() >= due:
                return
            slot = slots[index]
            core = slot.core
            _ = (slot.due, slot.lateness, core.context, core.reads, tuple(vars(slot.node).values()))

    def _hold_back(self, number: int) -> float:
        """How long worker ``number`` leaves due work to the workers in short hooks, or 0.0.

        NOTE [ workers under the GIL ]: while the GIL is enabled, one thread runs Python at a
        time, so short hooks run no faster on two workers than on one, and slower for the
        hand-offs. A free worker therefore takes due work only when every other worker is
        free or has been in its hook for HOLD_BACK seconds (blocked, or computing in torch
        outside the GIL); otherwise the worker about to be free takes it.

        Finding that out costs a wake-up, which under the GIL slows the worker running
        hooks, so a worker that keeps finding the others in short hooks looks less often:
        HOLD_BACK later, then twice, four and eight times that. And when workers wait for
        the next due update, one of them (``_waker``) wakes for it, the others that much
        later (``_watch_delay``): while one worker keeps up, the others wake about once per
        8 ms, off the bursts.
        """
        assert self._in_hook is not None
        now = _perf_counter()
        hold = 0.0
        for other, began in enumerate(self._in_hook):
            if other != number and began:
                left = HOLD_BACK - (now - began)
                if left > 0.0 and (hold == 0.0 or left < hold):
                    hold = left
        if hold > 0.0:
            hold += self._watch_delay(number) - HOLD_BACK
        return hold

    def _watch_delay(self, number: int) -> float:
        """HOLD_BACK, doubled each time worker ``number`` watched in a row, up to 8 times."""
        patience = self._patience[number]
        self._patience[number] = min(patience + 1, 3)
        return HOLD_BACK * (1 << patience)

    def _dedicated_main(self, slot: Slot) -> None:
        finished = False
        failed: BaseException | None = None  # how the update that finished failed
        while True:
            with self._lock:
                if finished:
                    if failed is not None:
                        self._fail(slot, "on_update", slot.last, failed)
                        failed = None
                    self._finish_dedicated(slot)
                    finished = False
                job, start, leave = self._next_for_dedicated(slot)
                if leave:
                    self._thread_exited()
                    return
            if job is None:
                dt = self._begin_update(slot, start)
                failed = self._call(slot, "on_update", slot.node.on_update, dt)[1]
                finished = True
            else:
                self._run_job(slot, job)
                with self._lock:
                    self._finish_job(slot, job)
            del job

    def _next_for_dedicated(self, slot: Slot) -> tuple[Job | None, float, bool]:
        """With the lock held, wait for the node's next hook: a job, or None and when the update
        starts; (..., True) to exit."""
        assert slot.cond is not None
        while True:
            if slot.jobs:
                self._taken[slot.index] = 1
                return slot.jobs.popleft(), 0.0, False
            if self._stopping:
                if slot.stopped or not slot.started:
                    return None, 0.0, True
                slot.cond.wait()
                continue
            timeout: float | None = None
            if self._running and not self._paused:
                now = self.clock.now()
                due = slot.due
                if due <= now:
                    self._taken[slot.index] = 1
                    self._busy += 1
                    return None, now, False
                if not self.clock.virtual:
                    timeout = self.clock.real_seconds(due - now)
            slot.cond.wait(timeout)

    def _finish_dedicated(self, slot: Slot) -> None:
        """With the lock held, the update of dedicated ``slot`` is done."""
        self._taken[slot.index] = 0
        self._busy -= 1
        if self._stopping:
            self._queue_stop(slot)
            self._work.notify_all()
        if self._busy == 0:
            self._updates_done()

    def _updates_done(self) -> None:
        """With the lock held, no update is running: wake the host if it has something to do.

        It waits for no update to be running (a state_dict) or, under the virtual timer, for
        the batch to be done (unless the next batch starts from here).
        """
        if self._paused or (self.clock.virtual and self._quiescent() and not self._next_batch()):
            self._host.notify_all()

    def _finish_job(self, slot: Slot, job: Job) -> None:
        self._taken[slot.index] = 0
        if job.kind == START:
            slot.started = job.error is None
        elif job.kind == STOP:
            slot.stopped = True
            if not slot.dedicated:
                self._worker_stops -= 1
                if self._worker_stops == 0:
                    self._work.notify_all()
        if self._stopping:
            self._queue_stop(slot)
            self._work.notify_all()
        if job.kind != STOP:
            self._pending -= 1
            if self._pending == 0:
                self._host.notify_all()

    def _begin_update(self, slot: Slot, start: float) -> float:
        """``slot``'s update starts at ``start``: its statistics and its next due time
        (sched.fixed-rate, sched.skip); returns its dt. No lock held: the node is taken, and
        its thread alone touches these."""
        period = slot.period
        lateness = start - slot.due
        following = slot.slot + 1
        due = following * period  # due_time(following, period), inlined
        if due < start:  # more than a period late: skip (sched.skip)
            following, skipped = next_slot(slot.slot, period, start)
            slot.skipped += skipped
            due = following * period
        slot.slot = following
        slot.due = due
        dt = start - slot.last
        slot.last = start
        done = slot.updates
        slot.updates = done + 1
        slot.dt_sum += dt
        if dt < slot.dt_min:
            slot.dt_min = dt
        if dt > slot.dt_max:
            slot.dt_max = dt
        if lateness > slot.lateness_max:
            slot.lateness_max = lateness
        if done < LATENESS_WINDOW:
            slot.lateness.append(lateness)
        else:
            slot.lateness[done % LATENESS_WINDOW] = lateness
        if self.trace is not None:
            slot.now = (start, dt, lateness)
        return dt

    def _run_job(self, slot: Slot, job: Job) -> None:
        node = slot.node
        hook = _HOOK_OF_JOB[job.kind]
        if job.kind == START:
            _, job.error = self._call(slot, hook, node.on_start)
        elif job.kind == RESTORE:
            _, job.error = self._call(slot, hook, node.load_state_dict, job.arg)
        elif job.kind == STATE:
            job.result, job.error = self._call(slot, hook, node.state_dict)
        else:
            _, job.error = self._call(slot, hook, node.on_stop)
        if job.error is not None and job.kind != RESTORE:
            with self._lock:
                self._fail(slot, hook, self.clock.now(), job.error)

    def _call(
        self, slot: Slot, hook: str, fn: Callable[..., Any], *args: Any
    ) -> tuple[Any, BaseException | None]:
        """The only place hooks are called: in the node's context, with the checks around it.

        This runs for every update: keep it to the checks the spec asks for.
        """
        core = slot.core
        slot.hook = hook
        core.hook_thread = _get_ident()
        streams = core.streams
        restore_host: Callable[[], None] | None = None
        if streams is not None:
            # On the host's thread (state_dict once the run has ended), put its own device
            # and streams back afterwards: the host's later work is not the node's.
            restore_host = streams.make_current(keep=not in_hook_thread())
            if hook == "state_dict":
                streams.wait()  # cuda.wait-state-dict: before, and after below
        grad = _is_grad_enabled()
        inference = _is_inference_mode_enabled()
        if _initial_seed() != self._seen_seed:
            self._observe_seed(None)
        began = _perf_counter()
        try:
            if _profiler_flags.get("_is_profiler_enabled", False):
                with torch.profiler.record_function(f"{slot.name}.{hook}"):
                    result = core.context.run(fn, *args)
            else:
                result = core.context.run(fn, *args)
            if core.reads:
                _check_reads(slot, hook)
            if streams is not None:
                streams.wait()  # cuda.wait-after-update (and after a restore, and state_dict)
            return result, None
        except BaseException as exc:
            return None, exc
        finally:
            ended = _perf_counter()
            slot.busy_seconds += ended - began
            if restore_host is not None:
                restore_host()
            if self.trace is not None:
                self.trace.record(slot.name, hook, began, ended, slot.now if hook == "on_update" else None)
            core.hook_thread = 0
            if core.reads:
                core.reads.clear()
            if (
                _is_grad_enabled() != grad
                or _is_inference_mode_enabled() != inference
                or _initial_seed() != self._seen_seed
            ):
                self._check_settings(slot, hook, grad, inference)

    def _check_settings(self, slot: Slot, hook: str, grad: bool, inference: bool) -> None:
        """After a hook: warn of the per-thread settings it changed, and notice a new seed."""
        if _is_grad_enabled() != grad:
            self._warn_setting(slot, hook, "grad mode", "torch.no_grad()")
        if _is_inference_mode_enabled() != inference:
            self._warn_setting(slot, hook, "inference mode", "torch.inference_mode()")
        if _initial_seed() != self._seen_seed:
            self._observe_seed((slot, hook))

    def _observe_seed(self, ended: tuple[Slot, str] | None) -> None:
        """Notice a change of torch's global seed, and name the hooks that may have made it.

        Called at the start of each hook (``ended`` None) and at its end. A change is pinned
        on the hook that ends, naming the hooks that ran meanwhile, which may have made it
        instead; a change first seen at a start while no hook runs was the host's.
        """
        seed = torch.initial_seed()
        if seed == self._seen_seed:
            return
        self._seen_seed = seed
        suspects = [] if ended is None else [ended]
        suspects += [(other, other.hook) for other in self._in_hooks()]  # ended has left
        if not suspects:
            return
        (slot, hook), others = suspects[0], [entry[0].name for entry in suspects[1:]]
        if "seed" in slot.warned:
            return
        slot.warned.add("seed")
        also = f" (or node {', '.join(map(repr, others))}, whose hook ran meanwhile)" if others else ""
        self._warnings.append(
            (
                GlobalRandomWarning,
                f"node {slot.name!r}{also} called torch.manual_seed in {hook}: that reseeds the "
                "generator every node shares; draw from self.generator instead "
                "(seeded with Node(seed=...))",
            )
        )

    def _warn_setting(self, slot: Slot, hook: str, setting: str, fix: str) -> None:
        if setting in slot.warned:
            return
        slot.warned.add(setting)
        self._warnings.append(
            (
                LeakedSettingWarning,
                f"node {slot.name!r} returned from {hook} with {setting} changed; the next node on "
                "this thread inherits it: keep such settings inside a with block in the hook "
                f"(with {fix}: ...)",
            )
        )

    def hook_of_this_thread(self) -> str:
        """ " of node 'NAME' (HOOK)" for the hook the calling thread runs, else ""."""
        thread = threading.get_ident()
        slot = next((slot for slot in self._in_hooks() if slot.core.hook_thread == thread), None)
        return "" if slot is None else f" of node {slot.name!r} ({slot.hook})"

    def _in_hooks(self) -> list[Slot]:
        """The nodes running a hook now (a scan: for the rare paths that name them)."""
        return [slot for slot in self.slots if slot.core.hook_thread]


def _check_reads(slot: Slot, hook: str) -> None:
    for port, message, version in slot.core.reads:
        if message._version != version:
            raise RuntimeError(
                f"node {slot.name!r} changed in place, in {hook}, a message it read from "
                f"{port.name!r}; messages are shared with the other readers and read-only: "
                "clone it first (message.clone())"
            )
