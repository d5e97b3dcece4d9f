"""Conformance tests for the page "State" (spec/en/state.md): rules ``state.*``.

The state tree, the default node state, CPU copies, strict restores, save/load, resume.
Trees are compared exactly: the same structure, and every tensor equal with torch.equal.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest
import torch
from _support import Bag, Drawer, wait_until
from torch import nn

import mujou
from mujou import Input, Net, Node, Output

# A guard against a hang (a bug), never a timing assertion.
HANG = 30.0


def wait_event(event: threading.Event, what: str) -> None:
    """Wait for ``event``; fail the test (instead of hanging) if it never comes."""
    assert event.wait(HANG), f"hang guard: {what} did not happen within {HANG} s"


def assert_trees_equal(a: object, b: object, path: str = "tree") -> None:
    """Assert two state trees are identical: same structure and types, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: tensor vs {type(b).__name__}"
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), (
            f"{path}: {a.dtype} {tuple(a.shape)} {a.device} vs {b.dtype} {tuple(b.shape)} {b.device}"
        )
        if a.is_floating_point() or a.is_complex():
            # Bit for bit, NaN included: compare the bytes.
            same = torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        else:
            same = torch.equal(a, b)
        assert same, f"{path}: tensors differ:\n{a}\n{b}"
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{path}: mapping vs {type(b).__name__}"
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_trees_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert isinstance(b, (list, tuple))
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_trees_equal(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert a == b, f"{path}: {a!r} vs {b!r}"


def tensors(tree: object) -> list[torch.Tensor]:
    """Every tensor in a tree."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, Mapping):
        return [t for v in tree.values() for t in tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in tensors(v)]
    return []


# --- nodes and nets -------------------------------------------------------------------------


class Noisy(Node):
    """A seeded noisy accumulator with an optional (host or peer) input."""

    out = Output()
    x = Input(optional=True)

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.acc = torch.zeros(3)
        self.t = torch.zeros((), dtype=torch.float64)

    def on_update(self, dt: float) -> None:
        self.t += dt
        x = self.x.read()
        self.acc.mul_(0.9).add_(torch.randn(3, generator=self.generator))
        if x is not None:
            self.acc.add_(0.5 * x)
        self.out.send(self.acc)


class Learner(Node):
    """A node with a module and an optimizer, trained on its input."""

    x = Input()
    y = Output()

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.lin = nn.Linear(3, 3)
        with torch.no_grad():
            nn.init.normal_(self.lin.weight, std=0.3, generator=self.generator)
            nn.init.zeros_(self.lin.bias)
        self.opt = torch.optim.SGD(self.lin.parameters(), lr=0.01, momentum=0.9)
        self.steps = torch.zeros((), dtype=torch.int64)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is None:
            return
        with torch.enable_grad():
            loss = (self.lin(x) - x).pow(2).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        self.steps += 1
        with torch.no_grad():
            self.y.send(self.lin(x))


class Arm(Net):
    def __init__(self) -> None:
        super().__init__()
        self.joint = Learner(1 / 32, seed=3)


class Robot(Net):
    """Two noisy sources at different periods, a learner in a sub-net, a feedback loop."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Noisy(1 / 64, seed=1)
        self.b = Noisy(3 / 128, seed=2)
        self.arm = Arm()
        self.connect(self.a.out, self.arm.joint.x)
        self.connect(self.arm.joint.y, self.b.x)


class Plain(Node):
    """Counts its updates in a tensor; logs hooks into ``log`` when given."""

    # The test's own list and switch are not state.
    state_exclude: ClassVar[tuple[str, ...]] = ("log", "fail_load")

    def __init__(self, period: float = 0.25, log: list[str] | None = None) -> None:
        super().__init__(period=period, seed=0)
        self.count = torch.zeros((), dtype=torch.int64)
        self.log = log
        self.fail_load = False

    def on_start(self) -> None:
        if self.log is not None:
            self.log.append(f"start {self.name}")

    def on_update(self, dt: float) -> None:
        if self.log is not None:
            self.log.append(f"update {self.name}")
        self.count += 1

    def on_stop(self) -> None:
        if self.log is not None:
            self.log.append(f"stop {self.name}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.fail_load:
            raise ValueError("cannot load this")
        super().load_state_dict(state)


class OtherPlain(Plain):
    """The same state keys as Plain, but another class."""


class TwoPlain(Net):
    def __init__(self, log: list[str] | None = None) -> None:
        super().__init__()
        self.p = Plain(log=log)
        self.q = Plain(log=log)


# --- state.tree-shape -----------------------------------------------------------------------


@pytest.mark.rule("state.tree-shape")
def test_tree_mirrors_the_net() -> None:
    """> run.state_dict() returns a nested dict mirroring the net: one entry per node (its
    state_dict()) and per sub-net (a nested dict), by attribute name, plus the key "@mujou"
    with the format version, the timer time, each node's schedule and the latest message of
    each port."""
    net = Robot()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    assert type(tree) is dict
    assert set(tree) == {"@mujou", "a", "b", "arm"}
    assert isinstance(tree["@mujou"], dict)
    assert set(tree["arm"]) == {"joint"}
    assert set(tree["a"]) == {"generator", "acc", "t"}
    assert set(tree["arm"]["joint"]) == {"generator", "lin", "opt", "steps"}
    # The "@mujou" entry holds a format version (an int under a key naming it).
    versions = [k for k in tree["@mujou"] if "version" in str(k)]
    assert len(versions) == 1 and type(tree["@mujou"][versions[0]]) is int, tree["@mujou"].keys()


# --- state.default-node-state ---------------------------------------------------------------


class Stateful(Node):
    """Tensor, module, optimizer and plain attributes."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=5)
        self.w = torch.zeros(2)
        self.lin = nn.Linear(2, 1)
        self.opt = torch.optim.SGD(self.lin.parameters(), lr=0.1, momentum=0.5)
        self.number = 3  # a plain value
        self.names = ["x"]  # a plain value
        self.nothing: torch.Tensor | None = None  # a plain value

    def on_update(self, dt: float) -> None:
        with torch.enable_grad():
            loss = self.lin(torch.randn(2, generator=self.generator)).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        self.w += 1
        self.number += 1


class StatefulNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.s = Stateful()


@pytest.mark.rule("state.default-node-state")
def test_default_state_holds_generator_tensors_and_stateful_attributes() -> None:
    """> The default Node.state_dict() holds "generator" (the generator's state) and, keyed by
    > attribute name, every instance attribute that is a torch.Tensor, that has state_dict and
    > load_state_dict (modules, optimizers; not a node), or that is a plain value ... All are
    > CPU copies."""
    net = StatefulNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.75)
        state = run.state_dict()["s"]
    node = net.s
    assert set(state) == {"generator", "w", "lin", "opt", "number", "names", "nothing"}
    assert torch.equal(state["generator"], node.generator.get_state())
    assert torch.equal(state["w"], torch.full((2,), 3.0))
    assert_trees_equal(state["lin"], node.lin.state_dict(), "lin")
    assert_trees_equal(state["opt"], node.opt.state_dict(), "opt")
    assert (state["number"], state["names"], state["nothing"]) == (6, ["x"], None)
    assert state["names"] is not node.names, "a plain value is a copy"
    assert all(t.device.type == "cpu" for t in tensors(state))
    # The node's own state_dict gives the same.
    assert_trees_equal(node.state_dict(), state)


class Colour(enum.IntEnum):
    RED = 1


class Point(NamedTuple):
    x: float
    y: float


class FloatLike(float):
    """A float subclass, as NumPy's float64 is one."""


class Plainly(Node):
    """Every kind of plain value, and values that look plain but are subclasses."""

    out = Output()  # a port: never in the state

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=2)
        self.values: dict[str, Any] = {
            "none": None,
            "flag": True,
            "count": 7,
            "ratio": 0.5,
            "z": 1 + 2j,
            "text": "abc",
            "raw": b"\x00\x01",
            "dtype": torch.float16,
            "place": torch.device("cpu"),
        }
        for key, value in self.values.items():
            setattr(self, key, value)
        self.pair = (1, torch.ones(2))
        self.history = [1.5, [2, (3, "x")], {"k": torch.zeros(1)}]
        self.by_number = {2: "two", 1: "one", None: 0.0, "s": [None]}
        self.peer: Node | None = None  # set to a node below: a node is not stateful state
        self.colour = Colour.RED
        self.point = Point(1.0, 2.0)
        self.like = FloatLike(1.0)
        self.tuple_keys = {(1, 2): "a tuple key"}
        self.cyclic: list[object] = []
        self.cyclic.append(self.cyclic)


@pytest.mark.rule("state.default-node-state")
def test_default_state_keeps_plain_values_of_exact_types() -> None:
    """> ... a plain value: None, a bool, int, float, complex, str, bytes, torch.dtype or
    > torch.device, or a list, tuple or dict (whose keys are such scalars) of plain values and
    > tensors. ... The node's ports and Mujou's own attributes are not in it."""
    node = Plainly()
    node.peer = Plainly()
    with pytest.warns(mujou.UnsavedAttributeWarning) as caught:
        state = node.state_dict()
    plain = {*node.values, "values", "pair", "history", "by_number"}
    assert set(state) == {"generator", *plain}, sorted(state)
    for key in node.values:
        assert type(state[key]) is type(getattr(node, key)) and state[key] == getattr(node, key), key
    assert type(state["pair"]) is tuple and torch.equal(state["pair"][1], torch.ones(2))
    assert state["pair"][1] is not node.pair[1], "tensors in plain values are copies"
    assert state["history"][:2] == [1.5, [2, (3, "x")]] and type(state["history"][1][1]) is tuple
    assert list(state["by_number"]) == [2, 1, None, "s"], "dict keys keep their types and order"
    # The subclasses, the node, the tuple key and the cycle are named in the warning instead.
    (warning,) = caught
    for name in ("peer", "colour", "point", "like", "tuple_keys", "cyclic"):
        assert repr(name) in str(warning.message), (name, str(warning.message))
    # Each plain value is what torch.load(weights_only=True) reads back.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert_trees_equal(torch.load(buffer, weights_only=True), state)


class Counting(Node):
    """Counts its updates in a plain int and keeps its recent dts in a plain list."""

    count = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=4)

    def on_start(self) -> None:
        self.n = 0
        self.recent: list[float] = []
        self.last: tuple[int, float] = (0, 0.0)
        self.noise = 0.0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.recent = [*self.recent[-4:], dt]
        self.noise += float(torch.rand((), generator=self.generator))
        self.last = (self.n, self.noise)
        self.count.send(torch.tensor(self.n))


class CountingNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.c = Counting()


@pytest.mark.rule("state.default-node-state", "state.default-load", "state.resume")
def test_a_plain_counter_resumes_exactly_through_a_file(tmp_path: Path) -> None:
    """> A node that keeps its state in tensors, modules, optimizers, counters and lists of them
    > needs to write nothing: saved, loaded and resumed, the counter goes on bit for bit."""
    with mujou.run(CountingNet(), timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        mujou.save(run.state_dict(), tmp_path / "counter.pt")
        run.sleep(1.0)
        went_on = run.state_dict()
    tree = mujou.load(tmp_path / "counter.pt")
    assert tree["c"]["n"] == 10 and type(tree["c"]["last"]) is tuple
    net = CountingNet()
    with mujou.run(net, timer=mujou.VirtualTimer(), state=tree) as run:
        assert net.c.n == 10 and type(net.c.last) is tuple
        run.sleep(1.0)
        resumed = run.state_dict()
    assert resumed["c"]["n"] == 20
    assert_trees_equal(resumed, went_on)


# --- state.exclude --------------------------------------------------------------------------


class WithCache(Node):
    state_exclude: ClassVar[tuple[str, ...]] = ("cache",)

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.cache = {"big": torch.zeros(3)}  # plain, but left out by name
        self.kept = 1


class WithFile(WithCache):
    state_exclude: ClassVar[tuple[str, ...]] = ("file",)

    def on_start(self) -> None:
        self.file = threading.Lock()  # stands for an open file: no state of its own


class ExcludingNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.a = WithCache()
        self.b = WithFile()


@pytest.mark.rule("state.exclude")
def test_state_exclude_leaves_attributes_out_of_state_and_load() -> None:
    """> The default state_dict and load_state_dict leave out the attributes named in the class
    > attribute state_exclude (a tuple of names) of the node's class and of its base classes."""
    with mujou.run(ExcludingNet(), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        tree = run.state_dict()  # no UnsavedAttributeWarning: the lock is excluded
    assert set(tree["a"]) == {"generator", "kept"}
    assert set(tree["b"]) == {"generator", "kept"}, "the base's names are left out too"
    net = ExcludingNet()
    net.a.cache["big"] += 5
    with mujou.run(net, timer=mujou.VirtualTimer(), state=tree) as run:
        assert torch.equal(net.a.cache["big"], torch.full((3,), 5.0)), "not restored"
        run.sleep(0.25)


@pytest.mark.rule("state.exclude")
@pytest.mark.parametrize("names", ["cache", ("cache", 3), None], ids=["str", "not-str", "none"])
def test_a_bad_state_exclude_is_refused_when_the_class_is_defined(names: object) -> None:
    """> A state_exclude that is not a tuple, list or set of strings raises TypeError when the
    > class is defined."""
    with pytest.raises(
        TypeError,
        match=r"^Bad\.state_exclude must be a tuple of attribute names, such as \('cache',\), got ",
    ):

        class Bad(Node):
            state_exclude = names  # type: ignore[assignment]  # the wrong value is the point


# --- state.unsaved-warning ------------------------------------------------------------------


class Unsaved(Node):
    """Holds objects the default state cannot keep."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.event = threading.Event()
        self.callback = print
        self.w = torch.zeros(1)


class UnsavedNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.first = Unsaved()
        self.second = Unsaved()


@pytest.mark.rule("state.unsaved-warning")
def test_unsaved_attributes_are_named_once_with_the_fix() -> None:
    """> An attribute that the default state_dict cannot keep ... is left out of the state and
    > named, with the fix, in an mujou.UnsavedAttributeWarning when the state is first taken:
    > once per node class and attribute, on the host."""
    with (
        pytest.warns(mujou.UnsavedAttributeWarning) as caught,
        mujou.run(UnsavedNet(), timer=mujou.VirtualTimer()) as run,
    ):
        run.sleep(0.5)
        tree = run.state_dict()
        assert len(caught) == 1, "the call that took the state issued the warning"
        run.sleep(0.25)
        run.state_dict()
    assert set(tree["first"]) == set(tree["second"]) == {"generator", "w"}
    messages = [str(w.message) for w in caught if issubclass(w.category, mujou.UnsavedAttributeWarning)]
    assert len(messages) == 1, messages  # two nodes of one class, the state taken twice
    (message,) = messages
    assert message.startswith("node 'first' (Unsaved) has attribute(s) 'event' (an Event), "), message
    assert "'callback' (a builtin_function_or_method)" in message, message
    assert "state_exclude = ('event', 'callback') on Unsaved" in message, message
    assert "state_dict and load_state_dict" in message, message
    # Warned on the host, by the run.state_dict() call that took the state: the warning's
    # place is this test's line, not a place in Mujou's threads.
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name], [w.filename for w in caught]


@pytest.mark.rule("state.unsaved-warning", "rules.warnings-on-host")
def test_after_the_end_the_warning_is_the_hosts_not_a_hook_failure() -> None:
    """> ... named ... in an mujou.UnsavedAttributeWarning when the state is first taken: ... on
    > the host. Taken once the run has ended, with -W error: the host's call raises the
    > warning itself, not a HookError of the node's state_dict."""

    class LateUnsaved(Unsaved):
        pass

    run = mujou.run(Bag(node=LateUnsaved()), timer=mujou.VirtualTimer())
    run.sleep(0.5)
    run.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error", mujou.UnsavedAttributeWarning)
        with pytest.raises(mujou.UnsavedAttributeWarning, match=r"^node 'node' \(LateUnsaved\) has "):
            run.state_dict()
    assert set(run.state_dict()["node"]) == {"generator", "w"}  # named once: no warning now


@pytest.mark.rule("state.unsaved-warning")
def test_an_unsaved_attribute_of_a_later_class_or_attribute_is_named_again() -> None:
    """> once per node class and attribute."""

    class Another(Unsaved):
        pass

    node = Another()
    with pytest.warns(
        mujou.UnsavedAttributeWarning, match=r"^node '' \(Another\) has attribute\(s\) 'event'"
    ):
        node.state_dict()
    node.extra = object()  # type: ignore[attr-defined]  # a new attribute, not named yet
    with pytest.warns(mujou.UnsavedAttributeWarning) as caught:
        node.state_dict()
    (only,) = caught
    assert "'extra' (an object)" in str(only.message) and "'event'" not in str(only.message)


# --- state.cpu-copies -----------------------------------------------------------------------


@pytest.mark.rule("state.cpu-copies")
def test_tree_tensors_share_no_memory_with_nodes() -> None:
    """> Every tensor in the state tree is a CPU tensor that shares no memory with the running
    nodes."""
    net = StatefulNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
        node_storages = {net.s.w.untyped_storage().data_ptr()} | {
            p.untyped_storage().data_ptr() for p in net.s.lin.parameters()
        }
        all_tensors = tensors(tree)
        assert all_tensors
        assert all(t.device.type == "cpu" for t in all_tensors)
        assert not {t.untyped_storage().data_ptr() for t in all_tensors} & node_storages
        w_before = tree["s"]["w"].clone()
        weight_before = tree["s"]["lin"]["weight"].clone()
        run.sleep(0.5)  # the node changes w and its weights in place
    assert torch.equal(tree["s"]["w"], w_before)
    assert torch.equal(tree["s"]["lin"]["weight"], weight_before)
    assert not torch.equal(net.s.w, w_before)


# --- state.default-load ---------------------------------------------------------------------


class Restorable(Node):
    """Makes its tensors in on_start; records what a restore did to them."""

    state_exclude: ClassVar[tuple[str, ...]] = ("refs",)  # references to its own tensors

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=7)
        self.lin = nn.Linear(2, 2)
        self.refs: list[torch.Tensor] = []

    def on_start(self) -> None:
        self.w = torch.zeros(3)  # same shape as the saved one: restored in place
        self.grow = torch.zeros(1)  # another shape: replaced
        self.refs[:] = [self.w, self.grow]

    def on_update(self, dt: float) -> None:
        self.w += torch.rand(3, generator=self.generator)
        self.grow = torch.cat([self.grow, self.w[:1]])


class RestorableNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.r = Restorable()


@pytest.mark.rule("state.default-load")
def test_default_load_restores_generator_tensors_in_place_and_modules() -> None:
    """> The default load_state_dict sets the generator's state, copies each tensor back to the
    > node's device (in place when the attribute is already a tensor of the same shape and
    > dtype), calls load_state_dict of each stateful attribute ..."""
    first = RestorableNet()
    with mujou.run(first, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        tree = run.state_dict()
    saved = tree["r"]
    second = RestorableNet()
    assert not torch.equal(second.r.lin.weight, first.r.lin.weight)
    with mujou.run(second, timer=mujou.VirtualTimer(), state=tree) as run2:
        node = second.r
        assert node.w is node.refs[0], "a tensor of the same shape is restored in place"
        assert torch.equal(node.w, saved["w"])
        assert node.grow.shape == (5,) and torch.equal(node.grow, saved["grow"])
        assert torch.equal(node.lin.weight, first.r.lin.weight)
        assert torch.equal(node.generator.get_state(), saved["generator"])
        assert node.w.device == node.device
        run2.sleep(0.25)
    # The restored generator continues the same sequence as the first run's.
    g = torch.Generator().manual_seed(0)
    g.set_state(saved["generator"])
    expected = saved["w"] + torch.rand(3, generator=g)
    assert torch.equal(second.r.w, expected)


class PlainRestore(Node):
    """Plain values of several shapes, changed at each update."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=7)
        self.steps = 0
        self.pair: tuple[int, torch.Tensor] = (0, torch.zeros(2))
        self.table: dict[int | str, list[float]] = {3: [], "b": [], 1: []}
        self.label: str | None = None

    def on_update(self, dt: float) -> None:
        self.steps += 1
        self.pair = (self.steps, self.pair[1] + 1)
        for values in self.table.values():
            values.append(dt * self.steps)
        self.label = f"step {self.steps}"


class PlainRestoreNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.p = PlainRestore()


@pytest.mark.rule("state.default-load")
def test_default_load_assigns_copies_of_plain_values() -> None:
    """> ... and assigns each plain value: a copy of the saved one, of the same types (a tuple
    > stays a tuple, dict keys keep their types and order), whose tensors are on the node's
    > device."""
    with mujou.run(PlainRestoreNet(), timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        tree = run.state_dict()
    saved = tree["p"]
    assert saved["steps"] == 4 and saved["label"] == "step 4"
    net = PlainRestoreNet()
    with mujou.run(net, timer=mujou.VirtualTimer(), state=tree) as run:
        node = net.p
        assert node.steps == 4 and node.label == "step 4"
        assert type(node.pair) is tuple and node.pair[0] == 4
        assert torch.equal(node.pair[1], torch.full((2,), 4.0)) and node.pair[1].device == node.device
        assert list(node.table) == [3, "b", 1] and node.table[3] == [0.25, 0.5, 0.75, 1.0]
        # Copies: the node's values share nothing with the tree.
        assert node.table[3] is not saved["table"][3]
        assert node.pair[1].untyped_storage().data_ptr() != saved["pair"][1].untyped_storage().data_ptr()
        run.sleep(0.25)
    assert saved["table"][3] == [0.25, 0.5, 0.75, 1.0], "the tree did not change with the node"
    assert net.p.steps == 5 and net.p.table[1][-1] == 1.25


@pytest.mark.rule("state.default-load")
def test_default_load_refuses_a_value_that_is_not_plain() -> None:
    """> ... assigns each plain value: a saved value that is not one is refused."""
    with mujou.run(PlainRestoreNet(), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.25)
        tree = run.state_dict()
    tree["p"]["label"] = object()
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(PlainRestoreNet(), timer=mujou.VirtualTimer(), state=tree)
    assert "'label' must hold a plain value" in str(info.value), str(info.value)


@pytest.mark.rule("state.default-load")
def test_default_load_is_strict() -> None:
    """> it is strict: missing or unexpected keys raise."""
    net = StatefulNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.25)
        tree = run.state_dict()
    missing = {**tree, "s": {k: v for k, v in tree["s"].items() if k != "w"}}
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(StatefulNet(), timer=mujou.VirtualTimer(), state=missing)
    assert 'Missing key(s): "w"' in str(info.value), str(info.value)
    assert "'s'" in str(info.value), str(info.value)
    extra = {**tree, "s": {**tree["s"], "bogus": torch.zeros(1)}}
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(StatefulNet(), timer=mujou.VirtualTimer(), state=extra)
    assert 'Unexpected key(s): "bogus"' in str(info.value), str(info.value)
    no_number = {**tree, "s": {k: v for k, v in tree["s"].items() if k != "number"}}
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(StatefulNet(), timer=mujou.VirtualTimer(), state=no_number)
    assert 'Missing key(s): "number"' in str(info.value), str(info.value)


# --- state.consistent-snapshot --------------------------------------------------------------


class Pair(Node):
    """Keeps a == b between updates; its first update stops halfway until released."""

    state_exclude: ClassVar[tuple[str, ...]] = ("halfway", "release")  # the test's events

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.a = torch.zeros(())
        self.b = torch.zeros(())
        self.halfway = threading.Event()
        self.release = threading.Event()

    def on_update(self, dt: float) -> None:
        self.a += 1
        if not self.halfway.is_set():
            self.halfway.set()
            self.release.wait(HANG)
        self.b += 1


class PairNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.p = Pair(0.01)
        self.q = Pair(0.003)
        self.q.halfway.set()  # only p blocks
        self.q.release.set()


@pytest.mark.rule("state.consistent-snapshot")
def test_snapshot_is_taken_between_updates() -> None:
    """> run.state_dict() taken while the run runs is a snapshot between updates: no hook is
    running while the node states are taken."""
    net = PairNet()
    trees: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    with mujou.run(net, workers=2) as run:

        def snapshot() -> None:
            try:
                trees.append(run.state_dict())
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        try:
            wait_event(net.p.halfway, "p is halfway through its first update")
            taker = threading.Thread(target=snapshot)
            taker.start()
            taker.join(0.1)  # gives state_dict a chance to start meanwhile (no assertion)
        finally:
            net.p.release.set()
        taker.join(HANG)
        assert not taker.is_alive(), "state_dict hung"
        for _ in range(20):
            trees.append(run.state_dict())
    assert errors == []
    for tree in trees:
        for name in ("p", "q"):
            a, b = tree[name]["a"], tree[name]["b"]
            assert torch.equal(a, b), f"snapshot taken during an update of {name}: a={a}, b={b}"
    assert float(trees[0]["p"]["a"]) >= 1.0


class Lone(Net):
    def __init__(self) -> None:
        super().__init__()
        self.p = Pair(0.005)
        self.p.halfway.set()  # never blocks
        self.p.release.set()


@pytest.mark.rule("state.consistent-snapshot")
def test_snapshot_of_a_node_its_worker_sleeps_for() -> None:
    """> run.state_dict() taken while the run runs is a snapshot between updates: no hook is
    running while the node states are taken.

    With one worker under the real-time timer, the worker keeps a lone node while it sleeps
    until the node's next update (the scheduling page): taking the state has it put the node
    back, and the updates go on afterwards."""
    net = Lone()
    with mujou.run(net, workers=1) as run:
        trees = []
        for _ in range(20):

            def updated(before: int = run.stats().nodes["p"].updates) -> bool:
                return run.stats().nodes["p"].updates > before

            wait_until(updated, "an update of p")
            trees.append(run.state_dict())
    counts = [float(tree["p"]["a"]) for tree in trees]
    for tree in trees:
        assert torch.equal(tree["p"]["a"], tree["p"]["b"]), f"snapshot taken during an update: {tree['p']}"
    assert counts == sorted(counts) and counts[-1] >= counts[0] + 19, counts


@pytest.mark.rule("state.consistent-snapshot")
def test_virtual_snapshot_is_the_state_at_run_time() -> None:
    """> under the virtual timer it is exactly the state at run.time."""
    net1, net2 = Robot(), Robot()
    with mujou.run(net1, workers=2, timer=mujou.VirtualTimer()) as run1:
        run1.sleep(1.0)
        one = run1.state_dict()
    with mujou.run(net2, workers=2, timer=mujou.VirtualTimer()) as run2:
        for _ in range(8):
            run2.sleep(0.125)
            run2.state_dict()  # taking snapshots changes nothing
        two = run2.state_dict()
    assert_trees_equal(one, two)
    assert int(one["arm"]["joint"]["steps"]) > 0


# --- state.save-load ------------------------------------------------------------------------


def robot_tree(seconds: float = 0.5) -> dict[str, Any]:
    with mujou.run(Robot(), timer=mujou.VirtualTimer()) as run:
        run.sleep(seconds)
        return run.state_dict()


@pytest.mark.rule("state.save-load")
def test_save_and_load_round_trip(tmp_path: Path) -> None:
    """> mujou.save(tree, path) writes ...; mujou.load(path) reads it with
    torch.load(weights_only=True)."""
    tree = robot_tree()
    mujou.save(tree, tmp_path / "robot.pt")
    assert_trees_equal(mujou.load(tmp_path / "robot.pt"), tree)
    mujou.save(tree, str(tmp_path / "robot2.pt"))
    assert_trees_equal(mujou.load(str(tmp_path / "robot2.pt")), tree)
    # A state file is a torch.save file that loads with weights_only=True (with the file's own
    # entry beside the tree: state.file-checksum).
    raw = torch.load(tmp_path / "robot.pt", weights_only=True)
    assert isinstance(raw.pop("@mujou-file"), dict)
    assert_trees_equal(raw, tree)


LOADED: list[str] = []


def _mark_loaded(what: str) -> list[str]:
    LOADED.append(what)
    return LOADED


class Trap:
    """Unpickling it would run code (call _mark_loaded)."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_mark_loaded, ("code ran",))


@pytest.mark.rule("state.save-load")
def test_load_never_runs_code(tmp_path: Path) -> None:
    """> so a state file never runs code."""
    path = tmp_path / "evil.pt"
    torch.save({"@mujou": {"version": 1}, "x": Trap()}, path)
    LOADED.clear()
    with pytest.raises(
        mujou.StateFileError, match=r"it holds an object of \(or built by\) [\w.]*_mark_loaded"
    ):
        mujou.load(path)
    assert LOADED == [], "loading a state file ran code"


@pytest.mark.rule("state.save-load")
def test_save_is_atomic(tmp_path: Path) -> None:
    """> mujou.save(tree, path) writes atomically (a complete file or the old one, never a
    partial one)."""
    path = tmp_path / "state.pt"
    old = robot_tree(0.25)
    new = robot_tree(0.5)
    mujou.save(old, path)
    mujou.save(new, path)  # over an existing file
    assert_trees_equal(mujou.load(path), new)
    # A save that fails (a lambda: refused before writing, state.save-values) leaves the old file
    # intact; one that fails mid-write is in test_state_files.py.
    bad = {**old, "a": {**old["a"], "zzz": lambda: None}}
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        mujou.save(bad, path)
    assert_trees_equal(mujou.load(path), new)
    leftovers = sorted(os.listdir(tmp_path))
    assert leftovers == ["state.pt"], f"a failed save left files behind: {leftovers}"


# --- state.resume ---------------------------------------------------------------------------


@pytest.mark.rule("state.resume")
@pytest.mark.parametrize(("t_save", "workers_after"), [(1.0, 1), (0.8, 2), (0.8, 4)])
def test_resume_continues_bit_for_bit(tmp_path: Path, t_save: float, workers_after: int) -> None:
    """> mujou.run(net, state=tree) restores each node (load_state_dict, after its on_start),
    the timer time, the schedules and the latest messages; under the virtual timer, a run
    saved at time T and resumed continues bit for bit as the run that went on."""
    t_end = 2.5
    net = Robot()
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(t_save)
        t = run.time
        mujou.save(run.state_dict(), tmp_path / "t.pt")
        latest = run.read(net.arm.joint.y)
        run.sleep(t_end - t)
        went_on = run.state_dict()
    assert latest is not None

    fresh = Robot()
    with mujou.run(
        fresh, workers=workers_after, timer=mujou.VirtualTimer(), state=mujou.load(tmp_path / "t.pt")
    ) as resumed:
        assert resumed.time == t
        restored_latest = resumed.read(fresh.arm.joint.y)
        assert restored_latest is not None and torch.equal(restored_latest, latest)
        resumed.sleep(t_end - t)
        assert resumed.time == run.time
        continued = resumed.state_dict()
    assert_trees_equal(continued, went_on)


# --- state.mismatch -------------------------------------------------------------------------


class ThreePlain(Net):
    def __init__(self, log: list[str] | None = None) -> None:
        super().__init__()
        self.p = Plain(log=log)
        self.q = Plain(log=log)
        self.r = Plain(log=log)


class OnePlain(Net):
    def __init__(self, log: list[str] | None = None) -> None:
        super().__init__()
        self.p = Plain(log=log)


class MixedPlain(Net):
    def __init__(self, log: list[str] | None = None) -> None:
        super().__init__()
        self.p = Plain(log=log)
        self.q = OtherPlain(log=log)


class Everything(Net):
    """Against a TwoPlain tree: p is another class, q is missing from the net, r is new."""

    def __init__(self, log: list[str] | None = None) -> None:
        super().__init__()
        self.p = OtherPlain(log=log)
        self.r = Plain(log=log)


class FailingLoadNet(Net):
    def __init__(self, log: list[str] | None = None) -> None:
        super().__init__()
        self.p = Plain(log=log)
        self.q = Plain(log=log)
        self.q.fail_load = True  # the same class as in the tree, but its load fails


def two_plain_tree() -> dict[str, Any]:
    with mujou.run(TwoPlain(), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        return run.state_dict()


def with_version(tree: dict[str, Any], version: object) -> dict[str, Any]:
    meta = dict(tree["@mujou"])
    (key,) = [k for k in meta if "version" in str(k)]
    meta[key] = version
    return {**tree, "@mujou": meta}


@pytest.mark.rule("state.mismatch")
@pytest.mark.parametrize(
    ("make_net", "change", "expect"),
    [
        (ThreePlain, None, [r"\br\b"]),  # a node the tree lacks
        (OnePlain, None, [r"\bq\b"]),  # a node the net lacks
        (MixedPlain, None, [r"'q'", r"OtherPlain", r"\bPlain\b"]),  # another class
        (TwoPlain, 999, [r"version", r"999"]),  # an unknown format version
        (FailingLoadNet, None, [r"'q'", r"cannot load this"]),  # a failing load_state_dict
        (Everything, None, [r"'p'.*OtherPlain", r"\bq\b", r"\br\b"]),  # all at once
    ],
)
def test_tree_for_another_net_is_refused(
    make_net: Callable[[list[str]], Net], change: int | None, expect: list[str]
) -> None:
    """> A tree that does not fit the net (missing or unexpected nodes, a node of another
    class, unknown format version, a failing load_state_dict) raises ValueError from
    mujou.run, listing every problem at once in torch's format ("Error(s) in loading state
    for net: ..."), and starts nothing — on_start hooks that ran get their on_stop."""
    tree = two_plain_tree()
    if change is not None:
        tree = with_version(tree, change)
    log: list[str] = []
    net = make_net(log)
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(net, workers=2, timer=mujou.VirtualTimer(), state=tree)
    message = str(info.value)
    for pattern in expect:
        assert re.search(pattern, message, re.S), (pattern, message)
    assert not any(e.startswith("update") for e in log), log
    starts = sorted(e.split()[1] for e in log if e.startswith("start"))
    stops = sorted(e.split()[1] for e in log if e.startswith("stop"))
    assert starts == stops, f"every on_start that ran gets its on_stop: {log}"
    # Nothing is left running: the net runs again.
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.25)


class OneDrawing(Net):
    def __init__(self, device: str, log: list[str] | None = None) -> None:
        super().__init__()
        self.drawer = Drawer(device, log)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; CUDA is not available here")
@pytest.mark.rule("cuda.state-restores-on-cuda-only", "state.mismatch")
def test_a_tree_saved_from_cpu_is_refused_by_a_cuda_node() -> None:
    """> Likewise, a tree saved from nodes on the CPU restores only into nodes on the CPU; a node
    > on CUDA gets `ValueError`. (state.mismatch: listed in torch's format, and nothing starts.)"""
    with mujou.run(OneDrawing("cpu"), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    log: list[str] = []
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(OneDrawing("cuda", log), timer=mujou.VirtualTimer(), state=tree)
    message = str(info.value)
    assert "node 'drawer' is on CUDA, but its state was saved from a CPU node" in message, message
    assert log == [], "nothing starts when the tree is refused"
    # The same tree restores into a CPU node.
    with mujou.run(OneDrawing("cpu"), timer=mujou.VirtualTimer(), state=tree) as run:
        run.sleep(0.25)


# --- state.restore-after-on-start -----------------------------------------------------------


class MadeInStart(Node):
    state_exclude: ClassVar[tuple[str, ...]] = ("log",)

    def __init__(self, log: list[str]) -> None:
        super().__init__(period=0.25, seed=0)
        self.log = log

    def on_start(self) -> None:
        self.log.append("on_start")
        self.w = torch.zeros(4)

    def on_update(self, dt: float) -> None:
        self.w += 1

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.log.append("load_state_dict")
        super().load_state_dict(state)


class MadeInStartNet(Net):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.m = MadeInStart(log)


@pytest.mark.rule("state.restore-after-on-start")
def test_state_made_in_on_start_is_restored() -> None:
    """> The restore loads the state after on_start, so state made in on_start is restored
    too."""
    log: list[str] = []
    with mujou.run(MadeInStartNet(log), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.75)
        tree = run.state_dict()
    assert torch.equal(tree["m"]["w"], torch.full((4,), 3.0))
    log2: list[str] = []
    net = MadeInStartNet(log2)
    with mujou.run(net, timer=mujou.VirtualTimer(), state=tree) as run2:
        assert log2 == ["on_start", "load_state_dict"]
        assert torch.equal(net.m.w, torch.full((4,), 3.0))
        assert torch.equal(run2.state_dict()["m"]["w"], torch.full((4,), 3.0))
        run2.sleep(0.25)
        assert torch.equal(net.m.w, torch.full((4,), 4.0))


@pytest.mark.rule("state.mismatch")
def test_a_class_saved_from_main_matches_the_same_class_imported() -> None:
    """> ... a node of another class (a class saved from a script's `__main__` matches the same
    > class imported from its module) ..."""
    net = StatefulNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    for meta in tree["@mujou"]["nodes"].values():
        meta["class"] = "__main__." + meta["class"].rsplit(".", 1)[1]
    with mujou.run(StatefulNet(), timer=mujou.VirtualTimer(), state=tree) as resumed:
        assert resumed.time == 0.5


# --- gaps found by mutation testing ---------------------------------------------------------


class Counter(Node):
    """Sends its update count on ``y``; reads a host-fed input and the count back."""

    y = Output()
    fed = Input(optional=True)
    back = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.count = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        self.fed.read()
        self.back.read()
        self.count += 1
        self.y.send(self.count)


class CounterNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.c = Counter()
        self.connect(self.c.y, self.c.back)


@pytest.mark.rule("state.cpu-copies")
def test_changing_the_trees_port_messages_leaves_the_run_alone() -> None:
    """> Every tensor in the state tree is a CPU tensor that shares no memory with the running
    > nodes: the tree's copies of the ports' latest messages (in "@mujou") included. The host
    > changes every tensor of the tree in place; the ports and the nodes do not see it."""
    net = CounterNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.write(net.c.fed, torch.tensor([5.0, 6.0]))
        run.sleep(0.5)
        tree = run.state_dict()
        meta = tensors(tree["@mujou"])
        assert len(meta) >= 2, "the tree holds no port message"  # c.y and c.fed at least
        for t in tensors(tree):
            t.add_(1000)
        # The live messages are unchanged, and a changed one would fail their reads.
        assert run.read(net.c.y).tolist() == [2.0, 2.0]  # type: ignore[union-attr]
        assert run.read(net.c.fed).tolist() == [5.0, 6.0]  # type: ignore[union-attr]
        assert net.c.count.tolist() == [2.0, 2.0]
        run.sleep(0.5)  # the node reads both ports again
        assert run.read(net.c.y).tolist() == [4.0, 4.0]  # type: ignore[union-attr]
