"""Conformance tests for the page "Scheduling" (spec/en/scheduling.md).

Rules: ``sched.*`` (due times, fixed rate, skipping, lateness, determinism) and
``visibility.*`` (when a message can be read).

No test asserts on wall-clock durations. Under ``mujou.VirtualTimer()`` the arithmetic is
exact (periods are binary fractions). Under the real-time timer the tests are causal: the
host blocks a worker until the run's timer has moved on by a given amount, and the checks
use only the start times of updates, rebuilt from their ``dt`` (the sum of a node's dt's is
the start time of its latest update), against the grid of due times ``k * period``.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Mapping
from itertools import accumulate, pairwise

import pytest
import torch
from _support import Bag, FirstValueReader
from torch import nn

import mujou
from mujou import Input, Net, Node, Output

# A guard against a hang (a bug), never a timing assertion.
HANG = 30.0


def wait_event(event: threading.Event, what: str) -> None:
    """Wait for ``event``; fail the test (instead of hanging) if it never comes."""
    assert event.wait(HANG), f"hang guard: {what} did not happen within {HANG} s"


def sleep_until(run: mujou.Run, t: float, step: float) -> None:
    """Let the run's (real-time) timer reach ``t``, in small run.sleep steps."""
    guard = time.monotonic() + HANG
    while run.time < t:
        assert time.monotonic() < guard, f"hang guard: run.time stuck at {run.time} < {t}"
        run.sleep(step)


def slot_indices(dts: list[float], period: float) -> list[int]:
    """For each update, the index of the grid slot its start time falls in."""
    return [math.floor(s / period) for s in accumulate(dts)]


# --- nodes ----------------------------------------------------------------------------------


class Ticker(Node):
    """Sends its update count k (1, 2, ...) as a float64 tensor [k]; records its dt's."""

    out = Output()

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.count = 0
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        self.count += 1
        self.out.send(torch.tensor([float(self.count)], dtype=torch.float64))


# --- sched.first-due ------------------------------------------------------------------------


class TwoTickers(Net):
    def __init__(self, p: float, q: float) -> None:
        super().__init__()
        self.p = Ticker(p)
        self.q = Ticker(q)


@pytest.mark.rule("sched.first-due")
def test_first_update_is_due_one_period_after_start() -> None:
    """> A node's first update is due one period after the timer starts (its k-th update,
    counting from 1, is due at k × period of timer time)."""
    net = TwoTickers(0.375, 0.25)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.125)
        assert (net.p.count, net.q.count) == (0, 0)
        run.sleep(0.125)  # t = 0.25
        assert (net.p.count, net.q.count) == (0, 1)
        run.sleep(0.125)  # t = 0.375
        assert (net.p.count, net.q.count) == (1, 1)
        run.sleep(3.0 - 0.375)
    assert list(accumulate(net.p.dts)) == [0.375 * k for k in range(1, 9)]
    assert list(accumulate(net.q.dts)) == [0.25 * k for k in range(1, 13)]


@pytest.mark.rule("sched.first-due")
def test_first_update_never_starts_early_under_real_time() -> None:
    """> (its k-th update, counting from 1, is due at k × period of timer time): an update
    never starts before its due time."""
    net = TwoTickers(0.01, 0.007)
    with mujou.run(net, workers=2) as run:
        sleep_until(run, 0.1, 0.01)
    for node in (net.p, net.q):
        starts = list(accumulate(node.dts))
        assert starts, "no update ran"
        assert node.period is not None
        assert starts[0] >= node.period, (starts[0], node.period)
        assert all(s >= k * node.period for k, s in enumerate(starts, 1)), starts


# --- sched.fixed-rate -----------------------------------------------------------------------


@pytest.mark.rule("sched.fixed-rate")
def test_fixed_rate_virtual() -> None:
    """> The node's next update is due one period after the previous due time (not after its
    end), so the average interval equals the period."""
    net = TwoTickers(1 / 64, 3 / 128)
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(3.0)
    assert net.p.dts == [1 / 64] * 192
    assert net.q.dts == [3 / 128] * 128


class Tenths(Node):
    """Every 0.1 s of timer time, sends a message (its stamp is the update's start)."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.zeros(1))


class Stamps(Node):
    """Triggered by ``x``; notes the stamp of each message it reads: its sender's start."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.stamps: list[float | None] = []

    def on_update(self, dt: float) -> None:
        self.stamps.append(self.x.stamp)


@pytest.mark.rule("sched.first-due", "sched.fixed-rate")
def test_due_times_are_products_never_sums_of_periods() -> None:
    """> The due time of its k-th update is computed as the one product `k * period` of timer
    > time (a Python float), not as a sum of periods, so that rounding never accumulates

    With `period=0.1` (not a binary fraction) the starts, read exactly as the stamps of the
    node's messages, are `k * 0.1`; a sum of periods drifts from the tenth on (0.9999999999999999),
    so the tenth update would run within a sleep to just before 1.0."""
    net = Bag(tenths=Tenths(), stamps=Stamps())
    net.connect(net.tenths.y, net.stamps.x)  # type: ignore[attr-defined]
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(math.nextafter(1.0, 0.0))
        assert run.stats().nodes["tenths"].updates == 9
        run.sleep(5.0 - run.time)
    assert net.stamps.stamps == [k * 0.1 for k in range(1, 51)]  # type: ignore[attr-defined]


class SelfBlocker(Node):
    """Its first updates each stop until the host lets them go on; records its dt's."""

    def __init__(self, period: float, blocking: int, total: int) -> None:
        super().__init__(period=period, seed=0)
        self.blocking = blocking
        self.total = total
        self.dts: list[float] = []
        self.reached: queue.Queue[int] = queue.Queue()
        self.go: queue.Queue[None] = queue.Queue()
        self.done = threading.Event()

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        k = len(self.dts)
        if k <= self.blocking:
            self.reached.put(k)
            self.go.get(timeout=HANG)
        if k >= self.total:
            self.done.set()


class SelfBlockerNet(Net):
    def __init__(self, period: float) -> None:
        super().__init__()
        self.n = SelfBlocker(period, blocking=3, total=8)


@pytest.mark.rule("sched.fixed-rate")
def test_fixed_rate_real_time_keeps_the_grid() -> None:
    """> The node's next update is due one period after the previous due time (not after its
    end).

    The node's first three updates each last at least 0.6 periods of timer time. Were the next
    update due a period after the end, the node would drift off the grid k × period by more
    than a period, uncounted; with fixed rate every slot up to the latest start is either an
    update or a counted skip."""
    period = 0.02
    net = SelfBlockerNet(period)
    with mujou.run(net, workers=1) as run:
        for k in range(1, 4):
            assert net.n.reached.get(timeout=HANG) == k
            start = sum(net.n.dts)
            sleep_until(run, start + 0.6 * period, period / 10)
            net.n.go.put(None)
        wait_event(net.n.done, "eight updates")
    stats = run.stats().nodes["n"]
    dts = list(net.n.dts)
    slots = slot_indices(dts, period)
    assert stats.updates == len(dts)
    assert all(k <= s for k, s in enumerate(slots, 1)), f"an update started early: {slots}"
    assert all(a < b for a, b in pairwise(slots)), slots
    assert stats.updates + stats.skipped == slots[-1], (
        f"updates {stats.updates} + skipped {stats.skipped} != slot of the latest start "
        f"{slots[-1]} (dts {dts})"
    )


# --- sched.skip / sched.lateness under real time --------------------------------------------


class Hog(Node):
    """Blocks its worker in its first update until released."""

    def __init__(self) -> None:
        super().__init__(period=0.05, seed=0)
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if self.updates == 1:
            self.blocked.set()
            self.release.wait(HANG)


class Victim(Node):
    """Records its dt's; signals after three updates that started after the release."""

    def __init__(self, period: float, release: threading.Event) -> None:
        super().__init__(period=period, seed=0)
        self.release = release
        self.dts: list[float] = []
        self.after = 0
        self.done = threading.Event()

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        if self.release.is_set():
            self.after += 1
            if self.after >= 3:
                self.done.set()


class HogNet(Net):
    def __init__(self, period: float) -> None:
        super().__init__()
        self.hog = Hog()
        self.victim = Victim(period, self.hog.release)


def run_blocked(period: float, slots_blocked: int) -> tuple[list[float], mujou.NodeStats, float]:
    """One worker; the hog holds it until the timer has moved ``slots_blocked`` periods on.

    Returns the victim's dt's, its stats, and the run's time at the end.
    """
    net = HogNet(period)
    with mujou.run(net, workers=1) as run:
        try:
            wait_event(net.hog.blocked, "the hog blocks its worker")
            t0 = run.time  # the victim's last start before the block is earlier than this
            sleep_until(run, t0 + slots_blocked * period, period / 5)
        finally:
            net.hog.release.set()
        wait_event(net.victim.done, "three victim updates after the release")
    return list(net.victim.dts), run.stats().nodes["victim"], run.time


@pytest.mark.rule("sched.skip")
def test_late_node_skips_slots_instead_of_bursting() -> None:
    """> When an update starts more than a period late, the slots that have passed are
    skipped (counted in stats as skipped), never run in a burst: the next update is due at
    the first slot after the start."""
    period = 0.01
    dts, stats, t_end = run_blocked(period, 10)
    slots = slot_indices(dts, period)
    assert all(dt > 0 for dt in dts), dts
    # The update after the block started at least 10 periods after the one before it.
    assert max(dts) >= 10 * period, dts
    assert stats.skipped >= 8, stats
    assert stats.updates == len(dts)
    assert stats.updates < math.floor(t_end / period), (stats, t_end)
    # No burst: each update starts in a later slot than the previous one, never early.
    assert all(k <= s for k, s in enumerate(slots, 1)), f"an update started early: {slots}"
    assert all(a < b for a, b in pairwise(slots)), (
        f"two updates started in one slot (a burst): slots {slots}, dts {dts}"
    )
    # Every slot up to the latest start was either run or counted as skipped.
    assert stats.updates + stats.skipped == slots[-1], (stats, slots, dts)


@pytest.mark.rule("sched.lateness")
def test_max_lateness_is_start_minus_due() -> None:
    """> An update's lateness is its start time minus its due time; stats report the
    maximum.

    The due time of each update follows from the previous start (the first slot after it)."""
    period = 0.01
    dts, stats, _ = run_blocked(period, 10)
    starts = list(accumulate(dts))
    dues = [period] + [(math.floor(s / period) + 1) * period for s in starts[:-1]]
    lateness = [s - d for s, d in zip(starts, dues, strict=True)]
    assert min(lateness) >= -1e-9, lateness
    assert max(lateness) >= 9 * period, lateness
    assert stats.lateness_max == pytest.approx(max(lateness), abs=period / 4), (stats, lateness)


@pytest.mark.rule("sched.lateness")
def test_no_lateness_under_virtual_timer() -> None:
    """> An update's lateness is its start time minus its due time; stats report the maximum.

    Under the virtual timer every update starts at its due time."""
    net = TwoTickers(1 / 64, 0.1)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(2.0)
        stats = run.stats()
    assert stats.nodes["p"].lateness_max == 0.0
    assert stats.nodes["q"].lateness_max == 0.0
    assert stats.nodes["p"].skipped == stats.nodes["q"].skipped == 0


# --- visibility -----------------------------------------------------------------------------


class Board:
    """What a writer has finished: set after its call returned."""

    def __init__(self) -> None:
        self.done = 0


class Publisher(Node):
    out = Output()

    def __init__(self, period: float, board: Board) -> None:
        super().__init__(period=period, seed=0)
        self.board = board
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.tensor([float(self.count)]))
        self.board.done = self.count  # send has returned


class Checker(Node):
    """Checks that each read sees at least what was known to be sent before it started."""

    x = Input(optional=True)

    def __init__(self, period: float, board: Board, updates: int) -> None:
        super().__init__(period=period, seed=0)
        self.board = board
        self.updates = updates
        self.n = 0
        self.violations: list[tuple[int, float | None]] = []
        self.checked = 0
        self.done = threading.Event()

    def on_update(self, dt: float) -> None:
        known = self.board.done  # read before the read starts
        m = self.x.read()
        if known > 0:
            self.checked += 1
            if m is None or float(m[0]) < known:
                self.violations.append((known, None if m is None else float(m[0])))
        self.n += 1
        if self.n >= self.updates:
            self.done.set()


class RealTimeVisibility(Net):
    def __init__(self, board: Board) -> None:
        super().__init__()
        self.pub = Publisher(0.002, board)
        self.check = Checker(0.003, board, updates=60)
        self.connect(self.pub.out, self.check.x)


@pytest.mark.rule("visibility.realtime")
def test_real_time_message_visible_after_send_returned() -> None:
    """> Under the real-time timer, a message is visible to every read (and host call) that
    starts after send returned."""
    board = Board()
    net = RealTimeVisibility(board)
    host_violations: list[tuple[int, float | None]] = []
    with mujou.run(net, workers=2) as run:
        for _ in range(60):
            known = board.done
            m = run.read(net.pub.out)
            if known > 0 and (m is None or float(m[0]) < known):
                host_violations.append((known, None if m is None else float(m[0])))
            time.sleep(0.001)
        wait_event(net.check.done, "60 checker updates")
    assert net.check.violations == [], "a node read an older message than one already sent"
    assert host_violations == [], "the host read an older message than one already sent"
    assert net.check.checked > 0


class VirtualVisibility(Net):
    def __init__(self) -> None:
        super().__init__()
        self.before = FirstValueReader(0.25)  # registered before the writer
        self.writer = Ticker(0.25)
        self.after = FirstValueReader(0.25)  # registered after the writer
        self.slow = FirstValueReader(0.5)
        self.fast = FirstValueReader(0.125)
        for reader in (self.before, self.after, self.slow, self.fast):
            self.connect(self.writer.out, reader.x)


@pytest.mark.rule("visibility.virtual")
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_virtual_message_visible_only_after_its_due_time(workers: int) -> None:
    """> Under the virtual timer, a message sent by an update due at time t becomes visible to
    the updates due after t, never to those due at t; the host sees it when its call that
    advanced time past t returns."""
    net = VirtualVisibility()
    with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.3)
        assert run.read(net.writer.out).tolist() == [1.0]  # type: ignore[union-attr]
        run.sleep(1.7)  # t = 2.0: the writer's 8th update was due at 2.0 and has run
        assert run.read(net.writer.out).tolist() == [8.0]  # type: ignore[union-attr]
        run.sleep(0.1)
        assert run.read(net.writer.out).tolist() == [8.0]  # type: ignore[union-attr]
    same = [None, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert net.before.seen == same
    assert net.after.seen == same
    assert net.slow.seen == [1.0, 3.0, 5.0, 7.0]
    fast: list[float | None] = [None if j <= 2 else float(math.ceil(j / 2) - 1) for j in range(1, 17)]
    assert net.fast.seen == fast


class HostWritten(Net):
    def __init__(self, period: float) -> None:
        super().__init__()
        self.reader = FirstValueReader(period)


@pytest.mark.rule("visibility.host-write")
def test_host_write_visible_to_updates_due_after_run_time() -> None:
    """> A message the host writes is visible to the updates that start after write returned
    (under the virtual timer: those due after run.time)."""
    net = HostWritten(0.25)
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)  # the update due at 0.5 has run
        run.write(net.reader.x, torch.tensor([7.0]))
        run.sleep(0.6)  # t = 1.1
        run.write(net.reader.x, torch.tensor([8.0]))
        run.sleep(0.15)  # t = 1.25
    assert net.reader.seen == [None, None, 7.0, 7.0, 8.0]


class WrittenChecker(Node):
    x = Input(optional=True)

    def __init__(self, board: Board) -> None:
        super().__init__(period=0.002, seed=0)
        self.board = board
        self.violations: list[tuple[int, float | None]] = []
        self.checked = 0

    def on_update(self, dt: float) -> None:
        known = self.board.done
        m = self.x.read()
        if known > 0:
            self.checked += 1
            if m is None or float(m[0]) < known:
                self.violations.append((known, None if m is None else float(m[0])))


class WrittenNet(Net):
    def __init__(self, board: Board) -> None:
        super().__init__()
        self.check = WrittenChecker(board)


@pytest.mark.rule("visibility.host-write")
def test_host_write_visible_after_write_returned_real_time() -> None:
    """> A message the host writes is visible to the updates that start after write
    returned."""
    board = Board()
    net = WrittenNet(board)
    with mujou.run(net, workers=1) as run:
        for k in range(1, 41):
            run.write(net.check.x, torch.tensor([float(k)]))
            board.done = k  # write has returned
            time.sleep(0.001)
        sleep_until(run, run.time + 0.01, 0.005)
    assert net.check.violations == []
    assert net.check.checked > 0


# --- sched.virtual-deterministic ------------------------------------------------------------


class Noise(Node):
    """A seeded noisy source with an optional feedback input."""

    out = Output()
    fb = Input(optional=True)

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.state = torch.zeros(4)
        self.t = torch.zeros((), dtype=torch.float64)

    def on_update(self, dt: float) -> None:
        self.t += dt
        self.state.mul_(0.9).add_(torch.randn(4, generator=self.generator))
        fb = self.fb.read()
        if fb is not None:
            self.state.add_(0.01 * fb)
        self.out.send(self.state)


class Mix(Node):
    """Mixes two inputs through a seeded linear layer, plus its own noise."""

    a = Input()
    b = Input()
    out = Output()

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.lin = nn.Linear(8, 4)
        with torch.no_grad():
            nn.init.normal_(self.lin.weight, std=0.3, generator=self.generator)
            nn.init.normal_(self.lin.bias, std=0.1, generator=self.generator)
        self.acc = torch.zeros(4)

    def on_update(self, dt: float) -> None:
        a, b = self.a.read(), self.b.read()
        x = torch.cat([torch.zeros(4) if a is None else a, torch.zeros(4) if b is None else b])
        with torch.no_grad():
            y = torch.tanh(self.lin(x)) + 0.1 * torch.randn(4, generator=self.generator)
        self.acc += y
        self.out.send(y)


class Accum(Node):
    """Integrates its input over time, on a dedicated thread."""

    x = Input()
    out = Output()

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=4, dedicated_thread=True)
        self.total = torch.zeros(4, dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.int64)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.total += x.to(torch.float64) * dt
        self.count += 1
        self.out.send(self.total.to(torch.float32))


class Inner(Net):
    def __init__(self) -> None:
        super().__init__()
        self.mix = Mix(1 / 32, seed=3)
        self.acc = Accum(5 / 256)


class Deterministic(Net):
    """Seeded noisy nodes, different periods, connections, a feedback loop, a sub-net."""

    def __init__(self) -> None:
        super().__init__()
        self.n1 = Noise(1 / 64, seed=1)
        self.n2 = Noise(3 / 128, seed=2)
        self.inner = Inner()
        self.connect(self.n1.out, self.inner.mix.a)
        self.connect(self.n2.out, self.inner.mix.b)
        self.connect(self.inner.mix.out, self.inner.acc.x)
        self.connect(self.inner.acc.out, self.n1.fb)


def deterministic_trees(workers: int) -> list[dict[str, object]]:
    net = Deterministic()
    trees = []
    with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.3)
        trees.append(run.state_dict())
        run.write(net.n2.fb, torch.ones(4))  # the host's messages are part of the input
        run.sleep(0.7)
        trees.append(run.state_dict())
    return trees


def assert_trees_equal(a: object, b: object, path: str = "tree") -> None:
    """Assert two state trees are identical: same structure and types, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: tensor vs {type(b).__name__}"
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), path
        same = torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        assert same, f"{path}: tensors differ:\n{a}\n{b}"
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{path}: mapping vs {type(b).__name__}"
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_trees_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert isinstance(b, (list, tuple))
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_trees_equal(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert a == b, f"{path}: {a!r} vs {b!r}"


@pytest.mark.rule("sched.virtual-deterministic")
def test_same_state_tree_bit_for_bit_with_1_2_and_4_workers() -> None:
    """> Under the virtual timer, the same net with the same seeds and inputs gives the same
    state tree, bit for bit, whatever the number of workers and whichever machine."""
    reference = deterministic_trees(1)
    assert int(reference[1]["inner"]["acc"]["count"]) == 51  # type: ignore[index]
    for workers in (2, 4, 1):
        trees = deterministic_trees(workers)
        for when, (ref, tree) in zip(("t=0.3", "t=1.0"), zip(reference, trees, strict=True), strict=True):
            assert_trees_equal(tree, ref, f"workers={workers} {when}")


# --- gaps found by mutation testing ---------------------------------------------------------


class LateTwice(Node):
    """On a thread of its own; its 2nd and 4th updates block until the host releases them, so
    the updates after them (the 3rd and the 5th) start late."""

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0, dedicated_thread=True)
        self.dts: list[float] = []
        self.held = {2: threading.Event(), 4: threading.Event()}
        self.release = {2: threading.Event(), 4: threading.Event()}
        self.after = threading.Event()  # the 5th update ran

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        k = len(self.dts)
        if k in self.held:
            self.held[k].set()
            self.release[k].wait(HANG)
        elif k == 5:
            self.after.set()


@pytest.mark.rule("sched.skip")
def test_skipped_counts_the_slots_of_every_late_start() -> None:
    """> When an update starts more than a period late, the slots that have passed are skipped
    > (counted in stats as skipped): `skipped` adds up the slots of each late start.

    The node is held twice for 10 periods or more of the run's timer. After each late start,
    every slot up to the latest start was either run or skipped, so each late start adds what
    it skipped to what the earlier ones did."""
    period = 0.01
    node = LateTwice(period)
    with mujou.run(Bag(node=node), workers=1) as run:
        counts: list[int] = []
        for k in (2, 4):
            try:
                wait_event(node.held[k], f"update {k} blocks")
                counts.append(run.stats().nodes["node"].skipped)  # taken while it is held
                sleep_until(run, run.time + 10 * period, period / 5)
            finally:
                node.release[k].set()
        wait_event(node.after, "the update after the second late start")
    stats = run.stats().nodes["node"]
    dts = list(node.dts)
    slots = slot_indices(dts, period)
    assert stats.updates == len(dts), (stats, dts)
    # Each of the two late starts skipped at least 8 slots (10 periods, less 2 of lateness).
    assert counts[0] + 8 <= counts[1], (counts, dts)
    assert counts[1] + 8 <= stats.skipped, (counts, stats, dts)
    assert stats.updates + stats.skipped == slots[-1], (
        f"updates {stats.updates} + skipped {stats.skipped} != slot of the latest start "
        f"{slots[-1]} (dts {dts})"
    )
