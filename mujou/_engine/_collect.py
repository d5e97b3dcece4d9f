"""Taking a run's state: the updates paused, every node's state_dict, the tree; never two at once.

See state.consistent-snapshot and run.state-after-error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from .._errors import HookError, MujouInternalError
from .._in_run import HookThread
from .._tree import build_tree
from ._policy import Policy
from ._slot import Job, Slot
from ._threads import Engine as ThreadsEngine
from ._threads import guarded, state_main


class Engine(ThreadsEngine, Protocol):
    """What taking the state uses of the run's engine (``_lifecycle.Engine``, which calls it:
    a Protocol, so that this module does not import it)."""

    collecting: object | None
    host: threading.Condition
    poll: float
    ended: bool
    end_time: float

    @property
    def error(self) -> BaseException | None: ...
    def host_wait(self, done: Callable[[], bool]) -> None: ...
    def raise_error(self) -> None: ...


def state_tree(engine: Engine) -> dict[str, Any]:
    """Take every node's state_dict between updates, and the tree from them.

    While the run runs, updates pause, worker nodes' state_dict runs on a thread of its
    own and dedicated nodes' on theirs; once the run has ended, on the calling thread,
    after every on_stop. The tree is built before updates resume, so its copies, the ports'
    messages and the schedules it reads are those of the same moment.
    See state.consistent-snapshot.
    """
    with _Turn(engine):
        return _collect(engine)


class _Turn:
    """One state collection at a time (``engine.collecting``, its holder), for a ``with``
    statement: taken once none holds it, given back however the statement ends.

    A lock taken by a timed ``acquire`` loop (timed, so that a wait stays interruptible on
    Windows) and released in a ``try`` after it had a window: a KeyboardInterrupt checked just
    after ``acquire`` returned True, before the ``try``, left it held, and every later
    ``run.state_dict`` waited for ever. Here the holder is the ``_Turn`` itself, so
    ``__exit__`` gives the turn back where this one holds it, whatever interrupted where, and
    ``__enter__`` calls it itself if anything interrupts it once the turn may be taken.
    """

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __enter__(self) -> None:
        engine = self._engine
        try:
            with engine.lock:
                take_turn(engine, self)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc_info: object) -> None:
        engine = self._engine
        with engine.lock:
            if engine.collecting is self:
                engine.collecting = None
                engine.host.notify_all()


def take_turn(engine: Engine, holder: object) -> None:
    """With the lock held: wait until no collection is under way, then make ``holder`` the
    one (timed waits: interruptible everywhere)."""
    while engine.collecting is not None:
        engine.host.wait(engine.poll)
    engine.collecting = holder


def _collect(engine: Engine) -> dict[str, Any]:
    policy = engine.policy
    with _Paused(engine) as taken:
        if taken is None:
            return _states_after_end(engine)
        now, jobs = taken
        with engine.lock:
            engine.host_wait(lambda: policy.pending == 0)
        if any(job.error is not None for _, job in jobs) or isinstance(engine.error, MujouInternalError):
            engine.raise_error()
        return build_tree(engine.slots, [job.result for _, job in jobs], now)


class _Paused:
    """The updates paused and the state jobs queued (``_pause_and_take``) for a ``with``
    statement: the time and the jobs, or None when the run stops (it waits for the end); the
    pause ends however the statement ends.

    A KeyboardInterrupt can come between any two steps of the host's thread. One that came
    after the pause and before the ``try`` that ended it left the run paused for good, and
    every later wait for an update waited for ever (the chaos suite's interrupt, seed 9, in a
    host's tag). So ``__enter__`` ends the pause itself if anything interrupts it once it
    began, the lock's release included, and from its return on the ``with`` statement does.
    """

    __slots__ = ("_engine", "_paused")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._paused = False

    def __enter__(self) -> tuple[float, list[tuple[Slot, Job]]] | None:
        engine = self._engine
        try:
            with engine.lock:
                if engine.policy.stopping:
                    taken = None
                else:
                    self._paused = True  # first: an interrupt once the pause began ends it
                    taken = _pause_and_take(engine)
                    self._paused = taken is not None  # None: it ended it, the run stops
                if taken is None:
                    engine.host_wait(lambda: engine.ended)
                return taken
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc_info: object) -> None:
        if self._paused:
            self._paused = False
            engine = self._engine
            with engine.lock:
                engine.policy.release_pause()
                engine.deliver()


def _pause_and_take(engine: Engine) -> tuple[float, list[tuple[Slot, Job]]] | None:
    """With the lock held: pause the updates, wait until none runs, queue the state jobs.

    Returns the time and the jobs in node order, or None when the run stops meanwhile (the
    pause ended). Raising, it leaves the pause to its caller (``_Paused``) to end.
    """
    policy = engine.policy
    policy.pause()
    engine.deliver()
    engine.host_wait(lambda: policy.busy == 0 or policy.stopping)
    if stopping_now(policy):
        policy.release_pause()
        engine.deliver()
        return None
    now = engine.clock.now()
    jobs = _state_jobs(engine, policy.take_states())
    engine.deliver()
    return now, jobs


def _state_jobs(engine: Engine, worker_jobs: list[tuple[Slot, Job]]) -> list[tuple[Slot, Job]]:
    """With the lock held, the state jobs just queued in node order; starts the state thread."""
    jobs_of = {slot.index: job for slot, job in worker_jobs}
    for slot in engine.policy.dedicated:
        jobs_of[slot.index] = slot.jobs[-1]
    if worker_jobs:
        HookThread(
            target=guarded,
            args=(engine, engine.policy.state_holder, state_main, worker_jobs),
            name="mujou-state",
            daemon=True,
        ).start()
    return [(slot, jobs_of[slot.index]) for slot in engine.slots]


def _states_after_end(engine: Engine) -> dict[str, Any]:
    states = []
    now = engine.end_time
    for slot in engine.slots:
        result, exc = engine.hooks.call(slot, "state_dict", slot.actor.state_dict)
        if exc is not None:
            raise HookError(slot.name, "state_dict", now, exc) from exc
        states.append(result)
    return build_tree(engine.slots, states, now)


def stopping_now(policy: Policy) -> bool:
    """``policy.stopping``, read again (a host wait released the lock since the last read)."""
    return policy.stopping
