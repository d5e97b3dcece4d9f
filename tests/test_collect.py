"""Taking the state (``_engine._collect``): the pause ends however the host's call ends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

import mujou
from mujou import Net, Node, Output
from mujou._engine import _collect


class Counter(Node):
    """Periodic; sends its count."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.y.send(torch.tensor(float(self.count)))

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count = state["count"]


class One(Net):
    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()


@pytest.mark.parametrize("timer", ["virtual", "real-time"])
def test_an_interrupt_just_after_the_pause_does_not_leave_the_run_paused(
    monkeypatch: pytest.MonkeyPatch, timer: str
) -> None:
    """A KeyboardInterrupt on the host's thread just after the updates paused for
    ``run.state_dict`` (as the chaos suite's interrupt can) ends the pause: the updates go on,
    and the next state is taken."""
    pause_and_take = _collect._pause_and_take

    def interrupted(engine: Any) -> Any:
        pause_and_take(engine)
        raise KeyboardInterrupt

    net = One()
    node = net.counter
    clock = mujou.VirtualTimer() if timer == "virtual" else None
    with mujou.run(net, workers=1, timer=clock) as run:
        seen: list[float] = []

        def note(count: torch.Tensor) -> bool:
            seen.append(float(count))
            return True

        run.wait_for(node.y, note, timeout=10.0)
        monkeypatch.setattr(_collect, "_pause_and_take", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run.state_dict()
        monkeypatch.setattr(_collect, "_pause_and_take", pause_and_take)
        # Paused for good, no update would run: the wait would raise TimeoutError.
        run.wait_for(node.y, lambda count: float(count) >= seen[0] + 3, timeout=10.0)
        assert run.state_dict()["counter"]["count"] >= seen[0] + 3


@pytest.mark.parametrize("timer", ["virtual", "real-time"])
def test_an_interrupt_just_after_the_turn_is_taken_gives_it_back(
    monkeypatch: pytest.MonkeyPatch, timer: str
) -> None:
    """A KeyboardInterrupt on the host's thread just after its ``run.state_dict`` took the
    one collection's turn, before anything else (the window a timed lock's ``acquire`` loop
    left before its ``try``), gives the turn back: the next ``run.state_dict`` is taken, where
    it would wait for ever (the hang guard ends the test then)."""
    take_turn = _collect.take_turn

    def interrupted(engine: Any, holder: object) -> None:
        take_turn(engine, holder)
        raise KeyboardInterrupt

    net = One()
    node = net.counter
    clock = mujou.VirtualTimer() if timer == "virtual" else None
    with mujou.run(net, workers=1, timer=clock) as run:
        run.wait_for(node.y, lambda count: True, timeout=10.0)
        monkeypatch.setattr(_collect, "take_turn", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run.state_dict()
        monkeypatch.setattr(_collect, "take_turn", take_turn)
        assert run.state_dict()["counter"]["count"] >= 1
