"""Conformance tests for the page "State" (spec/en/state.md): rules ``state.*``.

The state tree, the default node state, CPU copies, strict restores, save/load, resume.
Trees are compared exactly: the same structure, and every tensor equal with torch.equal.
"""

from __future__ import annotations

import os
import pickle
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import Drawer, wait_until
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
    """Tensor, module and optimizer attributes, plus attributes that are not state."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=5)
        self.w = torch.zeros(2)
        self.lin = nn.Linear(2, 1)
        self.opt = torch.optim.SGD(self.lin.parameters(), lr=0.1, momentum=0.5)
        self.number = 3  # not a tensor, not stateful
        self.names = ["x"]  # not a tensor, not stateful
        self.nothing: torch.Tensor | None = None  # not a tensor now

    def on_update(self, dt: float) -> None:
        with torch.enable_grad():
            loss = self.lin(torch.randn(2, generator=self.generator)).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        self.w += 1


class StatefulNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.s = Stateful()


@pytest.mark.rule("state.default-node-state")
def test_default_state_holds_generator_tensors_and_stateful_attributes() -> None:
    """> The default Node.state_dict() holds "generator" (the generator's state) and every
    instance attribute that is a torch.Tensor or has state_dict and load_state_dict (modules,
    optimizers), keyed by attribute name, as CPU copies."""
    net = StatefulNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.75)
        state = run.state_dict()["s"]
    node = net.s
    assert set(state) == {"generator", "w", "lin", "opt"}
    assert torch.equal(state["generator"], node.generator.get_state())
    assert torch.equal(state["w"], torch.full((2,), 3.0))
    assert_trees_equal(state["lin"], node.lin.state_dict(), "lin")
    assert_trees_equal(state["opt"], node.opt.state_dict(), "opt")
    assert all(t.device.type == "cpu" for t in tensors(state))
    # The node's own state_dict gives the same.
    assert_trees_equal(node.state_dict(), state)


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

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=7)
        self.lin = nn.Linear(2, 2)
        self.refs: list[torch.Tensor] = []  # a list: not part of the state

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
    """> The default load_state_dict sets the generator's state and copies each tensor back to
    the node's device (in place when the attribute is already a tensor of the same shape) and
    calls load_state_dict of each stateful attribute."""
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


# --- state.consistent-snapshot --------------------------------------------------------------


class Pair(Node):
    """Keeps a == b between updates; its first update stops halfway until released."""

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
