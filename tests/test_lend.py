"""The host's thread running a due update (``_engine._lend``): Mujou's own failures there."""

from __future__ import annotations

import _thread
import threading
import time
from functools import partial

import pytest
import torch
from _support import HANG_GUARD, Bag, Blocker

import mujou
from mujou import Input, Node, Output
from mujou._engine import _lend, _update

from ._compiled import skip_if_compiled
from .test_engine import fail_on


class Echo(Node):
    x = Input(optional=True)
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.stopped = False

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.y.send(x + 1)

    def on_stop(self) -> None:
        self.stopped = True


def test_an_error_of_mujou_on_the_lent_host_thread_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.internal-error: an exception in Mujou's code while the host runs an update stops
    the run with MujouInternalError, raised by the host's call; the node it held gets no more
    hooks (as a worker's, its state is unknown), and the stop does not wait for it."""
    skip_if_compiled(_update)
    fail_on(monkeypatch, "echo", update=None, thread=threading.get_ident())  # on the host's thread
    blocker, echo = Blocker(), Echo()
    run = mujou.run(Bag(blocker=blocker, echo=echo), workers=1)
    try:
        run.write(blocker.go, torch.zeros(1))
        assert blocker.inside.wait(HANG_GUARD)
        run.write(echo.x, torch.ones(1))
        with pytest.raises(mujou.MujouInternalError) as caught:
            run.wait_for(echo.y, timeout=HANG_GUARD)
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert threading.current_thread().name in str(caught.value)
    finally:
        blocker.release.set()
    with pytest.raises(mujou.MujouInternalError):
        run.stop()
    assert not run.running
    assert not echo.stopped  # held in its update when Mujou failed: no more hooks, as on a worker


class InterruptsAtThird(Node):
    """Periodic: its third update interrupts the main thread and spins until the interrupt
    ends it."""

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        if self.count == 3:
            _thread.interrupt_main()
            for _ in range(10_000_000):  # the interrupt comes at the interpreter's next check
                pass


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupted_sleep_moves_the_virtual_time_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    """threads.host-interrupt, sched.virtual-deterministic: a KeyboardInterrupt in an update the
    host's thread runs in run.sleep ends the sleep at that instant; no worker moves the time on
    for the ended call. The host's thread giving the update back and leaving run.sleep are
    made far apart here (a pause after the give-back), so that a worker that ends the instant
    has all the time it needs to start the next one. Planted: the sleep's target kept after the
    interrupt (``_done()`` without ``interrupted``): the time had moved on to 0.04 as the
    sleep raised."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("interrupt_main reaches the main thread only")
    done = _lend.Lender._done

    def slow_done(self: _lend.Lender, *, interrupted: bool = False) -> None:
        done(self, interrupted=interrupted)
        if interrupted:
            time.sleep(0.05)

    monkeypatch.setattr(_lend.Lender, "_done", slow_done)
    node = InterruptsAtThird()
    with mujou.run(Bag(node=node), workers=1, timer=mujou.VirtualTimer()) as run:
        with pytest.raises(KeyboardInterrupt):
            run.sleep(1.0)
        assert node.count == 3 and run.time == pytest.approx(0.03)
        run.sleep(0.01)
        assert node.count == 4 and run.time == pytest.approx(0.04)


def answers(k: int, message: torch.Tensor) -> bool:
    return float(message) == k + 1


def test_each_write_starts_the_count_of_the_idle_workers_looks_again() -> None:
    """threads.host-runs-updates, NOTE [ writes that wake no worker ]: the host's writes wake
    workers again after a second of idle looks since the host's last write, not after a second
    of looks in all: the round trips the host runs itself leave the workers nothing to find.
    The one worker is held in a hook throughout (so the host runs every round trip), and each
    round trip comes after IDLE_LOOKS - 100 looks, made under the lock as an idle worker makes
    them. Planted: the write not starting the count again (no ``looks = 0`` in
    ``write_arrived``): after the second trip the writes woke workers again."""
    blocker, echo = Blocker(), Echo()
    with mujou.run(Bag(blocker=blocker, echo=echo), workers=1) as run:
        try:
            run.write(blocker.go, torch.zeros(1))
            assert blocker.inside.wait(HANG_GUARD)
            engine = run._engine
            lender = engine.lender
            assert lender is not None
            for k in range(3):
                run.write(echo.x, torch.full((1,), float(k)))
                run.wait_for(echo.y, partial(answers, k), timeout=HANG_GUARD)
                with engine.lock:
                    for _ in range(_lend.IDLE_LOOKS - 100):
                        lender.idle_look()
                assert lender.defers, f"the next write would wake workers, after round trip {k}"
            with engine.lock:
                for _ in range(101):
                    lender.idle_look()
            assert not lender.defers  # a second of looks since the last write: it stopped writing
        finally:
            blocker.release.set()


class Noting(Node):
    """Triggered by ``x``: sets ``ran`` once it has seen ``until``, sends ``x + 1``."""

    x = Input(optional=True)
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.until = -1.0
        self.ran = threading.Event()

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        if float(x) == self.until:
            self.ran.set()
        self.y.send(x + 1)


def test_an_idle_worker_finds_a_deferred_write_at_its_next_look() -> None:
    """NOTE [ a look that finds nothing ]: an idle worker whose timed wait runs out waits again
    without asking the policy only while nothing is queued; the node a deferred write queued
    is found at the next look, long before a second of looks would end the deferral.
    Planted: the loop not looking at the queue: the update ran only once IDLE_LOOKS looks
    had ended the deferral, and ``defers`` was False by then."""
    node = Noting()
    with mujou.run(Bag(node=node), workers=1) as run:
        lender = run._engine.lender
        assert lender is not None
        for k in range(100):  # until the host runs one itself (the woken worker may win at first)
            run.write(node.x, torch.full((1,), float(k)))
            run.wait_for(node.y, partial(answers, k), timeout=HANG_GUARD)
            if lender.defers:
                break
        assert lender.defers, "the host ran no update in 100 round trips"
        time.sleep(0.05)  # the worker woken as the writes began to defer parks again meanwhile
        node.until = 1000.0
        run.write(node.x, torch.full((1,), 1000.0))  # not waited for: a worker must run it
        assert node.ran.wait(HANG_GUARD), "the deferred write's update never ran"
        assert lender.defers, "the update ran only after the deferral ended"
