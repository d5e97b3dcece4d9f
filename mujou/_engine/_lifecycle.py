"""The engine of a run: starting it, the host's waits, stopping (taking the state: ``_collect``).

One lock (``Engine.lock``) guards the policy and every node's bookkeeping between hooks; the
host's waits release it, and user code (hooks, ``wait_for`` predicates, state builders) never
runs under it.

Guarantees:
- ``start`` undoes itself: when it raises, every started node got its ``on_stop``, the threads
  ended and the net may run again (run.start-undone). A net is in one run at a time, also
  when two threads start it at once (run.one-run-per-net).
- Taking the state (``_collect.state_tree``) never overlaps a node's hooks: updates pause,
  and the state jobs are held like any other job, so a stop that begins meanwhile queues each
  node's ``on_stop`` after its ``state_dict``; once the run has ended the states are taken on
  the host's thread, after every ``on_stop`` (run.state-after-error). Two host threads take
  the state one after the other, and an interrupted host leaves the updates paused until the
  state jobs are done.
- Under the virtual timer, time moves only between instants, when no hook runs and nothing
  is due: messages sent at an instant are committed then, so updates due at one instant never
  see each other's messages (visibility.virtual). The host moves it, or, while the host
  sleeps to a set time, the thread that ends an instant does.
- Every host wait wakes at least every ``poll`` seconds, so a KeyboardInterrupt raised in the
  host thread by another thread (``_thread.interrupt_main()``) is seen promptly; a real SIGINT
  (Ctrl-C) interrupts the wait at once (run.interrupt).
- At interpreter exit every live run is stopped (each started node gets ``on_stop``) and an
  error no host call reported is printed (run.exit-stops).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from .._cpus import gil_enabled
from .._cuda import NodeStreams
from .._errors import HookError, MujouInternalError
from .._in_run import HookThread
from .._ports import Input, Output
from .._routing import OutputSpec, plan_routes
from .._timer import Timer
from .._trace import Recorder
from .._tree import check_tree
from ._arrivals import arrived, note_flows, sent_arrived, wire
from ._clock import RealClock, make_clock
from ._collect import state_tree
from ._exit import live
from ._hooks import Hooks
from ._instants import Instants
from ._lend import Lender
from ._lodge import plan as plan_lodges
from ._policy import Policy
from ._restore import check_schedule, restore_schedule
from ._slot import RESTORE, START, Job, Slot
from ._threads import CpuClocks, Lent, Parking, dedicated_main, guarded, idle_work, worker_main

if TYPE_CHECKING:
    from .._messages import Nest
    from .._node import Node
    from .._port import PortNode, Staged, _Port

# Real seconds the host's waits sleep at most before they look again: under the real-time
# timer a wake-up costs about 1 ms of CPU a second at 0.1 s, a tenth of an idle node's; under
# the virtual timer the run races on meanwhile, so the host looks more often.
HOST_POLL_REAL = 0.5
HOST_POLL_VIRTUAL = 0.1
_claims = threading.Lock()  # taken to claim a net's nodes for a run


class Engine(Instants):
    """Runs the hooks of a net's nodes on workers and dedicated threads, on a clock."""

    def __init__(
        self, nodes: Sequence[Node], workers: int, timer: Timer, trace: Recorder | None, *, lent: bool = False
    ) -> None:
        """``lent``: the calling thread, a ``HookThread``, is worker 0 whenever it waits for the
        engine, instead of a thread of its own (virtual timer only: NOTE [ a lent worker ])."""
        self.lock = threading.Lock()
        self.host = threading.Condition(self.lock)  # the host waits here
        self.clock = make_clock(timer)
        # ``sent`` runs under the real-time timer only (a virtual send is staged): its clock.
        self._real_clock = cast(RealClock, self.clock)
        self.virtual = self.clock.virtual
        self.slots = [Slot(node, node._mujou, i) for i, node in enumerate(nodes)]
        for slot in self.slots:
            slot.sent = partial(self.sent, slot)  # positional: no keyword dict per send
        self._members = {id(node) for node in nodes}
        self.policy = Policy(
            self.slots, workers, virtual=self.virtual, scale=self.clock.scale, gil=gil_enabled()
        )
        self.hooks = Hooks(self.slots, trace)
        self.tracing = trace is not None
        self.cpu_clocks: CpuClocks | None = None
        if self.policy.gil is not None and CpuClocks.available():
            self.cpu_clocks = self.policy.gil.cpu_of = CpuClocks(workers)
        self.parking = Parking(self.lock, workers + len(self.policy.dedicated))
        self._gates = {slot.index: workers + k for k, slot in enumerate(self.policy.dedicated)}
        self.workers = workers
        # Virtual timer: sent, not yet visible; each with its version counter at the send.
        self.staged: list[Staged] = []
        self.advance_until: float | None = None  # the host's sleep target, while it sleeps
        # Virtual timer: the instant's number among those at its time, counted on across host
        # calls at one time, so that each tag (time, microstep) of a run is its own (trigger.tags).
        self.microstep = 0
        self.call_microsteps = 0  # the microsteps of the host's current call (trigger.microstep-cap)
        self.ended = False
        self.end_time = 0.0
        self.end_real = 0.0
        self.real_start = 0.0  # perf_counter() when the timer started, 0.0 before
        self.worker_busy = [0.0] * workers  # real seconds each worker spent in hooks
        self.finishers: list[Callable[[], None]] = []  # run once the run has ended and stopped
        # Called, without the lock, by a thread about to wait (_threads.idle_work): work that
        # is put off until no update is to run (the recorder's copies, NOTE [ the recorder's tap ]).
        self.idle: list[Callable[[], bool]] = []
        if trace is not None:
            self.finishers.append(trace.write)
        self.error_reported = False  # a host call raised the run's error
        self._wakers: list[Callable[[], None]] = []  # called once when the run ends
        self._host_seq = 0  # counts notify_host calls: a wait misses none
        self.poll = HOST_POLL_VIRTUAL if self.virtual else HOST_POLL_REAL
        self.collecting: object | None = None  # the state collection under way (_collect._Turn)
        self.threads_started = False
        assert not lent or (self.virtual and isinstance(threading.current_thread(), HookThread))
        self.lent: Lent | None = Lent(self) if lent else None
        # The host's thread runs due worker updates while it waits (NOTE [ the host lends its thread ]).
        self.lender: Lender | None = Lender(self) if workers > 0 and not lent else None
        self._threads: list[threading.Thread] = [
            HookThread(
                target=guarded, args=(self, i + 1, worker_main, i), name=f"mujou-worker-{i}", daemon=True
            )
            for i in range(1 if lent else 0, workers)
        ]
        self._threads += [
            HookThread(
                target=guarded,
                args=(self, self.policy.dedicated_holder(slot), dedicated_main, slot),
                name=f"mujou-node-{slot.name}",
                daemon=True,
            )
            for slot in self.policy.dedicated
        ]

    def gate_of(self, slot: Slot) -> int:
        """The parking gate of dedicated ``slot``'s thread."""
        return self._gates[slot.index]

    @property
    def error(self) -> BaseException | None:
        return self.policy.error

    # -- starting --------------------------------------------------------------------------

    def claim(self) -> None:
        """Make the net's nodes this run's, or raise RuntimeError if one is in a run (run.one-run-per-net)."""
        with _claims:
            for slot in self.slots:
                if slot.core.engine is not None:
                    raise RuntimeError(
                        f"node {slot.name!r} is in a run that has not ended; stop that run first"
                    )
            for slot in self.slots:
                slot.core.engine = self

    def _unclaim(self) -> None:
        with _claims:
            for slot in self.slots:
                if slot.core.engine is self:
                    slot.core.engine = None

    def has_node(self, node: PortNode) -> bool:
        """Whether ``node`` is one of this run's."""
        return id(node) in self._members

    def check_state(self, tree: object) -> tuple[list[str], list[Any], dict[str, Any]]:
        """Match a state tree with the run's nodes: the problems, each node's state, the metadata."""
        problems, states, meta = check_tree(self.slots, tree)
        if not problems:
            problems = check_schedule(self.slots, meta)
        return problems, states, meta

    def state_tree(self) -> dict[str, Any]:
        """The run's state tree, taken between updates (see ``_collect``)."""
        return state_tree(self)

    def start(self, restore: Sequence[Any] | None) -> list[tuple[str, BaseException]]:
        """Start the threads, run every on_start, then the restore; return the restore errors.

        Raises the HookError of a failed on_start after stopping the started nodes. The caller
        calls ``abort`` when anything after ``start`` began fails.
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
            core.context = contextvars.Context()  # empty at the start of each run (threads.context)
            core.staged = self.staged if self.virtual else None
            core.streams = (
                NodeStreams(core.device, plan, slot.name) if slot.name in plan.touches_cuda else None
            )
            for port in core.ports.values():
                if isinstance(port, Output):
                    port._route = plan.routes[port.name]
                port._begin_run(slot)  # ports.stamp, ports.fresh
        wire(self.slots)
        live.add(self)
        self.threads_started = True
        for thread in self._threads:
            thread.start()
        self._run_jobs([(slot, Job(START)) for slot in self.slots])
        if self.error is not None:
            self.abort()
            self.error_reported = True
            self._leave_live()
            raise self.error
        self._commit()  # on_start's messages, before the restore replaces them (state.resume)
        if restore is None:
            return []
        jobs = [(slot, Job(RESTORE, state)) for slot, state in zip(self.slots, restore, strict=True)]
        self._run_jobs(jobs)
        return [(slot.name, job.error) for slot, job in jobs if job.error is not None]

    def _run_jobs(self, jobs: list[tuple[Slot, Job]]) -> None:
        with self.lock:
            self.policy.queue_jobs(jobs)
            self.deliver()
            self.host_wait(lambda: self.policy.pending == 0)

    def restore_schedule(self, meta: Mapping[str, Any]) -> None:
        """Set the timer time, the schedules and the latest messages of a checked tree."""
        restore_schedule(self.slots, self.clock, meta)

    def go(self, origin: float | None = None) -> None:
        """Start the timer: updates begin. ``origin``: the ``time.monotonic()`` at which the
        real-time timer starts, when several processes start theirs together."""
        with self.lock:
            self.clock.start(origin)
            self.real_start = time.perf_counter()
            if not self.tracing:  # a lodge notes no flow (observe.trace-flows): Engine.sent does
                plan_lodges(self.policy, self.clock, self.slots)  # where the policy lodges
            self.policy.start_timer()
            self.deliver()

    def abort(self) -> None:
        """Undo a start that failed: stop what started, end the threads, free the net.

        An engine whose threads never started ends here: no job can be queued for them after
        this (a state taken then runs on the calling thread, as after the end).
        """
        try:
            if self.threads_started:
                self.stop()
            else:
                with self.lock:
                    self.policy.begin_stop()
                    if not self.ended:
                        self._end()
        finally:
            self._unclaim()

    # -- the threads' side -----------------------------------------------------------------

    def deliver(self) -> bool:
        """With the lock held, wake whom the policy asked for; under the virtual timer, end the
        instant when it is over. Returns whether it did: the caller then asks the policy again,
        as what it was told before may have changed."""
        policy, parking = self.policy, self.parking
        host = policy.wake_host
        if policy.wake_workers == 2:
            parking.notify_workers()
        elif policy.wake_workers == 1:
            parking.notify_worker()
        if policy.wake_worker >= 0:
            parking.notify(policy.wake_worker)
        for slot in policy.wake_nodes:
            parking.notify(self._gates[slot.index])
        policy.delivered()
        if host:
            if self.virtual and self.advance_until is not None and self._next_instant():
                return True
            self._notify_host()
        return False

    def report(self, slot: Slot, hook: str, at: float, exc: BaseException) -> None:
        """With the lock held: ``slot``'s ``hook``, started at ``at``, raised ``exc``."""
        error = HookError(slot.name, hook, at, exc)
        error.__cause__ = exc
        self.policy.fail(slot, error)

    def crashed(self, holder: int, exc: BaseException, *, exits: bool) -> None:
        """Thread ``holder`` hit ``exc`` in Mujou's code: stop the run; count the exit if it ``exits``."""
        with self.lock:
            self.crashed_locked(holder, exc, exits=exits)

    def crashed_locked(self, holder: int, exc: BaseException, *, exits: bool) -> None:
        """``crashed``, with the lock held."""
        error = MujouInternalError(
            f"internal error in Mujou ({type(exc).__name__} on thread {threading.current_thread().name}); "
            "the run stopped: please report it with the traceback of the cause"
        )
        error.__cause__ = exc
        if self.policy.thread_crashed(holder, error, exits=exits):
            self._end()
        self.deliver()

    def failed(self, holder: int, error: BaseException) -> None:
        """Thread ``holder`` of Mujou's found that the run cannot go on, for a reason the user
        can act on (not a bug of Mujou's, as ``crashed`` says): stop the run, which raises
        ``error`` as it is."""
        with self.lock:
            if self.policy.thread_crashed(holder, error, exits=False):
                self._end()
            self.deliver()

    def thread_exited(self) -> None:
        """With the lock held, a thread exits."""
        if self.policy.thread_exited():
            self._end()

    def _end(self) -> None:
        self.end_time = self.clock.now()
        self.end_real = time.perf_counter()
        self.ended = True
        self._leave_live()
        self._notify_host()
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            waker()
        self._unclaim()

    def arrived(self, port: _Port) -> None:
        """A host write made a message visible on ``port``, which wakes triggered nodes
        (trigger.host)."""
        with self.lock:
            policy = self.policy
            arrived(policy, port, self.clock.now())
            if policy.wake:
                self.deliver()

    def sent(self, by: Slot, port: _Port) -> None:
        """``by``'s update sent on ``port``, which wakes triggered nodes, under the real-time
        timer: ``arrived`` for each, as the send returns (trigger.real-time). In the sender's
        hook, on its thread: the path from a send to the start of the update it triggers,
        kept short (NOTE [ the cost of an update ] in ``_update``)."""
        with self.lock:
            policy = self.policy
            clock = self._real_clock  # RealClock.now, inlined
            started = clock._start
            now = clock._origin
            if started is not None:
                now += (clock.source() - started) * clock.scale
            # The common case first (NOTE [ the send that hands off ] in _policy).
            hand, latest = port._hand, port._latest
            if hand < 0 or latest is None or not policy.sent_handed(hand, latest[4], now, by):
                sent_arrived(policy, port, now, by)
            if self.tracing:
                note_flows(self.slots, port, (threading.current_thread().name, time.perf_counter()))
            if policy.wake:
                self.deliver()

    # -- the host's side -------------------------------------------------------------------

    def _notify_host(self) -> None:
        self._host_seq += 1
        self.host.notify_all()
        if self.lent is not None:  # the host's thread may be parked as worker 0
            self.parking.notify(0)

    def notify_host(self) -> None:
        """Wake the host's waits (a message it waits for arrived)."""
        with self.lock:
            self._notify_host()

    def host_wait(self, done: Callable[[], bool], *, lend: bool = False) -> None:
        """With the lock held, wait until ``done()`` (cheap, no user code), looking every ``poll``;
        on the thread that lends itself as worker 0, doing worker 0's work meanwhile; with
        ``lend`` (virtual timer, the thread ``Lender.begin_instants`` lent), running the
        instants' worker updates meanwhile."""
        lent = self.lent
        if lent is not None and lent.here():
            lent.work(done)  # returns once done(), the lock held, but where worker 0 exited
            if not lent.exited:
                return
        elif lend and self.lender is not None:
            self.lender.lend_instants(done)  # returns once done(), the lock held
            return
        while not done():
            self.host.wait(self.poll)

    def raise_error(self) -> None:
        """Raise the run's error if a hook failed (or Mujou did)."""
        error = self.policy.error
        if error is not None:
            self.error_reported = True
            self._leave_live()
            raise error

    def _leave_live(self) -> None:
        """Leave the runs stopped at exit (``_exit.live``) once ended with no error unheard."""
        if self.ended and (self.error is None or self.error_reported):
            live.discard(self)

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker`` when the run ends (at once if it has)."""
        with self.lock:
            if not self.ended:
                self._wakers.append(waker)
                return
        waker()

    def wait_real(self, until: float | None, done: Callable[[], bool], *, lend: bool = True) -> bool:
        """Real-time timer: wait until ``done()``, the timer reaches ``until``, or the run ends
        (or fails), running due updates meanwhile when ``lend`` (``_lend``). ``done`` runs on
        the host's thread, outside the lock. Whether it became true."""
        clock = self.clock
        lender = self.lender if lend else None
        while True:
            seen = self._host_seq
            if done():
                return True
            if lender is not None and (until is None or clock.now() < until) and lender.run_one():
                continue  # it may have made done() true
            if self.idle and idle_work(self.idle):
                continue  # time passed
            with self.lock:
                if self.ended or self.policy.error is not None:
                    return False
                if seen != self._host_seq:  # woken while done() ran
                    continue
                timeout = self.poll
                if until is not None:
                    remaining = until - clock.now()
                    if remaining <= 0:
                        return False
                    timeout = min(timeout, clock.real_seconds(remaining))
                self.host.wait(timeout)

    def host_write(self, port: Input[Any], message: tuple[Any, Nest | None]) -> None:
        """The host's message (and its tensors): visible to the updates that start after this
        returns, stamped with the time now (ports.stamp).

        Real-time: no engine lock, publishing replaces one reference. Virtual timer: it waits
        until no instant runs (another host thread may be advancing the time), so that the
        message lands between two instants, never in the middle of an update.
        """
        if self.virtual:
            with self.lock:
                self.host_wait(lambda: not self.policy.instant or self.ended)
                port._write(message[0], message[1], self.clock.now())
                if port._wakes:
                    arrived(self.policy, port, self.clock.now())
                    if self.policy.wake:
                        self.deliver()
            return
        now = self.clock.now()
        port._write(message[0], message[1], now)
        if port._wakes:
            if self.lender is not None:
                self.lender.write_arrived(port, now)  # NOTE [ writes that wake no worker ]
            else:
                self.arrived(port)

    def stop(self) -> None:
        """Stop the run and wait until every started node's on_stop ran and threads ended."""
        with self.lock:
            self.policy.begin_stop()
            self.deliver()
            self.host_wait(lambda: self.ended)
            finishers, self.finishers = self.finishers, []
        for thread in self._threads:
            while thread.is_alive():
                thread.join(self.poll)
        for finish in finishers:  # once, on the first stop() that returns
            finish()

    # -- what the host reads ---------------------------------------------------------------

    def time(self) -> float:
        return self.end_time if self.ended else self.clock.now()
