"""Conformance tests for the page "Running a net" (spec/en/running.md).

Rules: ``run.*`` (mujou.run, the Run handle, errors, stopping) and ``timers.*``.

No test asserts on wall-clock durations. Scheduling arithmetic uses ``mujou.VirtualTimer()``;
under the real-time timer, tests order events with ``threading.Event`` (each wait bounded by a
hang guard, never used as an assertion) and only assert relations that hold however slow the
machine is (e.g. a timer interval nested inside a measured real interval).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest
import torch
from _support import HANG_GUARD, Bag

import mujou
from mujou import Input, Net, Node, Output

# A guard against a hang (a bug), never a timing assertion.
HANG = 30.0


def wait_event(event: threading.Event, what: str) -> None:
    """Wait for ``event``; fail the test (instead of hanging) if it never comes."""
    assert event.wait(HANG), f"hang guard: {what} did not happen within {HANG} s"


class Log:
    """A thread-safe list of (node, event) records, shared by the nodes of a test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[tuple[str, str]] = []

    def add(self, node: str, event: str) -> None:
        with self._lock:
            self.records.append((node, event))

    def events(self, event: str) -> list[str]:
        with self._lock:
            return [n for n, e in self.records if e == event]

    def snapshot(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.records)


def is_running(run: mujou.Run) -> bool:
    """run.running, read through a call (so the type checker does not narrow it)."""
    return run.running


def new_threads(before: set[threading.Thread]) -> list[str]:
    """The names of the live threads that were not alive in ``before``."""
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


# --- nodes ----------------------------------------------------------------------------------


class Ticker(Node):
    """Sends its update count k (1, 2, ...) as a float64 tensor [k]; logs its hooks."""

    out = Output()
    state_exclude: ClassVar[tuple[str, ...]] = ("log", "first_update", "stopped")  # the test's, not state

    def __init__(self, period: float = 0.25, *, log: Log | None = None, tag: str = "") -> None:
        super().__init__(period=period, seed=0)
        self.count = torch.zeros((), dtype=torch.int64)
        self.dts: list[float] = []
        self.log = log
        self.tag = tag
        self.first_update = threading.Event()
        self.stopped = threading.Event()

    def _log(self, event: str) -> None:
        if self.log is not None:
            self.log.add(self.tag, event)

    def on_start(self) -> None:
        self._log("start")

    def on_update(self, dt: float) -> None:
        self._log("update")
        self.dts.append(dt)
        self.count += 1
        self.out.send(self.count.to(torch.float64).reshape(1))
        self.first_update.set()

    def on_stop(self) -> None:
        self._log("stop")
        self.stopped.set()


class Reader(Node):
    """Records what it reads on ``x`` at each update (None, or the message's first value)."""

    x = Input(optional=True)
    state_exclude: ClassVar[tuple[str, ...]] = ("log",)  # the test's, not state

    def __init__(self, period: float = 0.25, *, log: Log | None = None, tag: str = "") -> None:
        super().__init__(period=period, seed=0)
        self.seen: list[float | None] = []
        self.log = log
        self.tag = tag

    def on_start(self) -> None:
        if self.log is not None:
            self.log.add(self.tag, "start")

    def on_update(self, dt: float) -> None:
        if self.log is not None:
            self.log.add(self.tag, "update")
        m = self.x.read()
        self.seen.append(None if m is None else float(m.flatten()[0]))

    def on_stop(self) -> None:
        if self.log is not None:
            self.log.add(self.tag, "stop")


class Failing(Node):
    """Counts its updates and raises ValueError("boom") in the hook named by ``fail_in``."""

    state_exclude: ClassVar[tuple[str, ...]] = ("raised", "log", "stopped")  # the test's, not state

    def __init__(
        self,
        period: float = 0.25,
        *,
        fail_in: str = "on_update",
        fail_at: int = 1,
        log: Log | None = None,
        tag: str = "",
    ) -> None:
        super().__init__(period=period, seed=0)
        self.fail_in = fail_in
        self.fail_at = fail_at
        self.count = torch.zeros((), dtype=torch.int64)
        self.raised: list[BaseException] = []
        self.log = log
        self.tag = tag
        self.stopped = threading.Event()

    def _fail(self) -> None:
        exc = ValueError("boom")
        self.raised.append(exc)
        raise exc

    def on_start(self) -> None:
        if self.log is not None:
            self.log.add(self.tag, "start")
        if self.fail_in == "on_start":
            self._fail()
        if self.log is not None:
            self.log.add(self.tag, "started")

    def on_update(self, dt: float) -> None:
        if self.log is not None:
            self.log.add(self.tag, "update")
        self.count += 1
        if self.fail_in == "on_update" and int(self.count) == self.fail_at:
            self._fail()

    def on_stop(self) -> None:
        if self.log is not None:
            self.log.add(self.tag, "stop")
        self.stopped.set()
        if self.fail_in == "on_stop":
            self._fail()


class Blocker(Node):
    """Blocks in its first update until ``release`` is set; logs its hooks."""

    def __init__(self, period: float, *, log: Log, tag: str) -> None:
        super().__init__(period=period, seed=0)
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.log = log
        self.tag = tag
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.log.add(self.tag, "update")
        self.updates += 1
        if self.updates == 1:
            self.blocked.set()
            self.release.wait(HANG)
        self.log.add(self.tag, "update-end")

    def on_stop(self) -> None:
        self.log.add(self.tag, "stop")


# --- nets -----------------------------------------------------------------------------------


class TickNet(Net):
    """One ticker and one reader of it."""

    def __init__(self, period: float = 0.25, log: Log | None = None) -> None:
        super().__init__()
        self.tick = Ticker(period, log=log, tag="tick")
        self.reader = Reader(period, log=log, tag="reader")
        self.connect(self.tick.out, self.reader.x)


class HostFed(Net):
    """A reader whose optional input only the host writes."""

    def __init__(self, period: float = 0.25) -> None:
        super().__init__()
        self.reader = Reader(period, tag="reader")


class Inner(Net):
    def __init__(self, node: Node) -> None:
        super().__init__()
        self.b = node


class FailNet(Net):
    """'a.b' fails (in a sub-net), 'other' ticks, 'r' reads a host-fed input."""

    def __init__(self, failing: Failing, other_period: float = 0.3, log: Log | None = None) -> None:
        super().__init__()
        self.a = Inner(failing)
        self.other = Ticker(other_period, log=log, tag="other")
        self.r = Reader(other_period, log=log, tag="r")


# --- run.start ------------------------------------------------------------------------------


class SlowStart(Node):
    """on_start waits a little (real time) and notes when it returned."""

    x = Input(optional=True)
    # The test's log and records, not state.
    state_exclude: ClassVar[tuple[str, ...]] = ("log", "first_read", "start_returned_at")

    def __init__(self, log: Log, tag: str, period: float = 0.25) -> None:
        super().__init__(period=period, seed=0)
        self.log = log
        self.tag = tag
        self.start_returned_at = math.nan
        self.first_read: list[float | None] = []

    def on_start(self) -> None:
        time.sleep(0.05)  # makes a run that does not wait for on_start observable
        self.log.add(self.tag, "start")
        self.start_returned_at = time.monotonic()

    def on_update(self, dt: float) -> None:
        if not self.first_read:
            m = self.x.read()
            self.first_read.append(None if m is None else float(m[0]))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.log.add(self.tag, "load")
        super().load_state_dict(state)


class SlowNet(Net):
    def __init__(self, log: Log) -> None:
        super().__init__()
        self.a = SlowStart(log, "a")
        self.b = SlowStart(log, "b")
        self.c = SlowStart(log, "c")


@pytest.mark.rule("run.start")
def test_on_start_hooks_then_restore_then_inputs_complete_before_run_returns() -> None:
    """> all on_start hooks, then the restore (state=), then the first messages of `inputs=`,
    complete before the timer starts and before mujou.run returns."""
    log = Log()
    net = SlowNet(log)
    with mujou.run(net, timer=mujou.VirtualTimer(), inputs={net.a.x: torch.tensor([1.0])}) as run:
        assert sorted(log.events("start")) == ["a", "b", "c"], log.snapshot()
        assert run.time == 0.0
        run.sleep(0.5)
        assert net.a.first_read == [1.0]  # inputs= is there for the first update
        tree = run.state_dict()

    log2 = Log()
    net2 = SlowNet(log2)
    # The restored tree holds [1.0] as the latest message of a.x; inputs= comes after it.
    with mujou.run(
        net2, timer=mujou.VirtualTimer(), state=tree, inputs={net2.a.x: torch.tensor([2.0])}
    ) as run2:
        records = log2.snapshot()
        starts = [i for i, (_, e) in enumerate(records) if e == "start"]
        loads = [i for i, (_, e) in enumerate(records) if e == "load"]
        assert len(starts) == 3 and len(loads) == 3, records
        assert max(starts) < min(loads), f"every on_start must finish before the restore: {records}"
        assert run2.time == 0.5
        run2.sleep(0.25)
        assert net2.a.first_read == [2.0], "inputs= must be applied after the restore"


@pytest.mark.rule("run.start")
def test_real_timer_starts_after_on_start() -> None:
    """> all on_start hooks ... complete before the timer starts and before mujou.run returns.

    Causal check: the timer started no earlier than the end of the last on_start, so the timer
    time read later is at most the real time elapsed since that end (scale 1)."""
    log = Log()
    net = SlowNet(log)
    with mujou.run(net, workers=1) as run:
        assert sorted(log.events("start")) == ["a", "b", "c"], log.snapshot()
        last_start_end = max(n.start_returned_at for n in (net.a, net.b, net.c))
        r = run.time
        after = time.monotonic()
        assert 0.0 <= r <= after - last_start_end + 1e-6, (r, after - last_start_end)


# --- run.arguments --------------------------------------------------------------------------


@pytest.mark.rule("run.arguments")
@pytest.mark.parametrize(
    ("workers", "exc", "pattern"),
    [
        (0, ValueError, r"^workers must be a positive int or None, got 0$"),
        (-3, ValueError, r"^workers must be a positive int or None, got -3$"),
        (True, TypeError, r"^workers must be a positive int or None, got (bool: )?True$"),
        ("2", TypeError, r"^workers must be a positive int or None, got (str: )?'2'$"),
        (2.0, TypeError, r"^workers must be a positive int or None, got (float: )?2\.0$"),
    ],
)
def test_bad_workers(workers: object, exc: type[Exception], pattern: str) -> None:
    """> workers not None or an int (bool excluded) → TypeError; workers < 1 → ValueError
    ("workers must be a positive int or None, got 0"). Bad arguments raise at once and start
    nothing."""
    log = Log()
    net = TickNet(log=log)
    with pytest.raises(exc, match=pattern):
        mujou.run(net, workers=workers, timer=mujou.VirtualTimer())  # type: ignore[arg-type]
    assert log.snapshot() == [], "a rejected run must start nothing"
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:  # nothing is left active
        run.sleep(0.25)


@pytest.mark.rule("run.arguments")
def test_bad_net_and_timer() -> None:
    """> net not a Net → TypeError; ... timer not a Timer → TypeError."""
    with pytest.raises(TypeError, match=r"^net must be a mujou\.Net, got "):
        mujou.run(Ticker())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^net must be a mujou\.Net, got "):
        mujou.run(None)  # type: ignore[arg-type]
    log = Log()
    net = TickNet(log=log)
    with pytest.raises(
        TypeError, match=r"^timer must be mujou\.RealTimeTimer\(\) or mujou\.VirtualTimer\(\), got "
    ):
        mujou.run(net, timer="virtual")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^timer must be mujou\.RealTimeTimer\(\) or mujou\.VirtualTimer\(\), got "
    ):
        mujou.run(net, timer=mujou.VirtualTimer)  # type: ignore[arg-type]
    assert log.snapshot() == []


@pytest.mark.rule("run.arguments")
def test_bad_inputs() -> None:
    """> inputs keys not Input ports of the net or values not tensors → TypeError/ValueError."""
    log = Log()
    net = TickNet(log=log)
    stranger = HostFed()
    with pytest.raises(
        TypeError, match=r"^inputs keys must be the Input ports of nodes, got <Output 'tick\.out'>$"
    ):
        mujou.run(net, inputs={net.tick.out: torch.zeros(1)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"^input 'reader\.x' in inputs= is not a port of this net$"):
        mujou.run(net, inputs={stranger.reader.x: torch.zeros(1)})
    with pytest.raises(
        TypeError, match=r"^inputs\['reader\.x'\] takes a tensor, or a nest .*; got a set at the top$"
    ):
        mujou.run(stranger, inputs={stranger.reader.x: {1.0}})
    assert log.snapshot() == []


# --- run.context-manager --------------------------------------------------------------------


@pytest.mark.rule("run.context-manager")
def test_with_block_stops_the_run() -> None:
    """> A Run is a context manager: leaving the with block calls stop()."""
    log = Log()
    net = TickNet(log=log)
    run = mujou.run(net, timer=mujou.VirtualTimer())
    with run as entered:
        assert entered is run
        run.sleep(0.5)
        assert is_running(run)
    assert not is_running(run)
    assert sorted(log.events("stop")) == ["reader", "tick"]


@pytest.mark.rule("run.context-manager")
def test_with_block_exception_is_not_replaced() -> None:
    """> when the block is left by an exception, stop() does not replace that exception."""
    log = Log()
    net = TickNet(log=log)
    with pytest.raises(KeyError, match="mine"), mujou.run(net, timer=mujou.VirtualTimer()):
        raise KeyError("mine")
    assert sorted(log.events("stop")) == ["reader", "tick"]

    # Also when a hook failed: stop() would raise HookError, but the block's own error wins.
    failing = Failing(0.01)
    with pytest.raises(KeyError, match="mine"), mujou.run(FailNet(failing)):
        wait_event(failing.stopped, "the failing node's on_stop")
        raise KeyError("mine")


# --- run.read -------------------------------------------------------------------------------


@pytest.mark.rule("run.read")
def test_read_returns_host_owned_cpu_copy_during_and_after() -> None:
    """> `run.read(port)` returns the latest message of an Output or Input of the net as a CPU
    copy the host owns (or None); it works during the run and after it ended."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        assert run.read(net.tick.out) is None
        assert run.read(net.reader.x) is None
        run.sleep(0.8)
        m = run.read(net.tick.out)
        assert m is not None
        assert m.device.type == "cpu"
        assert m.tolist() == [3.0]
        m.add_(100)  # the host owns its copy
        assert run.read(net.tick.out) is not m
        assert run.read(net.tick.out).tolist() == [3.0]  # type: ignore[union-attr]
        x = run.read(net.reader.x)
        assert x is not None and x.tolist() == [3.0]
        run.sleep(0.25)
    after = run.read(net.tick.out)
    assert after is not None and after.tolist() == [4.0]
    assert run.read(net.reader.x).tolist() == [4.0]  # type: ignore[union-attr]


# --- run.write ------------------------------------------------------------------------------


@pytest.mark.rule("run.write")
def test_write_sets_latest_message_as_snapshot() -> None:
    """> `run.write(input, tensor)` sets the latest message of an input that has no source in
    the net; ... the message is a snapshot, visible as in the scheduling rules."""
    net = HostFed()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.25)
        value = torch.tensor([7.0])
        run.write(net.reader.x, value)
        value.fill_(-1.0)  # the host changes its tensor after write: the message must not change
        assert run.read(net.reader.x).tolist() == [7.0]  # type: ignore[union-attr]
        run.sleep(0.5)
    assert net.reader.seen == [None, 7.0, 7.0]


@pytest.mark.rule("run.write")
def test_write_to_connected_input_and_after_end() -> None:
    """> writing an input that has a source raises ValueError; ... writing after the run ended
    raises RuntimeError."""
    net = TickNet()
    with (
        mujou.run(net, timer=mujou.VirtualTimer()) as run,
        pytest.raises(
            ValueError,
            match=r"^input 'reader\.x' has the source 'tick\.out'; "
            r"the host writes only inputs without a source$",
        ),
    ):
        run.write(net.reader.x, torch.zeros(1))
    fed = HostFed()
    with mujou.run(fed, timer=mujou.VirtualTimer()) as run2:
        run2.write(fed.reader.x, torch.zeros(1))
    with pytest.raises(RuntimeError, match=r"^run\.write\(\): the run has ended$"):
        run2.write(fed.reader.x, torch.zeros(1))


class Storing(Node):
    """Keeps the storage address of each message its input reads (None when it has none)."""

    x: Input[Any] = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.addresses: list[int | None] = []

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        self.addresses.append(None if message is None else message.data_ptr())


class StoringNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.n = Storing()


@pytest.mark.rule("run.write-no-copy")
def test_a_write_without_copy_hands_the_tensor_over() -> None:
    """> `run.write(input, message, copy=False)` makes each tensor of the message that is
    > already on the input's node's device the message itself ...: a change in place fails the
    > next read of the input. ... A `copy` that is not a bool raises `TypeError`."""
    net = StoringNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        handed, copied = torch.arange(3.0), torch.arange(3.0)
        run.write(net.n.x, handed, copy=False)
        run.sleep(0.25)
        run.write(net.n.x, copied)
        run.sleep(0.25)
        nest: dict[str, Any] = {"a": torch.ones(2), "n": 3}
        run.write(net.n.x, nest, copy=False)
        assert run.read(net.n.x)["a"].tolist() == [1.0, 1.0]  # type: ignore[index]
        with pytest.raises(TypeError, match=r"^run\.write\(\): copy must be a bool, got int: 0$"):
            run.write(net.n.x, handed, copy=0)  # type: ignore[arg-type]
        nest["a"].add_(1.0)  # the host changes what it handed over
        with pytest.raises(RuntimeError, match=r"^the latest message on 'n\.x' was changed in place"):
            run.read(net.n.x)
    assert net.n.addresses == [handed.data_ptr(), net.n.addresses[1]]  # the tensor itself
    assert net.n.addresses[1] != copied.data_ptr()  # a snapshot


class Declared(Node):
    """An input the host writes, declared as two float32 numbers, and an output."""

    x = Input(optional=True, dtype=torch.float32, shape=(2,))
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)


class DeclaredNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.n = Declared()


@pytest.mark.rule("run.write")
def test_each_write_is_checked_also_after_the_port_was_written() -> None:
    """A port written once is checked again at each write (the run keeps what it checked of
    the port, never of the value): a value that does not match the declaration, a port of
    another run's net, an output, each raises as at a first write."""
    a, b = DeclaredNet(), DeclaredNet()
    with mujou.run(a, timer=mujou.VirtualTimer()) as run:
        run.write(a.n.x, torch.zeros(2))
        with pytest.raises(TypeError, match=r"^run\.write\(\): input 'n\.x' "):
            run.write(a.n.x, torch.zeros(3))
        with pytest.raises(TypeError, match=r"^run\.write\(\): input 'n\.x' "):
            run.write(a.n.x, torch.zeros(2, dtype=torch.int64))
        with mujou.run(b, timer=mujou.VirtualTimer()) as other:
            other.write(b.n.x, torch.ones(2))
            with pytest.raises(ValueError, match=r"^port 'n\.x' is not a port of this run's net$"):
                run.write(b.n.x, torch.ones(2))
            with pytest.raises(ValueError, match=r"^port 'n\.x' is not a port of this run's net$"):
                other.write(a.n.x, torch.ones(2))
        with pytest.raises(TypeError, match=r"^run\.write\(\) takes an Input, got output 'n\.y'$"):
            run.write(a.n.y, torch.zeros(2))  # type: ignore[arg-type]
        assert run.wait_for(a.n.x, timeout=0.0).tolist() == [0.0, 0.0]
    with mujou.run(a, timer=mujou.VirtualTimer()) as again:  # a new run checks anew
        with pytest.raises(TypeError, match=r"^run\.write\(\): input 'n\.x' "):
            again.write(a.n.x, torch.zeros(3))
        again.write(a.n.x, torch.ones(2))
        assert again.wait_for(a.n.x, timeout=0.0).tolist() == [1.0, 1.0]


# --- run.subscribe --------------------------------------------------------------------------


@pytest.mark.rule("run.subscribe")
def test_subscription_is_ordered_and_starts_at_the_call() -> None:
    """> `run.subscribe(output, maxsize=1024)` returns a Subscription that receives, as CPU
    copies and in order, every message made visible on the port after the call."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)  # messages 1..4 before the call
        sub = run.subscribe(net.tick.out)
        assert isinstance(sub, mujou.Subscription)
        run.sleep(1.0)  # messages 5..8
        got = sub.drain()
        assert [m.tolist() for m in got] == [[5.0], [6.0], [7.0], [8.0]]
        assert all(m.device.type == "cpu" for m in got)
        assert sub.dropped == 0
        assert sub.drain() == []
        got[0].add_(100)  # the host's own copy
        assert run.read(net.tick.out).tolist() == [8.0]  # type: ignore[union-attr]
        # An input port can be subscribed too.
        sub_in = run.subscribe(net.reader.x)
        run.sleep(0.5)
        assert [m.tolist() for m in sub_in.drain()] == [[9.0], [10.0]]


@pytest.mark.rule("run.subscribe")
def test_subscription_drops_oldest_when_full() -> None:
    """> when more than maxsize are waiting, the oldest are dropped and counted in `dropped`;
    `drain()` returns the waiting ones."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        sub = run.subscribe(net.tick.out, maxsize=2)
        run.sleep(2.5)  # 10 messages
        assert [m.tolist() for m in sub.drain()] == [[9.0], [10.0]]
        assert sub.dropped == 8


@pytest.mark.rule("run.subscribe")
def test_subscription_get_and_close() -> None:
    """> `get(timeout=None)` waits for one; close() ends it."""
    net = TickNet()
    run = mujou.run(net, timer=mujou.VirtualTimer())
    with run:
        sub = run.subscribe(net.tick.out)
        with pytest.raises(RuntimeError, match="virtual timer"):
            sub.get(timeout=0.01)  # nothing waiting, and virtual time does not move here
        run.sleep(0.5)
        assert sub.get(timeout=HANG).tolist() == [1.0]
        with run.subscribe(net.tick.out) as closed:
            pass
        run.sleep(0.5)
        assert closed.drain() == [], "a closed subscription receives nothing more"
    # After the run ended, what is waiting is still returned, then get raises RuntimeError.
    assert sub.get(timeout=HANG).tolist() == [2.0]
    assert [m.tolist() for m in sub.drain()] == [[3.0], [4.0]]
    with pytest.raises(RuntimeError):
        sub.get(timeout=HANG)


@pytest.mark.rule("run.subscribe")
def test_subscription_real_time_counts_every_gap_as_a_drop() -> None:
    """> receives ... in order, every message made visible on the port after the call; when
    more than maxsize are waiting, the oldest are dropped and counted in `dropped`.

    Under the real-time timer: the values received are increasing, and every gap between
    them is a counted drop."""
    net = TickNet(period=0.002)
    with mujou.run(net, workers=1) as run:
        sub = run.subscribe(net.tick.out, maxsize=4)
        got = [int(sub.get(timeout=HANG)[0]) for _ in range(30)]
        dropped = sub.dropped
    gaps = sum(b - a - 1 for a, b in itertools.pairwise(got))
    assert all(b > a for a, b in itertools.pairwise(got)), got
    # Drops of messages before the first one received also count; gaps are at most that.
    assert gaps <= dropped, (got, dropped)


@pytest.mark.rule("run.subscribe")
def test_two_host_threads_subscribing_at_once_each_receive_every_message() -> None:
    """> `run.subscribe(output, ...)` returns a Subscription that receives [...] in order, every
    message made visible on the port after the call.

    Two host threads subscribe to one port, read a few messages and close, over and over at
    once (real-time timer): each subscription gets, without a gap, every message from the
    first one made visible after its call, so none of them was lost by the other thread's
    subscribe or close."""
    rounds, taken = 40, 3
    net = TickNet(period=0.002)
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    with mujou.run(net, workers=1) as run:

        def host() -> None:
            try:
                start.wait(HANG)
                for _ in range(rounds):
                    before = run.read(net.tick.out)
                    with run.subscribe(net.tick.out, maxsize=1_000_000) as sub:
                        after = run.read(net.tick.out)
                        got = [int(sub.get(timeout=HANG)[0]) for _ in range(taken)]
                        assert sub.dropped == 0
                    low = 1 if before is None else int(before[0]) + 1
                    high = 1 if after is None else int(after[0]) + 1
                    # The first message is one made visible after the call began, and no later
                    # than the one after the latest when the call had returned.
                    assert low <= got[0] <= high, (before, after, got)
                    assert got == list(range(got[0], got[0] + taken)), got
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=host) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * rounds * HANG)
            assert not thread.is_alive(), "a host thread hung"
    assert not errors, errors


# --- run.wait-for ---------------------------------------------------------------------------


@pytest.mark.rule("run.wait-for")
def test_wait_for_virtual_advances_until_the_predicate_holds() -> None:
    """> `run.wait_for(port, predicate=None, timeout=None)` returns (a CPU copy of) the port's
    latest message as soon as there is one for which predicate(message) is true ... Under the
    virtual timer it advances time, like sleep, until then."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        first = run.wait_for(net.tick.out)  # any message
        assert first.tolist() == [1.0] and first.device.type == "cpu"
        assert 0.25 <= run.time < 0.5
        m = run.wait_for(net.tick.out, lambda t: bool(t[0] >= 5))
        assert m.tolist() == [5.0]
        assert 1.25 <= run.time < 1.5, run.time
        assert run.read(net.tick.out).tolist() == [5.0]  # type: ignore[union-attr]
        m.add_(100)
        assert run.read(net.tick.out).tolist() == [5.0]  # type: ignore[union-attr]


def _at_least(k: float, message: torch.Tensor) -> bool:
    return bool(message[0] >= k)


@pytest.mark.rule("run.wait-for")
@pytest.mark.parametrize("virtual", [False, True], ids=["real-time", "virtual"])
def test_wait_for_on_an_input_with_a_source_waits_for_the_sources_messages(virtual: bool) -> None:
    """> returns (a CPU copy of) the port's latest message: an input's latest message is its
    source's, the second wait on the same input as the first."""
    net = TickNet(period=0.25 if virtual else 0.01)
    timer = mujou.VirtualTimer() if virtual else None
    with mujou.run(net, workers=1, timer=timer) as run:
        for k in (2.0, 3.0):
            m = run.wait_for(net.reader.x, functools.partial(_at_least, k), timeout=HANG_GUARD)
            assert m.tolist()[0] >= k
            assert m.device.type == "cpu"


@pytest.mark.rule("run.wait-for")
def test_wait_for_checks_the_current_message_first() -> None:
    """> checking the current latest message first."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.8)
        before = run.time
        m = run.wait_for(net.tick.out, lambda t: bool(t[0] >= 2))
        assert m.tolist() == [3.0]
        assert run.time == before


@pytest.mark.rule("run.wait-for")
def test_wait_for_timeout_in_timer_seconds() -> None:
    """> timeout is in timer seconds; on timeout it raises TimeoutError."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.1)
        with pytest.raises(TimeoutError):
            run.wait_for(net.tick.out, lambda t: False, timeout=1.0)
        assert run.time == pytest.approx(1.1)
    net2 = TickNet(period=0.01)
    with mujou.run(net2, workers=1) as run2:
        m = run2.wait_for(net2.tick.out, lambda t: bool(t[0] >= 3), timeout=HANG)
        assert m[0] >= 3
        t0 = run2.time
        with pytest.raises(TimeoutError):
            run2.wait_for(net2.tick.out, lambda t: False, timeout=0.05)
        assert run2.time >= t0 + 0.05


# --- run.sleep / run.time -------------------------------------------------------------------


@pytest.mark.rule("run.sleep")
def test_sleep_waits_timer_seconds() -> None:
    """> `run.sleep(seconds)` waits for `seconds` of the run's timer (negative → ValueError)."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.0)
        assert run.time == 0.0
        run.sleep(0.75)
        assert run.time == 0.75
        assert int(net.tick.count) == 3
        with pytest.raises(ValueError, match=r"^seconds must be a finite number of seconds >= 0, got -0\.5$"):
            run.sleep(-0.5)
        assert run.time == 0.75
    net2 = TickNet()
    with mujou.run(net2) as run2:
        t0 = run2.time
        run2.sleep(0.05)
        assert run2.time >= t0 + 0.05


@pytest.mark.rule("run.sleep")
def test_sleep_raises_the_runs_error() -> None:
    """> and raises the run's error if a hook failed meanwhile."""
    failing = Failing(0.25, fail_at=2)
    run = mujou.run(FailNet(failing), timer=mujou.VirtualTimer())
    try:
        run.sleep(0.25)
        with pytest.raises(mujou.HookError) as info:
            run.sleep(1.0)
        assert info.value.__cause__ is failing.raised[0]
        assert run.time == 0.5
    finally:
        with contextlib.suppress(mujou.HookError):
            run.stop()


@pytest.mark.rule("run.time")
def test_time_virtual_starts_at_zero_and_advances_with_sleep() -> None:
    """> `run.time` is the run's timer time in seconds: 0.0 when the timer starts (or the
    restored time), advancing with the timer."""
    net = TickNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        assert run.time == 0.0
        run.sleep(0.5)
        assert run.time == 0.5
        tree = run.state_dict()
    with mujou.run(TickNet(), timer=mujou.VirtualTimer(), state=tree) as run2:
        assert run2.time == 0.5
        run2.sleep(0.25)
        assert run2.time == 0.75


@pytest.mark.rule("run.time", "timers.realtime")
def test_time_real_starts_at_zero_and_follows_the_clock() -> None:
    """> `run.time` is ... 0.0 when the timer starts ..., advancing with the timer.

    The timer starts inside mujou.run, so a time read later lies between the real time
    elapsed since mujou.run returned and the real time elapsed since it was called."""
    called = time.monotonic()
    with mujou.run(TickNet()) as run:
        returned = time.monotonic()
        readings = []
        for _ in range(5):
            before = time.monotonic()
            r = run.time
            after = time.monotonic()
            assert before - returned - 1e-6 <= r <= after - called + 1e-6, (r, before, after)
            readings.append(r)
            time.sleep(0.005)
        assert readings == sorted(readings)


# --- run.stop / run.join --------------------------------------------------------------------


class StopNet(Net):
    def __init__(self, log: Log) -> None:
        super().__init__()
        self.a = Blocker(0.01, log=log, tag="a")
        self.b = Ticker(0.005, log=log, tag="b")


@pytest.mark.rule("run.stop")
def test_stop_waits_for_running_hooks_runs_on_stop_and_ends_threads() -> None:
    """> `run.stop()` stops the run: no update starts after it begins; it waits for running
    hooks, runs on_stop of every started node, ends the run's threads, and returns; a second
    call does nothing more."""
    log = Log()
    net = StopNet(log)
    before = set(threading.enumerate())
    run = mujou.run(net, workers=2)
    errors: list[BaseException] = []

    def stopper() -> None:
        try:
            run.stop()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        log.add("host", "stop-returned")

    try:
        wait_event(net.a.blocked, "a blocks in its first update")
        s = threading.Thread(target=stopper)
        s.start()
        s.join(0.2)  # gives stop() a chance to begin while a's hook is running (no assertion)
    finally:
        net.a.release.set()
    s.join(HANG)
    assert not s.is_alive(), "stop() hung"
    assert errors == []
    records = log.snapshot()
    stop_returned = records.index(("host", "stop-returned"))
    assert records.index(("a", "update-end")) < stop_returned, records
    assert sorted(n for n, e in records[:stop_returned] if e == "stop") == ["a", "b"], records
    first_stop = min(i for i, (_, e) in enumerate(records) if e == "stop")
    assert all(e != "update" for _, e in records[first_stop:]), (
        f"an update started after stop began: {records[first_stop:]}"
    )
    assert new_threads(before) == [], "stop() must end the run's threads"
    assert not run.running
    run.stop()  # a second call does nothing more
    assert log.snapshot() == records


@pytest.mark.rule("run.stop")
def test_stop_raises_the_hook_error() -> None:
    """> It raises the run's HookError if a hook failed."""
    failing = Failing(0.01)
    run = mujou.run(FailNet(failing))
    wait_event(failing.stopped, "the failing node's on_stop")
    with pytest.raises(mujou.HookError, match=r"^node 'a\.b' raised ValueError in on_update"):
        run.stop()


@pytest.mark.rule("run.join")
def test_join_waits_for_stop_from_another_thread() -> None:
    """> `run.join(timeout=None)` waits until the run ends (stop from another thread, ...)."""
    log = Log()
    net = TickNet(period=0.01, log=log)
    run = mujou.run(net)
    go = threading.Event()

    def stopper() -> None:
        go.wait(HANG)
        time.sleep(0.05)  # so that join() is likely waiting already (no assertion on it)
        run.stop()

    s = threading.Thread(target=stopper)
    s.start()
    go.set()
    run.join()
    assert not run.running
    assert sorted(log.events("stop")) == ["reader", "tick"], "join returned before the run ended"
    s.join(HANG)


@pytest.mark.rule("run.join")
def test_join_raises_hook_error_and_times_out() -> None:
    """> it raises the run's HookError if a hook failed; timeout is in timer seconds."""
    failing = Failing(0.01)
    with pytest.raises(mujou.HookError), mujou.run(FailNet(failing)) as run:
        run.join()
    with mujou.run(TickNet(), timer=mujou.VirtualTimer()) as run2:
        with pytest.raises(TimeoutError):
            run2.join(timeout=0.5)
        assert run2.time == 0.5
    with mujou.run(TickNet(period=0.01)) as run3:
        t0 = run3.time
        with pytest.raises(TimeoutError):
            run3.join(timeout=0.05)
        assert run3.time >= t0 + 0.05


@pytest.mark.rule("run.join", "timers.virtual")
def test_join_under_virtual_timer_advances_to_the_failure() -> None:
    """> Under VirtualTimer(), the timer time advances only inside the host's run.sleep /
    wait_for / join."""
    failing = Failing(0.25, fail_at=4)
    run = mujou.run(FailNet(failing), timer=mujou.VirtualTimer())
    try:
        with pytest.raises(mujou.HookError) as info:
            run.join()
        assert info.value.time == 1.0
    finally:
        with contextlib.suppress(mujou.HookError):
            run.stop()


# --- run.hook-error -------------------------------------------------------------------------


@pytest.mark.rule("run.hook-error")
def test_hook_error_message_attributes_and_cause() -> None:
    """> When a hook raises, the run stops on its own (no further updates; on_stop for every
    started node, the failing one included if its on_start had returned) and the host's next
    call that waits or writes ... raises mujou.HookError: message "node 'NAME' raised TYPE in
    HOOK at t=SECONDS: MESSAGE", attributes node, hook, time, chained from the original
    exception."""
    log = Log()
    failing = Failing(0.25, fail_at=3, log=log, tag="a.b")
    net = FailNet(failing, other_period=0.3, log=log)
    run = mujou.run(net, workers=2, timer=mujou.VirtualTimer())
    with pytest.raises(mujou.HookError) as info:
        run.sleep(5.0)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.args[0] == str(err)
    assert str(err) == "node 'a.b' raised ValueError in on_update at t=0.750: boom", str(err)
    assert err.node == "a.b"
    assert err.hook == "on_update"
    assert err.time == 0.75
    assert err.__cause__ is failing.raised[0]
    # The run stopped on its own: other's updates due at 0.3 and 0.6 ran, none after 0.75.
    assert not run.running
    assert int(net.other.count) == 2
    assert sorted(log.events("stop")) == ["a.b", "other", "r"]
    records = log.snapshot()
    first_stop = min(i for i, (_, e) in enumerate(records) if e == "stop")
    assert all(e != "update" for _, e in records[first_stop:]), records
    # state_dict still works after the failure.
    tree = run.state_dict()
    assert int(tree["a"]["b"]["count"]) == 3
    with pytest.raises(mujou.HookError):
        run.stop()


CALLS: dict[str, Callable[[mujou.Run, FailNet], object]] = {
    "sleep": lambda run, net: run.sleep(0.01),
    "wait_for": lambda run, net: run.wait_for(net.other.out, timeout=HANG),
    "join": lambda run, net: run.join(timeout=HANG),
    "write": lambda run, net: run.write(net.r.x, torch.zeros(1)),
    "subscribe": lambda run, net: run.subscribe(net.other.out),
    "stop": lambda run, net: run.stop(),
}


@pytest.mark.rule("run.hook-error")
@pytest.mark.parametrize("call", sorted(CALLS))
def test_hook_error_raised_by_the_hosts_next_call(call: str) -> None:
    """> the host's next call that waits or writes (sleep, wait_for, join, write, subscribe,
    stop, leaving the with block) raises mujou.HookError."""
    failing = Failing(0.01, fail_at=2)
    net = FailNet(failing, other_period=0.005)
    run = mujou.run(net, workers=2)
    try:
        wait_event(failing.stopped, "the failing node's on_stop")
        with pytest.raises(
            mujou.HookError, match=r"^node 'a\.b' raised ValueError in on_update at t=\d+\.\d{3}: boom$"
        ) as info:
            CALLS[call](run, net)
        assert info.value.__cause__ is failing.raised[0]
    finally:
        with contextlib.suppress(mujou.HookError):
            run.stop()


@pytest.mark.rule("run.hook-error")
def test_hook_error_raised_when_leaving_the_with_block() -> None:
    """> ... leaving the with block) raises mujou.HookError."""
    failing = Failing(0.01)
    with (
        pytest.raises(mujou.HookError, match=r"^node 'a\.b' raised ValueError in on_update at t="),
        mujou.run(FailNet(failing)),
    ):
        wait_event(failing.stopped, "the failing node's on_stop")


@pytest.mark.rule("run.hook-error")
def test_only_the_first_failure_is_reported() -> None:
    """> Only the first failure is reported.

    The failing update is the first failure; an on_stop that raises while the run stops on
    its own is a later one."""
    log = Log()
    failing = Failing(0.25, fail_at=1, log=log, tag="a.b")
    net = FailNet(failing, log=log)
    net2_stop_fail = Failing(0.25, fail_in="on_stop")
    net.late = Inner(net2_stop_fail)
    with pytest.raises(mujou.HookError) as info, mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
    assert (info.value.node, info.value.hook) == ("a.b", "on_update")
    assert net2_stop_fail.raised, "the on_stop hook of 'late.b' ran and raised"
    assert sorted(log.events("stop")) == ["a.b", "other", "r"]


# --- run.start-error ------------------------------------------------------------------------


class StartFailNet(Net):
    def __init__(self, log: Log) -> None:
        super().__init__()
        self.ok1 = Failing(0.01, fail_in="never", log=log, tag="ok1")
        self.bad = Failing(0.01, fail_in="on_start", log=log, tag="bad")
        self.ok2 = Failing(0.01, fail_in="never", log=log, tag="ok2")


@pytest.mark.rule("run.start-error")
@pytest.mark.parametrize("workers", [1, 3])
def test_on_start_error_raises_from_run(workers: int) -> None:
    """> When an on_start hook raises, mujou.run raises HookError after calling on_stop of the
    nodes whose on_start had returned; no update runs."""
    log = Log()
    net = StartFailNet(log)
    with pytest.raises(
        mujou.HookError, match=r"^node 'bad' raised ValueError in on_start at t=0\.000: boom$"
    ) as info:
        mujou.run(net, workers=workers)
    assert (info.value.node, info.value.hook, info.value.time) == ("bad", "on_start", 0.0)
    assert info.value.__cause__ is net.bad.raised[0]
    assert log.events("update") == []
    assert sorted(log.events("stop")) == sorted(log.events("started")), log.snapshot()
    assert "bad" not in log.events("stop")
    # Nothing is left running: the net may be run again.
    net.bad.fail_in = "never"
    with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.02)


# --- run.state-after-error ------------------------------------------------------------------


@pytest.mark.rule("run.state-after-error")
def test_read_and_state_dict_after_failure_and_after_end() -> None:
    """> After a failure (and after any end of the run), run.read and run.state_dict still work
    and give the state as the run left it."""
    failing = Failing(0.25, fail_at=3)
    net = FailNet(failing, other_period=0.3)
    run = mujou.run(net, workers=2, timer=mujou.VirtualTimer())
    with pytest.raises(mujou.HookError):
        run.sleep(5.0)
    assert run.read(net.other.out).tolist() == [2.0]  # type: ignore[union-attr]
    tree = run.state_dict()
    assert int(tree["other"]["count"]) == 2
    assert int(tree["a"]["b"]["count"]) == 3
    with pytest.raises(mujou.HookError):
        run.stop()
    assert run.read(net.other.out).tolist() == [2.0]  # type: ignore[union-attr]
    assert int(run.state_dict()["other"]["count"]) == 2

    ok = TickNet()
    with mujou.run(ok, timer=mujou.VirtualTimer()) as run2:
        run2.sleep(0.5)
    assert run2.read(ok.tick.out).tolist() == [2.0]  # type: ignore[union-attr]
    assert int(run2.state_dict()["tick"]["count"]) == 2


# --- run.stats ------------------------------------------------------------------------------


class ArmNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.joint = Ticker(0.125)


class StatsNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.tick = Ticker(0.25)
        self.arm = ArmNet()


@pytest.mark.rule("run.stats")
def test_stats_is_a_frozen_snapshot() -> None:
    """> `run.stats()` returns a frozen RunStats: time, workers (the number of worker
    threads), nodes (a mapping from node name to NodeStats with updates, skipped,
    lateness_max, busy seconds)."""
    net = StatsNet()
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        stats = run.stats()
        assert run.workers == 2
    assert isinstance(stats, mujou.RunStats)
    assert stats.time == 1.0
    assert stats.workers == 2
    assert set(stats.nodes) == {"tick", "arm.joint"}
    tick, joint = stats.nodes["tick"], stats.nodes["arm.joint"]
    assert isinstance(tick, mujou.NodeStats)
    assert (tick.updates, tick.skipped, tick.lateness_max) == (4, 0, 0.0)
    assert (joint.updates, joint.skipped, joint.lateness_max) == (8, 0, 0.0)
    # Each spent real time in its hooks (4 and 8 updates that make and send tensors).
    assert type(tick.busy) is float and tick.busy > 0.0, tick
    assert type(joint.busy) is float and joint.busy > 0.0, joint
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.time = 2.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tick.updates = 0  # type: ignore[misc]


# --- run.one-run-per-net --------------------------------------------------------------------


@pytest.mark.rule("run.one-run-per-net")
def test_one_active_run_per_node() -> None:
    """> A node can be in only one active run at a time: starting a run of a net whose node is
    running raises RuntimeError. A net may be run again after its run ended."""
    net = StatsNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        with pytest.raises(
            RuntimeError, match=r"^node 'tick' is in a run that has not ended; stop that run first$"
        ):
            mujou.run(net, timer=mujou.VirtualTimer())
        with pytest.raises(RuntimeError, match=r"^node 'arm\.joint' is in a run that has not ended"):
            mujou.run(net.arm, timer=mujou.VirtualTimer())  # a sub-net's node is running too
        run.sleep(0.25)  # the first run is unaffected
        assert int(net.tick.count) == 1
    with mujou.run(net, timer=mujou.VirtualTimer()) as again:
        again.sleep(0.25)
    assert int(net.tick.count) == 2


# --- timers ---------------------------------------------------------------------------------


@pytest.mark.rule("timers.realtime")
@pytest.mark.parametrize("scale", [0.5, 4.0])
def test_real_time_timer_scale(scale: float) -> None:
    """> RealTimeTimer(scale=s) runs s timer seconds per real second.

    Causal: a timer interval measured inside a real interval is at most s times it, and one
    measured around a real interval is at least s times it."""
    with mujou.run(TickNet(), timer=mujou.RealTimeTimer(scale=scale)) as run:
        for _ in range(3):
            a = time.monotonic()
            r0 = run.time
            b = time.monotonic()
            time.sleep(0.01)
            c = time.monotonic()
            r1 = run.time
            d = time.monotonic()
            assert scale * (c - b) - 1e-6 <= r1 - r0 <= scale * (d - a) + 1e-6, (r1 - r0, a, b, c, d)


@pytest.mark.rule("timers.realtime")
@pytest.mark.parametrize("scale", [0, 0.0, -1.0, math.nan, math.inf])
def test_real_time_timer_bad_scale(scale: float) -> None:
    """> (scale finite > 0, else ValueError)."""
    with pytest.raises(ValueError, match=r"^scale must be a finite number > 0, got "):
        mujou.RealTimeTimer(scale=scale)


@pytest.mark.rule("timers.virtual")
def test_virtual_time_moves_only_inside_host_calls() -> None:
    """> Under VirtualTimer(), the timer time advances only inside the host's run.sleep /
    wait_for / join, jumping from one due update to the next without waiting in real time;
    outside those calls no update runs."""
    net = TickNet()
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        time.sleep(0.05)
        assert run.time == 0.0 and int(net.tick.count) == 0
        run.sleep(1.0)
        assert run.time == 1.0 and int(net.tick.count) == 4
        time.sleep(0.05)
        assert run.time == 1.0 and int(net.tick.count) == 4
        run.wait_for(net.tick.out, lambda t: bool(t[0] >= 6))
        assert int(net.tick.count) == 6
        time.sleep(0.05)
        assert int(net.tick.count) == 6
        # A long stretch of timer time takes no real waiting (the test would time out).
        run.sleep(500.0)
        assert int(net.tick.count) == 2006
        assert net.tick.dts == [0.25] * 2006


# --- gaps found by mutation testing ---------------------------------------------------------


class FirstRead(Node):
    """Records what its first update reads on ``x``; its period is short."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.001, seed=0)
        self.first: list[float | None] = []
        self.updated = threading.Event()

    def on_update(self, dt: float) -> None:
        if not self.first:
            m = self.x.read()
            self.first.append(None if m is None else float(m[0]))
            self.updated.set()


class CopiedSlowly(torch.Tensor):
    """A tensor whose first torch operation (Mujou's copy of it) waits a while for ``updated``.

    Before the timer starts no update can run, so the wait always runs to its end: a copy made
    after the timer started would give the node's first update time to run without it.
    """

    updated: threading.Event | None = None

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if cls.updated is not None:
            cls.updated.wait(0.5)  # a bounded wait: it never decides the outcome by itself
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


@pytest.mark.rule("run.start")
def test_first_update_sees_the_inputs_message_under_real_time() -> None:
    """> the first messages of `inputs=` complete before the timer starts: under the real-time
    timer too, a node's first update reads the message of `inputs=`, however slow its copy."""
    node = FirstRead()
    message = torch.tensor([3.0]).as_subclass(CopiedSlowly)
    CopiedSlowly.updated = node.updated
    try:
        with mujou.run(Bag(reader=node), workers=1, inputs={node.x: message}) as run:
            CopiedSlowly.updated = None
            wait_event(node.updated, "the first update")
            assert run.read(node.x).tolist() == [3.0]  # type: ignore[union-attr]
    finally:
        CopiedSlowly.updated = None
    assert node.first == [3.0], "the first update ran before the inputs= message was in"


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException | None]]:
    """Start ``call`` on a thread of its own; the list gets its exception (None: returned)."""
    outcome: list[BaseException | None] = []

    def body() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=body, name="test-wait-for", daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.rule("run.wait-for")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_wait_for_that_never_matches_raises_timeout_error(timer: str) -> None:
    """> `timeout` is in timer seconds; on timeout it raises `TimeoutError`: a wait that can
    never match ends with it (run on a thread, so that ignoring the timeout fails, not hangs)."""
    net = TickNet(period=0.25 if timer == "virtual" else 0.01)
    the_timer = mujou.VirtualTimer() if timer == "virtual" else mujou.RealTimeTimer()
    with mujou.run(net, workers=1, timer=the_timer) as run:
        thread, outcome = in_thread(lambda: run.wait_for(net.tick.out, lambda t: False, timeout=0.5))
        thread.join(HANG)
        ended = not thread.is_alive()
        if not ended:
            run.stop()  # ends the wait (RuntimeError), so that the thread does not outlive the test
        assert ended, "wait_for ignored its timeout"
        assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError), outcome
        assert run.time >= 0.5


class ScaledTicker(Node):
    """Records the dt of its first update and signals it."""

    def __init__(self, period: float, *, dedicated_thread: bool) -> None:
        super().__init__(period=period, seed=0, dedicated_thread=dedicated_thread)
        self.first_dt: list[float] = []
        self.updated = threading.Event()

    def on_update(self, dt: float) -> None:
        if not self.first_dt:
            self.first_dt.append(dt)
            self.updated.set()


@pytest.mark.rule("timers.realtime")
@pytest.mark.parametrize("dedicated", [False, True], ids=["worker", "dedicated"])
def test_scale_applies_to_the_waits_for_due_updates(dedicated: bool) -> None:
    """> `RealTimeTimer(scale=s)` runs `s` timer seconds per real second: the scheduler waits
    for a due update `period / s` real seconds, not `period`.

    At scale 1000 a period of 2 timer seconds is 2 ms of real time. The first update's dt is
    the timer time it started at; waiting 2 real seconds would make it 2000 or more. The bound
    of 1000 (one real second late) holds on any machine that is not stalled."""
    node = ScaledTicker(2.0, dedicated_thread=dedicated)
    with mujou.run(Bag(node=node), workers=1, timer=mujou.RealTimeTimer(scale=1000.0)):
        wait_event(node.updated, "the first update")
    (dt,) = node.first_dt
    assert 2.0 <= dt < 1000.0, f"the first update due at 2.0 started at {dt}: the wait was not scaled"
