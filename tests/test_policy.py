"""The scheduling policy, driven without threads: a fake clock and a random scheduler of threads.

Each simulated thread (workers, dedicated threads, the state thread, the host) acts one step
at a time, as the real ones do between lock acquisitions: ask the policy, pop one update of
its batch (atomic, as ``list.pop``), run it, tell the policy. A seeded random scheduler picks
which thread acts next (trio's deterministic-scheduling idea), so thousands of interleavings
run per second, and after every step the policy's invariant is checked: each node in exactly
one place, the counts right. From every state some thread must be able to act, or the fake
time must move to a deadline; otherwise the run is stuck (a lost wake-up, a livelock).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

import mujou
from mujou._engine import Engine, _lodge
from mujou._engine._arrivals import arrived, sent_arrived, wire
from mujou._engine._batches import EXIT, FREE, HOST, JOB, KEEP, PARK, RUN, SLEEP, SPIN, WATCH, Batch
from mujou._engine._clock import RealClock
from mujou._engine._gil import HOLD_BACK, PROBE
from mujou._engine._invariant import check
from mujou._engine._policy import Policy
from mujou._engine._slot import START, STATE, STOP, Job, Slot
from mujou._engine._update import begin_update
from mujou._ports import Input, Output

STEPS = 3000  # steps of one random run before the stop


def make_slots(rng: random.Random, count: int, dedicated: float) -> list[Slot]:
    slots = []
    for index in range(count):
        period = rng.choice([0.01, 0.02, 0.03, 0.05, math.inf])  # inf: triggered only
        core = SimpleNamespace(
            period=period,
            dedicated=rng.random() < dedicated,
            device=torch.device("cpu"),
            ports={},
            trigger=None,
            min_interval=0.0,
            delay=0.0,
        )
        node = SimpleNamespace(name=f"n{index}", on_update=lambda dt: None)
        slots.append(Slot(cast(Any, node), cast(Any, core), index))
    return slots


def triggered_slot(
    index: int, period: float, *, delay: float = 0.0, min_interval: float = 0.0, dedicated: bool = False
) -> Slot:
    """A node with real ports, as a run has them: an output ``y`` and an input ``x`` that its
    trigger ``on("x")`` names (``connect`` gives ``x`` a source; else the host writes it)."""
    x: Input[Any] = Input(optional=True)
    y: Output[Any] = Output()
    core = SimpleNamespace(
        period=period,
        dedicated=dedicated,
        device=torch.device("cpu"),
        ports={"x": x, "y": y},
        trigger=mujou.on("x"),
        min_interval=min_interval,
        delay=delay,
    )
    node = SimpleNamespace(name=f"n{index}", on_update=lambda dt: None)
    slot = Slot(cast(Any, node), cast(Any, core), index)
    x._begin_run(slot)
    return slot


def connect(source: Slot, reader: Slot) -> None:
    """``source``'s output ``y`` feeds ``reader``'s input ``x``."""
    x, y = reader.core.ports["x"], source.core.ports["y"]
    assert isinstance(x, Input) and isinstance(y, Output)
    x._source = y


def send(policy: Policy, by: Slot, now: float, message: float, short: bool = False) -> None:
    """``by``'s update sends ``message`` on ``y`` under the real-time timer: what ``Output.send``
    does (publish, then the engine's ``arrived`` with the lock held); with ``short``, the
    arrival as ``Engine.sent`` makes it (``Policy.sent_handed``, else ``sent_arrived``)."""
    port = by.core.ports["y"]
    port._publish(torch.tensor(message), 0, None, by.last)
    if port._wakes:
        send_arrived_as_engine(policy, port, now, by, short)


def send_arrived_as_engine(policy: Policy, port: Any, now: float, by: Slot, short: bool) -> None:
    """The arrival of ``send``'s message, published on ``port``, under the lock."""
    hand, latest = port._hand, port._latest
    if not short:
        arrived(policy, port, now, by)
    elif hand < 0 or latest is None or not policy.sent_handed(hand, latest[4], now, by):
        sent_arrived(policy, port, now, by)


def write(policy: Policy, slot: Slot, now: float, message: float, short: bool = False) -> None:
    """The host writes ``message`` on ``slot``'s input ``x`` (``run.write``); with ``short``,
    the arrival as ``Lender.write_arrived`` makes it (``Policy.host_wrote``, else
    ``sent_arrived`` with no sender), a worker woken unless ``policy.host_defers``."""
    port = slot.core.ports["x"]
    assert isinstance(port, Input)
    port._write(torch.tensor(message), None, now)
    wakes = port._wakes
    if wakes:
        if not short:
            arrived(policy, port, now)
        elif len(wakes) != 1 or not policy.host_wrote(wakes[0], now, policy.host_defers):
            sent_arrived(policy, port, now, None)


def fresh(slot: Slot) -> bool:
    """Whether ``slot``'s next update finds an arrival on its trigger's input."""
    return any(port._fresh_next() for port in slot.trigger_inputs)


@dataclass
class Thread:
    """A simulated thread: what it waits for, and what it holds."""

    name: str
    worker: int = -1  # its number, for a worker
    slot: Slot | None = None  # its node, for a dedicated thread
    state: str = "ready"  # ready, parked, sleeping, batch, job, update, exited
    deadline: float = math.inf  # timer time a sleep ends at
    wakeable: bool = True  # a notify ends its sleep (not while it spins)
    keeping: bool = False  # a KEEP sleep: when it times out, the kept batch runs
    batch: Batch | None = None
    current: int = -1  # the index it popped from its batch and runs now
    job: tuple[Slot, Job] | None = None
    # A send's claim without the lock, begun (NOTE [ the send that lodges ]): the sender, its
    # output, the message's number, and what the claim read of the node it wakes.
    lodging: tuple[Slot, Output[Any], int, tuple[int, float, bool]] | None = None
    start: float = 0.0  # the time its batch or update started at
    jobs: list[tuple[Slot, Job]] = field(default_factory=list)  # the state thread's


class World:
    """The policy, its threads and a fake clock, stepped by a seeded random scheduler."""

    def __init__(
        self,
        seed: int,
        *,
        virtual: bool,
        workers: int,
        gil: bool,
        send_rate: float | None = None,
        plain: bool = False,
    ) -> None:
        """``plain``: the triggered nodes have no delay nor min_interval and most run on the
        workers, as the sends that lodge need (NOTE [ the send that lodges ])."""
        self.rng = random.Random(seed)
        self.plain = plain
        self.virtual = virtual
        # Triggers: an update sends on its output now and then, once or twice, which wakes the
        # nodes whose input it feeds (at once, or after a delay or min_interval), through the
        # engine's own arrivals (_arrivals.arrived: fresh bits, noted times, the policy's
        # arrival); some nodes have no period, and the host writes the inputs of those no
        # node feeds. Under the virtual timer a send is visible, and arrives, once the instant
        # is over (the engine's commit).
        self.send_rate = self.rng.choice([0.0, 0.0, 0.1, 0.5]) if send_rate is None else send_rate
        self.slots = self._make_slots(self.rng.randint(1, 8))
        self.staged: list[tuple[Output[Any], torch.Tensor, float]] = []
        self.sent = 0.0  # the last message sent or written: each is the next number
        self.policy = Policy(self.slots, workers, virtual=virtual, scale=1.0, gil=gil)
        self.now = 0.0
        self.real = 1000.0  # perf_counter's time, for the GIL's hold-back
        if gil:  # the CPU probe: each worker's thread always computes, or always waits
            rates = [self.rng.choice([0.0, 1.0]) for _ in range(workers)]
            if self.policy.gil is not None:
                self.policy.gil.cpu_of = lambda w: self.real * rates[w]
        self.threads = [Thread(f"w{w}", worker=w) for w in range(workers)]
        self.triggered = 0  # triggered updates checked
        self.threads += [Thread(f"d{slot.index}", slot=slot) for slot in self.policy.dedicated]
        self.parked_workers: list[Thread] = []  # the order workers parked in, the latest last
        self.fail_rate = self.rng.choice([0.0, 0.0, 0.01])
        self.crash_rate = self.rng.choice([0.0, 0.0, 0.002])  # Mujou's own code raising on a thread
        self.crashed: set[str] = set()
        self.started = False
        self.collecting = False
        self.steps = 0
        # The host's thread runs due updates while it waits (Policy.take_for_host): the one
        # it popped and runs, -1 for none; in some runs it never does.
        self.lends = self.rng.random() < 0.5
        self.lent = -1
        self.lent_updates = 0
        # Under the virtual timer, the host's thread that runs an instant alone (``take_alone``,
        # NOTE [ an instant run alone ] in _instants) holds this batch, one update a step; in
        # these runs the workers are not kept from the instant, so it is never alone in fact.
        self.alone: Batch | None = None
        self.alone_updates = 0
        self.lodged = 0  # nodes a send lodged without the lock
        self.lodged_late = 0  # of those, by a claim that read lodging before the stop began
        self.stop_soon = False  # the host stops the run at its next event (while a claim is begun)

    # -- the engine's side ---------------------------------------------------------------

    def deliver(self) -> None:
        policy = self.policy
        if policy.wake_workers == 2:
            for thread in self.parked_workers:
                self._wake(thread)
            self.parked_workers.clear()
        elif policy.wake_workers == 1 and self.parked_workers:
            self._wake(self.parked_workers.pop())
        if policy.wake_worker >= 0:
            thread = self.threads[policy.wake_worker]
            if thread in self.parked_workers:
                self.parked_workers.remove(thread)
            self._wake(thread)
        for slot in policy.wake_nodes:
            thread = next(t for t in self.threads if t.slot is slot)
            if thread.state in ("parked", "sleeping") and thread.wakeable:
                self._wake(thread)
        policy.delivered()

    def _wake(self, thread: Thread) -> None:
        if thread.state in ("parked", "sleeping") and thread.wakeable:
            thread.state, thread.deadline, thread.keeping = "ready", math.inf, False

    def check(self) -> None:
        current = [(self._holder(t), t.current) for t in self.threads if t.current >= 0]
        if self.lent >= 0:
            current.append((HOST, self.lent))
        problems = check(self.policy, current)
        assert not problems, (self.steps, problems)
        self.check_live()

    def check_live(self) -> None:
        """No lost wake-up: when every worker not in a hook waits, one of them wakes by the time
        work is there (a hook may block: threads.blocking-holds-worker holds only its worker)."""
        policy = self.policy
        workers = [t for t in self.threads if t.worker >= 0 and t.current < 0 and t.state != "exited"]
        if not workers or any(t.state not in ("parked", "sleeping") for t in workers):
            return
        if policy.jobs:
            due = self.now
        elif policy.may_start_updates():
            due = policy._earliest()[0]
        else:
            return
        if due == math.inf or (self.virtual and (due > self.now or not policy.instant)):
            return
        latest = max(due, self.now) + 8 * HOLD_BACK + 1e-9  # the longest a watcher looks later
        waking = [t for t in workers if t.state == "sleeping" and t.deadline <= latest]
        assert waking, (
            self.steps,
            f"work due at {due} and no worker wakes for it",
            self.now,
            [(t.name, t.state, t.deadline) for t in workers],
        )

    def _holder(self, thread: Thread) -> int:
        if thread.worker >= 0:
            return thread.worker + 1
        assert thread.slot is not None
        return self.policy.dedicated_holder(thread.slot)

    def _make_slots(self, count: int) -> list[Slot]:
        """``count`` nodes with real ports; each one's ``x`` is fed by a node before it or by
        the host (so no cycle of undelayed triggers forms: trigger.cycle), or under the
        real-time timer by any node when a delay or min_interval breaks the cycle."""
        rng, slots = self.rng, []
        for index in range(count):
            periods = [0.01, 0.02, 0.03, 0.05] + ([math.inf] if index and self.send_rate else [])
            if self.plain and index:
                periods = [0.01, math.inf, math.inf]
            slots.append(
                triggered_slot(
                    index,
                    rng.choice(periods),
                    delay=0.0 if self.plain else rng.choice([0.0, 0.0, 0.005]),
                    min_interval=0.0 if self.plain else rng.choice([0.0, 0.0, 0.01]),
                    dedicated=rng.random() < (0.1 if self.plain else 0.3),
                )
            )
        for reader in slots:
            delayed = reader.delay > 0.0 or reader.min_interval > 0.0
            sources = slots[: reader.index] if self.virtual or not delayed else slots
            if sources and rng.random() < 0.8:
                connect(rng.choice(sources), reader)
        wire(slots)
        return slots

    def send(self, by: Slot) -> None:
        """The update of ``by`` sends on its output: once or twice (two arrivals before the
        reader's update, which must make one update: trigger.coalesce)."""
        if self.rng.random() >= self.send_rate:
            return
        for _ in range(self.rng.choice([1, 1, 2])):
            self.sent += 1.0
            if self.virtual:
                port = by.core.ports["y"]
                assert isinstance(port, Output)
                self.staged.append((port, torch.tensor(self.sent), by.last))
            else:
                send(self.policy, by, self.now, self.sent, short=self.rng.random() < 0.5)

    def commit(self) -> None:
        """Virtual timer, the instant over: the staged sends are published, then arrive, as the
        engine's ``_commit`` does."""
        staged, self.staged = self.staged, []
        woken: list[Output[Any]] = []
        for port, message, stamp in staged:
            port._publish(message, 0, None, stamp)
            if port._wakes and port not in woken:
                woken.append(port)
        for port in woken:
            arrived(self.policy, port, self.now)

    def begin(self, slot: Slot, start: float) -> None:
        """``slot``'s update begins at ``start``: check the trigger's rules, then begin it.

        An update ahead of its periodic slot is a triggered one (as ``begin_update`` tells):
        an arrival made it, which it sees fresh (trigger.coalesce: the arrivals before an
        update make that one update, never a second that sees nothing), and it starts
        ``min_interval`` or more after the previous one (trigger.min-interval)."""
        periodic = slot.slot * slot.period
        if slot.due < periodic and start < periodic:
            self.triggered += 1
            assert fresh(slot), (self.steps, f"{slot.name} triggered at {start} with nothing fresh")
            assert start >= slot.last + slot.min_interval - 1e-12, (
                self.steps,
                f"{slot.name} triggered at {start}, {start - slot.last} after the previous",
            )
        begin_update(slot, start, False)

    # -- steps ---------------------------------------------------------------------------

    def enabled(self) -> list[Thread]:
        return [t for t in self.threads if t.state not in ("parked", "sleeping", "exited")]

    def step(self, thread: Thread) -> None:
        self.steps += 1
        if thread.name != "state" and self.rng.random() < self.crash_rate:
            self._crash(thread)
        elif thread.name == "state":
            self._state_step(thread)
        elif thread.slot is not None:
            self._dedicated_step(thread)
        else:
            self._worker_step(thread)
        if self.policy.wake:
            self.deliver()
        self.check()

    def _crash(self, thread: Thread) -> None:
        """An internal error on ``thread``: it goes on after the first, exits after the second."""
        thread.lodging = None  # a send's claim, begun: its arrival is lost with the thread's state
        exits = thread.name in self.crashed
        self.crashed.add(thread.name)
        if self.policy.thread_crashed(self._holder(thread), RuntimeError("internal"), exits=exits):
            self.ended = True
        thread.batch, thread.current, thread.job = None, -1, None
        if thread in self.parked_workers:
            self.parked_workers.remove(thread)
        thread.state, thread.deadline, thread.wakeable = ("exited" if exits else "ready"), math.inf, True

    def _sleep(self, thread: Thread, kind: int, arg: Any) -> None:
        if kind == PARK:
            thread.state, thread.deadline, thread.wakeable = "parked", math.inf, True
        elif kind == SPIN:
            thread.state, thread.deadline, thread.wakeable = "sleeping", float(arg), False
        else:
            thread.state, thread.deadline, thread.wakeable = "sleeping", self.now + float(arg), True
        if thread.worker >= 0 and thread.wakeable:
            self.parked_workers.append(thread)

    def _worker_step(self, thread: Thread) -> None:
        policy, w = self.policy, thread.worker
        if thread.state == "ready":
            kind, arg = policy.next_for_worker(w, self.now, self.real)
            if kind == RUN:
                assert isinstance(arg, Batch)
                thread.state, thread.batch, thread.start = "batch", arg, self.now
            elif kind == JOB:
                assert isinstance(arg, tuple)
                thread.state, thread.job = "job", arg
            elif kind == EXIT:
                thread.state = "exited"
                if policy.thread_exited():
                    self.ended = True
            else:
                assert kind in (SLEEP, WATCH, SPIN, PARK, KEEP)
                self._sleep(thread, kind, arg)
                thread.keeping = kind == KEEP
        elif thread.state == "batch":
            self._batch_step(thread)
        elif thread.state == "job":
            assert thread.job is not None
            slot, job = thread.job
            thread.job = None
            self._finish_job(slot, job, w + 1)
            thread.state = "ready"

    def _batch_step(self, thread: Thread) -> None:
        """One step of running a batch: pop the next update, or run the popped one, or end
        the claim a send of it began without the lock."""
        batch = thread.batch
        assert batch is not None
        if thread.lodging is not None:
            self._end_update(thread, batch, self._finish_lodge(thread))
            return
        if thread.current < 0:
            try:
                thread.current = batch.todo.pop()
            except IndexError:  # another worker took the last one
                thread.state, thread.batch = "ready", None
            return
        slot = self.slots[thread.current]
        self.begin(slot, thread.start if not batch.ran else self.now)
        if not self.virtual and self.rng.random() < 0.2:  # the hook took a while
            self.now += 0.0007
            self.real += 0.0007
        batch.ran.append(slot)
        thread.current = -1
        if self._begin_lodge(thread, slot):
            return  # the claim ends at this thread's next step: other threads act between
        self.send(slot)
        self._end_update(thread, batch, slot)

    def _end_update(self, thread: Thread, batch: Batch, slot: Slot) -> None:
        policy = self.policy
        if self.rng.random() < self.fail_rate:
            slot.hook = "on_update"
            policy.fail(slot, RuntimeError(f"{slot.name} failed"))
            policy.update_failed(batch)
        if not batch.todo or policy.jobs or policy.paused or policy.stopping or self.rng.random() < 0.1:
            thread.state, thread.batch = "ready", None

    def _begin_lodge(self, thread: Thread, slot: Slot) -> bool:
        """One worker, the real-time timer: the update of ``slot`` sends on an output whose
        send may lodge the node it wakes (NOTE [ the send that lodges ]); the claim reads now
        and writes at the thread's next step, so that the other threads act in between, as
        they may without the lock. Whether it began one."""
        port = slot.core.ports["y"]
        assert isinstance(port, Output)
        if port._lodge is None or self.rng.random() >= self.send_rate:
            return False
        self.sent += 1.0
        port._publish(torch.tensor(self.sent), 0, None, slot.last)
        assert port._latest is not None
        node = self.slots[port._hand]
        read = (self.policy.holder[node.index], node.due, self.policy.lodging)
        thread.lodging = (slot, port, port._latest[4], read)
        self.stop_soon = self.rng.random() < 0.03
        return True

    def _finish_lodge(self, thread: Thread) -> Slot:
        """The claim begun by ``_begin_lodge`` writes: as it read, though the stop may have
        begun meanwhile (``lodging`` read before it); else the engine's locked way."""
        assert thread.lodging is not None
        slot, port, number, (holder, due, lodging) = thread.lodging
        thread.lodging = None
        policy, node = self.policy, self.slots[port._hand]
        assert policy.holder[slot.index] == thread.worker + 1  # the sender is still its own
        if holder == 0 and due == math.inf:  # no thread changes a free node not due meanwhile
            assert (policy.holder[node.index], node.due) == (holder, due), self.steps
        was, policy.lodging = policy.lodging, lodging
        assert port._lodge is not None
        lodged = port._lodge(number)
        policy.lodging = policy.lodging and was  # as the stop left it, if it began meanwhile
        self.lodged += lodged
        self.lodged_late += lodged and policy.stopping
        if not lodged and port._wakes:
            send_arrived_as_engine(policy, port, self.now, slot, self.rng.random() < 0.5)
        return slot

    def _dedicated_step(self, thread: Thread) -> None:
        slot, policy = thread.slot, self.policy
        assert slot is not None
        if thread.state == "ready":
            kind, arg = policy.next_for_dedicated(slot, self.now)
            if kind == RUN:
                thread.state, thread.start = "update", float(cast(float, arg))
            elif kind == JOB:
                assert isinstance(arg, Job)
                thread.state, thread.job = "job", (slot, arg)
            elif kind == EXIT:
                thread.state = "exited"
                if policy.thread_exited():
                    self.ended = True
            else:
                self._sleep(thread, kind, arg)
        elif thread.state == "update":
            self.begin(slot, thread.start)
            self.send(slot)
            if self.rng.random() < self.fail_rate:
                slot.hook = "on_update"
                policy.fail(slot, RuntimeError(f"{slot.name} failed"))
            policy.update_done(slot)
            thread.state = "ready"
        elif thread.state == "job":
            assert thread.job is not None
            job_slot, job = thread.job
            thread.job = None
            self._finish_job(job_slot, job, policy.dedicated_holder(slot))
            thread.state = "ready"

    def _state_step(self, thread: Thread) -> None:
        policy = self.policy
        if thread.job is None:
            if not thread.jobs:
                thread.state = "exited"
                if policy.thread_exited():
                    self.ended = True
                return
            thread.job = thread.jobs.pop(0)
            policy.begin_state_job(*thread.job)
            return
        slot, job = thread.job
        thread.job = None
        self._finish_job(slot, job, policy.state_holder)

    def _finish_job(self, slot: Slot, job: Job, holder: int) -> None:
        slot.hook = {"start": "on_start", "state": "state_dict", "stop": "on_stop"}.get(job.kind, "")
        if job.kind == START and self.rng.random() < self.fail_rate * 5:
            job.error = RuntimeError("start failed")
            self.policy.fail(slot, job.error)
        self.policy.job_done(slot, job, holder)

    # -- the host and the clock ----------------------------------------------------------

    ended = False

    def lend(self) -> bool:
        """The host's thread, as it waits: take the update due earliest, or run the one it
        took and give it back; whether it did either."""
        policy = self.policy
        if self.lent < 0:
            batch = policy.take_for_host(self.now)
            if batch is None:
                return False
            assert batch is policy.batch[policy.workers] and len(batch.todo) == 1
            assert batch.due <= self.now
            self.lent = batch.todo.pop()
            return True
        self._host_update(self.slots[self.lent])
        self.lent = -1
        self.lent_updates += 1
        policy.host_done()
        return True

    def _host_update(self, slot: Slot) -> None:
        """The host's thread runs the update of ``slot``, in the host's batch."""
        policy = self.policy
        batch = policy.batch[policy.workers]
        self.begin(slot, self.now)
        batch.ran.append(slot)
        self.send(slot)
        if self.rng.random() < self.fail_rate:
            slot.hook = "on_update"
            policy.fail(slot, RuntimeError(f"{slot.name} failed"))
            policy.update_failed(batch)

    def run_alone(self) -> None:
        """One step of the instant the host runs alone: run the next update of its batch, or,
        once none is left (or a job, a pause or the stop needs the thread, as the runner ends
        a batch early), give the batch back (``done_alone``)."""
        policy, batch = self.policy, self.alone
        assert batch is not None
        if batch.todo and not (policy.jobs or policy.paused or policy.stopping):
            self._host_update(self.slots[batch.todo.pop()])
            self.alone_updates += 1
            return
        self.alone = None
        # Over only where the instant is (its dedicated nodes aside, which the caller checks).
        if policy.done_alone(policy.workers, self.now) and not policy.dedicated:
            assert policy.quiescent(self.now), self.steps

    def host(self) -> bool:
        """One move of the host or the clock when no thread can act; False when none is left."""
        policy = self.policy
        if self.alone is not None:
            self.run_alone()
            return True
        if self.lent >= 0 or (self.lends and self.lend()):
            if self.lent >= 0:
                self.lend()
            return True
        if self.collecting and policy.pending == 0:
            policy.release_pause()
            self.collecting = False
            return True
        if self.virtual and not policy.stopping and policy.running and policy.quiescent(self.now):
            self.commit()
            if policy.end_instant():
                return True
            due = policy.next_due()
            if due < math.inf:
                self.now = due
                policy.start_instant()
                if self.lends and self.rng.random() < 0.5:
                    self.alone = policy.take_alone(policy.workers, self.now)
                return True
        sleeping = [t for t in self.threads if t.state == "sleeping"]
        if sleeping:
            thread = min(sleeping, key=lambda t: t.deadline)
            if thread.deadline > self.now:
                if self.virtual and thread.wakeable:
                    return False  # under the virtual timer only the host moves the time
                self.real += thread.deadline - self.now
                self.now = thread.deadline
            if thread in self.parked_workers:
                self.parked_workers.remove(thread)
            thread.state, thread.deadline, thread.wakeable = "ready", math.inf, True
            if self.lends and self.rng.random() < 0.5:  # the host looks before the thread asks
                self.lend()
            if thread.keeping:  # the KEEP sleep timed out: run the kept batch, as the worker does
                thread.keeping = False
                kept = policy.run_kept(thread.worker, self.now)
                if kept is not None:
                    thread.state, thread.batch, thread.start = "batch", kept, self.now
            return True
        if policy.running and not policy.stopping and not policy.paused:
            # Nothing is due (every node triggered only): the host writes an input no node
            # feeds (node 0's at least), which wakes its node (the engine's arrived, under the
            # lock, between instants).
            fed = [slot for slot in self.slots if cast(Input[Any], slot.core.ports["x"])._source is None]
            self.sent += 1.0
            write(policy, self.rng.choice(fed), self.now, self.sent, short=self.rng.random() < 0.5)
            return True
        return False

    def host_event(self) -> None:
        """Something the host does now and then: take the state, or stop."""
        policy = self.policy
        if self.stop_soon:
            self.stop_soon = False
            policy.begin_stop()
            return
        roll = self.rng.random()
        if self.lends and self.rng.random() < 0.2:
            self.lend()
        if roll < 0.02 and not self.collecting and not policy.stopping and policy.busy == 0 and policy.paused:
            jobs = policy.take_states()
            self.collecting = True
            if jobs:
                self.threads.append(Thread("state", state="ready", jobs=jobs))
        elif roll < 0.03 and not self.collecting and not policy.stopping and not policy.paused:
            policy.pause()
        elif roll < 0.035 and policy.paused and not self.collecting and not policy.stopping:
            policy.release_pause()

    def run(self) -> None:
        policy = self.policy
        policy.queue_jobs([(slot, Job(START)) for slot in self.slots])
        self.deliver()
        self._drive(lambda: policy.pending == 0 or policy.stopping)
        if not policy.stopping:
            # The sends that may lodge (one worker, real-time): the fake clock is the timer's.
            _lodge.plan(policy, fake_clock(lambda: self.now), self.slots)
            policy.start_timer()
            self.deliver()
            self._drive(lambda: self.steps >= STEPS or policy.stopping, events=True)
        if self.collecting and not policy.pending:
            policy.release_pause()
        policy.begin_stop()
        self.deliver()
        self._drive(lambda: self.ended)
        for slot in self.slots:
            assert slot.stopped or not slot.started, f"{slot.name} started and was not stopped"
        assert policy.pending == 0 and policy.busy == 0 and policy.worker_stops == 0

    def _drive(self, done: Any, events: bool = False) -> None:
        for _ in range(20 * STEPS):
            if done():
                return
            if events:
                self.host_event()
                if self.policy.wake:
                    self.deliver()
            ready = self.enabled()
            if ready:
                self.step(self.rng.choice(ready))
                continue
            if self.host():
                if self.policy.wake:
                    self.deliver()
                self.check()
                continue
            if self.collecting or self.policy.paused:
                if self.collecting and self.policy.pending == 0:
                    continue
                self.policy.release_pause()
                self.collecting = False
                self.deliver()
                continue
            pytest.fail(f"stuck after {self.steps} steps: {[(t.name, t.state) for t in self.threads]}")
        pytest.fail(f"no progress to the goal in {20 * STEPS} moves")


@pytest.mark.parametrize("seed", range(300))
def test_random_nets_and_interleavings(seed: int) -> None:
    rng = random.Random(seed)
    world = World(
        seed,
        virtual=rng.random() < 0.4,
        workers=rng.randint(1, 4),
        gil=rng.random() < 0.5,
    )
    world.run()


@pytest.mark.parametrize("seed", range(100))
def test_random_hand_offs(seed: int) -> None:
    """The real-time timer, many sends: the sender's worker runs the updates its sends trigger
    next (NOTE [ handing off ]), another worker may take them from its shared batch, and the
    batch puts them back when it ends first."""
    World(seed, virtual=False, workers=1 + seed % 3, gil=seed % 2 == 1, send_rate=0.5).run()


@pytest.mark.parametrize("first", range(0, 200, 20))
def test_random_lodges(first: int) -> None:
    """One worker, the real-time timer, many sends: a send lodges the node it wakes in the
    worker's batch without the lock (NOTE [ the send that lodges ]), its claim's reads and
    writes apart, other threads' steps between them (the host lends its thread, writes,
    pauses, takes the state, stops, a thread crashes); some claims read ``lodging`` before
    the stop began."""
    lodged, late = 0, 0
    for seed in range(first, first + 20):
        world = World(seed, virtual=False, workers=1, gil=True, send_rate=0.5, plain=True)
        world.lends = seed % 2 == 0
        world.run()
        lodged += world.lodged
        late += world.lodged_late
    assert lodged > 0 and late > 0, (lodged, late)


@pytest.mark.parametrize("virtual", [False, True])
@pytest.mark.parametrize("first", range(0, 100, 10))
def test_random_runs_in_which_the_host_runs_due_updates(first: int, virtual: bool) -> None:
    """The real-time timer: the host's thread takes due updates as it waits (NOTE [ the host
    lends its thread ]), from the queue or a shared batch, between the workers' steps. The
    virtual timer: at an instant's start it takes every worker update due then
    (``take_alone``, NOTE [ an instant run alone ] in _instants), runs them one a step and
    gives them back (``done_alone``), the workers' steps between, which take from the queue
    meanwhile (in these runs they are not kept from the instant)."""
    lent = []
    for seed in range(first, first + 10):
        world = World(seed, virtual=virtual, workers=1 + seed % 3, gil=seed % 2 == 1, send_rate=0.5)
        world.lends = True
        world.run()
        lent.append(world.alone_updates if virtual else world.lent_updates)
    assert sum(count > 0 for count in lent) >= 5, lent  # a net may fail early, or have no worker node


def test_the_host_takes_one_update_due_now_earliest_first() -> None:
    slots = [triggered_slot(i, 0.01) for i in range(3)]
    policy = started_policy(slots, 1)
    assert policy.take_for_host(0.005) is None  # nothing due yet
    batch = policy.take_for_host(0.01)
    assert batch is not None and batch.todo == [0]  # registration order among equal due times
    assert policy.holder[0] == HOST and policy.busy == 1
    assert policy.queue.dues == [0.01]  # the others stay due
    assert not check(policy)
    batch.todo.pop()
    begin_update(slots[0], 0.01, False)
    batch.ran.append(slots[0])
    policy.host_done()
    assert policy.holder[0] == 0 and policy.busy == 0 and not check(policy)
    policy.pause()
    assert policy.take_for_host(0.02) is None  # a pause, a job or the stop needs it first


@pytest.mark.parametrize("short", [False, True], ids=["arrived", "lender"])
@pytest.mark.parametrize("defers", [False, True])
def test_a_host_write_wakes_no_worker_while_the_host_defers(defers: bool, short: bool) -> None:
    """NOTE [ writes that wake no worker ]: the arrival of a host write leaves the parked
    worker parked while ``host_defers``; a node's send wakes it either way."""
    slots = [triggered_slot(0, math.inf), triggered_slot(1, math.inf)]
    connect(slots[0], slots[1])
    wire(slots)
    policy = started_policy(slots, 1)
    assert policy.next_for_worker(0, 0.0, 0.0) == (PARK, None)
    policy.host_defers = defers
    write(policy, slots[0], 0.0, 1.0, short)
    assert policy.queue.dues == [0.0]
    assert policy.wake_worker == (-1 if defers else 0)
    policy.delivered()
    batch = policy.take_for_host(0.0)
    assert batch is not None
    slot = slots[batch.todo.pop()]
    begin_update(slot, 0.0, False)
    batch.ran.append(slot)
    send(policy, slot, 0.0, 2.0)  # by the host's update: no hand-off; the worker wakes, unless woken
    assert policy.wake_worker == (0 if defers else -1)
    policy.host_done()
    assert not check(policy)


@pytest.mark.rule("trigger.coalesce")
@pytest.mark.parametrize("short", [False, True], ids=["arrived", "lender"])
def test_a_write_while_the_host_runs_the_node_makes_it_due_when_the_host_is_done(short: bool) -> None:
    """``host_done``'s short path decides an arrival that came while the host's thread ran the
    node (``Slot.arrived``), as ``_put_back`` does: the node is due at that arrival's time."""
    slots = [triggered_slot(0, math.inf)]
    wire(slots)
    policy = started_policy(slots, 1)
    policy.host_defers = True
    write(policy, slots[0], 0.001, 1.0, short)
    batch = policy.take_for_host(0.001)
    assert batch is not None and batch.todo == [0] and policy.queue.dues == []
    begin_update(slots[batch.todo.pop()], 0.001, False)
    write(policy, slots[0], 0.002, 2.0, short)  # while it runs: marked, decided when it is back
    assert slots[0].arrived and policy.queue.dues == []
    batch.ran.append(slots[0])
    policy.host_done()
    assert policy.holder[0] == 0 and policy.busy == 0 and not check(policy)
    assert policy.queue.dues == [0.002] and slots[0].due == 0.002 and not slots[0].arrived


def started_policy(slots: list[Slot], workers: int, *, gil: bool = False, virtual: bool = False) -> Policy:
    """A real-time policy (or a ``virtual`` one, before its first instant) whose nodes have
    started and whose timer runs."""
    policy = Policy(slots, workers, virtual=virtual, scale=1.0, gil=gil)
    for slot in slots:
        slot.started = True
    policy.start_timer()
    policy.delivered()
    return policy


def test_a_worker_takes_every_node_due_by_now_and_puts_back_the_rest_at_their_own_times() -> None:
    """NOTE [ taking what is due ]: nodes due at three times, all by now, are one batch, the
    earliest first; a pause after the first puts the others back each at its own due time."""
    slots = [
        triggered_slot(0, 0.02),
        triggered_slot(1, 0.01),
        triggered_slot(2, 0.03),
        triggered_slot(3, 0.05),
    ]
    wire(slots)
    policy = started_policy(slots, 1)
    kind, batch = policy.next_for_worker(0, 0.035, 0.0)
    assert kind == RUN and isinstance(batch, Batch)
    assert batch.todo == [2, 0, 1] and batch.due == 0.01  # node 1 (0.01) first, node 3 later
    begin_update(slots[batch.todo.pop()], 0.035, False)
    batch.ran.append(slots[1])
    policy.pause()
    assert policy.next_for_worker(0, 0.036, 0.0)[0] == PARK
    assert [slot.due for slot in slots] == [0.02, 0.04, 0.03, 0.05]
    assert check(policy) == []  # each queued at its own due time


def test_two_shared_batches_of_one_due_time_do_not_freeze_a_worker() -> None:
    """Defect 1 of the engine issue: with two shared batches due at one time, the first run out,
    a free worker takes from the second (the old engine looked at the first only and retried
    forever with the lock held)."""
    slots = make_slots(random.Random(7), 6, 0.0)
    for slot in slots:
        slot.period = 0.01
    policy = started_policy(slots, 3)
    kind, first = policy.next_for_worker(0, 0.01, 0.0)
    assert kind == RUN and isinstance(first, Batch) and first.shared
    # Worker 0 pops three without the lock; worker 1 takes the rest as a batch of its own due
    # then (as nodes of another period falling due at the same time would be).
    rest = [first.todo.pop() for _ in range(3)]
    first.todo.clear()
    second = policy.batch[1]
    second.due, second.todo, second.shared = 0.01, list(rest), True
    for index in rest:
        policy.holder[index] = 2
    policy.shared.append(second)
    kind, third = policy.next_for_worker(2, 0.01, 0.0)
    assert kind == RUN and isinstance(third, Batch) and third.todo == [rest[-1]]


@pytest.mark.parametrize("computes", [False, True])
def test_a_worker_takes_due_work_at_once_when_the_other_waits_outside_the_gil(computes: bool) -> None:
    """Defect 10 of the engine issue: under the GIL a free worker leaves due work to a worker
    in a short hook, but not to one whose thread waits (I/O, a sleep): the probe of its CPU
    time tells, about PROBE after the first look, long before HOLD_BACK."""
    slots = make_slots(random.Random(5), 2, 0.0)
    for slot in slots:
        slot.period = 0.01
    policy = started_policy(slots, 2, gil=True)
    clock = {"real": 5.0}
    assert policy.gil is not None
    policy.gil.cpu_of = lambda w: clock["real"] if computes else 1.0
    kind, batch = policy.next_for_worker(0, 0.01, clock["real"])
    assert kind == RUN and isinstance(batch, Batch) and batch.shared
    index = batch.todo.pop()
    begin_update(slots[index], 0.01, False)  # worker 0 is in its hook
    clock["real"] += PROBE / 10
    kind, hold = policy.next_for_worker(1, 0.01, clock["real"])
    assert kind == WATCH and hold <= PROBE  # a first look: a window to judge by begins
    clock["real"] += 2 * PROBE
    kind, taken = policy.next_for_worker(1, 0.01, clock["real"])
    if computes:  # a Python-bound hook: left to worker 0 until HOLD_BACK
        assert kind == WATCH and taken >= HOLD_BACK - 3 * PROBE
    else:  # a waiting one: worker 1 takes the other update, and the other watchers wake
        assert kind == RUN and isinstance(taken, Batch) and len(taken.todo) == 1
        assert policy.wake_workers == 2
    assert check(policy, [(1, index)]) == []


def test_workers_parked_while_a_start_runs_exit_when_it_fails_during_the_stop() -> None:
    """Found by the simulator: worker 0 parks, stopping, while worker 1 runs node b's on_start;
    that on_start fails, so b needs no stop job, and worker 0 must still be woken to exit (it
    stayed parked, and the run's stop waited for it forever)."""
    slots = make_slots(random.Random(11), 2, 0.0)
    policy = Policy(slots, 2, virtual=False, scale=1.0, gil=False)
    policy.queue_jobs([(slot, Job(START)) for slot in slots])
    kinds = [policy.next_for_worker(w, 0.0, 0.0) for w in (0, 1)]
    assert [kind for kind, _ in kinds] == [JOB, JOB]
    (a, a_job), (b, b_job) = kinds[0][1], kinds[1][1]
    a_job.error = RuntimeError("a failed")
    a.hook = "on_start"
    policy.fail(a, a_job.error)
    policy.job_done(a, a_job, 1)
    assert policy.next_for_worker(0, 0.0, 0.0)[0] == PARK  # b is still in a worker's hands
    policy.delivered()
    b_job.error = RuntimeError("b failed")
    b.hook = "on_start"
    policy.fail(b, b_job.error)
    policy.job_done(b, b_job, 2)
    assert policy.wake and policy.wake_workers == 2
    assert [policy.next_for_worker(w, 0.0, 0.0)[0] for w in (0, 1)] == [EXIT, EXIT]


@pytest.mark.parametrize("workers", [1, 2])
def test_start_jobs_queued_once_stopping_are_dropped(workers: int) -> None:
    """Found by the processes' start: another process failed and the host's engine began
    stopping before it queued its on_start jobs; the workers had exited, so the jobs never ran
    and the start waited for them forever. They are dropped, as begin_stop drops those not
    begun: the host's wait ends at once, and no node starts."""
    slots = make_slots(random.Random(13), 3, 0.0)
    policy = Policy(slots, workers, virtual=False, scale=1.0, gil=False)
    policy.abort(RuntimeError("another process failed"))
    assert [policy.next_for_worker(w, 0.0, 0.0)[0] for w in range(workers)] == [EXIT] * workers
    policy.delivered()
    policy.queue_jobs([(slot, Job(START)) for slot in slots])
    assert policy.pending == 0 and not policy.jobs
    assert all(policy.holder[slot.index] == 0 for slot in slots)
    assert not any(slot.started for slot in slots)
    assert check(policy) == []


def hand_off_policy(
    workers: int, *, fed: bool = True, delay: float = 0.0, gil: bool = False
) -> tuple[Policy, list[Slot], Batch]:
    """Node 0 periodic, node 1 triggered only (fed by node 0, or by the host), node 2 periodic
    and due later (fed by the host); worker 0 runs node 0's update at 0.01."""
    slots = [triggered_slot(0, 0.01), triggered_slot(1, math.inf, delay=delay), triggered_slot(2, 0.05)]
    if fed:
        connect(slots[0], slots[1])
    wire(slots)
    policy = started_policy(slots, workers, gil=gil)
    kind, batch = policy.next_for_worker(0, 0.01, 0.0)
    assert kind == RUN and isinstance(batch, Batch) and batch.todo == [0]
    begin_update(slots[batch.todo.pop()], 0.01, False)
    return policy, slots, batch


@pytest.mark.parametrize("short", [False, True], ids=["arrived", "engine"])
def test_the_sending_worker_runs_what_its_send_triggered_next(short: bool) -> None:
    """NOTE [ handing off ]: the update node 0 sends in triggers node 1, which the worker runs
    next, in the same batch; a pause first puts it back at its own due time."""
    policy, slots, batch = hand_off_policy(1)
    send(policy, slots[0], 0.0102, 1.0, short)
    assert batch.todo == [1] and policy.holder[1] == 1 and policy.busy == 2
    assert not policy.wake and not batch.shared and check(policy, [(1, 0)]) == []
    batch.ran.append(slots[0])
    policy.pause()  # the batch ends before node 1 began: it goes back, due at 0.0102
    assert policy.next_for_worker(0, 0.0103, 0.0)[0] == PARK
    assert policy.queue.dues[0] == 0.0102 and slots[1].due == 0.0102 and policy.busy == 0
    assert check(policy) == []
    policy.release_pause()
    kind, taken = policy.next_for_worker(0, 0.0104, 0.0)
    assert kind == RUN and isinstance(taken, Batch) and taken.todo == [1] and taken.due == 0.0102


@pytest.mark.parametrize("short", [False, True], ids=["arrived", "engine"])
def test_another_worker_takes_a_handed_off_node_while_the_sender_is_in_its_hook(short: bool) -> None:
    """With two workers the batch of the hand-off is shared and the idle worker woken: if the
    sender's hook goes on (blocks), the other worker takes the node, at its own due time."""
    policy, slots, batch = hand_off_policy(2)
    kind, _ = policy.next_for_worker(1, 0.0101, 0.0)
    assert kind == SLEEP  # until node 2, at 0.05
    policy.delivered()
    send(policy, slots[0], 0.0102, 1.0, short)
    assert batch.todo == [1] and batch.shared and policy.wake and policy.wake_worker == 1
    assert check(policy, [(1, 0)]) == []
    kind, taken = policy.next_for_worker(1, 0.0103, 0.0)
    assert kind == RUN and isinstance(taken, Batch) and taken.todo == [1] and taken.due == 0.0102
    assert batch.todo == [] and policy.holder[1] == 2
    assert check(policy, [(1, 0)]) == []


@pytest.mark.parametrize("short", [False, True], ids=["arrived", "engine"])
def test_a_handed_off_node_waits_for_what_is_due_before_it(short: bool) -> None:
    """Earliest due first across a shared batch: a node that came due before the handed-off
    one (a trigger of the host's) is taken first by the other worker, though the batch it
    is in was due earlier still."""
    policy, slots, batch = hand_off_policy(2)
    send(policy, slots[0], 0.0102, 1.0, short)
    assert batch.todo == [1] and batch.shared
    write(policy, slots[2], 0.0101, 5.0)  # node 2, due at 0.05, is wanted at 0.0101 now
    kind, taken = policy.next_for_worker(1, 0.0103, 0.0)
    assert kind == RUN and isinstance(taken, Batch) and taken.todo == [2] and taken.due == 0.0101
    assert batch.todo == [1]
    assert check(policy, [(1, 0)]) == []


@pytest.mark.parametrize("case", ["delay", "earlier work", "host"])
@pytest.mark.parametrize("short", [False, True], ids=["arrived", "engine"])
def test_a_trigger_is_queued_when_the_sender_cannot_take_it(short: bool, case: str) -> None:
    """With a delay, an earlier update in the queue, or the host's write, the triggered node
    goes to the queue, as it did before the hand-off."""
    policy, slots, batch = hand_off_policy(1, fed=case != "host", delay=0.005 if case == "delay" else 0.0)
    if case == "earlier work":  # node 2 is late, due before the trigger
        policy.queue.remove(0.05, 2)
        slots[2].due = 0.0101
        policy.queue.push(0.0101, 2)
    if case == "host":
        write(policy, slots[1], 0.0102, 1.0)
    else:
        send(policy, slots[0], 0.0102, 1.0, short)
    if case == "delay":  # the arrival names no sender for an update due later
        assert slots[1].due == 0.0102 + 0.005
    assert batch.todo == [] and policy.holder[1] == 0
    assert slots[1].due in policy.queue.dues
    assert check(policy, [(1, 0)]) == []


def fake_clock(now: Callable[[], float]) -> RealClock:
    """The real-time timer's clock, started at 0, whose real time is ``now()`` (a test's)."""
    clock = RealClock(1.0, source=now)
    clock.start(0.0)
    return clock


def lodging_policy() -> tuple[Policy, list[Slot], Batch, Output[Any]]:
    """``hand_off_policy`` with one worker, the sends that lodge planned (the fake clock's
    time is 0.0102): node 0's update runs, and its output may lodge node 1."""
    policy, slots, batch = hand_off_policy(1, gil=True)
    _lodge.plan(policy, fake_clock(lambda: 0.0102), slots)
    port = slots[0].core.ports["y"]
    assert isinstance(port, Output) and port._lodge is not None and slots[1].lodger == 0
    port._publish(torch.tensor(1.0), 0, None, slots[0].last)
    return policy, slots, batch, port


def test_a_send_lodges_the_node_it_wakes_in_its_worker_s_batch() -> None:
    """NOTE [ the send that lodges ]: with one worker, node 0's send puts node 1 last in the
    batch without the lock, due at the send, not counted in ``busy``; the batch put back
    before node 1 began (a pause) queues it at that due time and leaves ``busy`` right."""
    policy, slots, batch, port = lodging_policy()
    assert port._lodge is not None and port._lodge(1)
    assert batch.todo == [1] and batch.lodged == 1 and policy.holder[1] == 1 and policy.busy == 1
    assert slots[1].due == 0.0102 and not policy.wake and check(policy, [(1, 0)]) == []
    assert not port._lodge(1)  # held now: the locked way marks the arrival
    batch.ran.append(slots[0])
    policy.pause()
    assert policy.next_for_worker(0, 0.0103, 0.0)[0] == PARK
    assert policy.queue.dues[0] == 0.0102 and policy.busy == 0 and batch.lodged == 0
    assert check(policy) == []


def test_no_send_lodges_in_a_process_without_the_gil() -> None:
    """Without the GIL a read of the queue's heap may find another thread's pop half done
    (NOTE [ the send that lodges ]): the sends take the locked way, none is planned."""
    policy, slots, _ = hand_off_policy(1, gil=False)
    assert not policy.lodges
    _lodge.plan(policy, fake_clock(lambda: 0.0), slots)
    port = slots[0].core.ports["y"]
    assert isinstance(port, Output) and port._lodge is None and slots[1].lodger == -1


class _Sender(mujou.Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)

    def on_update(self, dt: float) -> None:
        pass


class _Woken(mujou.Node):
    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)

    def on_update(self, dt: float) -> None:
        pass


class _SendNet(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.sender, self.woken = _Sender(), _Woken()
        self.connect(self.sender.y, self.woken.x)


def test_the_locked_send_reads_the_time_from_the_run_s_clock() -> None:
    """``Engine.sent``, the send that does not lodge, reads the real time in place from the
    run's clock (``RealClock.source``), as the lodge does: the arrival it notes is at the
    clock's timer time. Planted: ``time.monotonic`` read instead, the arrival noted about
    ``time.monotonic() - 490`` s instead of 10 s."""
    engine = Engine(list(_SendNet().nodes()), 1, mujou.RealTimeTimer(), None)
    try:
        sender, woken = engine.slots
        wire(engine.slots)
        clock = RealClock(1.0, source=lambda: 500.0)
        clock.start(490.0)  # timer time 10 s
        engine.clock = engine._real_clock = clock
        port = sender.core.ports["y"]
        port._latest = (torch.zeros(1), 0, None, 0.0, 1, True)
        sender.sent(port)
        assert list(woken.arrival_times) == [10.0] and list(woken.arrival_numbers) == [1]
    finally:
        engine.abort()


def test_no_lodge_past_an_update_due_at_or_before_the_send() -> None:
    """Earliest due first: node 2, late, is due before the send, so node 1 is not lodged."""
    policy, slots, _, port = lodging_policy()
    policy.queue.remove(0.05, 2)
    slots[2].due = 0.0101
    policy.queue.push(0.0101, 2)
    assert port._lodge is not None and not port._lodge(1)
    assert policy.holder[1] == 0 and slots[1].due == math.inf


@pytest.mark.parametrize("end", ["put back", "crash"])
def test_the_stop_leaves_a_lodged_node_s_stop_job_to_its_sender_s_release(end: str) -> None:
    """The stop begins while node 0's update runs: node 1, free, may be lodged meanwhile, so
    its stop job is queued once node 0 is released: when the batch goes back, or when the
    worker crashes in Mujou's code with node 0's update running (that node gets no hook)."""
    policy, slots, batch, _ = lodging_policy()
    policy.begin_stop()
    assert not policy.lodging and policy.holder[1] == 0 and not slots[1].stop_queued
    assert [slot.index for slot, _ in policy.jobs] == [2]
    if end == "put back":
        batch.ran.append(slots[0])
        kind, job = policy.next_for_worker(0, 0.0103, 0.0)
        assert kind == JOB and job[0] is slots[2]
        assert [slot.index for slot, _ in policy.jobs] == [0, 1]
    else:
        policy.thread_crashed(1, RuntimeError("internal"), exits=False)
        assert slots[0].stopped and [slot.index for slot, _ in policy.jobs] == [2, 1]
    assert check(policy) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pause_puts_back_a_held_batch(workers: int) -> None:
    slots = make_slots(random.Random(3), 1, 0.0)
    policy = started_policy(slots, workers)
    kind, batch = policy.next_for_worker(0, 0.0, 0.0)
    assert kind == SLEEP
    kind, batch = policy.next_for_worker(0, slots[0].due, 0.0)
    assert kind == RUN and isinstance(batch, Batch)
    index = batch.todo.pop()
    begin_update(slots[index], slots[0].due, False)
    batch.ran.append(slots[index])
    kind, _ = policy.next_for_worker(0, slots[0].last + 0.0001, 0.0)
    assert kind == (KEEP if workers == 1 else SLEEP)  # kept (one worker) or put back (two)
    assert batch.held == (workers == 1)
    policy.pause()
    kind, _ = policy.next_for_worker(0, slots[0].last + 0.0002, 0.0)
    assert kind == PARK and not batch.held and policy.busy == 0
    assert check(policy) == []
    jobs = policy.take_states()
    assert [job.kind for _, job in jobs] == [STATE]


@pytest.mark.rule("threads.earliest-due-first", "trigger.real-time")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("short", [False, True], ids=["arrived", "engine"])
def test_no_hand_off_past_an_update_due_at_the_same_time(short: bool, workers: int) -> None:
    """> A free worker takes ... the update due earliest, equal due times in registration
    order; the worker that runs the sending update runs the triggered one next "when nothing
    else is due before it" — nor at the same time: node 1 (registered first) is due at 0.0102
    by the host's write when node 0's send makes node 2 due then too; node 2 goes to the queue
    and runs after node 1, not handed off ahead of it (issue 28, mutant P08)."""
    slots = [triggered_slot(0, 0.01), triggered_slot(1, 0.05), triggered_slot(2, math.inf)]
    connect(slots[0], slots[2])
    wire(slots)
    policy = started_policy(slots, workers)
    kind, batch = policy.next_for_worker(0, 0.01, 0.0)
    assert kind == RUN and isinstance(batch, Batch) and batch.todo == [0]
    begin_update(slots[batch.todo.pop()], 0.01, False)
    write(policy, slots[1], 0.0102, 1.0)
    send(policy, slots[0], 0.0102, 2.0, short)
    assert batch.todo == [] and slots[1].due == slots[2].due == 0.0102
    batch.ran.append(slots[0])
    assert check(policy, []) == []
    kind, taken = policy.next_for_worker(0, 0.0102, 0.0)
    assert kind == RUN and isinstance(taken, Batch)
    order = [taken.todo.pop() for _ in range(len(taken.todo))]  # as the worker pops them
    assert order == [1, 2]


@pytest.mark.rule("sched.virtual-failure")
def test_of_the_failures_of_an_instant_the_earliest_registered_is_the_error() -> None:
    """> of several failures at `t`, the run's error is that of the node registered first

    Whatever order they failed in: node 1 fails first, then node 0, in one instant of the
    virtual timer; the run stops at the instant's end with node 0's error (issue 28, mutant
    P12: the first failure kept)."""
    slots = [triggered_slot(0, 0.01), triggered_slot(1, 0.01)]
    wire(slots)
    policy = started_policy(slots, 2, virtual=True)
    policy.start_instant()
    policy.delivered()
    kind, batch = policy.next_for_worker(0, 0.01, 0.0)
    assert kind == RUN and isinstance(batch, Batch) and batch.shared
    first = slots[batch.todo.pop()]
    kind, other = policy.next_for_worker(1, 0.01, 0.0)
    assert kind == RUN and isinstance(other, Batch)
    second = slots[other.todo.pop()]
    assert (first.index, second.index) == (0, 1)
    errors = {slot.index: RuntimeError(f"{slot.name} failed") for slot in slots}
    for slot, holder_batch in ((second, other), (first, batch)):  # the later registered first
        begin_update(slot, 0.01, False)
        slot.hook = "on_update"
        holder_batch.ran.append(slot)
        policy.fail(slot, errors[slot.index])
        policy.update_failed(holder_batch)
    assert (policy.error, policy.stopping) == (None, False)  # the instant's updates run first
    for w in (0, 1):
        policy.next_for_worker(w, 0.01, 0.0)
    assert policy.quiescent(0.01)
    assert policy.end_instant() and policy.stopping
    assert policy.error is errors[0]


def test_one_send_that_makes_two_nodes_due_wakes_a_worker_for_each() -> None:
    """Found by the simulator with real arrivals: node 0 (on its own thread) sends at 0.02 to
    node 1 (delay 0.005) and node 2; both workers sleep until 0.05. The worker woken for node
    2, due at once, takes only it: a second one must wake for node 1 at 0.025, or node 1
    waits for node 2's hook (or till 0.05) (threads.blocking-holds-worker)."""
    slots = [
        triggered_slot(0, 0.01, dedicated=True),
        triggered_slot(1, 0.05, delay=0.005),
        triggered_slot(2, math.inf),
    ]
    connect(slots[0], slots[1])
    connect(slots[0], slots[2])
    wire(slots)
    policy = started_policy(slots, 2)
    assert [policy.next_for_worker(w, 0.0, 0.0)[0] for w in (0, 1)] == [SLEEP, SLEEP]
    policy.delivered()
    slots[0].last = 0.02
    send(policy, slots[0], 0.02, 1.0)
    assert slots[2].due == 0.02 and slots[1].due == 0.025
    assert policy.wake and policy.wake_worker >= 0 and policy.wake_workers == 2


@pytest.mark.parametrize("job", [STATE, STOP])
def test_a_dedicated_thread_that_exits_on_an_internal_error_forgets_its_node_jobs(job: str) -> None:
    """Found by the simulator: the thread of a dedicated node crashed a second time (so it
    exits) while the node's stop job, or a state job the host waits for, was queued for it;
    nobody would ever run it: the run never ended, or the host waited forever. Its node gets
    no more hooks, as a node a crashed thread held (run.internal-error)."""
    slots = [triggered_slot(0, 0.01), triggered_slot(1, 0.01, dedicated=True)]
    wire(slots)
    policy = started_policy(slots, 1)
    if job == STATE:
        policy.pause()
        policy.take_states()
        assert policy.pending == 2
    else:
        policy.begin_stop()
    assert [j.kind for j in slots[1].jobs] == [job]
    policy.thread_crashed(policy.dedicated_holder(slots[1]), RuntimeError("internal"), exits=True)
    assert slots[1].stopped and not slots[1].jobs and policy.holder[1] == 0
    assert policy.pending == (1 if job == STATE else 0)  # the worker node's state job only
    assert check(policy) == []


def test_one_worker_keeps_no_batch_of_a_node_only_a_trigger_makes_due() -> None:
    """NOTE [ keeping a batch ]: a node due only by a trigger (due never by itself) is not
    kept held after its update, so the next arrival finds it free and takes the short path,
    ``sent_to_free``, also for a message from another process (``by`` None): due at once,
    queued, the idle worker woken, no hand-off (planted: the batch kept: KEEP, and
    ``sent_to_free`` declined the held node; and the hand-off tried with no sender: it raised)."""
    slots = [triggered_slot(0, math.inf)]
    wire(slots)
    policy = started_policy(slots, 1)
    slot, port = slots[0], slots[0].core.ports["x"]
    assert isinstance(port, Input)
    write(policy, slot, 0.01, 1.0)
    kind, batch = policy.next_for_worker(0, 0.01, 0.0)
    assert kind == RUN and isinstance(batch, Batch) and batch.todo == [0]
    begin_update(slots[batch.todo.pop()], 0.01, False)
    batch.ran.append(slot)
    kind, _ = policy.next_for_worker(0, 0.011, 0.0)
    assert kind == PARK and not batch.held and policy.holder[0] == 0
    assert check(policy) == []
    policy.delivered()
    port._write(torch.tensor(2.0), None, 0.02)  # as the inbox publishes a stand-in, then arrives
    assert policy.sent_to_free(slot, 0.02, None)
    assert slot.due == 0.02 and policy.queue.dues == [0.02] and policy.holder[0] == 0
    assert policy.wake and policy.wake_worker == 0
    policy.delivered()
    kind, batch = policy.next_for_worker(0, 0.02, 0.0)
    assert kind == RUN and isinstance(batch, Batch) and batch.todo == [0]


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("w", [0, 1])  # worker 0's batch (a process's command thread), the host's
def test_an_instant_run_alone_is_taken_whole_and_wakes_the_host_only_for_a_pause(
    paused: bool, w: int
) -> None:
    """NOTE [ an instant run alone ] in _instants: ``take_alone`` takes every worker node due
    by the instant, held by the thread (worker 0, or the host: HOST) in its batch, the one not
    due left queued; ``done_alone`` puts them back and says the instant is over. Its put-back
    wakes the host's waits only where a pause waits for no update to be held: the thread that
    runs the instant alone waits for its end itself. Planted: ``done_alone`` not waking the
    host for a pause: the paused case fails."""
    slots = [triggered_slot(0, 0.01), triggered_slot(1, 0.02), triggered_slot(2, 0.01)]
    wire(slots)
    policy = started_policy(slots, 1, virtual=True)
    policy.start_instant(alone=True)
    assert not policy.wake  # nobody to wake: the thread that started it runs it
    batch = policy.take_alone(w, 0.01)
    assert batch is policy.batch[w] and batch is not None
    held = 1 if w == 0 else HOST
    assert sorted(batch.todo) == [0, 2] and [policy.holder[i] for i in (0, 1, 2)] == [held, FREE, held]
    assert policy.busy == 2 and not check(policy)
    for index in reversed(list(batch.todo)):  # in order, as the runner pops them
        begin_update(slots[index], 0.01, False)
        batch.ran.append(slots[index])
    batch.todo.clear()
    if paused:
        policy.pause()
        policy.delivered()
    assert policy.done_alone(w, 0.01) is True
    assert policy.busy == 0 and not check(policy) and policy.queue.dues == [0.02]
    assert policy.wake_host is paused
