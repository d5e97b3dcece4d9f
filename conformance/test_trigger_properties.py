"""Property tests of triggered nets (spec/en/triggers.md), on random nets that hypothesis makes.

A hand-written net checks the case its author thought of; these build nets of 2 to 8 nodes,
periodic, triggered (``on``, ``on_all``, with or without ``timeout``) or both, with random
``delay`` and ``min_interval``, edges forward and (where no cycle of undelayed triggers can
form, trigger.cycle) backward, some on threads of their own, and inputs the host writes at
random times. When a property fails, hypothesis shrinks the net to a small one and prints it.

Under the virtual timer three properties: the same results for 1, 2 and 4 workers; the same
as ``Model``, the Triggers page's rules run by hand; and a resume from a tree taken half-way
that goes on bit for bit. Under the real-time timer: a node's hooks never overlap.

The examples are few and derandomized, with no example database, so that the suite is the
same on every machine and under ``pytest -n auto`` (the profile below).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import pytest
import torch
from _support import HANG_GUARD, Bag, hang_guard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mujou
from mujou import Input, Node, Output

PORTS = ("a", "b", "c")  # the inputs of every Cell
PERIODS = (0.01, 0.02, 0.03)
DELAYS = (0.0, 0.005)
MIN_INTERVALS = (0.0, 0.01)
SLEEPS = (0.0, 0.005, 0.01, 0.015, 0.025)  # what the host sleeps between its writes
START = 0.75  # what a Cell that sends in on_start sends there
REPLACED = 100.0  # the messages a Cell sends and replaces at once are above this, others in [-1, 2]

# A flag drawn as ``integers(0, 3) == 3`` is set one time in four and shrinks to unset: the
# small net hypothesis prints has only the features the failure needs.
PROPERTIES = settings(
    max_examples=50,
    deadline=None,  # a run's time is the machine's: 2 busy cores under -n auto
    derandomize=True,  # the same examples on every machine: CI is deterministic
    database=None,  # and no memory of earlier failures that would change what runs
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    """This module's hang guard, in place of conftest's: a failing property runs many nets
    while hypothesis shrinks it, and should get to print the small one. Each run in it is
    guarded on its own too (``HANG_GUARD``)."""
    with hang_guard(600.0):
        yield


# --------------------------------------------------------------------------------------------
# The nets


@dataclass(frozen=True)
class CellSpec:
    """One node of a random net."""

    period: float | None  # None: triggered only
    trigger: tuple[str, ...]  # the inputs it is triggered by; () for periodic only
    all: bool  # on_all instead of on
    timeout: float | None  # on_all's timeout
    delay: float
    min_interval: float
    sources: tuple[int | str | None, ...]  # per input: a node's index, "host" or None
    seed: int
    dedicated: bool = False  # on a thread of its own (trigger.dedicated-thread)
    start: bool = False  # sends START in on_start (trigger.arrival)

    def make_trigger(self) -> mujou.Trigger | None:
        if not self.trigger:
            return None
        if self.all:
            return mujou.on_all(*self.trigger, timeout=self.timeout)
        return mujou.on(*self.trigger)

    def node_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``Node.__init__`` for this node."""
        return {
            "period": self.period,
            "trigger": self.make_trigger(),
            "delay": self.delay,
            "min_interval": self.min_interval,
            "seed": self.seed,
            "dedicated_thread": self.dedicated,
        }


@dataclass(frozen=True)
class Write:
    """The host writes ``value`` to input ``port`` of node ``node``."""

    node: int
    port: str
    value: float


@dataclass(frozen=True)
class Step:
    """What the host does: its writes, then ``run.sleep(sleep)``, then maybe take the state
    (which changes nothing: state.consistent-snapshot)."""

    writes: tuple[Write, ...]
    sleep: float
    take_state: bool = False


@dataclass(frozen=True)
class Scenario:
    cells: tuple[CellSpec, ...]
    steps: tuple[Step, ...]


class Cell(Node):
    """Reads its inputs (value, fresh, stamp), draws from its generator, sends what depends
    on both (at times two messages, the second replacing the first), and keeps a record of it
    all: ``record`` (floats) and ``acc`` (a tensor), both in its state tree. Some send a first
    message in ``on_start`` too."""

    state_exclude: ClassVar[tuple[str, ...]] = ("spec",)

    a = Input(optional=True)
    b = Input(optional=True)
    c = Input(optional=True)
    y = Output()

    def __init__(self, spec: CellSpec) -> None:
        super().__init__(**spec.node_arguments())
        self.record: list[float] = []
        self.acc = torch.zeros(())
        self.replaced_read = 0  # reads of a message its sender replaced in the same update
        self.spec = spec

    def on_start(self) -> None:
        if self.spec.start:
            self.y.send(torch.tensor(START))

    def on_update(self, dt: float) -> None:
        reads = [(port.read(), port.fresh, port.stamp) for port in (self.a, self.b, self.c)]
        row, self.acc, sends, replaced = cell_update(self.acc, reads, dt, self.generator)
        self.record += row
        self.replaced_read += replaced
        for message in sends:
            self.y.send(message)


Read = tuple[torch.Tensor | None, bool, float | None]  # what an update reads: message, fresh, stamp


def cell_update(
    acc: torch.Tensor, reads: Sequence[Read], dt: float, generator: torch.Generator
) -> tuple[list[float], torch.Tensor, list[torch.Tensor], int]:
    """A Cell's update, from what it reads: its record's row, its new ``acc``, the messages it
    sends (in order), and how many of its reads were of a replaced message. Pure, so that the
    model (``Model``) runs the very same arithmetic."""
    row = [dt]
    replaced = 0
    total = acc * 0.5
    for message, fresh, stamp in reads:
        row += [float(fresh), -1.0 if stamp is None else stamp]
        if message is not None:
            total = total + message
            row.append(float(message))
            if message > REPLACED / 2:
                replaced += 1
    draw = torch.rand((), generator=generator)
    sends = []
    if draw < 0.3:  # a first message, replaced by the next in the same update: never read
        sends.append(REPLACED + torch.tanh(total))
    acc = torch.tanh(total + draw)  # bounded: a cycle never makes inf or nan
    row += [float(draw), float(acc)]
    sends.append(acc)
    return row, acc, sends, replaced


def build(cells: Sequence[CellSpec]) -> tuple[Bag, list[Cell]]:
    nodes = [Cell(spec) for spec in cells]
    net = Bag(**{f"n{i}": node for i, node in enumerate(nodes)})
    for node, spec in zip(nodes, cells, strict=True):
        for name, source in zip(PORTS, spec.sources, strict=True):
            if isinstance(source, int):
                net.connect(nodes[source].y, getattr(node, name))
    return net, nodes


@st.composite
def cell_specs(draw: st.DrawFn, index: int, count: int) -> CellSpec:
    """Node ``index`` of ``count``: its kind, trigger, delay, min_interval and input sources.

    An input may come from any node, itself included; one from a node at ``index`` or after
    (a backward edge) is in the trigger only when the node has a delay or a min_interval, so
    every cycle of the trigger graph has such a node and the net starts (trigger.cycle).
    Node 0 has a period, so that every net runs something.
    """
    kinds = ("periodic", "triggered", "both") if index else ("periodic", "both")  # one runs
    kind = draw(st.sampled_from(kinds))
    period = draw(st.sampled_from(PERIODS))
    choices: list[int | str | None] = [None, "host", *range(count)]
    sources = tuple(draw(st.sampled_from(choices)) for _ in PORTS)
    seed = draw(st.integers(0, 2**16))
    dedicated = draw(st.integers(0, 3)) == 3
    start = draw(st.integers(0, 3)) == 3
    periodic = CellSpec(period, (), False, None, 0.0, 0.0, sources, seed, dedicated, start)
    if kind == "periodic":
        return periodic
    delay = draw(st.sampled_from(DELAYS))
    min_interval = draw(st.sampled_from(MIN_INTERVALS))
    delayed = delay > 0 or min_interval > 0
    allowed = [
        name
        for name, source in zip(PORTS, sources, strict=True)
        if source == "host" or (isinstance(source, int) and (delayed or source < index))
    ]
    if not allowed:  # nothing may trigger it
        return periodic
    names = draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=len(allowed), unique=True))
    all_ = draw(st.booleans())
    timeout = draw(st.sampled_from((None, 0.01, 0.025))) if all_ else None
    return CellSpec(
        period if kind == "both" else None,
        tuple(names),
        all_,
        timeout,
        delay,
        min_interval,
        sources,
        seed,
        dedicated,
        start,
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """A random net and what the host does with it: 3 to 6 steps of writes and sleeps, the
    last sleep 0.03 s (so the run lasts 0.03 to 0.155 s)."""
    count = draw(st.integers(2, 8))
    cells = tuple(draw(cell_specs(i, count)) for i in range(count))
    fed = [
        (i, name)
        for i, spec in enumerate(cells)
        for name, source in zip(PORTS, spec.sources, strict=True)
        if source == "host"
    ]
    steps = []
    for _ in range(draw(st.integers(3, 6))):
        writes: tuple[Write, ...] = ()
        if fed:
            chosen = draw(st.lists(st.sampled_from(fed), max_size=3))
            writes = tuple(Write(i, name, draw(st.sampled_from((-1.0, 0.25, 2.0)))) for i, name in chosen)
        steps.append(Step(writes, draw(st.sampled_from(SLEEPS)), draw(st.integers(0, 3)) == 3))
    steps[-1] = Step(steps[-1].writes, 0.03)
    scenario = Scenario(cells, tuple(steps))
    describe(scenario)
    return scenario


def describe(scenario: Scenario) -> None:
    """What kinds of nets the examples cover (pytest --hypothesis-show-statistics)."""
    cells = scenario.cells
    event(f"triggered nodes: {sum(bool(spec.trigger) for spec in cells)} of {len(cells)}")
    for i, spec in enumerate(cells):
        if spec.trigger and spec.all:
            event("on_all with a timeout" if spec.timeout else "on_all")
        if spec.trigger and spec.period is not None:
            event("periodic and triggered")
        if spec.trigger and (spec.delay or spec.min_interval):
            event("delay or min_interval")
        named = [s for name, s in zip(PORTS, spec.sources, strict=True) if name in spec.trigger]
        if any(isinstance(s, int) and s >= i for s in named):
            event("triggered by a backward edge")
        if any(isinstance(s, int) and s < i for s in named):
            event("triggered by a node before it")
    if any(spec.start for spec in cells):
        event("sends in on_start")
    if any(spec.dedicated for spec in cells):
        event("a node on a thread of its own")
    if any(step.writes for step in scenario.steps):
        event("host writes")


def do(run: mujou.Run, nodes: Sequence[Cell], step: Step, *, sleep: bool = True) -> None:
    for write in step.writes:
        run.write(getattr(nodes[write.node], write.port), torch.tensor(write.value))
    if sleep:
        run.sleep(step.sleep)
        if step.take_state:
            run.state_dict()


# --------------------------------------------------------------------------------------------
# Comparing trees


def differences(a: object, b: object, where: str = "outcome") -> list[str]:
    """Where ``a`` and ``b`` differ, bit for bit: tensors by torch.equal (and dtype), floats
    by value (nan equal to nan), containers leaf by leaf."""
    if type(a) is not type(b):
        return [f"{where}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping)
        if list(a) != list(b):
            return [f"{where}: keys {list(a)} != {list(b)}"]
        return [d for key in a for d in differences(a[key], b[key], f"{where}[{key!r}]")]
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]")
        ]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def outcome(run: mujou.Run, nodes: Sequence[Cell]) -> dict[str, Any]:
    """What a run must give the same each time: the state tree, the records, the statistics."""
    stats = run.stats().nodes
    return {  # the records first: the first differences shown are the plainest
        "records": [list(node.record) for node in nodes],
        "tree": run.state_dict(),
        "updates": {name: stats[name].updates for name in stats},
        "coalesced": {name: dict(stats[name].coalesced) for name in stats},
        "time": run.time,
    }


def run_through(scenario: Scenario, workers: int) -> dict[str, Any]:
    net, nodes = build(scenario.cells)
    with hang_guard(HANG_GUARD), mujou.run(net, timer=mujou.VirtualTimer(), workers=workers) as run:
        for step in scenario.steps:
            do(run, nodes, step)
        return outcome(run, nodes)


# --------------------------------------------------------------------------------------------
# The model: the Triggers page, run by hand


Key = tuple[int, str]  # a port that holds messages: (node, "y") or a host-fed (node, input)


class Model:
    """The virtual timer of a Cell net as the spec says it runs, one tag at a time, in plain
    Python: periodic slots (sched.first-due, sched.fixed-rate), conditions (trigger.any,
    trigger.all, trigger.all-timeout), due times (trigger.due), tags (trigger.tags) and host
    writes (trigger.host). The Cells' arithmetic is ``cell_update``, so the model's records
    are the run's bit for bit when the engine keeps the rules."""

    def __init__(self, cells: Sequence[CellSpec]) -> None:
        self.cells = cells
        self.time = 0.0
        count = len(cells)
        self.generators = [torch.Generator().manual_seed(spec.seed) for spec in cells]
        self.acc = [torch.zeros(()) for _ in cells]
        self.records: list[list[float]] = [[] for _ in cells]
        self.replaced = [0] * count
        self.period = [math.inf if spec.period is None else spec.period for spec in cells]
        self.slot = [1] * count  # the next periodic update is due at slot * period
        self.due = [self.slot[i] * self.period[i] for i in range(count)]
        self.last = [0.0] * count  # the start of the previous update (of the run before it)
        self.updates = [0] * count
        self.latest: dict[Key, tuple[torch.Tensor, float, int]] = {}  # message, stamp, number
        self.seen = {(i, name): 0 for i in range(count) for name in PORTS}  # number last seen
        self.coalesced = {(i, name): 0 for i in range(count) for name in PORTS}
        started = [(i, "y") for i, spec in enumerate(cells) if spec.start]
        for key in started:  # on_start's messages: arrivals at the start time
            self.publish(key, torch.tensor(START), 0.0)
        self.arrivals(started, 0.0)

    def source(self, i: int, name: str) -> Key | None:
        source = self.cells[i].sources[PORTS.index(name)]
        if source == "host":
            return (i, name)
        return (source, "y") if isinstance(source, int) else None

    def fresh(self, i: int, name: str) -> bool:
        key = self.source(i, name)
        latest = None if key is None else self.latest.get(key)
        return latest is not None and latest[2] != self.seen[i, name]

    def publish(self, key: Key, message: torch.Tensor, stamp: float) -> None:
        number = self.latest[key][2] + 1 if key in self.latest else 1
        self.latest[key] = (message, stamp, number)

    def arrivals(self, keys: Sequence[Key], now: float) -> None:
        """Messages became visible on ``keys`` at ``now``: wake the nodes they trigger."""
        for j, spec in enumerate(self.cells):
            if not any(self.source(j, name) in keys for name in spec.trigger):
                continue
            fresh = [self.fresh(j, name) for name in spec.trigger]
            if spec.all and all(fresh):
                at = now
            elif spec.all and any(fresh):
                at = now + (math.inf if spec.timeout is None else spec.timeout)
            elif not spec.all and any(fresh):
                at = now
            else:
                continue
            due = at + spec.delay
            if self.last[j] + spec.min_interval > due:  # last: the run's start before a first update
                due = self.last[j] + spec.min_interval
            if due < self.due[j]:  # an earlier due time stands
                self.due[j] = due

    def write(self, i: int, name: str, value: torch.Tensor) -> None:
        self.publish((i, name), value, self.time)
        self.arrivals([(i, name)], self.time)

    def sleep(self, seconds: float) -> None:
        until = self.time + seconds
        while True:
            due = min(self.due)
            if due > until:
                break
            self.time = max(self.time, due)  # a later time, or the next microstep at this one
            self.tag([i for i, d in enumerate(self.due) if d <= self.time])
        self.time = until

    def tag(self, nodes: Sequence[int]) -> None:
        """Run ``nodes`` at one tag: each reads what the earlier tags sent; then the tag's
        messages become visible, and wake their triggered readers."""
        start, staged = self.time, []
        for i in nodes:
            periodic = self.slot[i] * self.period[i]
            if not (self.due[i] < periodic and start < periodic):  # a periodic update
                self.slot[i] += 1
            self.due[i] = self.slot[i] * self.period[i]
            dt, self.last[i] = start - self.last[i], start
            self.updates[i] += 1
            reads: list[Read] = []
            for name in PORTS:
                key = self.source(i, name)
                latest = None if key is None else self.latest.get(key)
                number = 0 if latest is None else latest[2]
                self.coalesced[i, name] += max(number - self.seen[i, name] - 1, 0)
                reads.append(
                    (None, False, None) if latest is None else (latest[0], self.fresh(i, name), latest[1])
                )
                self.seen[i, name] = number
            row, self.acc[i], sends, replaced = cell_update(self.acc[i], reads, dt, self.generators[i])
            self.records[i] += row
            self.replaced[i] += replaced
            staged += [((i, "y"), message) for message in sends]
        for key, message in staged:
            self.publish(key, message, start)
        self.arrivals([key for key, _ in staged], start)


# --------------------------------------------------------------------------------------------
# trigger.workers-identical


@pytest.mark.rule("trigger.workers-identical", "ports.read-latest")
@PROPERTIES
@given(scenarios())
def test_any_net_gives_the_same_results_with_any_number_of_workers(scenario: Scenario) -> None:
    """> Under the virtual timer a net with triggered nodes is deterministic as
    > sched.virtual-deterministic says: the tags, the state tree, what every read, fresh and
    > stamp return, and the updates and coalesced statistics are the same, bit for bit,
    > whatever the number of workers.

    And, on the way, ports.read-latest: an update never reads a message its source replaced
    by a later send in the same update."""
    one = run_through(scenario, 1)
    assert any(one["records"]), "no node ran: the property would hold for nothing"
    assert not any(node["replaced_read"] for node in one["tree"].values() if "replaced_read" in node), (
        "an update read a message that its sender had replaced in the same update (ports.read-latest)"
    )
    for workers in (2, 4):
        other = run_through(scenario, workers)
        assert not differences(one, other), (workers, differences(one, other)[:5])


# --------------------------------------------------------------------------------------------
# The rules of the Triggers page, against the model


@pytest.mark.rule(
    "trigger.tags",
    "trigger.due",
    "trigger.any",
    "trigger.all",
    "trigger.all-timeout",
    "trigger.delay",
    "trigger.min-interval",
    "trigger.periodic-and-triggered",
    "trigger.coalesce",
    "trigger.coalesced-stats",
    "trigger.host",
)
@PROPERTIES
@given(scenarios())
def test_any_net_runs_as_the_triggers_page_says(scenario: Scenario) -> None:
    """> Under the virtual timer every update runs at a tag (t, m) ... An arrival at tag
    > (t, m) that makes a node due at time d wakes it at (t, m + 1) when d == t (no delay and
    > no min_interval bound), and at (d, 0) when d > t. An update at a tag sees exactly the
    > messages of the earlier tags (and the host's writes made before it) ...

    > When the condition comes to hold at timer time s ..., the node becomes due at
    > max(s + delay, last + min_interval) ... When the node already has an earlier due time
    > (its next periodic slot, or an earlier trigger not yet run), that one stands.

    The run's records (each update's dt and what it read, fresh and stamp included), its
    updates and coalesced counts, are those of ``Model``, which follows these rules and those
    of trigger.any, trigger.all (and its timeout), trigger.periodic-and-triggered,
    trigger.coalesce and trigger.host, one tag at a time."""
    ran = run_through(scenario, 2)
    model = Model(scenario.cells)
    for step in scenario.steps:
        for write in step.writes:
            model.write(write.node, write.port, torch.tensor(write.value))
        model.sleep(step.sleep)
    names = [f"n{i}" for i in range(len(scenario.cells))]
    expected = {
        "records": model.records,
        "updates": dict(zip(names, model.updates, strict=True)),
        "coalesced": {
            name: {port: model.coalesced[i, port] for port in PORTS} for i, name in enumerate(names)
        },
        "time": model.time,
    }
    got = {key: ran[key] for key in expected}
    assert not differences(expected, got), differences(expected, got)[:5]


# --------------------------------------------------------------------------------------------
# trigger.state


@pytest.mark.rule("trigger.state")
@PROPERTIES
@given(scenarios(), st.booleans())
def test_any_net_resumed_from_its_state_continues_bit_for_bit(scenario: Scenario, after_writes: bool) -> None:
    """> The "@mujou" entry of the state tree holds, for each node, its pending triggered
    > update (its due time, or none) and the fresh flag of each input; a run resumed with
    > state= restores them, so that under the virtual timer it continues bit for bit as the
    > run that went on, triggered updates included.

    The tree is taken half-way, after a step or (``after_writes``) after the next step's
    writes and before its sleep: a node those writes woke is pending at run.time then.
    """
    went_on = run_through(scenario, 2)
    half = len(scenario.steps) // 2
    net, nodes = build(scenario.cells)
    with hang_guard(HANG_GUARD), mujou.run(net, timer=mujou.VirtualTimer(), workers=2) as run:
        for step in scenario.steps[:half]:
            do(run, nodes, step)
        if after_writes:
            do(run, nodes, scenario.steps[half], sleep=False)
        tree = run.state_dict()
    again, resumed = build(scenario.cells)
    with hang_guard(HANG_GUARD), mujou.run(again, timer=mujou.VirtualTimer(), workers=2, state=tree) as run:
        for i, step in enumerate(scenario.steps[half:]):
            do(run, resumed, Step((), step.sleep, step.take_state) if i == 0 and after_writes else step)
        back = outcome(run, resumed)
    # Statistics count from each run's start: the resumed run's are its own.
    for key in ("updates", "coalesced"):
        del went_on[key], back[key]
    assert not differences(went_on, back), differences(went_on, back)[:5]


class Echo(Node):
    """Triggered by ``x``, at most once per 0.01 s; records the start of each update."""

    x = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), min_interval=0.01, seed=0)
        self.starts: list[float] = []
        self.clock = 0.0

    def on_update(self, dt: float) -> None:
        self.clock += dt
        self.starts.append(self.clock)


@pytest.mark.rule("trigger.state", "trigger.min-interval")
def test_a_resumed_run_keeps_the_bound_of_the_previous_update() -> None:
    """> a run resumed with state= restores them, so that under the virtual timer it continues
    > bit for bit as the run that went on, triggered updates included.

    The shrunk example of the trigger.state property above (it found that a resumed run lost
    the bound of an update at 0.0, before min_interval counted from the run's start): the
    update at 0.01 bounds the next one to 0.02 (trigger.min-interval), in the resumed run too."""
    echo, resumed = Echo(), Echo()
    with hang_guard(HANG_GUARD), mujou.run(Bag(echo=echo), timer=mujou.VirtualTimer()) as run:
        run.write(echo.x, torch.tensor(1.0))
        run.sleep(0.01)  # due at max(0.0, the run's start + 0.01): the echo runs at 0.01
        tree = run.state_dict()
        run.write(echo.x, torch.tensor(2.0))  # due at max(0.01, 0.01 + 0.01)
        run.sleep(0.03)
    with (
        hang_guard(HANG_GUARD),
        mujou.run(Bag(echo=resumed), timer=mujou.VirtualTimer(), state=tree) as run,
    ):
        run.write(resumed.x, torch.tensor(2.0))
        run.sleep(0.03)
    assert echo.starts == [0.01, 0.02]
    assert resumed.starts == echo.starts  # its record and clock are in its state


# --------------------------------------------------------------------------------------------
# threads.hooks-exclusive, under the real-time timer


def hold() -> None:
    """A hook's work with the GIL released, as a hook that waits on I/O or a device: a window
    in which a second hook of the node would run, were the engine to start one."""
    time.sleep(0.0002)


def next_slot(start: float, slot: int, period: float | None) -> int | None:
    """The number of the node's next periodic slot after an update that started at ``start``
    (its running sum of ``dt``) with ``slot`` next, or None when that update took no slot: it
    started before the slot's due time ``slot * period`` (sched.fixed-rate), so a trigger
    made it (trigger.periodic-and-triggered). Past slots are skipped (sched.skip).

    The running sum of ``dt`` is the start up to rounding (about 1e-16 here): within
    ``SLOT_SLACK`` of a slot's due time an update counts as periodic, which only leaves it
    unchecked."""
    if period is None or start < slot * period - SLOT_SLACK:
        return None
    following = slot + 1
    while following * period < start - SLOT_SLACK:
        following += 1
    return following


SLOT_SLACK = 1e-12


class Guarded(Node):
    """Checks in each hook, with a lock it tries without blocking, that no other hook of
    this node runs meanwhile; counts its updates and sends the count.

    Checks also that each update that took no periodic slot (a triggered one) saw an arrival
    on its trigger's inputs (trigger.coalesce: arrivals before an update make that one update,
    never a second one that sees nothing fresh; trigger.any, trigger.all, trigger.all-timeout)
    and started ``min_interval`` or more after the previous one by its own ``dt``
    (trigger.min-interval). Neither depends on how the machine schedules the threads."""

    a = Input(optional=True)
    b = Input(optional=True)
    y = Output()
    state_exclude: ClassVar[tuple[str, ...]] = ("violations", "inside", "updated", "spec")

    def __init__(self, spec: CellSpec) -> None:
        super().__init__(**spec.node_arguments())
        self.inside = threading.Lock()
        self.violations: list[str] = []
        self.count = 0
        self.updated = threading.Event()
        self.spec = spec
        self.t = 0.0  # the start of the update running, by the running sum of dt
        self.slot = 1  # the number of the next periodic slot

    def _check_trigger(self, dt: float) -> None:
        spec = self.spec
        self.t += dt
        slot = next_slot(self.t, self.slot, spec.period)
        if slot is not None:
            self.slot = slot
            return
        fresh = [getattr(self, name).fresh for name in spec.trigger]
        needed = all(fresh) if spec.all and spec.timeout is None else any(fresh)
        if not needed:
            self.violations.append(
                f"a triggered update at {self.t} saw {dict(zip(spec.trigger, fresh, strict=True))}"
            )
        if dt < spec.min_interval - 1e-9:
            self.violations.append(f"a triggered update at {self.t} came {dt} after the previous")

    def _enter(self, hook: str) -> bool:
        if self.inside.acquire(blocking=False):
            return True
        self.violations.append(hook)
        return False

    def _work(self, hook: str) -> None:
        entered = self._enter(hook)
        try:
            hold()
        finally:
            if entered:
                self.inside.release()

    def on_start(self) -> None:
        self._work("on_start")

    def on_update(self, dt: float) -> None:
        entered = self._enter("on_update")
        try:
            self._check_trigger(dt)
            self.a.read()
            self.b.read()
            self.count += 1
            hold()
            self.y.send(torch.tensor(float(self.count)))
        finally:
            if entered:
                self.inside.release()

    def state_dict(self) -> dict[str, Any]:
        self._work("state_dict")
        return super().state_dict()

    def on_stop(self) -> None:
        self._work("on_stop")


@st.composite
def real_time_nets(draw: st.DrawFn) -> tuple[CellSpec, ...]:
    """2 to 6 nodes, some on threads of their own; node 0 periodic, each other one periodic or
    (mostly) triggered by an input from a node before it, so that each triggered node's
    sources send. Periods of 1 to 3 ms: many updates in a short run."""
    count = draw(st.integers(2, 6))
    cells = [CellSpec(0.001, (), False, None, 0.0, 0.0, (None, None), 0, draw(st.booleans()))]
    for index in range(1, count):
        forward = draw(st.integers(0, index - 1))
        back = draw(st.sampled_from([None, *range(count)]))
        period = draw(st.sampled_from((0.001, 0.002, 0.003)))
        dedicated = draw(st.integers(0, 3)) == 3
        if draw(st.integers(0, 3)) == 3:  # periodic only
            cells.append(CellSpec(period, (), False, None, 0.0, 0.0, (forward, back), index, dedicated))
            continue
        both = draw(st.booleans())
        all_ = draw(st.booleans())
        delay = draw(st.sampled_from((0.0, 0.001)))
        min_interval = draw(st.sampled_from((0.0, 0.001)))
        # A backward edge may trigger too, when a delay or min_interval breaks the cycle it
        # may close and any input is enough (on_all would wait for a node that waits for it).
        names = ("a", "b") if back is not None and (delay or min_interval) and not all_ else ("a",)
        timeout = 0.002 if all_ and draw(st.booleans()) else None
        cells.append(
            CellSpec(
                period if both else None,
                names,
                all_,
                timeout,
                delay,
                min_interval,
                (forward, back),
                index,
                dedicated,
            )
        )
    return tuple(cells)


def exceeds(seen: torch.Tensor, count: torch.Tensor) -> bool:
    return bool(count > seen)


@pytest.mark.rule("threads.hooks-exclusive", "trigger.coalesce", "trigger.min-interval")
@pytest.mark.parametrize("workers", [1, 2])
@settings(PROPERTIES, max_examples=10)
@given(cells=real_time_nets())
def test_the_hooks_of_a_triggered_node_never_overlap(workers: int, cells: tuple[CellSpec, ...]) -> None:
    """> The hooks of a node never run at the same time, and each sees what the previous one
    > wrote. Which worker runs a node may change from one hook to the next.

    Under the real-time timer with 1 and 2 workers, where a send wakes its triggered readers
    at once (trigger.real-time) while their previous update may still run, hands them off to
    the sending worker, or finds them in a kept batch, and the host takes the state in
    between. And each triggered update saw an arrival and kept its ``min_interval``
    (``Guarded``): the arrivals before an update make that one update, never a second one
    after it (trigger.coalesce)."""
    nodes = [Guarded(spec) for spec in cells]
    net = Bag(**{f"n{i}": node for i, node in enumerate(nodes)})
    for node, spec in zip(nodes, cells, strict=True):
        for name, source in zip(("a", "b"), spec.sources, strict=True):
            if isinstance(source, int):
                net.connect(nodes[source].y, getattr(node, name))
    with hang_guard(HANG_GUARD), mujou.run(net, timer=mujou.RealTimeTimer(), workers=workers) as run:
        for node in nodes:  # each node ran a few times, a triggered one on its source's sends
            run.wait_for(node.y, lambda count: bool(count >= 3), timeout=HANG_GUARD / 2)
        run.state_dict()
        for node in nodes:  # and go on after it
            seen = run.read(node.y)
            assert seen is not None
            run.wait_for(node.y, partial(exceeds, seen), timeout=HANG_GUARD / 2)
    assert [node.violations for node in nodes] == [[] for _ in nodes]
