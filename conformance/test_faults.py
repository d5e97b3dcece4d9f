"""Regression tests for faults of the engine: freezes, overlapping hooks, dead threads, races.

Each test checks a defect of an earlier engine, through the public API only. The rules they
cite are on the pages "Running a net", "Threads and devices", "State" and "Node rules".

Waits that could hang run on host threads of their own, joined with a hang guard (HANG), so
that a freeze fails the test instead of hanging it; conftest.py fails any test after 60 s.
No test asserts on wall-clock durations.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import pytest
import torch
from _support import HANG_GUARD, Bag, HangError, Plain, hang_guard, vt

import mujou
from mujou import Node, Output

HANG = HANG_GUARD  # a guard against a hang (a bug), never a timing assertion

_T = TypeVar("_T")


class Host(Generic[_T]):
    """``fn`` called on a host thread of its own; ``outcome()`` joins it within HANG seconds."""

    def __init__(self, fn: Callable[[], _T], what: str) -> None:
        self.what = what
        self._value: list[_T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._body, args=(fn,), name=f"host: {what}", daemon=True)
        self._thread.start()

    def _body(self, fn: Callable[[], _T]) -> None:
        try:
            self._value.append(fn())
        except BaseException as exc:
            self._error.append(exc)

    def outcome(self) -> _T | BaseException:
        """What ``fn`` returned or raised; fails the test if it is still running after HANG s."""
        self._thread.join(HANG)
        assert not self._thread.is_alive(), f"hang guard: {self.what} did not return within {HANG} s"
        return self._error[0] if self._error else self._value[0]

    def result(self) -> _T:
        """What ``fn`` returned; re-raises what it raised."""
        self.outcome()
        if self._error:
            raise self._error[0]
        return self._value[0]


def guarded(fn: Callable[[], _T], what: str) -> _T:
    """``fn()`` on a host thread: its result, or its exception; fails instead of hanging."""
    return Host(fn, what).result()


def at_once(*calls: tuple[Callable[[], object], str]) -> list[object]:
    """Each ``(fn, what)`` on a host thread of its own, all let go at once; what each returned
    or raised."""
    barrier = threading.Barrier(len(calls))

    def after_barrier(fn: Callable[[], object]) -> Callable[[], object]:
        def body() -> object:
            barrier.wait(HANG)
            return fn()

        return body

    hosts = [Host(after_barrier(fn), what) for fn, what in calls]
    return [host.outcome() for host in hosts]


# --- test 1: no freeze with the lock held ------------------------------------------------------


class Sleepy(Node):
    """Sleeps 1 to 4 ms in each update, a seeded random amount that varies by node and update."""

    def __init__(self, seed: int) -> None:
        super().__init__(period=0.01, seed=seed)
        self.rng = random.Random(seed)

    def on_update(self, dt: float) -> None:
        time.sleep(self.rng.uniform(0.001, 0.004))


def sleep_then_stop(run: mujou.Run) -> None:
    run.sleep(0.5)
    run.stop()


@pytest.mark.rule("threads.earliest-due-first", "run.stop")
def test_busy_workers_do_not_freeze() -> None:
    """Ten nodes that sleep in their updates, on five workers: the run goes on and stops."""
    for trial in range(3):
        run = mujou.run(Bag(**{f"n{i}": Sleepy(seed=100 * trial + i) for i in range(10)}), workers=5)
        guarded(functools.partial(sleep_then_stop, run), "run.sleep(0.5) then run.stop()")
        assert not run.running


# --- test 2: state_dict never overlaps another hook of its node -------------------------------


class Watched(Node):
    """Records, in the shared ``overlaps``, any of its hooks that begins while another runs.

    Recorded, not raised: raising in state_dict would be a hook failure of its own. Its first
    update waits for ``hold_update`` and its on_stop for ``hold_stop``, where given.
    """

    out = Output()
    # The test's events, lock and records are not the node's state.
    state_exclude: ClassVar[tuple[str, ...]] = (
        "hold_update",
        "hold_stop",
        "overlaps",
        "updating",
        "_lock",
        "_running",
    )

    def __init__(
        self,
        overlaps: list[str],
        *,
        dedicated: bool = False,
        fail_at: int = 0,
        stop_hold: float = 0.001,
        hold_update: threading.Event | None = None,
        hold_stop: threading.Event | None = None,
    ) -> None:
        super().__init__(period=0.01, seed=0, dedicated_thread=dedicated)
        self.stop_hold = stop_hold
        self.hold_update = hold_update
        self.hold_stop = hold_stop
        self.overlaps = overlaps
        self.fail_at = fail_at
        self.updates = 0
        self.stops = 0
        self.updating = threading.Event()  # set when an update begins
        self._lock = threading.Lock()
        self._running: list[str] = []

    @contextlib.contextmanager
    def _inside(self, hook: str, hold: float = 0.0005) -> Iterator[None]:
        with self._lock:
            if self._running:
                self.overlaps.append(f"{self.name}: {hook} began while {self._running} ran")
            self._running.append(hook)
        try:
            if hold:
                time.sleep(hold)  # widen the window an overlap needs
            yield
        finally:
            with self._lock:
                self._running.remove(hook)

    def on_update(self, dt: float) -> None:
        with self._inside("on_update", hold=0.003):  # the host often waits for an update
            self.updating.set()
            self.updates += 1
            if self.updates == 1 and self.hold_update is not None:
                assert self.hold_update.wait(HANG)
            if self.updates == self.fail_at:
                raise ValueError("boom")

    def on_stop(self) -> None:
        with self._inside("on_stop", hold=self.stop_hold):
            self.stops += 1
            if self.hold_stop is not None:
                assert self.hold_stop.wait(HANG)

    def state_dict(self) -> dict[str, Any]:
        with self._inside("state_dict", hold=0.002):
            return super().state_dict()


def check_hooks(net: Bag, overlaps: list[str]) -> None:
    """After the run: no hook of a node overlapped another, and each node's on_stop ran once."""
    assert not overlaps
    stops = {node.name: node.stops for node in net.nodes() if isinstance(node, Watched)}
    assert stops == dict.fromkeys(stops, 1), f"on_stop calls per node: {stops}"


def check_state(outcome: object, failing: str | None) -> None:
    """A state_dict() call returned a tree, or raised the HookError of ``failing``'s on_update."""
    if isinstance(outcome, mujou.HookError):
        assert (outcome.node, outcome.hook) == (failing, "on_update"), repr(outcome)
    else:
        assert isinstance(outcome, dict), repr(outcome)


@pytest.mark.rule("threads.hooks-exclusive", "state.consistent-snapshot", "run.state-after-error")
@pytest.mark.parametrize("how", ["hook-fails", "host-stops"])
@pytest.mark.parametrize("on_own", [False, True], ids=["workers", "dedicated"])
@pytest.mark.parametrize("virtual", [False, True], ids=["realtime", "virtual"])
def test_state_dict_while_the_run_ends(virtual: bool, on_own: bool, how: str) -> None:
    """The host asks for the state while c updates, and the run ends meanwhile (c's update
    fails, or another host thread stops the run): that call and the calls after the end return
    a tree or raise the run's HookError, no hook of a node overlaps another, and each node's
    on_stop runs once.

    The sleeps only make that order likely; any order must pass. A worker node a is held in its
    on_stop; a dedicated one stops at once, so that its thread may end first.
    """
    failing = "c" if how == "hook-fails" else None
    for _ in range(3):
        overlaps: list[str] = []
        let_update, let_stop = threading.Event(), threading.Event()
        a = Watched(overlaps, dedicated=on_own, stop_hold=0.0, hold_stop=None if on_own else let_stop)
        c = Watched(overlaps, dedicated=on_own, fail_at=1 if failing else 0, hold_update=let_update)
        net = Bag(a=a, b=Watched(overlaps, dedicated=on_own), c=c)
        run = mujou.run(net, workers=2, timer=vt() if virtual else None)
        joiner = Host(run.join, "run.join()")  # under the virtual timer, it moves the time
        assert c.updating.wait(HANG)
        taker = Host(run.state_dict, "run.state_dict() while c updates")
        time.sleep(0.05)
        stopper = None if failing else Host(run.stop, "run.stop() from another host thread")
        time.sleep(0.05)
        let_update.set()
        time.sleep(0.05)
        let_stop.set()
        check_state(taker.outcome(), failing)
        ended = joiner.outcome()
        assert isinstance(ended, mujou.HookError) if failing else ended is None, repr(ended)
        if stopper is not None:
            stopper.result()
        for _ in range(3):
            check_state(Host(run.state_dict, "run.state_dict() after the end").outcome(), failing)
        if failing:
            with pytest.raises(mujou.HookError):
                guarded(run.stop, "run.stop()")
        check_hooks(net, overlaps)


@pytest.mark.rule("threads.hooks-exclusive", "state.consistent-snapshot")
def test_state_dict_from_two_host_threads_at_once() -> None:
    """Two host threads call run.state_dict() at the same moment, many times: each gets a
    tree, and no node's state_dict runs twice at once."""
    overlaps: list[str] = []
    net = Bag(**{name: Watched(overlaps, dedicated=name == "c") for name in "abc"})
    run = mujou.run(net, workers=2)
    for _ in range(36):
        trees = at_once((run.state_dict, "run.state_dict()"), (run.state_dict, "run.state_dict()"))
        assert all(isinstance(tree, dict) for tree in trees), trees
    guarded(run.stop, "run.stop()")
    check_hooks(net, overlaps)


# --- test 3: an exception whose str() raises ---------------------------------------------------


class WeirdError(Exception):
    """An exception that cannot be turned into a string."""

    def __str__(self) -> str:
        raise ValueError("no str")


class WeirdIn(Node):
    """Raises WeirdError in the hook named ``hook``."""

    def __init__(self, hook: str, *, dedicated: bool = False) -> None:
        super().__init__(period=0.1, seed=0, dedicated_thread=dedicated)
        self.hook = hook

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook:
            raise WeirdError

    def on_start(self) -> None:
        self._maybe_raise("on_start")

    def on_update(self, dt: float) -> None:
        self._maybe_raise("on_update")

    def state_dict(self) -> dict[str, Any]:
        self._maybe_raise("state_dict")
        return super().state_dict()


def check_weird(error: object, hook: str) -> None:
    assert isinstance(error, mujou.HookError), repr(error)
    assert isinstance(error.__cause__, WeirdError)
    assert (error.node, error.hook) == ("bad", hook)
    assert "bad" in str(error)


@pytest.mark.rule("run.hook-error", "run.internal-error")
@pytest.mark.parametrize(
    ("hook", "dedicated"),
    [
        ("on_start", False),
        ("on_start", True),
        ("on_update", False),
        ("on_update", True),
        ("state_dict", False),
        ("state_dict", True),
    ],
)
def test_an_exception_without_str_stops_the_run(hook: str, dedicated: bool) -> None:
    """A hook raises an exception whose str() raises: the host gets HookError, nothing hangs."""
    net = Bag(ok=Plain(), bad=WeirdIn(hook, dedicated=dedicated))
    if hook == "on_start":
        check_weird(Host(lambda: mujou.run(net, timer=vt()), "mujou.run").outcome(), hook)
        return
    run = mujou.run(net, timer=vt())
    if hook == "on_update":
        check_weird(Host(lambda: run.sleep(1.0), "run.sleep(1.0)").outcome(), hook)
    else:
        check_weird(Host(run.state_dict, "run.state_dict()").outcome(), hook)
    check_weird(Host(run.stop, "run.stop()").outcome(), hook)
    assert not run.running


# --- test 4: a second run racing the first -----------------------------------------------------


class CountsStarts(Node):
    """Appends its name to ``starts`` in each on_start."""

    def __init__(self, starts: list[str]) -> None:
        super().__init__(period=0.1, seed=0)
        self.starts = starts

    def on_start(self) -> None:
        self.starts.append(self.name)


@pytest.mark.rule("run.one-run-per-net")
def test_two_runs_of_one_net_started_at_once() -> None:
    """Two threads start a run of one net at the same moment: one run starts, the other
    raises RuntimeError, and each node started once."""
    for _ in range(30):
        starts: list[str] = []
        net = Bag(**{f"n{i}": CountsStarts(starts) for i in range(4)})
        start = functools.partial(mujou.run, net, timer=vt())
        outcomes = at_once((start, "mujou.run"), (start, "mujou.run"))
        runs = [outcome for outcome in outcomes if isinstance(outcome, mujou.Run)]
        for run in runs:
            guarded(run.stop, "run.stop()")
        errors = [outcome for outcome in outcomes if not isinstance(outcome, mujou.Run)]
        assert len(runs) == 1, f"{len(runs)} runs started"
        assert type(errors[0]) is RuntimeError, repr(errors[0])
        assert sorted(starts) == [f"n{i}" for i in range(4)]


# --- test 5: a program that ends without stopping its run ---------------------------------------


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter that imports this mujou; it must exit by itself."""
    root = Path(mujou.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            timeout=50,  # under the 60 s guard of the test: a process that does not exit
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the program did not exit: {exc}")


_PRELUDE = """
    import os
    import time
    import torch
    import mujou
    from mujou import Net, Node, Output
    torch.set_num_threads(1)

    class Marked(Node):
        out = Output()
        def __init__(self, *, dedicated=False, fail=False):
            super().__init__(period=0.01, seed=0, dedicated_thread=dedicated)
            self.fail = fail
        def on_update(self, dt):
            if self.fail:
                raise ValueError("boom")
        def on_stop(self):
            os.write(1, f"on_stop {self.name}\\n".encode())  # one write: no interleaving

    class Pair(Net):
        def __init__(self, fail=False):
            super().__init__()
            self.a = Marked(fail=fail)
            self.b = Marked(dedicated=True)
"""


@pytest.mark.rule("run.exit-stops")
def test_a_program_that_exits_without_stopping_stops_its_run() -> None:
    """At exit, every started node's on_stop runs, and the process exits."""
    done = run_script(
        _PRELUDE
        + """
    run = mujou.run(Pair(), workers=1)
    run.sleep(0.05)
    os.write(1, b"exiting\\n")
    """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:1] == ["exiting"], done.stdout
    assert sorted(lines[1:]) == ["on_stop a", "on_stop b"], done.stdout


@pytest.mark.rule("run.exit-stops")
def test_a_failure_nobody_asked_about_is_reported_at_exit() -> None:
    """A hook fails while the host only reads ports, then the program exits: stderr names
    the HookError, its node and its hook."""
    done = run_script(
        _PRELUDE
        + """
    net = Pair(fail=True)
    run = mujou.run(net, workers=1)
    deadline = time.monotonic() + 20.0
    while run.running and time.monotonic() < deadline:
        run.read(net.a.out)
        time.sleep(0.01)
    os.write(1, b"exiting\\n")
    """
    )
    assert "HookError" in done.stderr, done.stderr
    assert "'a'" in done.stderr and "on_update" in done.stderr, done.stderr
    assert "on_stop a" in done.stdout and "on_stop b" in done.stdout


# --- test 6: a subscription after a failure, and under the virtual timer -----------------------


class FailsWhenTold(Node):
    """Fails in the first update after ``go`` is set."""

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.go = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.go.is_set():
            raise ValueError("boom")


class Quiet(Node):
    """Sends nothing."""

    out = Output()


@pytest.mark.rule("run.subscribe")
def test_subscription_get_raises_the_runs_hook_error() -> None:
    """A node fails while the host waits in get() on an empty subscription: get() raises the
    run's HookError, then and after."""
    quiet, bad = Quiet(), FailsWhenTold()
    run = mujou.run(Bag(quiet=quiet, bad=bad), workers=1)
    subscription = run.subscribe(quiet.out)
    bad.go.set()
    for _ in range(2):
        with pytest.raises(mujou.HookError) as caught:
            subscription.get(timeout=HANG)
        assert caught.value.node == "bad"
    with pytest.raises(mujou.HookError):
        guarded(run.stop, "run.stop()")


class Counter(Node):
    """Sends its update count."""

    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.tensor([float(self.count)]))


@pytest.mark.rule("run.subscribe")
def test_subscription_get_under_the_virtual_timer_does_not_wait() -> None:
    """Under the virtual timer nothing arrives while the host waits in get(): with nothing
    waiting, get() raises RuntimeError at once, naming what to do instead."""
    counter = Counter()
    with mujou.run(Bag(counter=counter), timer=vt()) as run, run.subscribe(counter.out) as subscription:
        for get in (lambda: subscription.get(timeout=5.0), subscription.get):
            error = Host(get, "subscription.get()").outcome()
            assert type(error) is RuntimeError, repr(error)
            assert "drain" in str(error) or "wait_for" in str(error), str(error)
        run.sleep(0.025)  # two updates, at 0.01 and 0.02
        assert subscription.get().tolist() == [1.0]
        assert subscription.get(timeout=5.0).tolist() == [2.0]


# --- test 7: an interrupt while the host waits -------------------------------------------------


class Interrupter(Node):
    """Interrupts the main thread once, in its tenth update after ``armed`` is set (t ≈ 1.0)."""

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)
        self.armed = threading.Event()
        self.updates = 0

    def on_update(self, dt: float) -> None:
        if self.armed.is_set():
            self.updates += 1
            if self.updates == 10:
                _thread.interrupt_main()


@pytest.mark.rule("run.interrupt")
@pytest.mark.usefixtures("sigint_raises")
def test_interrupt_while_the_host_sleeps_under_the_virtual_timer() -> None:
    """The host gets KeyboardInterrupt in run.sleep(3600) without the hour being run first."""
    interrupter = Interrupter()
    interrupter.armed.set()
    run = mujou.run(Bag(interrupter=interrupter), timer=vt())
    with pytest.raises(KeyboardInterrupt):
        run.sleep(3600.0)
    assert run.time < 3600.0
    guarded(run.stop, "run.stop()")


@pytest.mark.rule("run.interrupt")
@pytest.mark.usefixtures("sigint_raises")
def test_interrupt_while_the_host_joins() -> None:
    """The host gets KeyboardInterrupt in run.join() (real-time timer, no timeout)."""
    interrupter = Interrupter()
    run = mujou.run(Bag(interrupter=interrupter), workers=1)
    caught = threading.Event()
    watchdog_stopped: list[bool] = []

    def watchdog() -> None:  # ends the join if the interrupt never does, so that the test fails
        if not caught.wait(HANG):
            watchdog_stopped.append(True)
            run.stop()

    watcher = threading.Thread(target=watchdog, name="watchdog", daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        interrupter.armed.set()
        run.join()
    caught.set()
    assert not watchdog_stopped, "run.join() went on waiting after the interrupt"
    guarded(run.stop, "run.stop()")
    watcher.join(HANG)
    assert not watcher.is_alive()


# --- test 8: warnings flushed by two host threads at once --------------------------------------


class Flipper(Node):
    """Returns from on_start with grad mode flipped: one LeakedSettingWarning each."""

    out = Output()

    def on_start(self) -> None:
        torch.set_grad_enabled(not torch.is_grad_enabled())


def flush_from_two_threads(nodes: int) -> list[str]:
    """Start ``nodes`` flippers, then flush their warnings from two host threads at once, with
    thread switches as frequent as can be; return the LeakedSettingWarning messages issued."""
    flippers = [Flipper() for _ in range(nodes)]
    issued: list[str] = []

    def record(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        if issubclass(category, mujou.LeakedSettingWarning):
            issued.append(str(message))
        time.sleep(0)  # let the other host thread in: the flush must not rely on the GIL

    switch = sys.getswitchinterval()
    with warnings.catch_warnings():  # set here, seen by every thread: they share the filters
        warnings.simplefilter("always")
        warnings.showwarning = record
        run = mujou.run(Bag(**{f"n{i}": node for i, node in enumerate(flippers)}), timer=vt(), workers=2)
        sys.setswitchinterval(1e-6)
        try:
            outcomes = at_once(
                (functools.partial(run.read, flippers[0].out), "run.read()"), (run.stats, "run.stats()")
            )
        finally:
            sys.setswitchinterval(switch)
        guarded(run.stop, "run.stop()")
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert not errors, errors
    return issued


@pytest.mark.rule("rules.warnings-on-host")
def test_two_host_threads_flush_the_warnings_once() -> None:
    """Two host threads call run.read() and run.stats() at once while 200 warnings wait: no
    call fails, and each warning is issued once in all."""
    for _ in range(3):
        issued = flush_from_two_threads(200)
        assert len(issued) == 200
        assert len(set(issued)) == 200


# --- test 9: HookError.time of a job hook ------------------------------------------------------


class SlowFailingState(Node):
    """Its state_dict notes run.time, sleeps 50 ms (50 s of a scale-1000 timer), then raises."""

    def __init__(self) -> None:
        super().__init__(period=1000.0, seed=0)
        self.run: mujou.Run | None = None
        self.began: list[float] = []

    def state_dict(self) -> dict[str, Any]:
        assert self.run is not None
        self.began.append(self.run.time)
        time.sleep(0.05)
        raise ValueError("boom")


@pytest.mark.rule("run.hook-error")
def test_hook_error_time_of_state_dict_is_when_it_started() -> None:
    """HookError.time of a failing state_dict is the time it started, not when it raised."""
    slow = SlowFailingState()
    run = mujou.run(Bag(slow=slow), workers=1, timer=mujou.RealTimeTimer(scale=1000.0))
    slow.run = run
    before = run.time
    with pytest.raises(mujou.HookError) as caught:
        guarded(run.state_dict, "run.state_dict()")
    began = slow.began[0]
    assert caught.value.hook == "state_dict"
    # before <= start <= began (the hook read the time after it started) < began + 50 <= end
    assert before <= caught.value.time <= began, (before, caught.value.time, began)
    with pytest.raises(mujou.HookError):
        guarded(run.stop, "run.stop()")


# --- the suite's hang guard --------------------------------------------------------------------


def test_the_hang_guard_fails_a_hung_test(capsys: pytest.CaptureFixture[str]) -> None:
    """A wait that never ends is interrupted by HangError, with every thread's stack printed;
    the test's own guard is re-armed afterwards."""
    if not hasattr(signal, "SIGALRM"):
        pytest.skip("no SIGALRM here: the hang guard does nothing")
    outer = signal.getitimer(signal.ITIMER_REAL)[0]
    assert outer > 0, "conftest.py arms a guard for every test"
    with pytest.raises(HangError, match="hang guard"), hang_guard(0.05):
        threading.Event().wait()
    assert "test_the_hang_guard_fails_a_hung_test" in capsys.readouterr().err
    assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= outer
