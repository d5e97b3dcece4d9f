"""Regression tests for exactness defects: resume, failed starts, failures and determinism.

Rules: ``state.resume``, ``state.mismatch``, ``run.start-undone``, ``run.wait-for``,
``sched.lateness``, ``sched.virtual-failure`` and ``sched.virtual-deterministic``.

Every call that could hang on a defect runs on a helper thread joined with a hang guard, so a
hang fails the test instead of pytest. Nothing asserts on wall-clock time.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import pytest
import torch
from _support import HANG_GUARD, Bag, vt, wait_until

import mujou
from mujou import Input, Net, Node, Output

# --- helpers --------------------------------------------------------------------------------


def assert_trees_equal(a: object, b: object, path: str = "tree") -> None:
    """Two state trees are identical: same keys and types, every tensor equal (torch.equal)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: tensor vs {type(b).__name__}"
        assert a.dtype == b.dtype and torch.equal(a, b), f"{path}: tensors differ:\n{a}\n{b}"
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{path}: mapping vs {type(b).__name__}"
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_trees_equal(a[key], b[key], f"{path}[{key!r}]")
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


T = TypeVar("T")


def in_thread(call: Callable[[], T]) -> T:
    """``call()`` on a helper thread; its result, or its exception re-raised here.

    Fails the test when the call is still running after the hang guard (a deadlock).
    """
    outcome: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="test-host", daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), f"hang guard: the call did not return within {HANG_GUARD} s"
    if error:
        raise error[0]
    return outcome[0]


def mujou_threads(before: set[threading.Thread]) -> list[str]:
    """The names of the live mujou threads that were not alive in ``before``."""
    return [t.name for t in threading.enumerate() if t not in before and t.name.startswith("mujou-")]


def assert_no_thread_left(before: set[threading.Thread]) -> None:
    wait_until(lambda: not mujou_threads(before), "the run's threads to end")


class Counter(Node):
    """Counts its updates in a tensor and sends the count; may raise at its ``fail_at``-th."""

    out = Output()

    def __init__(self, period: float, seed: int, *, fail_at: int = 0, dedicated: bool = False) -> None:
        super().__init__(period=period, seed=seed, dedicated_thread=dedicated)
        self.count = torch.zeros((), dtype=torch.float64)
        self.fail_at = fail_at
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        self.count += 1
        self.out.send(self.count.clone())
        if int(self.count) == self.fail_at:
            raise ValueError("boom")


class Recorder(Node):
    """Keeps what it read last (``last``, nan for nothing) and every read in ``seen``."""

    x = Input(optional=True)

    def __init__(self, period: float, seed: int = 0) -> None:
        super().__init__(period=period, seed=seed)
        self.last = torch.full((), math.nan, dtype=torch.float64)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        self.last.fill_(math.nan if message is None else float(message))
        self.seen.append(float(self.last))


# --- state.resume: a node that sends in on_start --------------------------------------------


class StartSender(Counter):
    """Sends -1.0 in on_start, then its update count."""

    def on_start(self) -> None:
        self.out.send(torch.tensor(-1.0, dtype=torch.float64))


class SenderNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.sender = StartSender(0.1, seed=1)
        self.reader = Recorder(0.07, seed=2)
        self.connect(self.sender.out, self.reader.x)


@pytest.mark.rule("state.resume", "sched.virtual-deterministic")
def test_resume_is_bit_exact_when_a_node_sends_in_on_start() -> None:
    """What on_start sends on a resume does not replace the restored latest message."""
    net = SenderNet()
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        tree = run.state_dict()
        reads_before = len(net.reader.seen)
        run.sleep(1.0)
        went_on = run.state_dict()
    expected = net.reader.seen[reads_before:]
    assert expected[0] == 10.0 and -1.0 not in expected

    fresh = SenderNet()
    with mujou.run(fresh, timer=vt(), state=tree) as resumed:
        resumed.sleep(1.0)
        continued = resumed.state_dict()
    # The reader's record is a plain list of its state: resumed, it holds the first second too.
    assert fresh.reader.seen[reads_before:] == expected
    assert fresh.reader.seen == net.reader.seen
    assert_trees_equal(continued, went_on)


# --- state.mismatch / run.start-undone: a failed start leaks nothing ------------------------


class Hooked(Node):
    """Logs its on_start and on_stop."""

    x = Input(optional=True)

    def __init__(self, log: list[str], tag: str) -> None:
        super().__init__(period=0.1, seed=0)
        self.log = log
        self.tag = tag

    def on_start(self) -> None:
        self.log.append(f"start {self.tag}")

    def on_stop(self) -> None:
        self.log.append(f"stop {self.tag}")


class HookedNet(Net):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.a = Hooked(log, "a")
        self.b = Hooked(log, "b")


def good_tree() -> dict[str, Any]:
    with mujou.run(HookedNet([]), timer=vt()) as run:
        run.sleep(0.35)
        return run.state_dict()


def refused_start(start: Callable[[], mujou.Run]) -> None:
    """Call ``start`` (a mujou.run that must raise) guarded; a run it starts anyway is stopped."""

    def call() -> None:
        run = start()
        with contextlib.suppress(Exception):  # the stray run's own failure is not checked here
            run.stop()
        pytest.fail("mujou.run did not raise")

    in_thread(call)


def assert_start_undone(net: Net, log: list[str], before: set[threading.Thread]) -> None:
    """No mujou thread is left, every on_start that ran got its on_stop, the net runs again."""
    assert_no_thread_left(before)
    starts = sorted(e.split()[1] for e in log if e.startswith("start"))
    stops = sorted(e.split()[1] for e in log if e.startswith("stop"))
    assert starts == stops, f"every on_start that ran gets its on_stop: {log}"

    def run_again() -> None:
        with mujou.run(net, timer=vt()) as again:
            again.sleep(0.25)

    in_thread(run_again)
    assert_no_thread_left(before)


def without(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def bad_meta(**changes: object) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A change of the tree's "@mujou" entry (the value None removes the key)."""

    def change(tree: dict[str, Any]) -> dict[str, Any]:
        meta = dict(tree["@mujou"])
        for key, value in changes.items():
            meta = without(meta, key) if value is None else {**meta, key: value}
        return {**tree, "@mujou": meta}

    return change


def bad_node(key: str, value: object) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A change of node 'b''s schedule in the tree's "@mujou" entry."""

    def change(tree: dict[str, Any]) -> dict[str, Any]:
        meta = dict(tree["@mujou"])
        nodes = dict(meta["nodes"])
        nodes["b"] = {**nodes["b"], key: value}
        return {**tree, "@mujou": {**meta, "nodes": nodes}}

    return change


BAD_TREES = {
    "time missing": (bad_meta(time=None), [r"time"]),
    "time a string": (bad_meta(time="x"), [r"time"]),
    "time nan": (bad_meta(time=math.nan), [r"time"]),
    "time inf": (bad_meta(time=math.inf), [r"time"]),
    "time huge": (bad_meta(time=1e300), [r"time"]),
    "slot negative": (bad_node("slot", -1), [r"\bb\b", r"slot"]),
    "slot a float": (bad_node("slot", 2.5), [r"\bb\b", r"slot"]),
    "slot a string": (bad_node("slot", "3"), [r"\bb\b", r"slot"]),
    "last nan": (bad_node("last", math.nan), [r"\bb\b", r"last"]),
    "last after time": (bad_node("last", 1.0), [r"\bb\b", r"last"]),
    "period zero": (bad_node("period", 0.0), [r"\bb\b", r"period"]),
    "period negative": (bad_node("period", -0.1), [r"\bb\b", r"period"]),
    "period a string": (bad_node("period", "x"), [r"\bb\b", r"period"]),
}


@pytest.mark.rule("state.mismatch", "run.start-undone")
@pytest.mark.parametrize("problem", list(BAD_TREES))
def test_a_bad_tree_is_refused_and_leaks_nothing(problem: str) -> None:
    """A tree with a bad "@mujou" entry raises ValueError in torch's format, naming the entry,
    and the failed start leaves no thread, no started node and no engine behind."""
    change, expect = BAD_TREES[problem]
    tree = change(good_tree())
    log: list[str] = []
    net = HookedNet(log)
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net:") as info:
        refused_start(lambda: mujou.run(net, state=tree, timer=vt()))
    for pattern in expect:
        assert re.search(pattern, str(info.value).split("\n", 1)[1]), (pattern, str(info.value))
    assert_start_undone(net, log, before)


@pytest.mark.rule("run.start-undone", "run.arguments")
def test_an_input_that_cannot_be_copied_is_refused_and_leaks_nothing() -> None:
    """A meta tensor in inputs= makes mujou.run raise, naming the input; nothing is left."""
    log: list[str] = []
    net = HookedNet(log)
    port = net.b.x
    before = set(threading.enumerate())
    with pytest.raises((TypeError, ValueError), match=r"b\.x"):
        refused_start(lambda: mujou.run(net, inputs={port: torch.empty(3, device="meta")}, timer=vt()))
    assert_start_undone(net, log, before)


# --- sched.virtual-failure: the tree after a failure ----------------------------------------


class SixCounters(Net):
    """Six counters of one period; c2 raises at its 3rd update."""

    def __init__(self) -> None:
        super().__init__()
        for i in range(6):
            setattr(self, f"c{i}", Counter(0.1, seed=i, fail_at=3 if i == 2 else 0))


def tree_after_failure(net: Net, workers: int, seconds: float) -> tuple[str, dict[str, Any]]:
    """Run ``net`` under the virtual timer until a hook fails: the error and the state tree."""
    run = mujou.run(net, workers=workers, timer=vt())
    with pytest.raises(mujou.HookError) as info:
        run.sleep(seconds)
    tree = run.state_dict()
    with pytest.raises(mujou.HookError):
        run.stop()
    return str(info.value), tree


@pytest.mark.rule("sched.virtual-failure", "sched.virtual-deterministic")
def test_the_tree_after_a_failure_does_not_depend_on_the_workers() -> None:
    """Every update due at the failing time still runs, none due later: the same tree with
    1, 2 and 4 workers."""
    error, reference = tree_after_failure(SixCounters(), 1, 1.0)
    counts = [float(reference[f"c{i}"]["count"]) for i in range(6)]
    assert counts == [3.0] * 6, counts
    for workers in (2, 4):
        other_error, tree = tree_after_failure(SixCounters(), workers, 1.0)
        assert other_error == error
        assert_trees_equal(tree, reference, f"workers={workers}")


# --- sched.lateness: 0 under the virtual timer ----------------------------------------------


class Pausing(Counter):
    """At its 3rd update, holds its worker for 50 ms of real time: the others fall due meanwhile."""

    state_exclude: ClassVar[tuple[str, ...]] = ("inside",)  # the test's event, not state

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period, seed)
        self.inside = threading.Event()

    def on_update(self, dt: float) -> None:
        super().on_update(dt)
        if int(self.count) == 3:
            self.inside.set()
            threading.Event().wait(0.05)


class LateNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.own = Counter(0.01, seed=1, dedicated=True)
        self.shared = Counter(0.01, seed=2)
        self.pausing = Pausing(0.01, seed=3)


def assert_never_late(run: mujou.Run, net: LateNet) -> None:
    for name, stats in run.stats().nodes.items():
        assert stats.updates > 0 and stats.lateness_max == 0.0, (name, stats)
    for node in (net.own, net.shared, net.pausing):
        assert node.dts and all(0 < dt < math.inf for dt in node.dts), node.dts


@pytest.mark.rule("sched.lateness", "state.resume")
def test_lateness_is_zero_under_the_virtual_timer_after_a_real_time_run() -> None:
    """A run resumed under the virtual timer from a real-time tree whose nodes were due when it
    was taken is never late, and its dt are > 0."""
    real_net = LateNet()
    with mujou.run(real_net, workers=1) as real:
        assert real_net.pausing.inside.wait(HANG_GUARD), "hang guard: the pause never came"
        tree = real.state_dict()  # taken during or right after the pause
    net = LateNet()
    with mujou.run(net, workers=1, timer=vt(), state=tree) as run:
        run.sleep(0.5)
        assert_never_late(run, net)


@pytest.mark.rule("sched.lateness")
def test_lateness_of_a_dedicated_node_is_zero_under_the_virtual_timer() -> None:
    """> under the virtual timer it is always 0 (a node on a dedicated thread included)."""
    net = LateNet()
    with mujou.run(net, workers=1, timer=vt()) as run:
        run.sleep(0.5)
        assert_never_late(run, net)


# --- run.wait-for: the predicate runs outside the engine ------------------------------------


@pytest.mark.rule("run.wait-for")
@pytest.mark.parametrize("virtual", [True, False], ids=["virtual", "real-time"])
def test_wait_for_predicate_may_take_the_state(virtual: bool) -> None:
    """A predicate that calls run.state_dict() does not deadlock wait_for."""
    counter = Counter(0.01, seed=1)
    net = Bag(c=counter)

    def host() -> float:
        with mujou.run(net, workers=1, timer=vt() if virtual else None) as run:

            def big_enough(message: torch.Tensor) -> bool:
                return float(run.state_dict()["c"]["count"]) >= 3 and float(message) >= 3

            return float(run.wait_for(counter.out, big_enough))

    assert in_thread(host) >= 3


class Releaser(Node):
    """Sets ``go`` at an update that starts once ``entered`` is set."""

    def __init__(self, entered: threading.Event, go: threading.Event) -> None:
        super().__init__(period=0.01, seed=0)
        self.entered = entered
        self.go = go

    def on_update(self, dt: float) -> None:
        if self.entered.is_set():
            self.go.set()


@pytest.mark.rule("run.wait-for")
def test_nodes_update_while_the_predicate_runs() -> None:
    """Under the real-time timer, a predicate that waits for a node's update gets it."""
    entered, go = threading.Event(), threading.Event()
    released: list[bool] = []
    counter = Counter(0.01, seed=1)
    net = Bag(c=counter, r=Releaser(entered, go))

    def waits_for_the_releaser(message: torch.Tensor) -> bool:
        entered.set()
        released.append(go.wait(HANG_GUARD))
        return True

    def host() -> None:
        with mujou.run(net, workers=2) as run:
            run.wait_for(counter.out, waits_for_the_releaser)

    in_thread(host)
    assert released == [True]


# --- sched.virtual-deterministic: random nets, failures and dedicated nodes -----------------


class Noisy(Node):
    """Mixes its own noise with what it reads; may run on its own thread and fail."""

    x = Input(optional=True)
    out = Output()

    def __init__(self, period: float, seed: int, dedicated: bool, fail_at: int) -> None:
        super().__init__(period=period, seed=seed, dedicated_thread=dedicated)
        self.state = torch.zeros(3)
        self.count = torch.zeros((), dtype=torch.int64)
        self.fail_at = fail_at

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.state.mul_(0.5).add_(torch.randn(3, generator=self.generator))
        message = self.x.read()
        if message is not None:
            self.state.add_(message)
        self.out.send(self.state)
        if int(self.count) == self.fail_at:
            raise ValueError("boom")


def random_net(seed: int) -> Net:
    """3 to 6 seeded nodes of random periods, each fed by an earlier one or none; some on their
    own thread; in about half of the nets one node fails at a random update."""
    rng = random.Random(seed)
    size = rng.randint(3, 6)
    failing = rng.randrange(size) if rng.random() < 0.5 else -1
    nodes = [
        Noisy(
            rng.choice([0.01, 0.02, 0.03, 0.05]),
            seed=rng.randrange(2**32),
            dedicated=rng.random() < 0.3,
            fail_at=rng.randint(1, 15) if i == failing else 0,
        )
        for i in range(size)
    ]
    net = Bag(**{f"n{i}": node for i, node in enumerate(nodes)})
    for i, node in enumerate(nodes[1:], 1):
        if rng.random() < 0.7:
            net.connect(nodes[rng.randrange(i)].out, node.x)
    return net


def run_to_end(net: Net, workers: int) -> tuple[str, dict[str, Any]]:
    """Run ``net`` 0.5 s under the virtual timer or until a hook fails: the error and the tree."""
    run = mujou.run(net, workers=workers, timer=vt())
    error = ""
    try:
        run.sleep(0.5)
    except mujou.HookError as exc:
        error = str(exc)
    tree = run.state_dict()
    with contextlib.suppress(mujou.HookError):
        run.stop()
    return error, tree


@pytest.mark.rule("sched.virtual-deterministic", "sched.virtual-failure")
@pytest.mark.parametrize("seed", range(20))
def test_random_nets_give_the_same_tree_with_1_2_and_4_workers(seed: int) -> None:
    """Random seeded nets, some with dedicated nodes and a failing node: the same tree and
    the same error with 1, 2 and 4 workers."""
    error, reference = run_to_end(random_net(seed), 1)
    for workers in (2, 4):
        other_error, tree = run_to_end(random_net(seed), workers)
        assert other_error == error
        assert_trees_equal(tree, reference, f"workers={workers}")
