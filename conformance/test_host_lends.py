"""Conformance tests for the host's thread running due updates while it waits
(spec/en/threads-and-devices.md, "The host's thread"): rules ``threads.host-*``.

No assertion on timing: the run's one worker is held in a hook of another node (``Blocker``)
until the test releases it, so a due update of a worker node can only run on the host's
thread, in a call of the run in which the host waits, or not at all.
"""

from __future__ import annotations

import _thread
import contextlib
import threading
from collections.abc import Callable, Iterator
from functools import partial

import pytest
import torch
from _support import HANG_GUARD, Bag, Blocker, hang_guard, vt

import mujou
from mujou import Input, Node, Output


class Echo(Node):
    """Triggered by ``x``: notes the thread it runs on and its grad mode, calls ``action``,
    and sends ``x + 1``."""

    x = Input(optional=True)
    y = Output()

    def __init__(self, *, dedicated: bool = False) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0, dedicated_thread=dedicated)
        self.seen: list[tuple[threading.Thread, bool]] = []
        self.action: Callable[[], None] | None = None
        self.started_on: threading.Thread | None = None

    def on_start(self) -> None:
        self.started_on = threading.current_thread()

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.seen.append((threading.current_thread(), torch.is_grad_enabled()))
        if self.action is not None:
            self.action()
        self.y.send(x + 1)


@contextlib.contextmanager
def busy_worker(echo: Echo) -> Iterator[tuple[mujou.Run, Blocker]]:
    """A real-time run of ``echo`` whose one worker is held by a ``Blocker`` throughout."""
    blocker = Blocker()
    with hang_guard(HANG_GUARD), mujou.run(Bag(blocker=blocker, echo=echo), workers=1) as run:
        try:
            run.write(blocker.go, torch.zeros(1))
            assert blocker.inside.wait(HANG_GUARD), "the blocker never started"
            yield run, blocker
        finally:
            blocker.release.set()


def value(message: torch.Tensor) -> float:
    return float(message.reshape(-1)[0])


def answers(k: int, message: torch.Tensor) -> bool:
    return value(message) == k + 1


def sleep_refused(run: mujou.Run, refused: list[str]) -> Callable[[], None]:
    """A hook's action: call ``run.sleep``, which a hook may not, and keep the refusal."""

    def wait_in_the_hook() -> None:
        try:
            run.sleep(0.0)
        except RuntimeError as exc:
            refused.append(str(exc))

    return wait_in_the_hook


@pytest.mark.rule("threads.host-runs-updates")
@pytest.mark.rule("threads.host-thread")
def test_the_waiting_host_runs_a_due_update_itself_in_each_call_that_waits() -> None:
    """wait_for, Subscription.get and sleep each run the echo on the host's own thread, where
    the run's calls that wait refuse it as from any hook."""
    echo = Echo()
    host = threading.current_thread()
    refused: list[str] = []
    with busy_worker(echo) as (run, _):
        echo.action = sleep_refused(run, refused)
        run.write(echo.x, torch.tensor([1.0]))
        assert value(run.wait_for(echo.y, timeout=HANG_GUARD)) == 2.0
        echo.action = None
        with run.subscribe(echo.y) as subscription:
            run.write(echo.x, torch.tensor([2.0]))
            assert value(subscription.get(timeout=HANG_GUARD)) == 3.0
        run.write(echo.x, torch.tensor([3.0]))
        run.sleep(0.1)  # its writes wake no worker now: sleep runs the update too
        latest = run.read(echo.y)
        assert latest is not None and value(latest) == 4.0
    assert [thread for thread, _ in echo.seen] == [host] * 3
    assert echo.started_on is not None and echo.started_on.name == "mujou-worker-0"  # no job on the host
    assert refused and refused[0].startswith("run.sleep() cannot be called from a hook of node 'echo'")


@pytest.mark.rule("threads.host-runs-updates")
def test_a_dedicated_node_runs_on_its_own_thread_while_the_host_waits() -> None:
    echo = Echo(dedicated=True)
    with busy_worker(echo) as (run, _):
        run.write(echo.x, torch.tensor([1.0]))
        assert value(run.wait_for(echo.y, timeout=HANG_GUARD)) == 2.0
    assert [thread.name for thread, _ in echo.seen] == ["mujou-node-echo"]


@pytest.mark.rule("threads.host-runs-updates")
@pytest.mark.rule("threads.host-thread")
def test_under_the_virtual_timer_the_host_runs_the_instants_updates() -> None:
    """With one worker, the updates of the instants that wait_for and sleep make run on the
    host's thread (no worker is woken for them), where the run's calls that wait refuse it."""
    echo = Echo()
    refused: list[str] = []
    with hang_guard(HANG_GUARD), mujou.run(Bag(echo=echo), workers=1, timer=vt()) as run:
        echo.action = sleep_refused(run, refused)
        for k in range(3):
            run.write(echo.x, torch.tensor([float(k)]))
            assert value(run.wait_for(echo.y, partial(answers, k))) == k + 1
        echo.action = None
        run.write(echo.x, torch.tensor([7.0]))
        run.sleep(0.01)
        latest = run.read(echo.y)
        assert latest is not None and value(latest) == 8.0
    assert [thread for thread, _ in echo.seen] == [threading.current_thread()] * 4
    assert echo.started_on is not None and echo.started_on.name == "mujou-worker-0"  # no job on the host
    assert len(refused) == 3 and refused[0].startswith(
        "run.sleep() cannot be called from a hook of node 'echo'"
    )


class Walker(Node):
    """Periodic: adds a step drawn from its generator to ``total`` and sends it; notes the
    thread of each update."""

    y = Output()

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.total = torch.zeros(3)
        self.threads: list[str] = []

    def on_update(self, dt: float) -> None:
        self.threads.append(threading.current_thread().name)
        self.total = self.total + torch.randn(3, generator=self.generator)
        self.y.send(self.total)


class Summer(Node):
    """Triggered by either input: adds what both hold now to ``total`` and sends it."""

    a = Input()
    b = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a", "b"), seed=0)
        self.total = torch.zeros(3)
        self.threads: list[str] = []

    def on_update(self, dt: float) -> None:
        self.threads.append(threading.current_thread().name)
        for port in (self.a, self.b):
            message = port.read()
            if message is not None:
                self.total = self.total + message
        self.y.send(self.total)


class Walk(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.a = Walker(0.003, 1)
        self.b = Walker(0.005, 2)
        self.s = Summer()
        self.connect(self.a.y, self.s.a)
        self.connect(self.b.y, self.s.b)


def walk(workers: int, *, no_grad: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Run a Walk 0.1 s of virtual time (half in sleeps, half in waits for the summer's
    messages), the host in ``torch.no_grad()`` when ``no_grad``: each node's total and the
    read of the summer's output, and the threads of every update."""
    net = Walk()
    with hang_guard(HANG_GUARD), mujou.run(net, workers=workers, timer=vt(), seed=5) as run:
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            for _ in range(5):
                run.sleep(0.01)
                before = run.time
                run.wait_for(net.s.y, lambda _: run.time >= before + 0.01)  # noqa: B023
            latest = run.read(net.s.y)
        tree = run.state_dict()
    assert latest is not None
    totals = {name: tree[name]["total"] for name in ("a", "b", "s")}
    return {**totals, "read": latest}, net.a.threads + net.b.threads + net.s.threads


@pytest.mark.rule("threads.host-runs-updates")
@pytest.mark.rule("sched.virtual-deterministic")
def test_under_the_virtual_timer_the_host_running_updates_changes_no_result() -> None:
    """The same totals and reads, bit for bit, when the host runs every update (one worker),
    when the workers run them all (the host in no_grad lends nothing), and with three workers."""
    lent, on_host = walk(1, no_grad=False)
    kept, on_workers = walk(1, no_grad=True)
    shared, _ = walk(3, no_grad=False)
    assert set(on_host) == {threading.current_thread().name}
    assert set(on_workers) == {"mujou-worker-0"}
    assert len(on_host) == len(on_workers) > 50
    for name, tensor in lent.items():
        assert torch.equal(tensor, kept[name]), name
        assert torch.equal(tensor, shared[name]), name


@pytest.mark.rule("threads.host-thread-settings")
def test_the_host_in_no_grad_leaves_the_update_to_a_worker() -> None:
    """A host thread with grad mode off runs no update: the echo waits for the worker and sees
    grad mode on there."""
    echo = Echo()
    with busy_worker(echo) as (run, blocker):
        run.write(echo.x, torch.tensor([1.0]))
        with torch.no_grad():
            with pytest.raises(TimeoutError):
                run.wait_for(echo.y, timeout=0.1)  # nobody may run it meanwhile
            assert echo.seen == []
            blocker.release.set()
            assert value(run.wait_for(echo.y, timeout=HANG_GUARD)) == 2.0
    assert [(thread.name, grad) for thread, grad in echo.seen] == [("mujou-worker-0", True)]


@pytest.mark.rule("threads.host-thread-settings")
def test_grad_mode_a_hook_leaves_off_does_not_reach_the_host() -> None:
    echo = Echo()

    def leak() -> None:  # the hook never sets it back
        torch.set_grad_enabled(False)

    echo.action = leak
    with busy_worker(echo) as (run, _):
        run.write(echo.x, torch.tensor([1.0]))
        assert value(run.wait_for(echo.y, timeout=HANG_GUARD)) == 2.0
        assert torch.is_grad_enabled()
        with pytest.warns(
            mujou.LeakedSettingWarning, match=r"^node 'echo' returned from on_update with grad mode"
        ):
            run.read(echo.y)
    assert [thread for thread, _ in echo.seen] == [threading.current_thread()]


@pytest.mark.rule("threads.host-interrupt")
@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_of_the_host_in_an_update_it_runs_is_the_hosts() -> None:
    """KeyboardInterrupt in the update the host runs ends that update and leaves the host's
    call; the run goes on, with no error, and the next update runs."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("interrupt_main reaches the main thread only")
    echo = Echo()
    reached: list[str] = []

    def interrupted() -> None:
        echo.action = None
        _thread.interrupt_main()
        for _ in range(100_000):  # the interrupt comes at the next check of the interpreter
            pass
        reached.append("after the interrupt")

    echo.action = interrupted
    with busy_worker(echo) as (run, _):
        run.write(echo.x, torch.tensor([1.0]))
        with pytest.raises(KeyboardInterrupt):
            run.wait_for(echo.y, timeout=HANG_GUARD)
        assert run.running and reached == []
        run.write(echo.x, torch.tensor([5.0]))
        assert value(run.wait_for(echo.y, timeout=HANG_GUARD)) == 6.0
    assert [thread for thread, _ in echo.seen] == [threading.current_thread()] * 2


class Interrupting(Node):
    """Periodic: at its third update, interrupts the main thread (once) and notes whether the
    update went on after it; notes the thread of each update."""

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.count = 0
        self.reached: list[int] = []
        self.threads: list[threading.Thread] = []

    def on_update(self, dt: float) -> None:
        self.threads.append(threading.current_thread())
        self.count += 1
        if self.count == 3:
            _thread.interrupt_main()
            for _ in range(100_000):  # the interrupt comes at the next check of the interpreter
                pass
            self.reached.append(self.count)


@pytest.mark.rule("threads.host-interrupt")
@pytest.mark.usefixtures("sigint_raises")
def test_under_the_virtual_timer_an_interrupt_in_an_update_the_host_runs_is_the_hosts() -> None:
    """The host's thread runs the instants of run.sleep (one worker): a KeyboardInterrupt in
    an update there ends it and leaves run.sleep, the time at that update's instant; the run
    goes on, with no error. (On a 16-core machine the time had moved on to 0.04, and the node
    updated a fourth time, once in two runs: a worker that ended the instant went on with the
    sleep's; tests/test_lend.py widens that window.)"""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("interrupt_main reaches the main thread only")
    node = Interrupting()
    with hang_guard(HANG_GUARD), mujou.run(Bag(node=node), workers=1, timer=vt()) as run:
        with pytest.raises(KeyboardInterrupt):
            run.sleep(1.0)
        assert run.running and node.reached == [] and node.count == 3
        assert run.time == pytest.approx(0.03)
        run.sleep(0.1)
        assert node.count >= 10
    assert node.threads[:3] == [threading.current_thread()] * 3


@pytest.mark.rule("threads.host-runs-updates")
def test_a_write_the_host_does_not_wait_for_still_runs_on_a_worker() -> None:
    """After round trips the host ran itself (its writes then wake no worker), a write it does
    not wait for runs on the worker all the same, while the host waits outside the run."""
    echo = Echo()
    ran = threading.Event()
    with busy_worker(echo) as (run, blocker):
        for k in range(3):
            run.write(echo.x, torch.tensor([float(k)]))
            assert value(run.wait_for(echo.y, partial(answers, k), timeout=HANG_GUARD)) == k + 1
        blocker.release.set()
        run.sleep(0.05)  # the worker is most likely idle again by then (either way it must run it)
        echo.action = ran.set
        run.write(echo.x, torch.tensor([9.0]))
        assert ran.wait(HANG_GUARD), "the update of the write never ran"
    host = threading.current_thread()
    assert [thread.name for thread, _ in echo.seen] == [host.name] * 3 + ["mujou-worker-0"]


class Saturating(Node):
    """Always due: each update takes twice its period (the host may run it meanwhile)."""

    def __init__(self) -> None:
        super().__init__(period=0.001, seed=0)

    def on_update(self, dt: float) -> None:
        threading.Event().wait(0.002)


@pytest.mark.rule("run.sleep")
@pytest.mark.rule("threads.host-runs-updates")
def test_a_sleep_ends_on_time_while_updates_are_always_due() -> None:
    """After a round trip the host ran (its writes then wake no worker, and it runs due updates
    in run.sleep too), it runs them only until the sleep's end: in a net whose updates are
    always due run.sleep still returns (after the update it runs, if any)."""
    echo = Echo()
    with hang_guard(HANG_GUARD), mujou.run(Bag(a=Saturating(), b=Saturating(), echo=echo), workers=1) as run:
        for k in range(20):  # the host's first look may find a Saturating update first
            run.write(echo.x, torch.tensor([float(k)]))
            run.wait_for(echo.y, partial(answers, k), timeout=HANG_GUARD)
            if threading.current_thread() in [thread for thread, _ in echo.seen]:
                break
        for _ in range(5):
            before = run.time
            run.sleep(0.01)
            assert run.time >= before + 0.01


@pytest.mark.rule("threads.host-runs-updates")
def test_a_host_that_only_sleeps_leaves_the_updates_to_the_workers() -> None:
    """Before any round trip the host ran itself, run.sleep runs no update: it waits for the
    busy worker."""
    echo = Echo()
    with busy_worker(echo) as (run, blocker):
        run.write(echo.x, torch.tensor([1.0]))
        run.sleep(0.05)
        assert echo.seen == []
        blocker.release.set()
        run.wait_for(echo.y, timeout=HANG_GUARD)
