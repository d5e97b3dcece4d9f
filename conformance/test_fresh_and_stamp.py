"""Conformance tests for ``Input.fresh`` and ``Input.stamp``: ``ports.fresh``, ``ports.stamp``
(spec/en/nodes-and-ports.md), their place in ``ports.only-in-own-hooks`` and in the state tree
(``state.port-messages``).

Every test runs under the virtual timer but the real-time one, which waits on events.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest
import torch
from _support import HANG_GUARD, Bag, vt

import mujou
from mujou import Input, Node, Output


class Source(Node):
    """Sends its update count at each update (and 0 in on_start when asked)."""

    y = Output()

    def __init__(self, period: float, *, in_start: bool = False) -> None:
        super().__init__(period=period, seed=0)
        self.count = torch.zeros(())  # a tensor: part of the node's state
        self.in_start = in_start

    def on_start(self) -> None:
        if self.in_start:
            self.y.send(torch.tensor([0.0]))

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.y.send(self.count.reshape(1))


class Watcher(Node):
    """Records (fresh, stamp, value read) at each update, and fresh in on_start and on_stop."""

    x = Input(optional=True)
    state_exclude: ClassVar[tuple[str, ...]] = ("log", "hooks")  # the test's records, not state

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.log: list[tuple[bool, float | None, float | None]] = []
        self.hooks: dict[str, bool] = {}

    def on_start(self) -> None:
        self.hooks["on_start"] = self.x.fresh

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        self.log.append((self.x.fresh, self.x.stamp, None if message is None else float(message[0])))

    def on_stop(self) -> None:
        self.hooks["on_stop"] = self.x.fresh


def chain(
    source_period: float, watcher_period: float, *, in_start: bool = False
) -> tuple[Bag, Source, Watcher]:
    src, watcher = Source(source_period, in_start=in_start), Watcher(watcher_period)
    net = Bag(src=src, watcher=watcher)
    net.connect(src.y, watcher.x)
    return net, src, watcher


# --------------------------------------------------------------------------------------------
# ports.fresh


@pytest.mark.rule("ports.fresh", "ports.stamp")
def test_a_fast_reader_sees_each_message_fresh_once() -> None:
    """> In a node's update, Input.fresh is whether the latest visible message became visible
    > after the node's previous update started (in its first update of a run: whether there is
    > a message)."""
    net, _, watcher = chain(0.5, 0.25)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.5)
    # Sent at 0.5 and 1.0 (visible after those instants); the watcher updates every 0.25.
    assert watcher.log == [
        (False, None, None),  # 0.25
        (False, None, None),  # 0.5: the message sent at 0.5 is not visible yet
        (True, 0.5, 1.0),  # 0.75
        (False, 0.5, 1.0),  # 1.0
        (True, 1.0, 2.0),  # 1.25
        (False, 1.0, 2.0),  # 1.5
    ]


@pytest.mark.rule("ports.fresh")
def test_a_slow_reader_sees_fresh_when_any_arrived() -> None:
    """> whether the latest visible message became visible after the node's previous update
    > started (several arrivals in between make one fresh message)."""
    net, _, watcher = chain(0.25, 1.0)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(3.0)
    assert [entry[0] for entry in watcher.log] == [True, True, True]
    assert [entry[2] for entry in watcher.log] == [3.0, 7.0, 11.0]


class Quiet(Node):
    """Sends once, in its first update."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.sent = False

    def on_update(self, dt: float) -> None:
        if not self.sent:
            self.sent = True
            self.y.send(torch.tensor([1.0]))


@pytest.mark.rule("ports.fresh")
def test_fresh_in_other_hooks_is_since_the_last_update() -> None:
    """> in its other hooks, whether it became visible after its last update started (before
    > its first update: whether there is a message)."""
    net, _, watcher = chain(0.5, 0.25)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.75)  # the watcher's last update at 0.75 saw the message of 0.5
    assert watcher.hooks == {"on_start": False, "on_stop": False}
    net, _, watcher = chain(0.5, 1.0)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)  # the message of 1.0 became visible after the watcher's update at 1.0
    assert watcher.hooks == {"on_start": False, "on_stop": True}
    quiet, late = Quiet(), Watcher(1.0)
    net = Bag(quiet=quiet, late=late)
    net.connect(quiet.y, late.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)  # sent at 0.25, seen by the update at 1.0
        run.sleep(0.5)
    assert late.hooks == {"on_start": False, "on_stop": False}
    assert late.log == [(True, 0.25, 1.0)]


@pytest.mark.rule("ports.fresh")
def test_fresh_and_stamp_do_not_depend_on_the_workers() -> None:
    """> Under the virtual timer, fresh and stamp are the same whatever the number of workers."""
    logs = []
    for workers in (1, 2, 4):
        sources = [Source(0.1 * (i + 1)) for i in range(3)]
        watchers = [Watcher(0.07 + 0.05 * i) for i in range(3)]
        net = Bag(
            **{f"s{i}": node for i, node in enumerate(sources)},
            **{f"w{i}": node for i, node in enumerate(watchers)},
        )
        for i in range(3):
            net.connect(sources[i].y, watchers[(i + 1) % 3].x)
        with mujou.run(net, timer=vt(), workers=workers) as run:
            run.sleep(2.0)
        logs.append([watcher.log for watcher in watchers])
    assert logs[0] == logs[1] == logs[2]
    assert any(entry[0] for entry in logs[0][0]) and not all(entry[0] for entry in logs[0][0])


class Ping(Node):
    """Sends once when told, from its update; records when it sent."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.001, seed=0)
        self.go = threading.Event()
        self.sent = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.go.is_set() and not self.sent.is_set():
            self.y.send(torch.ones(1))
            self.sent.set()


class Catcher(Node):
    """Counts the updates that found x fresh; sets ``caught`` at the first."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.001, seed=0)
        self.fresh = 0
        self.caught = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.x.fresh:
            self.fresh += 1
            self.caught.set()


@pytest.mark.rule("ports.fresh")
def test_under_real_time_a_message_is_fresh_once_or_twice() -> None:
    """> Under the real-time timer a message that arrives while an update runs is fresh in the
    > next update ...: fresh never misses a message, and may show one twice there."""
    ping, catcher = Ping(), Catcher()
    net = Bag(ping=ping, catcher=catcher)
    net.connect(ping.y, catcher.x)
    with mujou.run(net, workers=1) as run:
        ping.go.set()
        assert ping.sent.wait(HANG_GUARD) and catcher.caught.wait(HANG_GUARD)
        run.sleep(0.05)  # many more updates of the catcher, no new message
    assert catcher.fresh in (1, 2)


# --------------------------------------------------------------------------------------------
# ports.stamp


@pytest.mark.rule("ports.stamp")
def test_host_messages_are_stamped_with_the_run_time() -> None:
    """> for run.write, run.time when it was called; for inputs=, the run's start time; from
    > another hook, ... 0.0 before its first; None before any."""
    watcher = Watcher(0.25)
    with mujou.run(Bag(watcher=watcher), timer=vt()) as run:
        run.sleep(0.25)
        run.sleep(0.1)
        run.write(watcher.x, torch.tensor([5.0]))  # at 0.35
        run.sleep(0.4)
    assert watcher.log == [(False, None, None), (True, 0.35, 5.0), (False, 0.35, 5.0)]
    fed = Watcher(0.25)
    with mujou.run(Bag(fed=fed), timer=vt(), inputs={fed.x: torch.tensor([1.0])}) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    assert fed.log == [(True, 0.0, 1.0), (False, 0.0, 1.0)]
    resumed = Watcher(0.25)
    with mujou.run(Bag(fed=resumed), timer=vt(), state=tree, inputs={resumed.x: torch.tensor([2.0])}) as run:
        run.sleep(0.25)
    assert resumed.log == [(True, 0.5, 2.0)], "inputs= of a resumed run: its start time"
    net, _, watcher = chain(0.5, 0.25, in_start=True)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
    assert watcher.log == [(True, 0.0, 0.0)]


# --------------------------------------------------------------------------------------------
# ports.only-in-own-hooks


@pytest.mark.rule("ports.only-in-own-hooks")
def test_fresh_and_stamp_only_in_the_nodes_hooks() -> None:
    """> send, read, fresh and stamp may be used only from the hooks of the port's own node."""
    watcher = Watcher(0.25)
    with mujou.run(Bag(watcher=watcher), timer=vt()) as run:
        for what in ("fresh", "stamp"):
            with pytest.raises(
                RuntimeError,
                match=rf"^port 'watcher\.x': {what} was called outside the hooks of node 'watcher'; "
                r".* the host uses run\.read\(\) and run\.write\(\)$",
            ):
                getattr(watcher.x, what)
        run.sleep(0.25)


# --------------------------------------------------------------------------------------------
# state.port-messages


@pytest.mark.rule("state.port-messages", "ports.fresh", "ports.stamp")
def test_fresh_and_stamps_resume_exactly() -> None:
    """> The "@mujou" entry holds each port's latest message with its stamp and each input's
    > fresh flag, so that a resumed run reads the same messages, stamps and fresh flags."""
    for at in (0.5, 0.625, 0.75):  # the watcher's last update saw the newest message, or not
        net, _, watcher = chain(0.5, 0.125)
        with mujou.run(net, timer=vt()) as run:
            run.sleep(at)
            tree = run.state_dict()
            run.sleep(1.0)
        went_on = watcher.log[len(watcher.log) - 8 :]
        again, _, resumed = chain(0.5, 0.125)
        with mujou.run(again, timer=vt(), state=tree) as run:
            run.sleep(1.0)
        assert resumed.log == went_on, (at, resumed.log, went_on)
        assert any(entry[0] for entry in went_on)
