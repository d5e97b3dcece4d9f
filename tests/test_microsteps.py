"""The microstep cap (trigger.microstep-cap), the backstop behind the cycle check: a cycle
let through (the check patched out) stops the run with a RuntimeError instead of freezing
the virtual time."""

from __future__ import annotations

import pytest
import torch

import mujou
from mujou import _start


class Ping(mujou.Node):
    x = mujou.Input()
    y = mujou.Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))
        self.stopped = False

    def on_start(self) -> None:
        self.y.send(torch.zeros(()))

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.y.send(x + 1)

    def on_stop(self) -> None:
        self.stopped = True


class Loop(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.ping = Ping()
        self.connect(self.ping.y, self.ping.x)


def test_the_cycle_check_refuses_the_loop() -> None:
    with pytest.raises(ValueError, match="'ping' -> 'ping'"):
        mujou.run(Loop(), timer=mujou.VirtualTimer())


def test_a_cycle_let_through_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_start, "_check_cycles", lambda nodes: None)
    net = Loop()
    run = mujou.run(net, workers=1, timer=mujou.VirtualTimer())
    with pytest.raises(
        RuntimeError, match=r"more than 10000 times without the time moving \(due again: 'ping'\)"
    ):
        run.sleep(1.0)
    assert run.time == 0.0
    assert net.ping.stopped
    assert (
        run.stats().nodes["ping"].updates == 10000
    )  # a first at 0.0 (its on_start sent), then 9999 microsteps
    run.state_dict()  # the state can still be saved
