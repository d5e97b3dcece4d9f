"""Nodes and nets for conformance/test_process_orders.py, importable by name.

The processes of a run are spawned: each imports the classes of its nodes by name, so they
live at the top level of a module on ``sys.path``. What a test reads back from a process goes
through the public API (``run.state_dict()``, ``run.read``, ``run.stats()``).
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

import mujou
from mujou import Input, Net, Node, Output


class Counter(Node):
    """Periodic: sends how many updates it has run (1.0, 2.0, ...)."""

    out = Output()

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.tensor(float(self.count)))


class Sampler(Node):
    """Periodic: records what its optional input holds at each update (-1.0 for nothing)."""

    x = Input(optional=True)

    def __init__(self, period: float) -> None:
        super().__init__(period=period)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        self.seen.append(-1.0 if message is None else float(message))


class SendsOnStart(Node):
    """Sends ``value`` once, in on_start; its updates send nothing (its period is long)."""

    out = Output()

    def __init__(self, value: float) -> None:
        super().__init__(period=100.0)
        self.value = value

    def on_start(self) -> None:
        self.out.send(torch.tensor(self.value))

    def on_update(self, dt: float) -> None:
        pass


class Woken(Node):
    """Triggered by ``x``: records each message it was woken for."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        assert message is not None  # triggered by it
        self.seen.append(float(message))


class FailsAt(Node):
    """Periodic: raises ValueError naming itself at its update number ``at``."""

    def __init__(self, period: float, at: int) -> None:
        super().__init__(period=period)
        self.at = at
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        if self.count == self.at:
            raise ValueError(f"{self.count} updates")


class Sleeper(Node):
    """Periodic: each update holds its worker for ``seconds`` of real time."""

    def __init__(self, period: float, seconds: float) -> None:
        super().__init__(period=period)
        self.seconds = seconds

    def on_update(self, dt: float) -> None:
        time.sleep(self.seconds)


class OwnThread(Node):
    """Periodic, on a thread of its own: it never runs on a worker."""

    def __init__(self, period: float) -> None:
        super().__init__(period=period, dedicated_thread=True)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1


class LongPeriod(Net):
    """A counter with a long period read by a sampler with a shorter one (proc.virtual)."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter(0.3)
        self.sampler = Sampler(0.5)
        self.connect(self.counter.out, self.sampler.x)


class StartCrossings(Net):
    """Messages sent in on_start to triggered readers, in both directions across processes."""

    def __init__(self) -> None:
        super().__init__()
        self.host_sender = SendsOnStart(1.5)
        self.far_reader = Woken()
        self.far_sender = SendsOnStart(2.5)
        self.host_reader = Woken()
        self.connect(self.host_sender.out, self.far_reader.x)
        self.connect(self.far_sender.out, self.host_reader.x)


class ThreeFailures(Net):
    """Three nodes that fail at the same tag: the earliest registered is in the last group of
    ``processes=``, the next in the host, the last in the first group."""

    def __init__(self) -> None:
        super().__init__()
        self.early = FailsAt(0.1, 3)
        self.middle = FailsAt(0.1, 3)
        self.late = FailsAt(0.1, 3)


def raises_earlys_failure(run: mujou.Run) -> None:
    """Run ``run``, a ``ThreeFailures``'s, for a second: its error must be ``early``'s at t=0.3
    (sched.virtual-failure), as in one process. The run is stopped either way."""
    try:
        with pytest.raises(mujou.HookError) as info:
            run.sleep(1.0)
    finally:
        with contextlib.suppress(mujou.HookError):
            run.stop()
    error = info.value
    assert (error.node, error.hook) == ("early", "on_update"), str(error)
    assert abs(error.time - 0.3) < 1e-9, error.time
    assert str(error).startswith("node 'early' raised ValueError in on_update at t=0.300: 3 updates")


class BusyHost(Net):
    """A node that keeps the host's worker busy, and one on a thread of its own to place in
    another process, whose worker then runs no hook."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeper = Sleeper(0.1, 0.005)
        self.own = OwnThread(0.1)
