"""Conformance tests for ``mujou.testing`` (spec/en/testing.md): the comparison of state trees
and the harness that runs one node (or a small net) under the virtual timer."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import OrderedDict
from typing import Any, ClassVar

import pytest
import torch
from _support import Bag

import mujou
import mujou.testing
from mujou import Input, Node, Output
from mujou.testing import Harness, assert_states_equal, state_difference

# --- comparing state trees ------------------------------------------------------------------


def _tree() -> dict[str, Any]:
    return {
        "@mujou": {"version": 1, "time": 0.5},
        "smoother": {"mean": torch.tensor([0.5, 0.25, 1.0]), "count": 3, "log": [1.0, (2, "a")]},
        "big": {"w": torch.zeros(100, 100)},
    }


@pytest.mark.rule("testing.compare")
def test_equal_trees_have_no_difference() -> None:
    """> state_difference returns None when the two state trees are equal."""
    assert state_difference(_tree(), _tree()) is None
    assert assert_states_equal(_tree(), _tree()) is None  # type: ignore[func-returns-value]


@pytest.mark.rule("testing.compare", "testing.compare-message")
def test_the_first_difference_is_named_by_its_path_index_and_values() -> None:
    """> ... names the first difference found walking first in its order: its path ... and what
    differs; the text never holds a whole tensor."""
    first, second = _tree(), _tree()
    second["big"]["w"][3, 4] = 1.5
    second["big"]["w"][7, 0] = -2.0
    second["smoother"]["count"] = 4  # later in the walk than ["big"]? no: "smoother" comes first
    assert state_difference(first, second) == "['smoother']['count']: 3 in the first tree, 4 in the second"
    second["smoother"]["count"] = 3
    expected = (
        "['big']['w']: element (3, 4): 0.0 in the first tree, 1.5 in the second (2 of 10000 elements differ)"
    )
    assert state_difference(first, second) == expected
    with pytest.raises(AssertionError) as caught:
        assert_states_equal(first, second)
    assert str(caught.value) == f"the state trees differ at {expected}"
    assert len(str(caught.value)) < 200  # no tensor printed


@pytest.mark.rule("testing.compare-equal", "testing.compare-message")
@pytest.mark.parametrize(
    ("first", "second", "difference"),
    [
        (
            torch.zeros(3),
            torch.zeros(3, dtype=torch.float64),
            "the root: dtype torch.float32 in the first tree, torch.float64 in the second",
        ),
        (torch.zeros(3), torch.zeros(1, 3), "the root: shape (3,) in the first tree, (1, 3) in the second"),
        ({"a": 1}, {"a": 1, "b": 2}, "the root: the key 'b' is only in the second tree"),
        ({"a": 1, "b": 2}, {"b": 2}, "the root: the key 'a' is only in the first tree"),
        ([1, 2], [1, 2, 3], "the root: 2 items in the first tree, 3 in the second"),
        ([1, 2], (1, 2), "the root: a list in the first tree, a tuple in the second"),
        ({"x": [0, 1.0]}, {"x": [0, 1]}, "['x'][1]: a float in the first tree, a int in the second"),
        (0.0, -0.0, "the root: 0.0 in the first tree, -0.0 in the second"),
        (
            torch.tensor([0.0]),
            torch.tensor([-0.0]),
            "the root: element (0,): 0.0 in the first tree, -0.0 in the second (1 of 1 elements differ)",
        ),
        (
            torch.tensor(1 + 2j),
            torch.tensor(1 + 3j),
            "the root: element (): (1+2j) in the first tree, (1+3j) in the second (1 of 1 elements differ)",
        ),
        (
            "a" * 500,
            "b",
            f"the root: '{'a' * 27}...{'a' * 28}' in the first tree, 'b' in the second",
        ),
    ],
)
def test_what_differs_is_said(first: object, second: object, difference: str) -> None:
    assert state_difference(first, second) == difference


@pytest.mark.rule("testing.compare-equal")
def test_equal_means_the_same_bits_and_keys_in_any_order() -> None:
    """> mappings in any order, whatever their classes; NaN equals a NaN of the same bits."""
    nan = torch.tensor([1.0, math.nan])
    assert state_difference({"a": nan, "b": math.nan}, OrderedDict(b=math.nan, a=nan.clone())) is None
    assert state_difference(torch.tensor([1, 2]), torch.tensor([1, 2])) is None
    assert state_difference(torch.tensor(1 + 2j), torch.tensor(1 + 2j)) is None
    assert state_difference(torch.tensor([True]), torch.tensor([False])) is not None


@pytest.mark.rule("testing.compare-message")
def test_a_generator_state_that_differs_is_named_as_such() -> None:
    one, two = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    difference = state_difference(
        {"n": {"generator": one.get_state()}}, {"n": {"generator": two.get_state()}}
    )
    assert difference is not None
    assert difference.startswith("['n']['generator']: element (0,): ")
    assert "this is a generator's state" in difference


# --- the harness ----------------------------------------------------------------------------


class Smoother(Node):
    """Periodic: moves its mean halfway to its input at each update, and sends it."""

    x = Input(optional=True)
    y = Output()
    stops: ClassVar[list[str]] = []

    def __init__(self) -> None:
        super().__init__(period=0.25)  # due times exact in binary: at 0.5, not 0.5000000000000001

    def on_start(self) -> None:
        self.mean = torch.zeros(3)
        self.noise = torch.rand(1, generator=self.generator)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.mean += 0.5 * (x - self.mean)
            self.y.send(self.mean)

    def on_stop(self) -> None:
        Smoother.stops.append(self.name)


class Echo(Node):
    """Triggered: answers each message with twice it; fails on a negative one."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        if x.item() < 0:
            raise ValueError("negative")
        self.y.send(2 * x)


class StopFails(Node):
    """Fails as it stops."""

    def on_stop(self) -> None:
        raise ValueError("cannot stop")


def _values(sent: list[tuple[float, torch.Tensor]]) -> list[tuple[float, Any]]:
    """(time, value as a list or a number), the time rounded off its float noise."""
    return [(round(t, 9), m.tolist()) for t, m in sent]


@pytest.mark.rule("testing.harness", "testing.harness-feed", "testing.harness-sent", "testing.harness-state")
def test_a_periodic_node_fed_at_chosen_times() -> None:
    """> A later feed is written when advance reaches its time, after the updates due then."""
    node = Smoother()
    with Harness(node) as h:
        assert node.name == "smoother" and h.time == 0.0
        h.feed("x", torch.ones(3), at=0.375)
        h.feed(node.x, torch.zeros(3), at=0.75)  # after the update due at 0.75: seen at 1.0
        h.advance(1.0)
        assert h.time == 1.0
        assert _values(h.sent("y")) == [
            (0.5, [0.5, 0.5, 0.5]),
            (0.75, [0.75, 0.75, 0.75]),
            (1.0, [0.375, 0.375, 0.375]),
        ]
        assert _values(h.sent(node.y)) == _values(h.sent("y"))
        assert h.read("y").tolist() == [0.375] * 3
        state = h.state()
        assert sorted(state) == ["generator", "mean", "noise"]
        assert state["mean"].tolist() == [0.375] * 3
        assert sorted(h.state_dict()) == ["@mujou", "smoother"]
        assert h.run.seed == 0
        assert list(h.net.nodes()) == [node]
        # The message is a snapshot taken by feed: changing the tensor afterwards changes nothing.
        fed = torch.ones(3)
        h.feed("x", fed, at=1.1)
        fed.fill_(100.0)
        h.advance(0.25)
        assert h.read("x").tolist() == [1.0, 1.0, 1.0]


@pytest.mark.rule("testing.harness-advance", "testing.harness-feed")
def test_a_triggered_node_steps_from_feed_to_feed() -> None:
    """> step runs the updates still due now; else it runs to the next due update or feed."""
    with Harness(Echo(), inputs={"x": torch.tensor(1.0)}) as h:
        assert h.step() == 0.0
        assert _values(h.sent("y")) == [(0.0, 2.0)]
        h.feed("x", torch.tensor(3.0), at=1.0)
        h.feed("x", torch.tensor(4.0), at=2.0)
        assert h.step() == 1.0  # the feed, and the update it woke at that time
        assert _values(h.sent("y")) == [(0.0, 2.0), (1.0, 6.0)]
        h.feed("x", torch.tensor(5.0))  # now: written at once, its update runs at the next step
        assert h.step() == 1.0
        assert h.step() == 2.0
        assert _values(h.sent("y"))[2:] == [(1.0, 10.0), (2.0, 8.0)]
        with pytest.raises(RuntimeError, match=r"^step\(\): nothing is due and no feed is waiting"):
            h.step()


@pytest.mark.rule("testing.harness-advance", "testing.harness-close")
def test_a_failing_hook_fails_the_call_that_ran_it() -> None:
    h = Harness(Echo(), inputs={"x": torch.tensor(-1.0)})
    with pytest.raises(
        mujou.HookError, match=r"^node 'echo' raised ValueError in on_update at t=0.000"
    ) as caught:
        h.advance(1.0)
    assert isinstance(caught.value.__cause__, ValueError)
    h.close()  # the error was raised once: close does not raise it again
    h.close()  # a second call does nothing
    assert isinstance(h.state()["generator"], torch.Tensor)
    with pytest.raises(RuntimeError, match=r"^advance\(\): the harness is closed$"):
        h.advance(1.0)
    # Left by an exception, the block's exception leaves it, not the run's.
    with pytest.raises(KeyError), Harness(Echo(), inputs={"x": torch.tensor(-1.0)}) as h:
        raise KeyError("mine")


@pytest.mark.rule("testing.harness-close")
def test_leaving_the_block_stops_the_run_and_keeps_what_was_sent() -> None:
    Smoother.stops.clear()
    with Harness(Smoother(), name="filter") as h:
        h.feed("x", torch.ones(3))
        h.advance(0.25)
    assert Smoother.stops == ["filter"]
    assert len(h.sent("y")) == 1 and h.read("filter.y") is not None
    for call in (lambda: h.feed("x", torch.ones(3)), h.step):
        with pytest.raises(RuntimeError, match=r"the harness is closed$"):
            call()
    with (
        pytest.raises(mujou.HookError, match=r"^node 'stop_fails' raised ValueError in on_stop "),
        Harness(StopFails()),
    ):
        pass  # the run's error, never raised before, is raised by the exit


@pytest.mark.rule("testing.harness", "testing.harness-ports", "testing.harness-state")
def test_a_small_net_runs_in_the_harness_by_port_names() -> None:
    echo, smoother = Echo(), Smoother()
    net = Bag(echo=echo, smoother=smoother)
    with Harness(net, inputs={"echo.x": torch.tensor(2.0)}) as h:
        h.feed(smoother.x, torch.ones(3), at=0.125)
        h.advance(0.25)
        assert _values(h.sent("echo.y")) == [(0.0, 4.0)]
        assert [t for t, _ in h.sent("smoother.y")] == [0.25]
        assert sorted(h.state()) == ["@mujou", "echo", "smoother"]
        with pytest.raises(ValueError, match=r"^sent: no port is named 'y'; the ports are \['echo.x', "):
            h.sent("y")


@pytest.mark.rule("testing.harness", "testing.harness-ports", "testing.harness-feed")
def test_the_harness_refuses_what_it_cannot_do() -> None:
    with pytest.raises(TypeError, match=r"^target must be a mujou.Node or a mujou.Net, got int: 3$"):
        Harness(3)  # type: ignore[arg-type]
    placed = Smoother()
    Bag(placed=placed)
    with pytest.raises(ValueError, match=r"^node 'placed' is in a net already"):
        Harness(placed)
    echo = Echo()
    with pytest.raises(ValueError, match=r"^input 'echo.x' has no source"):
        Harness(echo)  # as mujou.run: an input that is not optional needs a first message
    with Harness(echo, inputs={echo.x: torch.tensor(1.0)}) as h:  # refused, the node is free
        assert h.step() == 0.0
    other = Smoother()
    with Harness(Smoother()) as h:
        h.advance(0.2)
        with pytest.raises(ValueError, match=r"^at=0.1 is in the past: the harness's time is 0.2"):
            h.feed("x", torch.ones(3), at=0.1)
        with pytest.raises(TypeError, match=r"^feed: 'smoother.y' is an output; the host feeds inputs$"):
            h.feed("y", torch.ones(3))
        with pytest.raises(TypeError, match=r"^sent: 'smoother.x' is an input"):
            h.sent("x")
        with pytest.raises(ValueError, match=r"is not a port of the harness's Smoother node$"):
            h.feed(other.x, torch.ones(3))
        with pytest.raises(TypeError, match=r"^feed\('smoother.x'\)"):
            h.feed("x", "not a tensor")


@pytest.mark.rule("testing.harness", "threads.run-seed")
def test_two_harnesses_fed_alike_end_in_equal_states() -> None:
    """> Every run of a harness is reproducible (the virtual timer's run seed is 0)."""
    states = []
    for seed in (None, None, 4):
        with Harness(Smoother(), seed=seed) as h:
            h.feed("x", torch.ones(3), at=0.25)
            h.advance(1.0)
            states.append(h.state_dict())
    assert_states_equal(states[0], states[1])
    assert state_difference(states[0], states[2]) is not None  # another seed: another noise


@pytest.mark.rule("overview.testing-module")
def test_the_testing_module_is_public_and_not_imported_by_mujou() -> None:
    """> mujou.testing, which import mujou does not import; its public API is exactly the
    names in mujou.testing.__all__; each has a docstring and reports __module__ == "mujou.testing"."""
    assert mujou.testing.__all__ == ["Harness", "assert_states_equal", "state_difference"]
    public = {name for name in vars(mujou.testing) if not name.startswith("_")}
    assert public == set(mujou.testing.__all__)
    for name in mujou.testing.__all__:
        obj = getattr(mujou.testing, name)
        assert obj.__doc__, name
        assert obj.__module__ == "mujou.testing", name
    code = "import sys, mujou; print('mujou.testing' in sys.modules, 'mujou._harness' in sys.modules)"
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)

    assert done.stdout.split() == ["False", "False"]
