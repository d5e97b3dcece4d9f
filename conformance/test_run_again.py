"""Conformance tests for a net run a second time (spec/en/running.md, rule ``run.again``).

Each test runs a net once so that its ports hold messages, then runs the same net objects again
and checks that nothing of the first run is seen by the second, in one process and with a node in
a process of its own.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _process_nodes import Source
from _support import Bag, vt

import mujou
from mujou import Input, Net, Node, Output


class Sink(Node):
    """Records what its input held when it started, and each message it read."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1)
        self.at_start: list[tuple[Any, bool]] = []

    def on_start(self) -> None:
        self.at_start.append((self.x.read(), self.x.fresh))

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.y.send(x.sum())


class Fed(Node):
    """An input the host feeds (no source), and a node that never sends."""

    cmd = Input(optional=True)


def _net() -> tuple[Net, Source, Sink, Fed]:
    source, sink, fed = Source(period=0.1, seed=3), Sink(), Fed(period=0.1)
    net = Bag(source=source, sink=sink, fed=fed)
    net.connect(source.out, sink.x)
    return net, source, sink, fed


def _second_run_sees_nothing(far: bool) -> None:
    """Run the net twice; the second run must see no message of the first."""
    net, source, sink, fed = _net()
    processes = {"far": [source]} if far else None
    with mujou.run(net, timer=vt(), processes=processes) as run:
        run.write(fed.cmd, torch.ones(2))
        run.sleep(0.35)
        for port in (source.out, sink.x, sink.y, fed.cmd):
            assert run.read(port) is not None, port
    with mujou.run(net, timer=vt(), processes=processes) as run:
        # No update has run yet: every port is empty, the host-fed input included.
        for port in (source.out, sink.x, sink.y, fed.cmd):
            assert run.read(port) is None, port
        ports = run.state_dict()["@mujou"]["ports"]
        assert set(ports.values()) == {None}, ports
        with pytest.raises(TimeoutError):
            run.wait_for(sink.y, timeout=0.05)  # a message of the first run would end it at once
        assert run.wait_for(sink.y, timeout=1.0) is not None  # this run's own messages come
    assert sink.at_start == [(None, False), (None, False)]


@pytest.mark.rule("run.again")
def test_a_second_run_in_one_process_sees_no_message_of_the_first() -> None:
    _second_run_sees_nothing(far=False)


@pytest.mark.rule("run.again")
def test_a_second_run_with_processes_sees_no_message_of_the_first() -> None:
    _second_run_sees_nothing(far=True)
