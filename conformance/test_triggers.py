"""Conformance tests for the page "Triggers" (spec/en/triggers.md): rules ``trigger.*``.

Under ``mujou.VirtualTimer()`` the checks are exact: every time is a binary fraction, and a
node's start times are rebuilt from its ``dt`` (their running sum), which is exact for such
times. A tag's microstep is not visible through the API; the tests see it through what each
update reads (``fresh``, ``stamp``, values) and through the order of starts and ends in a
shared log. Under the real-time timer no test asserts on wall-clock durations: they are
causal (a triggered node runs after a write with nothing periodic to wake the workers), and
the lower bounds they check are the timer's own readings.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
from _support import HANG_GUARD, Bag, vt

import mujou
from mujou import Input, Net, Node, Output

# What an update saw on one input: (value or None, fresh, stamp).
Seen = tuple[float | None, bool, float | None]
# One update: (start time, dt, {input attribute: Seen}).
Record = tuple[float, float, dict[str, Seen]]


def _value(message: object) -> float | None:
    if message is None:
        return None
    assert isinstance(message, torch.Tensor)
    return float(message.reshape(-1)[0])


class Probe(Node):
    """Records each update's start time (the running sum of its dt's), dt, and what it saw on
    each of its inputs; optionally appends ``(name, "start"/"end")`` to a shared ``log``.

    Subclasses declare the inputs and outputs; ``react`` sends what the update sends.
    """

    state_exclude: ClassVar[tuple[str, ...]] = ("log",)

    def __init__(self, log: list[tuple[str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(seed=0, **kwargs)
        self.t = 0.0
        self.records: list[Record] = []
        self.log = log

    def on_update(self, dt: float) -> None:
        if self.log is not None:
            self.log.append((self.name, "start"))
        self.t += dt
        seen: dict[str, Seen] = {}
        for attr in type(self).input_names():
            port = getattr(self, attr)
            seen[attr] = (_value(port.read()), port.fresh, port.stamp)
        self.records.append((self.t, dt, seen))
        self.react()
        if self.log is not None:
            self.log.append((self.name, "end"))

    @classmethod
    def input_names(cls) -> list[str]:
        return [name for name in dir(cls) if isinstance(getattr(cls, name, None), Input)]

    def react(self) -> None:
        """What the update sends (nothing by default)."""

    def starts(self) -> list[float]:
        return [record[0] for record in self.records]


class Counter(Node):
    """Sends its update count (1.0, 2.0, ...) on ``out`` at each update."""

    out = Output()

    def __init__(self, period: float | None = 0.125, **kwargs: Any) -> None:
        super().__init__(period=period, seed=0, **kwargs)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.tensor([float(self.count)]))


class OnX(Probe):
    """A probe with one optional input ``x``, triggered by it unless told otherwise."""

    x = Input(optional=True)

    def __init__(self, log: list[tuple[str, str]] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("trigger", mujou.on("x"))
        super().__init__(log, **kwargs)


class Relay(OnX):
    """Triggered by ``x``; sends ``x + 1`` on ``y``."""

    y = Output()

    def react(self) -> None:
        m = self.x.read()
        if m is not None:
            self.y.send(m + 1)


class TwoIn(Probe):
    """A probe with optional inputs ``a`` and ``b``."""

    a = Input(optional=True)
    b = Input(optional=True)


def one(x: float) -> torch.Tensor:
    return torch.tensor([x])


def first_is(value: float) -> Callable[[torch.Tensor], bool]:
    """A ``wait_for`` predicate: the message's first element is ``value``."""
    return lambda m: bool(m.reshape(-1)[0] == value)


def is_(value: float) -> Callable[[torch.Tensor], bool]:
    """A ``wait_for`` predicate, as the page's Echo example writes it: ``y == value``."""
    return lambda y: bool(y == value)


# --- trigger.any ----------------------------------------------------------------------------


@pytest.mark.rule("trigger.any")
def test_any_updates_on_a_new_message_on_either_input() -> None:
    """> `trigger=mujou.on(*inputs)` makes the node's condition hold when any of the named
    inputs (by attribute name) has had an arrival since the node's previous update started."""
    node = TwoIn(trigger=mujou.on("a", "b"))
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
        assert node.records == []  # no arrival: no update
        run.write(node.a, one(1.0))
        run.sleep(0.25)  # t = 0.5
        run.write(node.b, one(2.0))
        run.sleep(0.25)  # t = 0.75
        run.sleep(1.0)  # nothing new: no update
    assert node.records == [
        (0.25, 0.25, {"a": (1.0, True, 0.25), "b": (None, False, None)}),
        (0.5, 0.25, {"a": (1.0, False, 0.25), "b": (2.0, True, 0.5)}),
    ]


@pytest.mark.rule("trigger.any")
def test_any_ignores_inputs_it_does_not_name() -> None:
    """> ... when any of the named inputs (by attribute name) has had an arrival: an input
    the trigger does not name wakes nothing."""
    node = TwoIn(trigger=mujou.on("a"))
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.write(node.b, one(5.0))
        run.sleep(1.0)
        assert node.records == []
        run.write(node.a, one(1.0))
        run.sleep(0)
    assert node.records == [(1.0, 1.0, {"a": (1.0, True, 1.0), "b": (5.0, True, 0.0)})]


# --- trigger.all / trigger.all-timeout ------------------------------------------------------


@pytest.mark.rule("trigger.all")
def test_all_waits_for_a_new_message_on_each_input() -> None:
    """> `trigger=mujou.on_all(*inputs)` makes the condition hold when every one of the named
    inputs has had an arrival since the node's previous update started."""
    node = TwoIn(trigger=mujou.on_all("a", "b"))
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.write(node.a, one(1.0))
        run.sleep(0.25)
        run.write(node.a, one(2.0))  # two on a, none on b: no update
        run.sleep(0.25)
        assert node.records == []
        run.write(node.b, one(3.0))  # t = 0.5: now both
        run.sleep(0.25)
        run.write(node.b, one(4.0))  # only b since the last update: none
        run.sleep(1.0)
    assert node.records == [(0.5, 0.5, {"a": (2.0, True, 0.25), "b": (3.0, True, 0.5)})]


@pytest.mark.rule("trigger.all-timeout")
def test_all_timeout_runs_after_the_first_arrival() -> None:
    """> With `mujou.on_all(*inputs, timeout=seconds)`, the condition also holds `timeout`
    seconds of the timer after the first arrival on one of the inputs since the node's
    previous update started, even if the others have had none; the update then reads whatever
    messages are there."""
    node = TwoIn(trigger=mujou.on_all("a", "b", timeout=0.25))
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        run.write(node.a, one(1.0))  # first arrival: t = 1.0
        run.sleep(0.125)
        run.write(node.a, one(2.0))  # a later one does not move the timeout
        run.sleep(0.5)
        run.write(node.b, one(3.0))  # t = 1.625: b alone; due 1.875
        run.sleep(0.125)
        run.write(node.a, one(4.0))  # t = 1.75: both -> at once
        run.sleep(1.0)
    assert node.records == [
        (1.25, 1.25, {"a": (2.0, True, 1.125), "b": (None, False, None)}),
        (1.75, 0.5, {"a": (4.0, True, 1.75), "b": (3.0, True, 1.625)}),
    ]


# --- trigger.period-none --------------------------------------------------------------------


@pytest.mark.rule("trigger.period-none")
def test_trigger_without_period_is_triggered_only() -> None:
    """> A node given a `trigger` and no `period`, or `period=None` and a `trigger`, is
    triggered only: it has no periodic updates, and `node.period` is `None`."""
    implicit = OnX()
    explicit = OnX(period=None)
    both = OnX(period=0.25)
    assert (implicit.period, explicit.period, both.period) == (None, None, 0.25)
    net = Bag(i=implicit, e=explicit, b=both)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        stats = run.stats().nodes
        assert (stats["i"].updates, stats["e"].updates, stats["b"].updates) == (0, 0, 4)
        run.write(implicit.x, one(1.0))
        run.sleep(1.0)
        assert run.stats().nodes["i"].updates == 1
    assert implicit.starts() == [1.0]
    assert explicit.records == []


@pytest.mark.rule("trigger.period-none")
def test_period_none_without_trigger_is_refused() -> None:
    """> `period=None` without a `trigger` raises `ValueError`."""

    class NoTrigger(Node):
        def __init__(self) -> None:
            super().__init__(period=None)

    with pytest.raises(ValueError, match="period"):
        NoTrigger()


# --- trigger.periodic-and-triggered ---------------------------------------------------------


@pytest.mark.rule("trigger.periodic-and-triggered")
def test_triggered_update_leaves_the_periodic_slots() -> None:
    """> A node given both a `period` and a `trigger` has its periodic updates ... and a
    triggered update each time its condition holds; a triggered update does not move the
    periodic slots: the next periodic update stays due at its slot."""
    node = OnX(period=0.25)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.375)
        run.write(node.x, one(1.0))  # t = 0.375: a triggered update between 0.25 and 0.5
        run.sleep(0.625)
    assert node.starts() == [0.25, 0.375, 0.5, 0.75, 1.0]
    assert [record[1] for record in node.records] == [0.25, 0.125, 0.125, 0.25, 0.25]
    assert [record[2]["x"][1] for record in node.records] == [False, True, False, False, False]


@pytest.mark.rule("trigger.periodic-and-triggered")
def test_periodic_update_counts_as_the_previous_update() -> None:
    """> A periodic update also counts as the node's previous update for the condition: a
    command that arrives just before a periodic update is read by it and makes no extra
    update."""
    node = OnX(period=0.25, delay=0.25)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.375)
        run.write(node.x, one(1.0))  # due at 0.625, but the periodic update at 0.5 reads it
        run.sleep(0.625)
    assert node.starts() == [0.25, 0.5, 0.75, 1.0]
    assert [record[2]["x"] for record in node.records][:2] == [
        (None, False, None),
        (1.0, True, 0.375),
    ]


# --- trigger.min-interval -------------------------------------------------------------------


@pytest.mark.rule("trigger.min-interval")
def test_min_interval_spaces_triggered_updates() -> None:
    """> `min_interval=seconds` (default `0.0`) is the shortest time from the start of the
    node's previous update (or of the run, before its first update) to the start of a
    triggered update: the arrivals in between coalesce into one triggered update at the end
    of the interval."""
    camera = Counter(period=1 / 64)
    detector = OnX(min_interval=0.125)
    net = Bag(camera=camera, detector=detector)
    net.connect(camera.out, detector.x)
    with mujou.run(net, timer=vt(), workers=2) as run:
        run.sleep(1.0)
    assert detector.min_interval == 0.125
    # The first frame (1/64) makes it due at 1/8 (the run's start + 1/8), then each 1/8; at
    # (k/8, 0) it runs beside the camera and reads the newest frame of an earlier tag.
    assert detector.starts() == [k / 8 for k in range(1, 9)]
    values = [record[2]["x"][0] for record in detector.records]
    assert values == [8.0 * k - 1 for k in range(1, 9)]
    assert all(record[2]["x"][1] for record in detector.records)


@pytest.mark.rule("trigger.min-interval")
def test_min_interval_never_delays_a_periodic_update() -> None:
    """> It never delays a periodic update."""
    node = OnX(period=0.25, min_interval=0.5)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.125)
        run.write(node.x, one(1.0))  # due at 0.5 (the run's start + 0.5)...
        run.sleep(0.875)
    # ... read by the periodic update at 0.25; the periodic ones keep their 0.25 spacing.
    assert node.starts() == [0.25, 0.5, 0.75, 1.0]
    assert [record[2]["x"][1] for record in node.records] == [True, False, False, False]


# --- trigger.delay --------------------------------------------------------------------------


@pytest.mark.rule("trigger.delay")
def test_delay_virtual() -> None:
    """> `delay=seconds` (default `0.0`) is a logical delay: a triggered update is due `delay`
    seconds of the timer after the arrival that made the condition hold."""
    node = OnX(delay=0.25)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.write(node.x, one(1.0))  # t = 0: due at 0.25
        run.sleep(0.125)
        assert node.records == []
        run.sleep(0.875)
        run.write(node.x, one(2.0))  # t = 1.0: due at 1.25
        run.sleep(0.125)
        run.write(node.x, one(3.0))  # newer, before that update: read by it, no second
        run.sleep(1.0)
    assert node.records == [
        (0.25, 0.25, {"x": (1.0, True, 0.0)}),
        (1.25, 1.0, {"x": (3.0, True, 1.125)}),
    ]
    assert node.delay == 0.25


class Blocker(Node):
    """Triggered by ``x``; each update waits (guarded) for ``gate`` and records its dt."""

    x = Input(optional=True)
    y = Output()
    state_exclude: ClassVar[tuple[str, ...]] = ("gate", "started")

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trigger", mujou.on("x"))
        super().__init__(**kwargs)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.dts: list[float] = []
        self.values: list[float | None] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        self.values.append(_value(self.x.read()))
        self.started.set()
        assert self.gate.wait(HANG_GUARD), "hang guard: the test never opened the gate"
        m = self.x.read()
        self.y.send(m if m is not None else one(-1.0))


@pytest.mark.rule("trigger.delay", "trigger.real-time")
def test_delay_real_time_never_starts_early() -> None:
    """> ... a triggered update is due `delay` seconds of the timer after the arrival that made
    the condition hold, under both timers. (trigger.real-time:) A node due later (a `delay`,
    a `min_interval`) waits for its due time as a periodic update does: it does not start
    before that time, as the timer reads it."""
    node = Blocker(delay=0.05)
    node.gate.set()
    net = Bag(n=node)
    with mujou.run(net) as run:
        before = run.time
        run.write(node.x, one(1.0))
        reply = run.wait_for(node.y, timeout=HANG_GUARD)
        assert _value(reply) == 1.0
    # The first update's dt is its start time (the timer starts at 0.0).
    assert len(node.dts) == 1
    assert node.dts[0] >= before + 0.05, (node.dts, before)


# --- trigger.node-properties / trigger.object -----------------------------------------------


@pytest.mark.rule("trigger.node-properties")
def test_node_properties() -> None:
    """> A node reads its trigger settings back as read-only properties: `node.trigger` (the
    `mujou.Trigger`, or `None`), `node.min_interval` and `node.delay` (`float` seconds), and
    `node.period` (a `float`, or `None` for a node that is triggered only); assigning any of
    them raises `AttributeError`."""
    node = OnX(period=0.5, min_interval=1, delay=0.25)
    assert node.trigger == mujou.on("x")
    assert isinstance(node.trigger, mujou.Trigger)
    assert (node.period, node.min_interval, node.delay) == (0.5, 1.0, 0.25)
    assert type(node.min_interval) is float and type(node.delay) is float
    plain = Counter(period=0.25)
    assert (plain.trigger, plain.min_interval, plain.delay, plain.period) == (None, 0.0, 0.0, 0.25)
    assert type(plain.min_interval) is float and type(plain.delay) is float
    assert OnX().period is None
    for attr, value in [("trigger", None), ("min_interval", 0.0), ("delay", 0.0), ("period", 0.1)]:
        with pytest.raises(AttributeError):
            setattr(node, attr, value)
    assert (node.trigger, node.min_interval, node.delay, node.period) == (mujou.on("x"), 1.0, 0.25, 0.5)


@pytest.mark.rule("trigger.object")
def test_trigger_object() -> None:
    """> `mujou.on` and `mujou.on_all` return a `mujou.Trigger`, a frozen value with the
    attributes `inputs` (a tuple of the input names, in the order given), `all` (`False` for
    `on`, `True` for `on_all`) and `timeout` (`float` seconds, or `None`), equal to another
    with the same three, and whose `repr` is the call that makes it: `on('imu', 'scan')`,
    `on_all('imu', 'scan', timeout=0.05)`."""
    any_ = mujou.on("imu", "scan")
    all_ = mujou.on_all("imu", "scan", timeout=0.05)
    wait = mujou.on_all("scan", "imu")
    assert isinstance(all_, mujou.Trigger)
    assert (any_.inputs, any_.all, any_.timeout) == (("imu", "scan"), False, None)
    assert (all_.inputs, all_.all, all_.timeout) == (("imu", "scan"), True, 0.05)
    assert (wait.inputs, wait.all, wait.timeout) == (("scan", "imu"), True, None)
    assert type(mujou.on_all("a", timeout=1).timeout) is float
    assert repr(any_) == "on('imu', 'scan')"
    assert repr(all_) == "on_all('imu', 'scan', timeout=0.05)"
    assert repr(wait) == "on_all('scan', 'imu')"
    assert any_ == mujou.on("imu", "scan") and hash(any_) == hash(mujou.on("imu", "scan"))
    assert all_ == mujou.on_all("imu", "scan", timeout=0.05)
    assert hash(all_) == hash(mujou.on_all("imu", "scan", timeout=0.05))
    assert any_ != mujou.on("scan", "imu")  # the order is kept
    assert any_ != mujou.on_all("imu", "scan")
    assert all_ != mujou.on_all("imu", "scan", timeout=0.5)
    assert len({any_, mujou.on("imu", "scan"), all_}) == 2
    for attr, value in [("inputs", ("x",)), ("all", True), ("timeout", 1.0), ("other", 1)]:
        with pytest.raises(AttributeError):
            setattr(any_, attr, value)
    assert (any_.inputs, any_.all, any_.timeout) == (("imu", "scan"), False, None)


@pytest.mark.rule("trigger.object")
def test_one_trigger_serves_several_node_classes() -> None:
    """> ... (a `Trigger` names inputs by attribute name, not by port): one value may serve
    several node classes with inputs of the same names."""
    shared = mujou.on("x")
    first, second = OnX(trigger=shared), Relay(trigger=shared)
    assert first.trigger is shared and second.trigger is shared
    net = Bag(first=first, second=second)
    with mujou.run(net, timer=vt()) as run:
        run.write(first.x, one(1.0))
        run.write(second.x, one(2.0))
        run.sleep(0)
    assert first.starts() == [0.0] and second.starts() == [0.0]


# --- trigger.arguments ----------------------------------------------------------------------


class Ports(Node):
    """A node with inputs ``frame`` and ``imu`` and an output ``boxes``, taking any arguments."""

    frame = Input(optional=True)
    imu = Input(optional=True)
    boxes = Output()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


@pytest.mark.rule("trigger.arguments")
def test_arguments_unknown_input_output_empty_repeated() -> None:
    """> a name in the trigger that is not an input of the node (the message names the
    node's class and lists its inputs), the name of an output, no name at all, or a name
    given twice raises `ValueError`."""
    with pytest.raises(ValueError, match="frames") as info:
        Ports(trigger=mujou.on("frames"))
    message = str(info.value)
    assert "Ports" in message and "'frame'" in message and "'imu'" in message, message
    with pytest.raises(ValueError, match="boxes") as info:
        Ports(trigger=mujou.on("boxes"))
    assert "output" in str(info.value), info.value
    with pytest.raises(ValueError, match="'x'"):
        Ports(trigger=mujou.on_all("imu", "x", timeout=1.0))  # the second name is unknown
    with pytest.raises(ValueError, match=r"on\(\)"):
        mujou.on()
    with pytest.raises(ValueError, match=r"on_all\(\)"):
        mujou.on_all()
    with pytest.raises(ValueError, match="'frame' twice"):
        mujou.on("frame", "imu", "frame")
    with pytest.raises(ValueError, match="'imu' twice"):
        mujou.on_all("imu", "imu")


@pytest.mark.rule("trigger.arguments")
def test_arguments_types() -> None:
    """> a name that is not a `str`, or a `trigger` that is not a `mujou.Trigger`, raises
    `TypeError`; `min_interval`, `delay` and `timeout` take real numbers as in
    [](#run.number-arguments) (else `TypeError`)."""
    bad_names: list[object] = [1, None, b"frame", Ports.frame]
    for name in bad_names:
        with pytest.raises(TypeError, match="str"):
            mujou.on(name)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="str"):
            mujou.on_all("frame", name)  # type: ignore[arg-type]
    bad_triggers: list[object] = ["frame", ("frame",), mujou.on, 1]
    for trigger in bad_triggers:
        with pytest.raises(TypeError, match="trigger"):
            Ports(trigger=trigger)
    for value in ["0.1", None, True, torch.tensor(0.1), 1j]:
        with pytest.raises(TypeError, match="min_interval"):
            Ports(trigger=mujou.on("frame"), min_interval=value)
        with pytest.raises(TypeError, match="delay"):
            Ports(trigger=mujou.on("frame"), delay=value)
        if value is not None:
            with pytest.raises(TypeError, match="timeout"):
                mujou.on_all("frame", timeout=value)  # type: ignore[arg-type]


@pytest.mark.rule("trigger.arguments")
def test_arguments_ranges_name_the_argument_and_value() -> None:
    """> `min_interval` and `delay` finite and `>= 0`, `timeout` finite and `> 0` (else
    `ValueError`); ... Each message names the argument, shows the value and says what is
    allowed."""
    for value in [-0.001, -1, math.nan, math.inf, -math.inf]:
        for arg in ("min_interval", "delay"):
            with pytest.raises(ValueError, match=arg) as info:
                Ports(trigger=mujou.on("frame"), **{arg: value})
            assert repr(value) in str(info.value) or str(value) in str(info.value), info.value
    for value in [0, 0.0, -0.5, math.nan, math.inf]:
        with pytest.raises(ValueError, match="timeout") as info:
            mujou.on_all("frame", timeout=value)
        assert repr(value) in str(info.value) or str(value) in str(info.value), info.value
    node = Ports(trigger=mujou.on("frame"), min_interval=0, delay=0.0)  # 0 is allowed
    assert (node.min_interval, node.delay) == (0.0, 0.0)


@pytest.mark.rule("trigger.arguments")
def test_arguments_timing_without_trigger() -> None:
    """> and `min_interval` or `delay` other than `0` without a `trigger` raises
    `ValueError`."""
    for arg in ("min_interval", "delay"):
        with pytest.raises(ValueError, match=arg) as info:
            Ports(period=0.1, **{arg: 0.5})
        assert "trigger" in str(info.value) and "0.5" in str(info.value), info.value
    node = Ports(period=0.1, min_interval=0.0, delay=0)
    assert node.trigger is None


@pytest.mark.rule("trigger.arguments")
def test_arguments_spec_example_typo() -> None:
    """> `Typo()  # ValueError: trigger names 'frames', which is not an input of Typo; its
    inputs: 'frame'` (the page's example: checked in `super().__init__`)."""

    class Typo(Node):
        frame = Input()

        def __init__(self) -> None:
            super().__init__(trigger=mujou.on("frames"))

    with pytest.raises(ValueError, match=r"'frames'.*Typo.*'frame'"):
        Typo()


# --- trigger.arrival ------------------------------------------------------------------------


class StartSender(Node):
    """Sends 7.0 on ``out`` in ``on_start``; periodic (1.0) after that, sending its count."""

    out = Output()

    def __init__(self) -> None:
        super().__init__(period=1.0, seed=0)
        self.count = 0

    def on_start(self) -> None:
        self.out.send(one(7.0))

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(one(float(self.count)))


@pytest.mark.rule("trigger.arrival")
def test_on_start_and_inputs_are_arrivals_at_the_start_time() -> None:
    """> The messages sent in `on_start` and those of `inputs=` are arrivals at the timer's
    start time: a node they trigger is due then."""
    sender = StartSender()
    reader = OnX()
    fed = OnX()
    delayed = OnX(delay=0.25)
    net = Bag(sender=sender, reader=reader, fed=fed, delayed=delayed)
    net.connect(sender.out, reader.x)
    net.connect(sender.out, delayed.x)
    with mujou.run(net, timer=vt(), inputs={fed.x: one(3.0)}) as run:
        run.sleep(0.5)
    assert reader.records == [(0.0, 0.0, {"x": (7.0, True, 0.0)})]
    assert fed.records == [(0.0, 0.0, {"x": (3.0, True, 0.0)})]
    assert delayed.records == [(0.25, 0.25, {"x": (7.0, True, 0.0)})]


@pytest.mark.rule("trigger.arrival")
def test_host_write_and_sends_are_arrivals() -> None:
    """> An arrival on an input is a new message becoming visible on it: a message its source
    sends ..., a message the host writes with `run.write`."""
    source = Counter(period=0.25)
    reader = OnX()
    host_fed = OnX()
    net = Bag(source=source, reader=reader, host_fed=host_fed)
    net.connect(source.out, reader.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.5)
        run.write(host_fed.x, one(9.0))
        run.sleep(0.125)
    assert reader.records == [
        (0.25, 0.25, {"x": (1.0, True, 0.25)}),
        (0.5, 0.25, {"x": (2.0, True, 0.5)}),
    ]
    assert host_fed.records == [(0.5, 0.5, {"x": (9.0, True, 0.5)})]


@pytest.mark.rule("trigger.arrival")
def test_restoring_a_tree_is_not_an_arrival() -> None:
    """> Restoring a state tree is not an arrival: a resumed run takes its nodes' pending
    triggers from the tree ([](#trigger.state)) instead of from the messages restored or sent
    in `on_start`."""

    def make() -> tuple[Net, StartSender, OnX]:
        sender, reader = StartSender(), OnX()
        net = Bag(sender=sender, reader=reader)
        net.connect(sender.out, reader.x)
        return net, sender, reader

    net, _, reader = make()
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.5)  # reader ran at 0.0 (on_start's message) and 1.0: nothing pending
        tree = run.state_dict()
    assert reader.starts() == [0.0, 1.0]
    net2, _, reader2 = make()
    with mujou.run(net2, timer=vt(), state=tree) as run:
        assert run.time == 1.5
        run.sleep(0.25)  # on_start sent 7.0 again, and the tree holds a message: no update
        assert reader2.starts() == [0.0, 1.0]
        run.sleep(0.25)  # t = 2.0: the sender's next update wakes it
    assert reader2.starts() == [0.0, 1.0, 2.0]
    assert reader2.records[-1] == (2.0, 1.0, {"x": (2.0, True, 2.0)})


# --- trigger.due ----------------------------------------------------------------------------


@pytest.mark.rule("trigger.due")
def test_due_an_earlier_due_time_stands() -> None:
    """> When the condition comes to hold at timer time `s` ..., the node becomes due at
    `max(s + delay, last + min_interval)` ... When the node already has an earlier due time
    (... an earlier trigger not yet run), that one stands. (The page's example, in binary
    fractions: arrivals at 1.125 and 1.25 with `delay=0.25` make one update, at 1.375, that
    reads the message of 1.25.)"""
    node = OnX(delay=0.25)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.125)
        run.write(node.x, one(1.0))
        run.sleep(0.125)
        run.write(node.x, one(2.0))
        run.sleep(1.0)
    assert node.records == [(1.375, 1.375, {"x": (2.0, True, 1.25)})]


@pytest.mark.rule("trigger.due")
def test_due_min_interval_bound_from_the_previous_start() -> None:
    """> ... `max(s + delay, last + min_interval)`, where `last` is the start of its previous
    update (no bound before its first update). (The page's example: the same arrivals with
    `min_interval` as well, after an update at 1.0, make it due at the bound.)"""
    node = OnX(delay=0.25, min_interval=0.5)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.75)
        run.write(node.x, one(0.0))  # first update: no bound -> 0.75 + 0.25 = 1.0
        run.sleep(0.375)
        run.write(node.x, one(1.0))  # t = 1.125
        run.sleep(0.125)
        run.write(node.x, one(2.0))  # t = 1.25
        run.sleep(1.0)
    assert node.starts() == [1.0, 1.5]
    assert node.records[1] == (1.5, 0.5, {"x": (2.0, True, 1.25)})


@pytest.mark.rule("trigger.due")
def test_due_before_the_first_update_counts_from_the_run_start() -> None:
    """> ... where `last` is the start of its previous update (before its first update: the
    start of the run, as for `dt`)."""
    node = OnX(min_interval=0.5)
    net = Bag(n=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.125)
        run.write(node.x, one(1.0))  # due at max(0.125, 0.0 + 0.5)
        run.sleep(0.875)
        run.write(node.x, one(2.0))  # t = 1.0: due at max(1.0, 0.5 + 0.5)
        run.sleep(0)
    assert node.records == [(0.5, 0.5, {"x": (1.0, True, 0.125)}), (1.0, 0.5, {"x": (2.0, True, 1.0)})]


@pytest.mark.rule("trigger.due")
def test_due_triggered_update_is_ordered_by_its_due_time() -> None:
    """> A triggered update is ordered among the others by its due time, as
    [](#threads.earliest-due-first) says: with one worker, a node triggered to be due at 0.25
    runs before a periodic one due at 0.5, and after one due at 0.125."""
    log: list[tuple[str, str]] = []
    early = Probe(log, period=0.125)
    late = Probe(log, period=0.5)
    trig = OnX(log, delay=0.25)
    net = Bag(early=early, late=late, trig=trig)
    with mujou.run(net, timer=vt(), workers=1) as run:
        run.write(trig.x, one(1.0))
        run.sleep(0.5)
    starts = [name for name, what in log if what == "start"]
    assert starts == ["early", "early", "trig", "early", "early", "late"]


# --- trigger.coalesce -----------------------------------------------------------------------


class Burst(Node):
    """Sends ``n`` messages (count.1, count.2, ...) on ``out`` in each update."""

    out = Output()

    def __init__(self, n: int, period: float = 0.25) -> None:
        super().__init__(period=period, seed=0)
        self.n = n
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        for k in range(1, self.n + 1):
            self.out.send(one(self.count + k / 8))


@pytest.mark.rule("trigger.coalesce")
def test_coalesce_arrivals_before_an_update_make_one_update() -> None:
    """> Messages stay latest-value: all the arrivals on a node's inputs before one of its
    updates starts make that one update, which reads the latest message of each input."""
    burst = Burst(3)
    node = TwoIn(trigger=mujou.on("a", "b"))
    net = Bag(burst=burst, node=node)
    net.connect(burst.out, node.a)
    with mujou.run(net, timer=vt()) as run:
        run.write(node.b, one(10.0))
        run.write(node.b, one(11.0))
        run.sleep(0.5)
        coalesced = run.stats().nodes["node"].coalesced
    assert node.records == [
        (0.0, 0.0, {"a": (None, False, None), "b": (11.0, True, 0.0)}),
        (0.25, 0.25, {"a": (1.375, True, 0.25), "b": (11.0, False, 0.0)}),
        (0.5, 0.25, {"a": (2.375, True, 0.5), "b": (11.0, False, 0.0)}),
    ]
    assert dict(coalesced) == {"a": 4, "b": 1}


@pytest.mark.rule("trigger.coalesce")
def test_coalesce_arrivals_during_an_update_make_one_more_virtual() -> None:
    """> the arrivals while an update runs make at most one more triggered update, after it:
    under the virtual timer, the messages sent at the tag of a node's (periodic) update."""
    burst = Burst(3)
    node = OnX(period=0.25)
    net = Bag(burst=burst, node=node)
    net.connect(burst.out, node.x)
    with mujou.run(net, timer=vt(), workers=2) as run:
        run.sleep(0.25)
    assert node.records == [
        (0.25, 0.25, {"x": (None, False, None)}),  # periodic, with the burst
        (0.25, 0.0, {"x": (1.375, True, 0.25)}),  # one more, at the next microstep
    ]


@pytest.mark.rule("trigger.coalesce")
def test_coalesce_arrivals_during_an_update_make_one_more_real_time() -> None:
    """> the arrivals while an update runs make at most one more triggered update, after it
    (real-time timer: the host writes three times while the update is blocked)."""
    node = Blocker()
    net = Bag(n=node)
    with mujou.run(net, workers=2) as run:
        run.write(node.x, one(1.0))
        assert node.started.wait(HANG_GUARD), "hang guard: the first update never started"
        for value in (2.0, 3.0, 4.0):
            run.write(node.x, one(value))
        node.gate.set()
        reply = run.wait_for(node.y, lambda y: bool(y[0] == 4.0), timeout=HANG_GUARD)
        assert _value(reply) == 4.0
        run.sleep(0.05)  # room for a wrong third update (not a timing assertion)
        coalesced = run.stats().nodes["n"].coalesced
    assert node.values == [1.0, 4.0]
    assert dict(coalesced) == {"x": 2}


# --- trigger.coalesced-stats ----------------------------------------------------------------


class Camera(Node):
    frame = Output()

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.frame.send(torch.tensor(float(self.count)))


class Logger(Node):
    frame = Input()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        m = self.frame.read()
        assert m is not None
        self.seen.append(float(m))


class CameraNet(Net):
    def __init__(self, camera: float, **logger: Any) -> None:
        super().__init__()
        self.camera = Camera(camera)
        self.logger = Logger(**logger)
        self.connect(self.camera.frame, self.logger.frame)


@pytest.mark.rule("trigger.coalesced-stats")
def test_coalesced_spec_example_logger() -> None:
    """> `print(run.stats().nodes["logger"].coalesced)  # {'frame': 899}` (the page's
    example as written: a camera at 1 kHz feeds a logger with `period=0.01`; the logger runs
    100 times and each time reads one frame: frames 9, 19, ..., 999)."""
    net = CameraNet(0.001, period=0.01)
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        stats = run.stats().nodes["logger"]
        assert dict(stats.coalesced) == {"frame": 899}
        assert stats.updates == 100
    assert net.logger.seen == [10.0 * k - 1 for k in range(1, 101)]


@pytest.mark.rule("trigger.coalesced-stats")
def test_coalesced_counted_when_the_next_update_starts() -> None:
    """> `NodeStats.coalesced` maps the attribute name of each input of the node to the
    number of arrivals on it that were replaced by a later arrival before an update of the
    node started after them, so that no update of the node saw them as fresh. (A triggered
    node with a `min_interval` coalesces the same way; an arrival is counted when the next
    update starts. In binary fractions: a camera every p = 1/1024 s, `min_interval=10 p`.)"""
    p = 1 / 1024
    net = CameraNet(p, trigger=mujou.on("frame"), min_interval=10 * p)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1000 * p)  # updates at 10 p, 20 p, ..., each reading the frame before
        assert dict(run.stats().nodes["logger"].coalesced) == {"frame": 899}
        run.sleep(5 * p)  # frames 1000-1004 replaced, but no update started since
        assert dict(run.stats().nodes["logger"].coalesced) == {"frame": 899}
        run.sleep(5 * p)  # the update at 1010 p reads frame 1009: 1000-1008 are counted
        stats = run.stats().nodes["logger"]
        assert dict(stats.coalesced) == {"frame": 899 + 9}
        assert stats.updates == 101
    assert net.logger.seen == [10.0 * k - 1 for k in range(1, 102)]


@pytest.mark.rule("trigger.coalesced-stats")
def test_coalesced_counts_for_every_node_zero_for_none() -> None:
    """> it counts on every node's inputs, triggered or not, and is `0` for an input with
    none."""
    fast = Counter(period=0.125)
    reader = TwoIn(period=0.5)  # periodic only, reads a source four times faster
    net = Bag(fast=fast, reader=reader)
    net.connect(fast.out, reader.a)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        stats = run.stats().nodes
    # At 0.5 it reads message 3 (1, 2 replaced); at 1.0 message 7 (4, 5, 6 replaced).
    assert [record[2]["a"][0] for record in reader.records] == [3.0, 7.0]
    assert dict(stats["reader"].coalesced) == {"a": 5, "b": 0}
    assert dict(stats["fast"].coalesced) == {}


# --- trigger.tags ---------------------------------------------------------------------------


class PCamera(Node):
    frame = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.frame.send(torch.tensor(float(self.count)))


class PDetector(Node):
    frame = Input()
    boxes = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("frame"))

    def on_update(self, dt: float) -> None:
        m = self.frame.read()
        assert m is not None
        self.boxes.send(m * 2)


class PTracker(Node):
    boxes = Input()
    track = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("boxes"))

    def on_update(self, dt: float) -> None:
        m = self.boxes.read()
        assert m is not None
        self.track.send(m + 1)


class Pipeline(Net):
    def __init__(self) -> None:
        super().__init__()
        self.camera = PCamera()
        self.detector = PDetector()
        self.tracker = PTracker()
        self.connect(self.camera.frame, self.detector.frame)
        self.connect(self.detector.boxes, self.tracker.boxes)


@pytest.mark.rule("trigger.tags")
def test_spec_example_pipeline() -> None:
    """> `run.sleep(0.01)` returns after the tag `(0.01, 2)`, with `run.time == 0.01` (the
    page's Pipeline example, as written)."""
    net = Pipeline()
    with mujou.run(net, timer=mujou.VirtualTimer(), workers=2) as run:
        run.sleep(0.01)
        assert run.read(net.tracker.track) == 3.0  # frame 1, through both nodes, at 0.01
        assert run.time == 0.01
        run.sleep(0.01)
        assert run.read(net.tracker.track) == 5.0  # frame 2, at 0.02


class Chain(Net):
    """camera (periodic) -> detector -> tracker (triggered), with a periodic watcher of the
    camera and a node both periodic and triggered by the camera; all probes share a log."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        super().__init__()
        self.camera = Counter(period=0.125)
        self.detector = Relay(log)
        self.tracker = Relay(log)
        self.watcher = OnX(log, period=0.125, trigger=None)
        self.both = OnX(log, period=0.125)
        self.connect(self.camera.out, self.detector.x)
        self.connect(self.detector.y, self.tracker.x)
        self.connect(self.camera.out, self.watcher.x)
        self.connect(self.camera.out, self.both.x)


@pytest.mark.rule("trigger.tags")
@pytest.mark.parametrize("workers", [1, 4])
def test_tags_microsteps_visibility_and_dt(workers: int) -> None:
    """> Periodic updates run at microstep 0. An arrival at tag `(t, m)` that makes a node due
    at time `d` wakes it at `(t, m + 1)` when `d == t` ... An update at a tag sees exactly the
    messages of the earlier tags ...; a message sent at `(t, m)` becomes visible when that tag
    ends, with the stamp `t`; every update at one tag ends before any update of the next tag
    starts. The `dt` of an update that follows another of the same node at the same `t` is
    `0.0`, and a host call that runs the updates of time `t` returns after the last tag at
    `t`."""
    log: list[tuple[str, str]] = []
    net = Chain(log)
    with mujou.run(net, timer=vt(), workers=workers) as run:
        run.sleep(0.125)
        track = run.read(net.tracker.y)
        assert track is not None and float(track[0]) == 3.0  # the whole chain ran at 0.125
        assert run.time == 0.125
        run.sleep(0.125)
    t1, t2 = 0.125, 0.25
    assert net.detector.records == [(t1, t1, {"x": (1.0, True, t1)}), (t2, t1, {"x": (2.0, True, t2)})]
    assert net.tracker.records == [(t1, t1, {"x": (2.0, True, t1)}), (t2, t1, {"x": (3.0, True, t2)})]
    # The periodic watcher at (t, 0) never sees the camera's message of the same tag.
    assert net.watcher.records == [(t1, t1, {"x": (None, False, None)}), (t2, t1, {"x": (1.0, True, t1)})]
    # Periodic at (t, 0), then triggered at (t, 1) with dt 0.0.
    assert net.both.records == [
        (t1, t1, {"x": (None, False, None)}),
        (t1, 0.0, {"x": (1.0, True, t1)}),
        (t2, t1, {"x": (1.0, False, t1)}),
        (t2, 0.0, {"x": (2.0, True, t2)}),
    ]
    # Tags in order at each time: (t, 0) watcher and both; (t, 1) detector and both; (t, 2)
    # tracker. Every update of a tag ends before one of the next starts.
    tag = {"watcher": 0, "detector": 1, "tracker": 2}
    half = len(log) // 2
    for events in (log[:half], log[half:]):
        tags: list[int] = []
        seen_both = 0
        for name, what in events:
            if name == "both":
                seen_both += what == "start"
                tags.append(seen_both - 1)
            else:
                tags.append(tag[name])
        assert tags == sorted(tags), events
    assert len(log) == 2 * 2 * 5


# --- trigger.workers-identical --------------------------------------------------------------


class Noise(Node):
    """Sends a random draw from its generator at each update, after ``pause`` real seconds
    (so that with several workers, the other nodes of its tag run meanwhile)."""

    out = Output()

    def __init__(self, period: float, seed: int, pause: float = 0.0) -> None:
        super().__init__(period=period, seed=seed)
        self.pause = pause

    def on_update(self, dt: float) -> None:
        if self.pause:
            time.sleep(self.pause)
        self.out.send(torch.randn(1, generator=self.generator))


class Mix(TwoIn):
    """Sends a + b + a draw on ``y`` (what is missing counts as 0)."""

    y = Output()

    def react(self) -> None:
        a, b = self.a.read(), self.b.read()
        total = torch.randn(1, generator=self.generator)
        for m in (a, b):
            if m is not None:
                total = total + m
        self.y.send(total)


class Busy(Net):
    """Triggers of every kind, fed by periodic random sources and by the host."""

    def __init__(self) -> None:
        super().__init__()
        self.s1 = Noise(1 / 16, 1)
        self.s2 = Noise(3 / 32, 2, pause=0.001)
        self.fuse = Mix(trigger=mujou.on_all("a", "b", timeout=1 / 32))
        self.any = Mix(trigger=mujou.on("a", "b"), min_interval=1 / 8)
        self.late = Relay(delay=3 / 64)
        self.both = Mix(period=1 / 8, trigger=mujou.on("a"))
        self.tail = Mix(trigger=mujou.on("a", "b"))
        self.host = Relay()
        self.peek = Mix(period=3 / 32, trigger=None)  # at s2's tags, after it in the order
        self.connect(self.s1.out, self.fuse.a)
        self.connect(self.s2.out, self.fuse.b)
        self.connect(self.s1.out, self.any.a)
        self.connect(self.fuse.y, self.any.b)
        self.connect(self.any.y, self.late.x)
        self.connect(self.late.y, self.both.a)
        self.connect(self.s2.out, self.both.b)
        self.connect(self.both.y, self.tail.a)
        self.connect(self.host.y, self.tail.b)
        self.connect(self.s1.out, self.peek.a)
        self.connect(self.s2.out, self.peek.b)


def busy_script(run: mujou.Run, net: Busy, t_from: float, t_to: float) -> None:
    """The host's part: a write to ``host`` at each 1/4 (and one more at the same time), from
    ``t_from`` to ``t_to``; the writes stand at fixed times, so a resumed run can replay them."""
    t = t_from
    while t < t_to:
        k = round(t * 4)
        run.write(net.host.x, one(float(k)))
        run.sleep(0)
        run.write(net.host.x, one(float(k) + 0.5))
        run.sleep(0.25)
        t = run.time


def busy_records(net: Busy) -> dict[str, list[Record]]:
    return {
        name: list(getattr(net, name).records)
        for name in ("fuse", "any", "late", "both", "tail", "host", "peek")
    }


def same_tree(a: object, b: object, path: str = "tree") -> None:
    """Assert two state trees are identical: same structure and types, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (path, a, b)
        for key in a:
            same_tree(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_tree(x, y, f"{path}[{i}]")
    else:
        same_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
        assert type(a) is type(b) and (a == b or same_nan), (path, a, b)


def busy_run(workers: int) -> tuple[dict[str, list[Record]], dict[str, Any], dict[str, Any]]:
    net = Busy()
    with mujou.run(net, timer=vt(), workers=workers) as run:
        busy_script(run, net, 0.0, 2.0)
        tree = run.state_dict()
        stats = {name: (s.updates, dict(s.coalesced)) for name, s in run.stats().nodes.items()}
    return busy_records(net), tree, stats


@pytest.mark.rule("trigger.workers-identical")
def test_workers_identical() -> None:
    """> Under the virtual timer a net with triggered nodes is deterministic ...: the tags,
    the state tree, what every read, `fresh` and `stamp` return, and the `updates` and
    `coalesced` statistics are the same, bit for bit, whatever the number of workers."""
    records1, tree1, stats1 = busy_run(1)
    assert all(records1.values()), {name: len(r) for name, r in records1.items()}
    assert sum(count for _, counts in stats1.values() for count in counts.values()) > 0
    for workers in (2, 4):
        records, tree, stats = busy_run(workers)
        assert records == records1, workers
        same_tree(tree, tree1)
        assert stats == stats1, workers


# --- trigger.cycle --------------------------------------------------------------------------


class Ping(Node):
    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))  # add delay=0.001 to make it a loop in time

    def on_update(self, dt: float) -> None:
        m = self.x.read()
        assert m is not None
        self.y.send(m + 1)


class Started(Relay):
    """A relay that notes its on_start in a shared list."""

    state_exclude: ClassVar[tuple[str, ...]] = ("log", "started_log")

    def __init__(self, starts: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started_log = starts

    def on_start(self) -> None:
        self.started_log.append(self.name)


def loop_net(starts: list[str], a: dict[str, Any], b: dict[str, Any]) -> Net:
    """a.y -> b.x and b.y -> a.x, plus a periodic node and a host-fed one, all noting on_start."""
    net = Bag(
        src=Started(starts, period=0.25, trigger=None),
        a=Started(starts, **a),
        b=Started(starts, **b),
    )
    net.connect(net.a.y, net.b.x)  # type: ignore[attr-defined]
    net.connect(net.b.y, net.a.x)  # type: ignore[attr-defined]
    return net


@pytest.mark.rule("trigger.cycle")
def test_cycle_is_refused_before_any_node_starts() -> None:
    """> When the graph of a net has a cycle, `mujou.run` raises `ValueError` before any node
    starts, and its message names the nodes of one cycle in order, from a node back to it
    (`triggered nodes 'a' -> 'b' -> 'a' form a cycle with no delay: ...`)."""
    starts: list[str] = []
    net = loop_net(starts, {}, {})
    for timer in (vt(), mujou.RealTimeTimer()):
        with pytest.raises(ValueError, match=r"triggered nodes 'a' -> 'b' -> 'a' form a cycle with no delay"):
            mujou.run(net, timer=timer)
        assert starts == []


@pytest.mark.rule("trigger.cycle")
def test_cycle_of_one_spec_example_ping() -> None:
    """> A node triggered by its own output forms a cycle of one: the `Ping` below, named
    `ping` in a net that connects its `y` to its `x`, gives `'ping' -> 'ping'`."""
    net = Bag(ping=Ping())
    net.connect(net.ping.y, net.ping.x)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"'ping' -> 'ping'"):
        mujou.run(net, timer=vt())


@pytest.mark.rule("trigger.cycle")
@pytest.mark.parametrize(
    "b",
    [
        {"delay": 0.125},
        {"min_interval": 0.125},
        {"period": 0.125, "trigger": None},  # periodic only
        {"trigger": mujou.on("other")},  # triggered by another input
    ],
    ids=["delay", "min_interval", "periodic", "other-input"],
)
def test_cycle_broken(b: dict[str, Any]) -> None:
    """> The trigger graph has an edge from node A to node B when B is triggered by an input
    whose source is an output of A and B has `delay == 0` and `min_interval == 0`. (A node not
    triggered by its predecessor's output (periodic only, or triggered by other inputs), a
    `delay` or a `min_interval` breaks it.)"""

    class WithOther(Started):
        other = Input(optional=True)

    starts: list[str] = []
    net = Bag(
        a=Started(starts),
        b=WithOther(starts, **b),
    )
    net.connect(net.a.y, net.b.x)  # type: ignore[attr-defined]
    net.connect(net.b.y, net.a.x)  # type: ignore[attr-defined]
    with mujou.run(net, timer=vt()) as run:
        run.write(net.b.other, one(0.0))  # type: ignore[attr-defined]
        run.sleep(0.5)
    assert sorted(starts) == ["a", "b"]


# --- trigger.microstep-cap ------------------------------------------------------------------

CAP = 10_000


class Spin(Node):
    """Triggered by its own output (and by the host's ``go``) with a ``min_interval`` too small
    to move a time >= 1.0 (t + 1e-300 == t): not a cycle for the check, yet every update is
    due at the same time again, so only the microstep cap stops it."""

    x = Input(optional=True)
    go = Input(optional=True)
    y = Output()
    state_exclude: ClassVar[tuple[str, ...]] = ("stops",)

    def __init__(self, stops: list[str], limit: int = 0) -> None:
        super().__init__(trigger=mujou.on("x", "go"), min_interval=1e-300)
        self.updates = 0
        self.stops = stops
        self.limit = limit  # > 0: after a write to go, stop after this many updates
        self.left = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if self.go.fresh:
            self.left = self.limit
        self.left -= 1
        if self.limit == 0 or self.left > 0:
            self.y.send(one(float(self.updates)))

    def on_stop(self) -> None:
        self.stops.append(self.name)


@pytest.mark.rule("trigger.microstep-cap")
def test_microstep_cap_stops_the_run() -> None:
    """> Under the virtual timer, when one host call runs more than 10000 microsteps at one
    timer time, the run stops as when a hook fails (every started node gets its `on_stop`),
    and that call raises `RuntimeError` naming the time and the nodes due at the microstep it
    refused."""
    assert 1.0 + 1e-300 == 1.0
    stops: list[str] = []
    net = Bag(spin=Spin(stops), other=Counter(period=0.5))
    net.connect(net.spin.y, net.spin.x)  # type: ignore[attr-defined]
    run = mujou.run(net, timer=vt())
    try:
        run.sleep(1.0)
        run.write(net.spin.go, one(0.0))  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match=r"1\.0.*'spin'") as info:
            run.sleep(0.5)
        assert "'other'" not in str(info.value), info.value
        assert run.time == 1.0
    finally:
        with contextlib.suppress(RuntimeError):  # the run's error, raised again
            run.stop()
    assert sorted(stops) == ["spin"]
    assert net.spin.updates == CAP  # type: ignore[attr-defined]


@pytest.mark.rule("trigger.microstep-cap")
@pytest.mark.parametrize("woken_by", ["write", "periodic"])
def test_microstep_cap_allows_ten_thousand_in_one_call(woken_by: str) -> None:
    """> when one host call runs more than 10000 microsteps at one timer time, the run stops:
    10000 microsteps after the time's first instant run, whether the chain starts from a host
    write (the call begins at a time whose instant already ran) or from a periodic update of
    the call's own new instant."""
    stops: list[str] = []
    spin = Spin(stops)
    clock = Counter(period=1.0)
    net = Bag(clock=clock, spin=spin)
    net.connect(spin.y, spin.x)
    if woken_by == "periodic":
        net.connect(clock.out, spin.go)
    run = mujou.run(net, timer=vt())
    try:
        if woken_by == "write":
            run.sleep(1.0)
            run.write(spin.go, one(0.0))
        with pytest.raises(RuntimeError, match="10000"):
            run.sleep(0.5 if woken_by == "write" else 1.0)
        assert run.time == 1.0
    finally:
        with contextlib.suppress(RuntimeError):  # the run's error, raised again
            run.stop()
    assert spin.updates == CAP
    assert stops == ["spin"]


class Echo(Node):
    x = Input(optional=True)
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))

    def on_update(self, dt: float) -> None:
        m = self.x.read()
        assert m is not None
        self.y.send(m)


class Server(Net):
    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo()


@pytest.mark.rule("trigger.microstep-cap")
def test_microstep_cap_counts_within_one_host_call() -> None:
    """> It counts within one host call, so a host that writes and waits many times at one
    instant ([](#trigger.host)) never reaches it: two calls of 6000 microsteps each at time
    1.0 run to the end."""
    stops: list[str] = []
    spin = Spin(stops, limit=6000)
    net = Bag(spin=spin)
    net.connect(spin.y, spin.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        for _ in range(2):
            run.write(spin.go, one(0.0))
            run.sleep(0)
        assert run.time == 1.0
        assert run.stats().nodes["spin"].updates == 12_000
    assert spin.updates == 12_000


# --- trigger.host ---------------------------------------------------------------------------


@pytest.mark.rule("trigger.host")
def test_spec_example_echo() -> None:
    """> So `run.write` followed by `run.wait_for` is an event-driven round trip: the host
    asks, the node answers, and under the virtual timer no timer time passes (the page's
    Echo example, as written)."""
    net = Server()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        for i in range(3):
            run.write(net.echo.x, torch.tensor(float(i)))
            reply = run.wait_for(net.echo.y, is_(i), timeout=1.0)
            assert reply == i
        assert run.time == 0.0  # three round trips, no timer time


@pytest.mark.rule("trigger.host")
@pytest.mark.parametrize("call", ["sleep0", "sleep", "wait_for"])
def test_host_write_runs_at_a_microstep_of_its_own(call: str) -> None:
    """> `run.write(input, message)` is an arrival on the input at `run.time` ... Under the
    virtual timer, a node so made due at `run.time` runs in the host's next call that runs
    updates (`run.sleep`, `run.sleep(0)` included, `run.wait_for`, `run.join`), at a
    microstep of its own after every update that already ran at `run.time` and before any
    update of a later time."""
    source = Counter(period=0.25)
    echo = TwoIn(trigger=mujou.on("a"))
    net = Bag(source=source, echo=echo)
    net.connect(source.out, echo.b)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
        run.write(echo.a, one(1.0))
        assert echo.records == []  # not before the host's next call
        if call == "sleep0":
            run.sleep(0)
            assert run.time == 0.25
        elif call == "sleep":
            run.sleep(0.25)
        else:
            run.wait_for(source.out, lambda m: bool(m[0] == 2.0), timeout=1.0)
        assert source.count == (1 if call == "sleep0" else 2)
    # At 0.25, after the source's update of 0.25 (its message is visible), before 0.5.
    assert echo.records == [(0.25, 0.25, {"a": (1.0, True, 0.25), "b": (1.0, True, 0.25)})]


@pytest.mark.rule("trigger.host")
def test_host_write_and_join() -> None:
    """> a node so made due at `run.time` runs in the host's next call that runs updates
    (..., `run.join`)."""
    node = Relay()

    class Stopper(Node):
        x = Input(optional=True)

        def __init__(self) -> None:
            super().__init__(trigger=mujou.on("x"))

        def on_update(self, dt: float) -> None:
            raise RuntimeError("stop here")

    net = Bag(n=node, stopper=Stopper())
    net.connect(node.y, net.stopper.x)  # type: ignore[attr-defined]
    run = mujou.run(net, timer=vt())
    run.write(node.x, one(1.0))
    with pytest.raises(mujou.HookError, match="stop here"):
        run.join(timeout=1.0)
    assert node.records == [(0.0, 0.0, {"x": (1.0, True, 0.0)})]


# --- trigger.real-time ----------------------------------------------------------------------


class RelayNet(Net):
    """host -> first -> second, triggered only: nothing periodic wakes the workers."""

    def __init__(self, **second: Any) -> None:
        super().__init__()
        self.first = Relay()
        self.second = Relay(**second)
        self.connect(self.first.y, self.second.x)


@pytest.mark.rule("trigger.real-time")
@pytest.mark.parametrize("workers", [1, 2])
def test_real_time_send_wakes_an_idle_worker(workers: int) -> None:
    """> Under the real-time timer, when an arrival makes a node's condition hold, the node is
    queued at its due time before the `send` (or `run.write`) returns, and an idle worker is
    woken at once: no timed poll is on the path from the `send` to the update. (Here nothing
    is periodic: without the wake-ups the workers would sleep forever and the waits time
    out.)"""
    net = RelayNet()
    with mujou.run(net, workers=workers) as run:
        for i in range(5):
            run.write(net.first.x, one(float(10 * i)))
            reply = run.wait_for(net.second.y, first_is(10 * i + 2), timeout=HANG_GUARD)
            assert _value(reply) == 10 * i + 2
    assert [record[2]["x"][0] for record in net.second.records] == [10.0 * i + 1 for i in range(5)]
    assert all(record[2]["x"][1] for record in net.second.records)


@pytest.mark.rule("trigger.real-time")
def test_real_time_min_interval_waits_for_its_due_time() -> None:
    """> A node due later (a `delay`, a `min_interval`) waits for its due time as a periodic
    update does: its update starts no earlier than `min_interval` after the previous one, by
    the node's own `dt`."""
    net = RelayNet(min_interval=0.05)
    with mujou.run(net, workers=2) as run:
        for i in range(3):
            run.write(net.first.x, one(float(10 * i)))
            run.wait_for(net.second.y, first_is(10 * i + 2), timeout=HANG_GUARD)
    dts = [record[1] for record in net.second.records]
    assert len(dts) == 3
    assert all(dt >= 0.05 - 1e-9 for dt in dts[1:]), dts


@pytest.mark.rule("trigger.delay")
@pytest.mark.parametrize("workers", [1, 2])
def test_real_time_delay_after_a_send_waits_for_its_due_time(workers: int) -> None:
    """> `delay=seconds` is a logical delay: a triggered update is due `delay` seconds of the
    timer after the arrival that made the condition hold. Under the real-time timer, for a
    node woken by another node's send (a worker's hand-off path): each update starts no
    earlier than `delay` after the stamp of the message that woke it."""
    net = RelayNet(delay=0.03)
    with mujou.run(net, workers=workers) as run:
        for i in range(3):
            run.write(net.first.x, one(float(10 * i)))
            run.wait_for(net.second.y, first_is(10 * i + 2), timeout=HANG_GUARD)
    records = net.second.records
    assert len(records) == 3
    for start, _, seen in records:
        stamp = seen["x"][2]
        assert stamp is not None
        assert start >= stamp + 0.03 - 1e-9, records


# --- trigger.dedicated-thread ---------------------------------------------------------------


class Threaded(Relay):
    """A relay that notes the thread of each of its hooks."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads: list[int] = []

    def on_start(self) -> None:
        self.threads.append(threading.get_ident())

    def react(self) -> None:
        self.threads.append(threading.get_ident())
        super().react()


@pytest.mark.rule("trigger.dedicated-thread")
@pytest.mark.parametrize("virtual", [True, False], ids=["virtual", "real-time"])
def test_dedicated_thread_node_can_be_triggered(virtual: bool) -> None:
    """> A node with `dedicated_thread=True` can have a trigger: an arrival that makes it due
    wakes its own thread, which runs the triggered update there, under both timers."""
    camera = Counter(period=0.125)
    chained = Threaded(dedicated_thread=True)
    asked = Threaded(dedicated_thread=True)
    net = Bag(camera=camera, chained=chained, asked=asked)
    net.connect(camera.out, chained.x)
    timer: mujou.Timer = vt() if virtual else mujou.RealTimeTimer()
    with mujou.run(net, timer=timer, workers=1) as run:
        for i in range(3):
            run.write(asked.x, one(float(i)))
            reply = run.wait_for(asked.y, first_is(i + 1), timeout=HANG_GUARD)
            assert _value(reply) == i + 1
        run.wait_for(chained.y, lambda y: bool(y[0] >= 4.0), timeout=HANG_GUARD)  # frame 3
        if virtual:
            assert run.time == 0.375
    for node in (chained, asked):
        assert len(node.threads) >= 4, node.threads
        assert len(set(node.threads)) == 1, node.threads  # on_start's thread runs every update
        assert node.threads[0] != threading.get_ident()
    assert chained.threads[0] != asked.threads[0]
    if virtual:  # the camera's frame at each 1/8, at the next microstep
        assert chained.records == [(k / 8, 1 / 8, {"x": (float(k), True, k / 8)}) for k in (1, 2, 3)]
    assert [record[2]["x"][0] for record in asked.records] == [0.0, 1.0, 2.0]


# --- trigger.state --------------------------------------------------------------------------


@pytest.mark.rule("trigger.state")
@pytest.mark.parametrize("workers_after", [1, 2])
def test_state_round_trip_continues_bit_for_bit(workers_after: int) -> None:
    """> The `"@mujou"` entry of the state tree holds, for each node, its pending triggered
    update (its due time, or none) and the fresh flag of each input; a run resumed with
    `state=` restores them, so that under the virtual timer it continues bit for bit as the
    run that went on, triggered updates included. (Saved right after a `run.write` that woke
    a node: resumed, it runs in the first call that runs updates.)"""
    net = Busy()
    with mujou.run(net, timer=vt(), workers=2) as run:
        busy_script(run, net, 0.0, 1.0)
        run.write(net.host.x, one(100.0))
        tree = run.state_dict()
        run.sleep(0)
        busy_script(run, net, 1.0, 2.0)
        went_on = run.state_dict()
    records = busy_records(net)
    assert any(record[0] == 1.0 and record[2]["x"][0] == 100.0 for record in net.host.records)

    net2 = Busy()
    with mujou.run(net2, timer=vt(), workers=workers_after, state=tree) as run:
        assert run.time == 1.0
        run.sleep(0)
        busy_script(run, net2, 1.0, 2.0)
        resumed = run.state_dict()
    same_tree(resumed, went_on)
    assert busy_records(net2) == records


@pytest.mark.rule("trigger.state")
def test_state_keeps_a_pending_delayed_update() -> None:
    """> ... its pending triggered update (its due time, or none) and the fresh flag of each
    input; a run resumed with `state=` restores them (a delayed update due after the save,
    and a node with nothing pending)."""

    def make() -> tuple[Net, OnX, OnX]:
        delayed, idle = OnX(delay=0.25), OnX()
        return Bag(delayed=delayed, idle=idle), delayed, idle

    net, delayed, idle = make()
    with mujou.run(net, timer=vt()) as run:
        run.write(idle.x, one(5.0))
        run.sleep(0.875)
        run.write(delayed.x, one(1.0))  # due at 1.125
        run.sleep(0.125)
        tree = run.state_dict()
    assert delayed.records == [] and idle.starts() == [0.0]
    net2, delayed2, idle2 = make()
    with mujou.run(net2, timer=vt(), state=tree) as run:
        run.sleep(0.0625)
        assert delayed2.records == []
        run.sleep(1.0)
    assert delayed2.records == [(1.125, 1.125, {"x": (1.0, True, 0.875)})]
    assert idle2.starts() == [0.0]  # nothing pending: its restored message wakes nothing


# --- the host sees whole instants -----------------------------------------------------------


class RelayChain(Net):
    """source -> r1 -> r2 -> r3: a periodic counter and three triggered relays, which run at
    the microsteps 1, 2 and 3 of the counter's instant."""

    def __init__(self) -> None:
        super().__init__()
        self.source = Counter()
        self.r1, self.r2, self.r3 = Relay(), Relay(), Relay()
        self.connect(self.source.out, self.r1.x)
        self.connect(self.r1.y, self.r2.x)
        self.connect(self.r2.y, self.r3.x)


@pytest.mark.rule("trigger.tags", "trigger.state")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("predicate", [True, False], ids=["predicate", "latest"])
def test_wait_for_returns_after_the_whole_instant(workers: int, predicate: bool) -> None:
    """> every update at one tag ends before any update of the next tag starts ... a host call
    > that runs the updates of time `t` returns after the last tag at `t`

    and "the host never sees an instant half done". Defect 14 of issue 23: `wait_for(r1.y)`
    returned after the tag (0.125, 1), before r2 and r3 ran at (0.125, 2) and (0.125, 3):
    `run.read(r2.y)` was None and the state tree held r2's pending trigger. As `run.sleep`
    and a `wait_for` that times out do, it returns once the instant is whole."""
    net = RelayChain()
    with mujou.run(net, timer=vt(), workers=workers) as run:
        found = run.wait_for(net.r1.y, first_is(2.0) if predicate else None, timeout=1.0)
        assert _value(found) == 2.0 and run.time == 0.125
        r2, r3 = run.read(net.r2.y), run.read(net.r3.y)
        assert _value(r2) == 3.0 and _value(r3) == 4.0
        tree = run.state_dict()
        nodes = tree["@mujou"]["nodes"]
        assert [nodes[name]["trigger"] for name in ("r1", "r2", "r3")] == [None, None, None]
        # The next instant's chain, the same way (the latest message is looked at first).
        found = run.wait_for(net.r1.y, first_is(3.0), timeout=1.0)
        r3 = run.read(net.r3.y)
        assert _value(found) == 3.0 and run.time == 0.25 and _value(r3) == 5.0


@pytest.mark.rule("trigger.tags", "proc.virtual")
def test_wait_for_returns_after_the_whole_instant_with_processes() -> None:
    """The same with r2 and r3 in a process of their own: the lockstep asks the host's
    predicate between whole instants only, not between the tags of one time."""
    net = RelayChain()
    with mujou.run(net, timer=vt(), processes={"far": [net.r2, net.r3]}) as run:
        found = run.wait_for(net.r1.y, first_is(2.0), timeout=1.0)
        assert _value(found) == 2.0 and run.time == 0.125
        r2, r3 = run.read(net.r2.y), run.read(net.r3.y)
        assert _value(r2) == 3.0 and _value(r3) == 4.0
        nodes = run.state_dict()["@mujou"]["nodes"]
        assert [nodes[name]["trigger"] for name in ("r1", "r2", "r3")] == [None, None, None]


# --- trigger.coalesce and trigger.min-interval under the real-time timer --------------------


class SendsTwice(Node):
    """Periodic; each update sends its count twice on ``y``: 2k - 1, then 2k."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        for _ in range(2):
            self.count += 1
            self.y.send(one(float(self.count)))


@pytest.mark.rule("trigger.coalesce", "trigger.min-interval")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("min_interval", [0.0, 0.05])
def test_real_time_arrivals_before_an_update_make_that_one_update(workers: int, min_interval: float) -> None:
    """> all the arrivals on a node's inputs before one of its updates starts make that one
    > update, which reads the latest message of each input

    Defect 6 of issue 23: a send hands the reader off to the sending worker, and the second
    send of the same update came while the reader was in that worker's batch, not begun; the
    due time it made was applied after the update that read it, which ran the reader again
    with nothing fresh, ``min_interval`` or not. Every reader update must see ``x`` fresh
    and start ``min_interval`` or more after the previous one (its own ``dt``); with one
    worker nothing can run the reader between the two sends, so each reader update reads the
    second message of a source update."""
    net = Bag(source=SendsTwice(), reader=Relay(min_interval=min_interval))
    net.connect(net.source.y, net.reader.x)  # type: ignore[attr-defined]
    with mujou.run(net, timer=mujou.RealTimeTimer(), workers=workers) as run:
        run.wait_for(net.reader.y, lambda m: bool(m.reshape(-1)[0] >= 13), timeout=HANG_GUARD)  # type: ignore[attr-defined]
    records = net.reader.records  # type: ignore[attr-defined]
    sends = net.source.count  # type: ignore[attr-defined]
    assert records and all(seen["x"][1] for _, _, seen in records), records
    assert all(dt >= min_interval - 1e-9 for _, dt, _ in records), records
    assert len(records) <= sends
    if workers == 1:
        assert len(records) <= sends // 2
        assert all(seen["x"][0] is not None and seen["x"][0] % 2 == 0 for _, _, seen in records), records


class Holds(OnX):
    """Periodic every 0.1 s and triggered by ``x`` with a delay of 0.12 s; its first update
    waits for the host (``started``, ``release``)."""

    def __init__(self) -> None:
        super().__init__(period=0.1, delay=0.12)
        self.started = threading.Event()
        self.release = threading.Event()

    state_exclude: ClassVar[tuple[str, ...]] = ("log", "started", "release")

    def react(self) -> None:
        if len(self.records) == 1:
            self.started.set()
            assert self.release.wait(HANG_GUARD)


@pytest.mark.rule("trigger.periodic-and-triggered", "trigger.coalesce")
@pytest.mark.parametrize("workers", [1, 2])
def test_real_time_a_periodic_update_reads_an_arrival_and_makes_no_extra_update(workers: int) -> None:
    """> A periodic update also counts as the node's previous update for the condition: a
    > command that arrives just before a periodic update is read by it and makes no extra
    > update.

    Defect 7 of issue 23: the host writes during the node's first update (at 0.1), which
    makes it due at 0.1 + 0.12, after its periodic update at 0.2; that update reads the
    message. With one worker the kept batch kept the trigger, and the node ran again at
    about 0.22 with nothing fresh. Every update that took no periodic slot (by the node's
    own start times, the running sum of its ``dt``) must have seen ``x`` fresh, and exactly
    one update sees it."""
    node = Holds()
    net = Bag(node=node)
    with mujou.run(net, timer=mujou.RealTimeTimer(), workers=workers) as run:
        assert node.started.wait(HANG_GUARD)
        run.write(node.x, one(1.0))
        node.release.set()
        deadline = run.time + HANG_GUARD
        while len(node.records) < 5 and run.time < deadline:
            run.sleep(0.05)
    records = node.records[:5]
    assert len(records) == 5
    slot = 1
    for start, _, seen in records:
        if start >= slot * 0.1 - 1e-12:  # a periodic update: the first slot at or after it is next
            slot = max(slot + 1, math.ceil(start / 0.1 - 1e-9))
            while slot * 0.1 < start:
                slot += 1
            continue
        assert seen["x"][1], ("an update that took no periodic slot saw nothing fresh", records)
    assert [seen["x"][1] for _, _, seen in records].count(True) == 1, records


class HeldFusion(TwoIn):
    """``on_all("a", "b", timeout=30)``: its first update (both inputs written) waits for the
    host (``started``, ``release``)."""

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on_all("a", "b", timeout=30.0))
        self.started = threading.Event()
        self.release = threading.Event()

    state_exclude: ClassVar[tuple[str, ...]] = ("log", "started", "release")

    def react(self) -> None:
        if len(self.records) == 1:
            self.started.set()
            assert self.release.wait(HANG_GUARD)


@pytest.mark.rule("trigger.due", "trigger.all-timeout", "trigger.state")
@pytest.mark.parametrize("workers", [1, 2])
def test_real_time_two_arrivals_during_an_update_the_first_one_counts(workers: int) -> None:
    """> When the condition comes to hold at timer time `s` (... for a timeout the first
    > arrival's time plus `timeout`) ... When the node already has an earlier due time (...
    > an earlier trigger not yet run), that one stands.

    Two arrivals on ``a`` while the node's update runs, the second at least 0.01 s of the
    timer after the first: its next update is due 30 s after the first of them, which the
    state tree shows before it runs (issue 28, mutant T06: a later arrival replaced the
    earlier due time). The bounds are the timer's own readings around each write."""
    node = HeldFusion()
    with mujou.run(Bag(node=node), timer=mujou.RealTimeTimer(), workers=workers) as run:
        run.write(node.a, one(1.0))
        run.write(node.b, one(1.0))
        assert node.started.wait(HANG_GUARD)
        before = run.time
        run.write(node.a, one(2.0))
        after = run.time
        run.sleep(0.01)
        later = run.time
        run.write(node.a, one(3.0))
        node.release.set()
        due = run.state_dict()["@mujou"]["nodes"]["node"]["trigger"]
    assert after < later
    assert before + 30.0 <= due <= after + 30.0, (before, after, later, due)


class StopSignal(Node):
    """Never updates (triggered by an input nothing feeds); its on_stop tells that the stop began."""

    x = Input(optional=True)
    state_exclude: ClassVar[tuple[str, ...]] = ("stopped",)

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))
        self.stopped = threading.Event()

    def on_stop(self) -> None:
        self.stopped.set()


@pytest.mark.rule("trigger.state", "trigger.due")
def test_real_time_an_arrival_during_the_last_update_is_in_the_final_tree() -> None:
    """> The `"@mujou"` entry of the state tree holds, for each node, its pending triggered
    > update (its due time, or none)

    Also after the run ended: the host writes while the node's update runs (so the arrival
    is decided when the node comes back), and the stop begins before that update ends (the
    other node's on_stop ran). The tree taken after the stop holds the update the write made
    due, 30 s after it."""
    node, signal = HeldFusion(), StopSignal()
    run = mujou.run(Bag(node=node, signal=signal), timer=mujou.RealTimeTimer(), workers=2)
    try:
        run.write(node.a, one(1.0))
        run.write(node.b, one(1.0))
        assert node.started.wait(HANG_GUARD)
        before = run.time
        run.write(node.a, one(2.0))
        after = run.time
        stopper = threading.Thread(target=run.stop)
        stopper.start()
        assert signal.stopped.wait(HANG_GUARD)
        node.release.set()
        stopper.join(HANG_GUARD)
        assert not stopper.is_alive()
        due = run.state_dict()["@mujou"]["nodes"]["node"]["trigger"]
    finally:
        node.release.set()
        run.stop()
    assert due is not None and before + 30.0 <= due <= after + 30.0, (before, after, due)
