"""The run's threads: thin loops that ask the policy under the lock and act outside it.

Guarantees:
- Each loop holds the engine's lock only to ask the policy and to tell it what was done;
  hooks, copies and waits for the time run outside it.
- Every thread body is guarded: an exception in Mujou's own code on a worker, a dedicated
  thread or the state thread stops the run with ``MujouInternalError`` chained to it, and the
  thread's exit is counted, so ``stop()`` and the host's waits return (run.internal-error).
- A thread about to wait first calls the engine's ``idle`` callbacks (without the lock),
  then asks the policy again if one did work: work put off until no update is to run.
- Idle threads park on a lock of their own (``Parking``): no allocation per wait, and a
  notify for work wakes the worker that parked last, whose caches are the warmest.
- Only the GIL-independent guarantees of ``threading`` are relied on (``list.pop`` and
  ``list.append`` are atomic on every build), so the loops are the same on free-threaded builds.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._batches import EXIT, JOB, KEEP, PARK, RUN, SLEEP, SPIN, WATCH, Batch
from ._slot import HOOK_OF_JOB, RESTORE, START, STATE, Job, Slot
from ._update import UpdateEngine, batch_runner, begin_update

_TIMEOUT_MAX = threading.TIMEOUT_MAX
# Real seconds: the longest an idle worker waits while the host's writes wake no worker, so
# that the update of a write the host does not wait for starts within about this (``_lend``).
LOOK = 0.002
_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))  # releases the GIL
_perf_counter = time.perf_counter
# The CPU clock of a thread, by its ident (Unix): what tells a hook waiting outside the GIL.
_thread_cpu_clock: Callable[[int], int] | None = getattr(time, "pthread_getcpuclockid", None)


class Lending(Protocol):
    """What an idle worker reads of the host's lending (``_lend.Lender``)."""

    @property
    def defers(self) -> bool: ...
    def idle_look(self) -> bool: ...


class Engine(UpdateEngine, Protocol):
    """What the threads use of the run's engine (``_lifecycle.Engine``, which starts them: a
    Protocol, so that this module does not import it)."""

    parking: Parking

    @property
    def lender(self) -> Lending | None: ...

    cpu_clocks: CpuClocks | None
    worker_busy: list[float]
    idle: list[Callable[[], bool]]
    advance_until: float | None  # virtual timer: the host's sleep target, while it sleeps

    def gate_of(self, slot: Slot) -> int: ...
    def thread_exited(self) -> None: ...
    def crashed(self, holder: int, exc: BaseException, *, exits: bool) -> None: ...
    def crashed_locked(self, holder: int, exc: BaseException, *, exits: bool) -> None: ...


class CpuClocks:
    """The CPU seconds each worker's thread has used: the policy's probe (``HoldBack.cpu_of``,
    NOTE [ workers under the GIL ]). Read under the lock, by another worker, only when it
    considers holding back; nan for a thread it cannot read (not started, or ended)."""

    __slots__ = ("_ids",)

    def __init__(self, workers: int) -> None:
        self._ids: list[int | None] = [None] * workers  # clock ids (negative numbers, on Linux)

    @staticmethod
    def available() -> bool:
        return _thread_cpu_clock is not None

    def register(self, w: int) -> None:
        """Called by worker ``w``'s thread as it starts."""
        if _thread_cpu_clock is not None:
            self._ids[w] = _thread_cpu_clock(threading.get_ident())

    def __call__(self, w: int) -> float:
        clock = self._ids[w]
        if clock is None:
            return math.nan
        try:
            return time.clock_gettime(clock)
        except OSError:  # the thread ended: its clock is gone
            return math.nan


class Gate(Protocol):
    """What a thread parks on: a lock held while nobody opened it (``threading.Lock``), or a
    gate that does more while its worker waits (``_processes._inbox.ListeningGate``)."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...
    def release(self) -> None: ...


class Parking:
    """Parked threads, each on a gate of its own; every method is called with ``lock`` held.

    Gates ``0 .. workers - 1`` are the workers', the rest the dedicated threads'.
    ``threading.Condition`` would allocate a lock for every wait and wake its waiters in the
    order they came; a worker waits many times a second.
    """

    __slots__ = ("_gates", "_lock", "_others", "_workers")

    def __init__(self, lock: threading.Lock, gates: int) -> None:
        self._lock = lock
        self._gates: list[Gate] = [_closed_lock() for _ in range(gates)]  # held while nobody opened it
        self._workers: list[int] = []  # the parked workers, the latest last
        self._others: list[int] = []  # the parked dedicated threads

    def wait(self, number: int, timeout: float | None, worker: bool) -> bool:
        """Release the lock, wait for a notify or ``timeout`` seconds, take the lock back.

        Returns whether a notify woke the thread (False when the time ran out).
        """
        gate = self._gates[number]
        parked = self._workers if worker else self._others
        parked.append(number)
        self._lock.release()
        try:
            notified = gate.acquire(True, -1 if timeout is None else min(max(timeout, 0.0), _TIMEOUT_MAX))
        finally:
            self._lock.acquire()
        if not notified:
            # The lists are replaced by notify_workers: read them again, not ``parked``.
            parked = self._workers if worker else self._others
            if number in parked:
                parked.remove(number)
            else:  # notified after the time ran out, before the lock was back: the gate is open
                gate.acquire()
                notified = True
        return notified

    def notify(self, number: int) -> None:
        """Wake thread ``number`` if it is parked."""
        for parked in (self._workers, self._others):
            if number in parked:
                parked.remove(number)
                self._gates[number].release()
                return

    def notify_worker(self) -> None:
        """Wake one parked worker, the one that parked last."""
        if self._workers:
            self._gates[self._workers.pop()].release()

    def notify_workers(self) -> None:
        """Wake every parked worker."""
        parked, self._workers = self._workers, []
        for number in parked:
            self._gates[number].release()

    def use_gates(self, gates: Sequence[Gate] | None) -> None:
        """The workers park on ``gates`` from now on (None: on plain locks again); the parked
        ones are woken, to park on their new gate when they wait again."""
        self.notify_workers()
        for number in range(len(gates) if gates is not None else len(self._gates)):
            if gates is not None:
                self._gates[number] = gates[number]
            elif not isinstance(self._gates[number], _LOCK):
                self._gates[number] = _closed_lock()

    def prefer(self, number: int) -> None:
        """If worker ``number`` is parked, make it the one the next ``notify_worker`` wakes:
        the worker that received a message runs the update it triggers (_processes._inbox)."""
        workers = self._workers
        if number in workers and workers[-1] != number:
            workers.remove(number)
            workers.append(number)


_LOCK = type(threading.Lock())


def _closed_lock() -> threading.Lock:
    gate = threading.Lock()
    gate.acquire()
    return gate


def guarded(engine: Engine, holder: int, body: Callable[..., None], *args: Any) -> None:
    """Run a thread's ``body``; an exception in it stops the run with MujouInternalError.

    After a first one the thread goes on, without the nodes it held, to run the other
    nodes' stop jobs; after a second it exits. The state thread exits at once.
    """
    again = body is not state_main
    try:
        body(engine, *args)
    except BaseException as exc:
        engine.crashed(holder, exc, exits=not again)
        if not again:
            return
        try:
            body(engine, *args)
        except BaseException as second:
            engine.crashed(holder, second, exits=True)


def worker_main(engine: Engine, w: int) -> None:
    """Worker ``w``: ask the policy what to do next, do it, tell the policy, again."""
    if engine.cpu_clocks is not None:
        engine.cpu_clocks.register(w)
    run = batch_runner(engine, w)
    with engine.lock:
        _work(engine, w, run, None)


def _work(
    engine: Engine, w: int, run: Callable[[Batch, float], float], done: Callable[[], bool] | None
) -> bool:
    """Worker ``w``'s loop, with the lock held on entry, on return and when it raises (it
    releases it to run a batch or a job): until ``done()`` (None: until the worker exits).
    Whether the worker exited."""
    lock, policy, clock = engine.lock, engine.policy, engine.clock
    next_for_worker, now_of = policy.next_for_worker, clock.now
    gil = policy.gil is not None
    busy = engine.worker_busy
    while done is None or not done():
        now = now_of()
        kind, arg = next_for_worker(w, now, _perf_counter() if gil else 0.0)
        if policy.wake and engine.deliver() and kind > JOB:
            continue  # the next virtual instant began
        if kind == RUN:
            now = now_of()  # again: putting back and taking a large batch takes a while
        elif kind > JOB:
            if kind == EXIT:
                engine.thread_exited()
                return True
            if done is not None and done():  # the policy counts the worker idle: it asks again
                return False
            if engine.idle and kind != SPIN and _idle_work_unlocked(engine):
                continue  # time passed: the policy may have work now
            kept = _idle(engine, w, kind, arg)
            if kept is None:
                continue
            kind, (arg, now) = RUN, kept
        lock.release()
        try:
            if kind == RUN:
                busy[w] += run(arg, now)
            else:
                slot, job = arg
                before = slot.busy_seconds  # the hook caller measures each hook's time there
                run_job(engine, slot, job, w + 1)
                busy[w] += slot.busy_seconds - before
        finally:
            del arg  # drop the references while idle, as concurrent.futures does
            lock.acquire()
    return False


def _idle(engine: Engine, w: int, kind: int, arg: Any) -> tuple[Batch, float] | None:
    """With the lock held, worker ``w`` waits as the policy said (KEEP, SLEEP, PARK, WATCH or
    SPIN); the batch it kept and the time now, when it is to run that batch at once.

    While the host's writes wake no worker (NOTE [ writes that wake no worker ] in ``_lend``)
    it waits LOOK at most, then asks again: a timed wait that ends early is one the policy
    already allows for (a notify that came first).

    NOTE [ a look that finds nothing ]: a worker told to PARK had nothing queued, and whatever
    gives it work notifies it, but for the host's deferred writes, which only queue the node.
    So a look whose wait ran out, with the queue still empty, waits again at once instead of
    asking the policy: the look held the GIL 9 us (p50; p90 17) that way, and a round trip of
    the host that began meanwhile waited for it (bench's echo-triggered: a tenth of the trips
    had a look within 100 us, their p50 5-12 us above the others'). Not with idle callbacks
    (``Engine.idle``): they run before each wait."""
    lender = engine.lender
    if lender is not None and lender.defers and kind != SPIN:
        if kind == PARK:
            parking, queue = engine.parking, engine.policy.queue
            while not parking.wait(w, LOOK, True):
                if not lender.idle_look() or queue.dues or engine.idle:
                    break
            return None
        if arg > LOOK:
            arg = LOOK
    if kind == KEEP:
        if not _wait_timed(engine, w, arg, True):
            now = engine.clock.now()
            kept = engine.policy.run_kept(w, now)
            if kept is not None:
                return kept, now
    elif kind == SLEEP:
        _wait_timed(engine, w, arg, True)
    elif kind == PARK:
        engine.parking.wait(w, None, True)
    elif kind == WATCH:
        _wait_timed(engine, w, arg, False)
    else:  # SPIN
        _spin_until(engine, arg)
    return None


class Lent:
    """Worker 0 of a run whose host thread lends itself: it is that worker while it waits.

    NOTE [ a lent worker ]: under the virtual timer a run's process takes the host's commands
    one at a time, and a tag's command waits for the process's updates of the tag. A worker
    woken for them, and the command thread woken back once they are done, were two wake-ups
    of sleeping threads per tag, each tens of microseconds on a busy machine: more than a small
    tag takes. So there the command thread is worker 0 (a ``HookThread`` named as a worker):
    each time it waits for the engine (``Engine.host_wait``) it runs worker 0's work until the
    wait ends. Between commands no update is due under the virtual timer, so none waits for
    it; ``Engine._notify_host`` also wakes it where it parks as a worker. Like a worker's, an
    exception in Mujou's code here stops the run (run.internal-error); after a second one this
    thread no longer works as worker 0.
    """

    __slots__ = ("_crashes", "_engine", "_ident", "_run", "exited")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._ident = threading.get_ident()
        self._run: Callable[[Batch, float], float] | None = None
        self._crashes = 0
        self.exited = False  # EXIT came, or a second crash: worker 0 is gone

    def here(self) -> bool:
        """Whether the calling thread is the lent one, still worker 0."""
        return not self.exited and threading.get_ident() == self._ident

    def work(self, done: Callable[[], bool]) -> None:
        """With the lock held (also when it returns): worker 0's work until ``done()``, or
        until worker 0 exits."""
        while not self.exited:
            try:
                self._work(done)
                return
            except BaseException as exc:  # with the lock held: see the module's _work
                self._crashed(exc)

    def run_alone(self, now: float) -> bool:
        """With the lock held (also when it returns), virtual timer, the instant at ``now``
        begun and worker 0 the only thread that runs its worker updates (NOTE [ an instant
        run alone ] in ``_instants``): worker 0's work for it in one take, one run and one
        put-back, without its loop. Whether the instant's worker updates are over; False:
        nothing decided here, or some left (``work`` goes on from there)."""
        if self.exited:
            return False
        engine = self._engine
        policy, lock = engine.policy, engine.lock
        batch = policy.take_alone(0, now)
        if batch is None:
            return False
        if batch.todo:
            run = self._runner()
            lock.release()
            try:
                engine.worker_busy[0] += run(batch, now)
            except BaseException as exc:  # as in work: the batch goes back in ``work``'s loop
                lock.acquire()
                self._crashed(exc)
                return False
            lock.acquire()
        over = policy.done_alone(0, now)
        if policy.wake:
            engine.deliver()
        return over

    def _crashed(self, exc: BaseException) -> None:
        """With the lock held: Mujou's code failed on worker 0 (run.internal-error)."""
        self._crashes += 1
        self.exited = self._crashes > 1
        self._engine.crashed_locked(1, exc, exits=self.exited)

    def _runner(self) -> Callable[[Batch, float], float]:
        """Worker 0's runner, made the first time the thread works as worker 0."""
        run = self._run
        if run is None:
            engine = self._engine
            run = self._run = batch_runner(engine, 0)
            if engine.cpu_clocks is not None:
                engine.cpu_clocks.register(0)
        return run

    def _work(self, done: Callable[[], bool]) -> None:
        """``work``'s loop: worker 0's (``_work``), with the lock held as there."""
        if _work(self._engine, 0, self._runner(), done):
            self.exited = True


def run_job(engine: Engine, slot: Slot, job: Job, holder: int) -> None:
    """Run ``job`` on ``slot``, held by thread ``holder``, and tell the policy."""
    node, kind = slot.actor, job.kind
    hook = HOOK_OF_JOB[kind]
    at = engine.clock.now()
    call = engine.hooks.call
    if kind == START:
        _, job.error = call(slot, hook, node.on_start)
    elif kind == RESTORE:
        _, job.error = call(slot, hook, node.load_state_dict, job.arg)
    elif kind == STATE:
        job.result, job.error = call(slot, hook, node.state_dict)
    else:
        _, job.error = call(slot, hook, node.on_stop)
    with engine.lock:
        if job.error is not None and kind != RESTORE:
            engine.report(slot, hook, at, job.error)
        engine.policy.job_done(slot, job, holder)
        if engine.policy.wake:
            engine.deliver()


def dedicated_main(engine: Engine, slot: Slot) -> None:
    """The thread of dedicated node ``slot``: its jobs and its updates."""
    lock, policy, clock, parking = engine.lock, engine.policy, engine.clock, engine.parking
    holder, gate = policy.dedicated_holder(slot), engine.gate_of(slot)
    traced = engine.hooks.trace is not None
    on_update = slot.actor.on_update
    while True:
        with lock:
            while True:
                kind, arg = policy.next_for_dedicated(slot, clock.now())
                if policy.wake:
                    engine.deliver()
                if kind in (RUN, JOB):
                    break
                if kind == EXIT:
                    engine.thread_exited()
                    return
                if engine.idle and _idle_work_unlocked(engine):
                    continue  # time passed: the policy may have work now
                parking.wait(gate, None if kind == PARK else arg, False)  # type: ignore[arg-type]  # SLEEP: float
        if kind == RUN:
            assert isinstance(arg, float)
            dt = begin_update(slot, arg, traced)
            failed = engine.hooks.call(slot, "on_update", on_update, dt)[1]
            with lock:
                if failed is not None:
                    engine.report(slot, "on_update", slot.last, failed)
                policy.update_done(slot)
                if policy.wake:
                    engine.deliver()
        else:
            assert isinstance(arg, Job)
            run_job(engine, slot, arg, holder)
        del arg


def state_main(engine: Engine, jobs: list[tuple[Slot, Job]]) -> None:
    """The state thread: the worker nodes' state_dict, one after the other (cuda.wait-state-dict)."""
    holder = engine.policy.state_holder
    for slot, job in jobs:
        with engine.lock:
            engine.policy.begin_state_job(slot, job)
        run_job(engine, slot, job, holder)
    with engine.lock:
        engine.thread_exited()


def idle_work(calls: list[Callable[[], bool]]) -> bool:
    """Call each of ``calls`` (``Engine.idle``: each does a bounded piece of put-off work and
    says whether it did any), on a thread about to wait; whether one did work."""
    did = False
    for call in calls:
        if call():
            did = True
    return did


def _idle_work_unlocked(engine: Engine) -> bool:
    """With the lock held: :func:`idle_work` without it; whether one did work."""
    engine.lock.release()
    try:
        return idle_work(engine.idle)
    finally:
        engine.lock.acquire()


def _wait_timed(engine: Engine, w: int, timeout: float, learn: bool) -> bool:
    """With the lock held, wait for a notify or ``timeout`` real seconds; when ``learn``, learn
    how late timed wake-ups come (NOTE [ waking for a burst ]). Whether a notify woke it."""
    if not (learn and engine.policy.bursts):
        return engine.parking.wait(w, timeout, True)
    deadline = _perf_counter() + timeout
    if engine.parking.wait(w, timeout, True):
        return True
    engine.policy.learn_lateness(_perf_counter() - deadline)
    return False


def _spin_until(engine: Engine, due: float) -> None:
    """With the lock held, release it and yield the CPU until the timer reaches ``due``."""
    clock = engine.clock
    engine.lock.release()
    try:
        while clock.now() < due:
            _yield_cpu()
    finally:
        engine.lock.acquire()
