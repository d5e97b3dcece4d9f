"""The sender's core handed to the reader its send woke (NOTE [ the core handed to the reader ]
in ``mujou._processes._handover``): once a send, and not for ``PAUSE`` times as long as a yield
that kept the thread off its core for more than ``BUDGET``."""

from __future__ import annotations

from mujou._processes._handover import BUDGET, PAUSE, Handover


class _Core:
    """A fake clock, and a yield that takes ``cost`` seconds of it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cost = 0.0
        self.yields = 0

    def clock(self) -> float:
        return self.now

    def give(self) -> None:
        self.yields += 1
        self.now += self.cost


def test_each_call_yields_once_while_yields_cost_little() -> None:
    core = _Core()
    handover = Handover(core.give, core.clock)
    core.cost = BUDGET / 2
    for _ in range(5):
        handover()
        core.now += 0.001
    assert core.yields == 5


def test_a_yield_over_the_budget_stops_the_yields_for_pause_times_its_length() -> None:
    """Planted (no pause after a dear yield, or a pause counted from the yield's end): fails."""
    core = _Core()
    handover = Handover(core.give, core.clock)
    core.cost = 2 * BUDGET  # the core was busy: others ran before this thread
    handover()
    assert core.yields == 1
    core.cost = 0.0
    began = core.now - 2 * BUDGET
    core.now = began + PAUSE * 2 * BUDGET - 1e-6
    handover()
    assert core.yields == 1  # still paused
    core.now = began + PAUSE * 2 * BUDGET
    handover()
    assert core.yields == 2  # tried again
    handover()
    assert core.yields == 3  # and cheap again: no pause


def test_a_longer_yield_pauses_longer() -> None:
    """The pause is the yield's length times ``PAUSE`` (planted: a fixed pause, fails)."""
    core = _Core()
    handover = Handover(core.give, core.clock)
    core.cost = 10 * BUDGET
    handover()
    core.cost = 0.0
    core.now = 10 * BUDGET * PAUSE - 1e-6  # past the pause a yield of 2 * BUDGET would make
    handover()
    assert core.yields == 1


def test_a_yield_at_the_budget_does_not_pause() -> None:
    core = _Core()
    handover = Handover(core.give, core.clock)
    core.cost = BUDGET
    handover()
    core.cost = 0.0
    handover()
    assert core.yields == 2


def test_without_sched_yield_nothing_is_called() -> None:
    """Where the platform has no ``sched_yield`` (Windows), a send hands nothing over."""
    core = _Core()
    handover = Handover(None, core.clock)
    handover()
    assert core.yields == 0
