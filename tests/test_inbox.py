"""The wake pipes into a process (``_processes._inbox``): a parked worker takes the records
itself (proc.wake-worker), and its listening gate parks like a lock."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch
from _support import HANG_GUARD

from mujou._engine._arrivals import wire
from mujou._engine._batches import PARK, RUN, Batch
from mujou._engine._invariant import check
from mujou._engine._slot import Slot
from mujou._engine._threads import Parking
from mujou._engine._update import begin_update
from mujou._ports import Input
from mujou._processes._inbox import LISTENING, Inbox
from mujou._processes._ring import RingWriter
from mujou._processes._wire import Pipe, Standins, _framed
from tests.test_policy import started_policy, triggered_slot

pytestmark = pytest.mark.skipif(not LISTENING, reason="workers wait on the pipes only on Linux")


class _Engine:
    """What the inbox uses of its engine, with ``workers`` workers parking in ``parking``."""

    def __init__(self, workers: int) -> None:
        self.lock = threading.Lock()
        self.parking = Parking(self.lock, workers)
        self.workers = workers
        self.ended = False
        self.crashes: list[BaseException] = []

    def crashed(self, holder: int, exc: BaseException, *, exits: bool) -> None:
        self.crashes.append(exc)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, _Engine, Pipe, RingWriter]]:
    """An inbox over one pipe whose workers listen, without its thread; the sender's ends."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    engine = _Engine(1)
    box = Inbox(cast(Any, engine), Standins(["y"]), [reader])
    box._listen()
    pipe, ring = Pipe(writer), RingWriter()
    yield box, engine, pipe, ring
    pipe.close()
    box.close(0.0)
    ring.close()
    reader.close()


def _send(pipe: Pipe, ring: RingWriter, value: float, number: int) -> None:
    announce = ring.write([torch.full((4,), value)], float(number), number)
    pipe.send("y", _framed(pickle.dumps(("y",), protocol=pickle.HIGHEST_PROTOCOL)), announce)


def _park(engine: _Engine, timeout: float, woke: list[bool]) -> threading.Thread:
    def wait() -> None:
        with engine.lock:
            woke.append(engine.parking.wait(0, timeout, True))

    thread = threading.Thread(target=wait, name="parked-worker", daemon=True)
    thread.start()
    return thread


def test_a_parked_worker_takes_the_records_itself(inbox: tuple[Inbox, _Engine, Pipe, RingWriter]) -> None:
    """A record that comes while worker 0 is parked is taken on that worker's thread: the
    message is published there, and the worker is still parked until notified (planted: the
    gates not registered on the pipes: nothing is published while the worker waits)."""
    box, engine, pipe, ring = inbox
    seen: list[tuple[str, float]] = []
    published = threading.Event()

    def watch(message: Any) -> None:
        seen.append((threading.current_thread().name, float(message[0])))
        published.set()

    box.standins.ports["y"]._add_watcher(watch)
    _send(pipe, ring, 7.0, 1)  # in the pipe before the worker parks: no other reader races it
    woke: list[bool] = []
    thread = _park(engine, HANG_GUARD, woke)
    assert published.wait(HANG_GUARD), "the parked worker did not take the record"
    assert seen == [("parked-worker", 7.0)]
    assert thread.is_alive() and not woke  # taking a record that wakes nothing is no notify
    with engine.lock:
        engine.parking.notify_worker()
    thread.join(HANG_GUARD)
    assert woke == [True] and engine.crashes == []


def test_a_parked_worker_runs_the_update_it_claimed_before_its_wait_returns(
    inbox: tuple[Inbox, _Engine, Pipe, RingWriter],
) -> None:
    """NOTE [ claiming a received update ]: the update the parked worker claimed as it took a
    record (the claim itself: the test below) runs on that worker's thread, from the claim's
    start, inside its wait, which then returns as notified, its busy time counted (planted:
    the gate's wait not running the claim: the update never ran, and the worker, notified,
    would only have asked the policy again)."""
    box, engine, pipe, ring = inbox
    box.standins.ports["y"]._wakes = (0,)  # a node it triggers
    batch = Batch()
    claims: list[int | None] = []
    runs: list[tuple[str, Batch, float]] = []

    def arrived(woken: Any, worker: int | None) -> tuple[Batch, float]:
        claims.append(worker)
        engine.parking.notify(0)  # as the claim does, under the engine's lock
        return batch, 0.5

    def run(taken: Batch, start: float) -> float:
        runs.append((threading.current_thread().name, taken, start))
        return 0.25

    box._arrived = arrived  # type: ignore[method-assign]  # the claim: tested below
    gate = box._gates[0]
    gate._runner = run
    cast(Any, engine).worker_busy = [1.0]
    _send(pipe, ring, 7.0, 1)
    woke: list[bool] = []
    _park(engine, HANG_GUARD, woke).join(HANG_GUARD)
    assert claims == [0] and runs == [("parked-worker", batch, 0.5)] and woke == [True]
    assert cast(Any, engine).worker_busy == [1.25] and engine.crashes == []


def test_a_listening_gate_parks_as_a_lock(inbox: tuple[Inbox, _Engine, Pipe, RingWriter]) -> None:
    """A wait on a listening gate ends False when its time runs out, True when notified, and
    at once when the workers go back to plain locks (planted: ``use_gates(None)`` that wakes
    no parked worker: the last wait runs to its bound and ends False)."""
    _, engine, _, _ = inbox
    woke: list[bool] = []
    _park(engine, 0.01, woke).join(HANG_GUARD)
    thread = _park(engine, HANG_GUARD, woke)
    while True:  # parked: notified from another thread
        with engine.lock:
            if engine.parking._workers:
                engine.parking.notify_worker()
                break
    thread.join(HANG_GUARD)
    thread = _park(engine, HANG_GUARD, woke)
    while True:
        with engine.lock:
            if engine.parking._workers:
                engine.parking.use_gates(None)
                break
    thread.join(HANG_GUARD)
    assert woke == [False, True, True]


def test_closing_the_inbox_closes_the_gates_descriptors() -> None:
    """The gates' eventfds and epolls close with the inbox, also one whose worker still waits
    in it (it closes them as it leaves); planted: no ``_close_fds`` as the waiter leaves."""
    before = _fds()
    reader, writer = multiprocessing.Pipe(duplex=False)
    engine = _Engine(2)
    box = Inbox(cast(Any, engine), Standins(["y"]), [reader])
    box._listen()
    woke: list[bool] = []
    thread = _park(engine, HANG_GUARD, woke)
    while True:
        with engine.lock:
            if engine.parking._workers:
                break
    box.close(0.0)
    thread.join(HANG_GUARD)
    writer.close()
    reader.close()
    assert woke == [True]
    assert _fds() == before


def test_records_are_taken_whole_in_any_pieces() -> None:
    """Taking records: a record seen before and read alone is looked up whole; one cut
    between two reads, or several in one read, still publish the newest message once
    (planted: the whole-record lookup that publishes nothing: message 4 never came)."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    box = Inbox(cast(Any, _Engine(1)), Standins(["y"]), [reader])
    pipe, ring = Pipe(writer), RingWriter()
    seen: list[float] = []
    box.standins.ports["y"]._add_watcher(lambda message: seen.append(float(message[0])))
    record = _framed(pickle.dumps(("y",), protocol=pickle.HIGHEST_PROTOCOL))
    fd = reader.fileno()
    try:
        _send(pipe, ring, 1.0, 1)  # the announcement, then a first record: unpickled
        box.receive(fd, None)
        ring.write([torch.full((4,), 2.0)], 2.0, 2)
        os.write(writer.fileno(), record[:3])
        box.receive(fd, None)  # a piece of a frame: nothing yet
        os.write(writer.fileno(), record[3:])
        box.receive(fd, None)
        ring.write([torch.full((4,), 3.0)], 3.0, 3)
        os.write(writer.fileno(), record + record)
        box.receive(fd, None)  # two records of one output: its newest message, once
        ring.write([torch.full((4,), 4.0)], 4.0, 4)
        os.write(writer.fileno(), record)
        box.receive(fd, None)  # alone, and seen before: looked up whole
        assert seen == [1.0, 2.0, 3.0, 4.0]
        assert box.standins.ports["y"]._latest is not None and box.standins.ports["y"]._latest[4] == 4
        assert cast(Any, box.engine).crashes == []
    finally:
        pipe.close()
        box.close(0.0)
        ring.close()
        reader.close()


def test_the_worker_that_took_a_record_claims_the_update_it_makes_due_now_only() -> None:
    """NOTE [ claiming a received update ]: a message from another process that parked worker
    0 took makes the triggered node that worker's batch, which it runs at once without the
    queue; the claim declines (and changes nothing) when another update is due first
    (threads.earliest-due-first), when ``min_interval`` makes it due later, and with the GIL's
    hold-back (planted: the queue's due time not compared: the claim ran the node before the
    one due earlier; the due time not compared with now: it was claimed 5 ms early)."""

    def received(slot: Slot, value: float, now: float) -> None:
        port = slot.core.ports["x"]
        assert isinstance(port, Input)
        port._write(torch.tensor(value), None, now)  # as the inbox publishes the stand-in

    slot = triggered_slot(0, math.inf)
    wire([slot])
    policy = started_policy([slot], 1)
    received(slot, 1.0, 0.01)
    batch = policy.received_to_free(slot, 0.01, 0)  # the worker runs it at once
    assert batch is policy.batch[0] and batch.todo == [0] and not batch.held
    assert policy.holder[0] == 1 and not policy.queue.dues and check(policy) == []
    begin_update(policy.slots[batch.todo.pop()], 0.01, False)
    batch.ran.append(slot)
    assert policy.next_for_worker(0, 0.011, 0.0)[0] == PARK and check(policy) == []

    # Another node due before it: the general way, the earlier one first.
    first, later = triggered_slot(0, 0.015), triggered_slot(1, math.inf)
    wire([first, later])
    policy = started_policy([first, later], 1)
    received(later, 2.0, 0.02)
    assert policy.received_to_free(later, 0.02, 0) is None
    assert later.due == math.inf and policy.holder[1] == 0 and not policy.batch[0].todo
    assert policy.sent_to_free(later, 0.02, None)
    kind, batch = policy.next_for_worker(0, 0.02, 0.0)
    assert kind == RUN and isinstance(batch, Batch) and batch.todo == [1, 0]  # the next last

    # Due later than now (min_interval after its last start): the general way.
    spaced = triggered_slot(0, math.inf, min_interval=0.005)
    wire([spaced])
    policy = started_policy([spaced], 1)
    spaced.last = 0.018
    received(spaced, 3.0, 0.02)
    assert policy.received_to_free(spaced, 0.02, 0) is None and spaced.due == math.inf
    assert policy.sent_to_free(spaced, 0.02, None) and spaced.due == 0.023

    # Several workers with the GIL's hold-back: the general way.
    shared = triggered_slot(0, math.inf)
    wire([shared])
    policy = started_policy([shared], 2, gil=True)
    received(shared, 4.0, 0.03)
    assert policy.received_to_free(shared, 0.03, 1) is None


class _Watched:
    """An inbox with one stand-in, "y", fed through a pipe from a plain ring, and what it
    published (``seen``; ``published`` set at each)."""

    def __init__(self) -> None:
        self.reader, writer = multiprocessing.Pipe(duplex=False)
        self.box = Inbox(cast(Any, _Engine(0)), Standins(["y"]), [self.reader])
        self.pipe, self.ring = Pipe(writer), RingWriter()
        self.seen: list[float] = []
        self.published = threading.Event()
        self.record = _framed(pickle.dumps(("y",), protocol=pickle.HIGHEST_PROTOCOL))
        self.box.standins.ports["y"]._add_watcher(self._watch)

    def _watch(self, message: Any) -> None:
        self.seen.append(float(message[0]))
        self.published.set()

    def first(self) -> None:
        """Start the inbox's thread; message 1 is published, as any."""
        self.box.start()
        _send(self.pipe, self.ring, 1.0, 1)
        assert self.published.wait(HANG_GUARD), "message 1 was not published"
        self.published.clear()

    def close(self) -> None:
        self.pipe.close()
        self.box.close(HANG_GUARD)
        self.ring.close()
        self.reader.close()


@contextlib.contextmanager
def _watched() -> Iterator[_Watched]:
    watched = _Watched()
    try:
        yield watched
    finally:
        watched.close()


def test_a_record_taken_before_its_write_is_done_publishes_the_message_once_done() -> None:
    """NOTE [ the wake before the copy ]: the record of a plain write goes before its copy;
    the inbox's thread, taking it while the copy has not finished, publishes the message once
    the write is done, with no later record (planted: the thread not looking at the
    unsettled output again: message 2 never came)."""
    with _watched() as w:
        w.first()
        taken = threading.Event()

        def wake() -> None:  # the record, then the copy only once the thread found it begun
            if taken.is_set():  # again, once done (the reader gave up waiting: _WAITING): no
                return  # record this time, the thread is to look again by itself
            w.pipe.send("y", w.record, None)
            deadline = time.monotonic() + HANG_GUARD
            while not w.box._unsettled and time.monotonic() < deadline:
                time.sleep(0.001)
            taken.set()

        assert w.ring.write_plain(torch.full((4,), 2.0), 2.0, 2, wake)
        assert taken.is_set() and w.seen == [1.0]
        assert w.published.wait(HANG_GUARD), "message 2 was not published once its write was done"
        assert w.seen == [1.0, 2.0]


def test_a_write_that_stays_unfinished_is_looked_at_again_without_a_busy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a writer stays stopped in the middle of a plain write whose record came first
    (NOTE [ the wake before the copy ]), the inbox's thread looks at it again on its timed
    waits and never wakes itself for it; once the write is done, the message is published
    (planted: ``_unsettle`` writing the thread's eventfd, as a worker's ``receive`` does: the
    thread woke itself at each look)."""
    with _watched() as w:
        looks = threading.Semaphore(0)
        recheck = w.box._recheck

        def counted() -> None:
            recheck()
            looks.release()

        w.box._recheck = counted  # type: ignore[method-assign]  # counts the thread's looks
        self_wakes: list[int] = []
        eventfd_write = os.eventfd_write

        def write(fd: int, value: int) -> None:
            if threading.current_thread().name == "mujou-ports-in":
                self_wakes.append(fd)
            eventfd_write(fd, value)

        monkeypatch.setattr(os, "eventfd_write", write)
        release = threading.Event()

        def stopped_in_the_middle() -> None:
            w.pipe.send("y", w.record, None)
            release.wait(HANG_GUARD)

        sender = threading.Thread(
            target=lambda: w.ring.write_plain(torch.full((4,), 2.0), 2.0, 2, stopped_in_the_middle),
            daemon=True,
        )
        try:
            w.first()
            sender.start()
            for _ in range(3):
                assert looks.acquire(timeout=HANG_GUARD), "the thread did not look at the write again"
            assert self_wakes == [] and w.seen == [1.0]
            release.set()
            sender.join(HANG_GUARD)
            assert w.published.wait(HANG_GUARD), "message 2 was not published once its write was done"
            assert w.seen == [1.0, 2.0]
        finally:
            release.set()


def test_a_writer_that_finishes_after_its_reader_gave_up_wakes_it_again() -> None:
    """NOTE [ the wake before the copy ]: a reader that gave up waiting for a write begun
    asks its writer (the ring's waiting word) to wake it once done; the writer's second
    record publishes the message, with no timed look of the thread (here never made)
    (planted: the writer not looking at the waiting word: message 2 never came)."""
    with _watched() as w:
        w.box._recheck = lambda: None  # type: ignore[method-assign]  # only the writer's record publishes
        w.first()
        calls = 0

        def wake() -> None:  # the first record, then the copy once the thread gave up on it
            nonlocal calls
            calls += 1
            w.pipe.send("y", w.record, None)
            deadline = time.monotonic() + HANG_GUARD
            while calls == 1 and not w.box._unsettled and time.monotonic() < deadline:
                time.sleep(0.001)

        assert w.ring.write_plain(torch.full((4,), 2.0), 2.0, 2, wake)
        assert w.published.wait(HANG_GUARD), "message 2 was not published by the writer's second record"
        assert w.seen == [1.0, 2.0] and calls == 2
