"""Conformance tests for the ``Run`` handle as an object (spec/en/running.md).

Rules ``run.enter-once`` and ``run.repr``: one ``with`` block per run, and a readable repr.
"""

from __future__ import annotations

import re
import threading

import pytest
from _support import HANG_GUARD, Bag, Plain, vt

import mujou
from mujou import Node

ENTERED = r"^this run was already used in a with block; a Run is entered once"


# --- run.enter-once -------------------------------------------------------------------------


@pytest.mark.rule("run.enter-once")
def test_a_nested_with_block_is_refused_and_the_run_goes_on() -> None:
    """> A Run is entered by one with block: entering it again (nested in that block ...) raises
    > RuntimeError."""
    net = Bag(a=Plain())
    with mujou.run(net, timer=vt()) as run:
        with pytest.raises(RuntimeError, match=ENTERED), run:
            pytest.fail("the second with block was entered")
        assert run.running, "the refused entry did not stop the run"
        run.sleep(0.5)
    assert not run.running


@pytest.mark.rule("run.enter-once")
def test_a_second_with_block_after_the_first_is_refused() -> None:
    """> entering it again (... after it ...) raises RuntimeError."""
    run = mujou.run(Bag(a=Plain()), timer=vt())
    with run:
        run.sleep(0.25)
    with pytest.raises(RuntimeError, match=ENTERED), run:
        pytest.fail("the second with block was entered")
    # A run never entered may be entered once, also after it was stopped.
    other = mujou.run(Bag(a=Plain()), timer=vt())
    other.stop()
    with other:
        pass


@pytest.mark.rule("run.enter-once")
def test_two_threads_entering_at_once_one_wins() -> None:
    """> entering it again (... from another thread) raises RuntimeError."""
    for _ in range(20):
        run = mujou.run(Bag(a=Plain()), timer=vt())
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def enter(
            run: mujou.Run = run, barrier: threading.Barrier = barrier, outcomes: list[str] = outcomes
        ) -> None:
            barrier.wait(HANG_GUARD)
            try:
                run.__enter__()
                outcomes.append("entered")
            except RuntimeError:
                outcomes.append("refused")

        threads = [threading.Thread(target=enter) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD)
        run.stop()
        assert sorted(outcomes) == ["entered", "refused"], outcomes


# --- run.repr -------------------------------------------------------------------------------


class Failing(Node):
    def on_update(self, dt: float) -> None:
        raise ValueError("broken")


class ReprInHook(Node):
    """Takes the run's repr inside its own update, as a user debugging a hook would."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.run: mujou.Run | None = None
        self.seen: list[str] = []

    def on_update(self, dt: float) -> None:
        if self.run is not None:
            self.seen.append(repr(self.run))


class Robot(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.probe = ReprInHook()
        self.arm = Plain()


@pytest.mark.rule("run.repr")
def test_repr_while_running_in_a_hook_and_after_the_end() -> None:
    """> repr(run) shows the net's class, whether the run is running or has ended, the timer
    > time, the number of workers and the kind of timer. It may be called from any thread, in
    > a hook and after the end, and never raises."""
    net = Robot()
    with mujou.run(net, timer=vt(), workers=2) as run:
        net.probe.run = run
        assert repr(run) == "<mujou.Run of Robot: running, t=0.000 s, 2 workers, virtual timer>"
        run.sleep(1.25)
        assert repr(run) == "<mujou.Run of Robot: running, t=1.250 s, 2 workers, virtual timer>"
    assert repr(run) == "<mujou.Run of Robot: ended, t=1.250 s, 2 workers, virtual timer>"
    in_hook = net.probe.seen
    assert in_hook, "the hook never took the repr"
    assert all(
        re.fullmatch(r"<mujou\.Run of Robot: running, t=\d\.\d{3} s, 2 workers, virtual timer>", r)
        for r in in_hook
    ), in_hook
    with mujou.run(Bag(a=Plain()), workers=1) as real:
        assert re.fullmatch(
            r"<mujou\.Run of Bag: running, t=\d+\.\d{3} s, 1 worker, real-time timer>", repr(real)
        )


@pytest.mark.rule("run.repr")
def test_repr_names_the_failed_node() -> None:
    """> (and which node failed, if one did)"""
    run = mujou.run(Bag(bad=Failing(period=0.5)), timer=vt(), workers=1)
    with pytest.raises(mujou.HookError):
        run.sleep(1.0)
    with pytest.raises(mujou.HookError):
        run.stop()
    assert repr(run) == (
        "<mujou.Run of Bag: ended, node 'bad' failed in on_update, t=0.500 s, 1 worker, virtual timer>"
    )
