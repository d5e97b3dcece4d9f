"""Conformance tests for the page "Observing a run" (spec/en/observing.md).

Rules: ``observe.*`` (run.stats() and its values, the workers' busy fractions, the trace file,
the profiler ranges, ``python -m mujou info`` and the progress line).

No test asserts on wall-clock durations. Under ``mujou.VirtualTimer()`` the statistics of timer
time are exact and compared with ``==``. Under the real-time timer the tests compare the
statistics with what the run itself recorded (the ``dt`` each update received, the lateness in
the trace), and real-time output (the progress line) is checked causally: the host waits, under
a hang guard that is never an assertion, until the line has appeared.

The trace file is checked against the Chrome trace event format by a small checker written from
the format's description (:func:`check_chrome_trace`), not by the implementation's own code.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import os
import platform
import re
import select
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import checkout_environ
from torch.profiler import ProfilerActivity, profile

import mujou
from mujou import Net, Node, Output

# A guard against a hang (a bug), never a timing assertion.
HANG = 30.0
# The hooks every node of these tests has.
HOOKS = ("on_start", "on_update", "on_stop")


def wait_event(event: threading.Event, what: str) -> None:
    """Wait for ``event``; fail the test (instead of hanging) if it never comes."""
    assert event.wait(HANG), f"hang guard: {what} did not happen within {HANG} s"


def sleep_until(run: mujou.Run, t: float, step: float) -> None:
    """Let the run's (real-time) timer reach ``t``, in small run.sleep steps."""
    guard = time.monotonic() + HANG
    while run.time < t:
        assert time.monotonic() < guard, f"hang guard: run.time stuck at {run.time} < {t}"
        run.sleep(step)


def due_times(period: float, count: int) -> list[float]:
    """The due times of a node's first ``count`` updates: k × period (sched.first-due)."""
    return [k * period for k in range(1, count + 1)]


def updates_by(period: float, t: float) -> int:
    """How many updates of a node are due at or before timer time ``t`` (k × period <= t)."""
    return sum(1 for k in range(1, math.floor(t / period) + 3) if k * period <= t)


def due_differences(period: float, count: int) -> list[float]:
    """The exact differences of consecutive due times (the first from the timer's start, 0)."""
    dues = [0.0, *due_times(period, count)]
    return [b - a for a, b in itertools.pairwise(dues)]


# --- nodes ----------------------------------------------------------------------------------


class Calls:
    """Every hook call of the nodes of one test, by (node, hook); safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def add(self, node: str, hook: str) -> None:
        with self._lock:
            self.counts[(node, hook)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


class Probe(Node):
    """Sends a little computation each update; records its hook calls and its dt's.

    ``fail_in`` names a hook that raises on its ``fail_at``-th call (after being recorded).
    """

    out = Output()

    def __init__(
        self,
        period: float,
        calls: Calls,
        *,
        dedicated_thread: bool = False,
        fail_in: str | None = None,
        fail_at: int = 1,
    ) -> None:
        super().__init__(period=period, seed=0, dedicated_thread=dedicated_thread)
        self.calls = calls
        self.fail_in = fail_in
        self.fail_at = fail_at
        self.dts: list[float] = []
        self.x = torch.zeros(8)

    def _called(self, hook: str) -> None:
        self.calls.add(self.name, hook)
        if hook == self.fail_in and self.calls.snapshot()[(self.name, hook)] == self.fail_at:
            raise ValueError(f"{self.name} fails in {hook}")

    def on_start(self) -> None:
        self._called("on_start")

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        self.x = torch.tanh(self.x + torch.randn(8, generator=self.generator))
        self.out.send(self.x)
        self._called("on_update")

    def on_stop(self) -> None:
        self._called("on_stop")


class Inner(Net):
    def __init__(self, calls: Calls) -> None:
        super().__init__()
        self.x = Probe(1 / 64, calls)
        self.y = Probe(0.01, calls)


class Mixed(Net):
    """Probe nodes (one in a sub-net) and a dedicated node, registered in a known order."""

    ORDER = ("b", "inner.x", "inner.y", "dedicated", "a")

    def __init__(self, calls: Calls) -> None:
        super().__init__()
        self.b = Probe(3 / 128, calls)
        self.inner = Inner(calls)
        self.dedicated = Probe(0.1, calls, dedicated_thread=True)
        self.a = Probe(0.25, calls)


def worker_nodes(net: Net) -> dict[str, Probe]:
    """The nodes of ``net`` by name (all of them are Workers in these tests)."""
    found = {node.name: node for node in net.nodes()}
    nodes = {name: node for name, node in found.items() if isinstance(node, Probe)}
    assert list(nodes) == list(found), found
    return nodes


class Single(Net):
    def __init__(self, node: Node) -> None:
        super().__init__()
        self.node = node


# --- the Chrome trace event format ------------------------------------------------------------


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass
class Trace:
    """A checked trace: its complete events, and the name of each (pid, tid) track."""

    slices: list[dict[str, Any]]
    tracks: dict[tuple[object, object], str]

    def track(self, event: Mapping[str, Any]) -> str:
        return self.tracks[(event["pid"], event["tid"])]

    def of(self, node: str, hook: str) -> list[dict[str, Any]]:
        return [e for e in self.slices if e["name"] == node and e["cat"] == hook]


def check_chrome_trace(path: Path) -> Trace:
    """Load ``path`` and check it against the Chrome trace event format (JSON object form).

    The object has a ``traceEvents`` list. Every event has a ``ph`` (phase) and ``pid``/``tid``.
    A complete event (``"X"``) has a ``name`` and ``cat`` (strings), and ``ts`` and ``dur``
    (microseconds, numbers >= 0). A metadata event (``"M"``) named ``thread_name`` has
    ``args.name``. Every track that holds a complete event is named by a ``thread_name`` event,
    once.
    """
    with path.open(encoding="utf-8") as file:
        document = json.load(file)
    assert isinstance(document, dict), f"a trace is a JSON object, got {type(document).__name__}"
    events = document.get("traceEvents")
    assert isinstance(events, list), f"traceEvents must be a list, got {events!r:.200}"
    slices: list[dict[str, Any]] = []
    tracks: dict[tuple[object, object], str] = {}
    for index, event in enumerate(events):
        where = f"traceEvents[{index}] = {event!r:.300}"
        assert isinstance(event, dict), where
        assert isinstance(event.get("ph"), str), f"{where}: no phase 'ph'"
        for key in ("pid", "tid"):
            assert isinstance(event.get(key), (int, str)) and not isinstance(event.get(key), bool), (
                f"{where}: {key} must be a number or a string"
            )
        if event["ph"] == "X":
            for key in ("name", "cat"):
                assert isinstance(event.get(key), str) and event[key], f"{where}: {key} must be a string"
            for key in ("ts", "dur"):
                assert _number(event.get(key)) and event[key] >= 0, f"{where}: {key} must be a number >= 0"
            if "args" in event:
                assert isinstance(event["args"], dict), f"{where}: args must be an object"
            slices.append(event)
        elif event["ph"] == "M":
            assert isinstance(event.get("name"), str), f"{where}: a metadata event has a name"
            args = event.get("args")
            assert isinstance(args, dict), f"{where}: a metadata event has args"
            if event["name"] == "thread_name":
                assert isinstance(args.get("name"), str) and args["name"], f"{where}: args.name"
                track = (event["pid"], event["tid"])
                assert track not in tracks, f"{where}: track {track} named twice"
                tracks[track] = args["name"]
    unnamed = {(e["pid"], e["tid"]) for e in slices} - set(tracks)
    assert not unnamed, f"tracks without a thread_name event: {sorted(map(str, unnamed))}"
    return Trace(slices, tracks)


def assert_one_slice_per_hook_call(trace: Trace, calls: Mapping[tuple[str, str], int]) -> None:
    """The trace has exactly one complete event per hook call the nodes recorded."""
    counted = collections.Counter((e["name"], e["cat"]) for e in trace.slices if e["cat"] in HOOKS)
    assert dict(counted) == dict(calls), (
        f"slices per (node, hook) {sorted(counted.items())} != hook calls {sorted(calls.items())}"
    )


def assert_no_overlap(slices: list[dict[str, Any]], what: str) -> None:
    """Slices that one thread (or one node) ran one after the other do not overlap.

    The tolerance (1 µs) absorbs rounding ``ts`` and ``dur`` separately.
    """
    ordered = sorted(slices, key=lambda e: (e["ts"], e["dur"]))
    for first, second in itertools.pairwise(ordered):
        assert first["ts"] + first["dur"] <= second["ts"] + 1.0, f"{what}: {first} overlaps {second}"


# --- observe.stats --------------------------------------------------------------------------

NODE_FIELDS = {
    "updates": int,
    "skipped": int,
    "busy": float,
    "dt_min": float,
    "dt_mean": float,
    "dt_max": float,
    "lateness_p50": float,
    "lateness_p99": float,
    "lateness_max": float,
}


def assert_stats_shape(stats: mujou.RunStats, workers: int, names: tuple[str, ...]) -> None:
    assert isinstance(stats, mujou.RunStats), type(stats)
    assert dataclasses.is_dataclass(stats)
    run_fields = {f.name for f in dataclasses.fields(stats)}
    assert {"time", "workers", "nodes", "worker_busy"} <= run_fields, run_fields
    assert type(stats.time) is float, stats.time
    assert type(stats.workers) is int and stats.workers == workers, stats.workers
    assert isinstance(stats.nodes, Mapping), type(stats.nodes)
    assert tuple(stats.nodes) == names, f"nodes not in registration order: {list(stats.nodes)}"
    assert type(stats.worker_busy) is tuple and len(stats.worker_busy) == workers, stats.worker_busy
    assert all(type(b) is float for b in stats.worker_busy), stats.worker_busy
    for name, node in stats.nodes.items():
        assert isinstance(node, mujou.NodeStats), (name, type(node))
        fields = {f.name for f in dataclasses.fields(node)}
        assert set(NODE_FIELDS) <= fields, (name, fields)
        for field, kind in NODE_FIELDS.items():
            value = getattr(node, field)
            assert type(value) is kind, f"{name}.{field} = {value!r} is not a {kind.__name__}"


@pytest.mark.rule("observe.stats")
def test_stats_fields_types_and_order_during_and_after_the_run() -> None:
    """> run.stats() returns a frozen RunStats with time (the timer time when it was taken),
    workers (the number of worker threads), nodes (a mapping from node name to the node's
    NodeStats, in registration order) and worker_busy (a tuple with one entry per worker). A
    NodeStats holds updates and skipped (int), busy, dt_min, dt_mean and dt_max, and
    lateness_p50, lateness_p99 and lateness_max. run.stats() works during the run and after it
    ended."""
    calls = Calls()
    net = Mixed(calls)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        during = run.stats()
        assert during.time == run.time == 0.5
        run.sleep(0.5)
    after = run.stats()
    again = run.stats()
    for stats in (during, after):
        assert_stats_shape(stats, 2, Mixed.ORDER)
    assert after.time == run.time == 1.0
    assert again.time == after.time and again.nodes == after.nodes
    nodes = worker_nodes(net)
    for name, node in nodes.items():
        assert node.period is not None
        assert after.nodes[name].updates == len(node.dts), (name, after.nodes[name], len(node.dts))
        assert during.nodes[name].updates == updates_by(node.period, 0.5), (name, during)
        assert after.nodes[name].skipped == 0
        assert after.nodes[name].busy > 0.0, (name, after.nodes[name])
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.time = 2.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.nodes["a"].updates = 0  # type: ignore[misc]


@pytest.mark.rule("observe.stats")
def test_stats_work_after_a_failed_hook() -> None:
    """> run.stats() works during the run and after it ended (here: ended by a failed hook)."""
    calls = Calls()
    net = Single(Probe(0.125, calls, fail_in="on_update", fail_at=3))
    with pytest.raises(mujou.HookError), mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(2.0)
    stats = run.stats()
    assert_stats_shape(stats, 1, ("node",))
    assert stats.nodes["node"].updates == 3, stats
    assert stats.nodes["node"].dt_max == 0.125, stats


# --- observe.stats-values -------------------------------------------------------------------


class Periods(Net):
    """Nodes whose periods are not binary fractions, so due times differ from sums of periods."""

    def __init__(self, calls: Calls) -> None:
        super().__init__()
        self.p1 = Probe(0.01, calls)
        self.p2 = Probe(0.1, calls)
        self.p3 = Probe(1 / 30, calls)
        self.p4 = Probe(3 / 128, calls)


@pytest.mark.rule("observe.stats-values")
@pytest.mark.parametrize("workers", [1, 3])
def test_virtual_dt_is_the_exact_difference_of_due_times(workers: int) -> None:
    """> The dt statistics are over every update of the run [...] Under the virtual timer every
    lateness is 0.0 and each dt is the exact difference of due times."""
    calls = Calls()
    net = Periods(calls)
    with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        stats = run.stats()
    for name, node in worker_nodes(net).items():
        assert node.period is not None
        count = updates_by(node.period, 1.0)
        expected = due_differences(node.period, count)
        s = stats.nodes[name]
        assert node.dts == expected, f"{name}: dt's {node.dts} != differences of due times {expected}"
        assert s.updates == count, (name, s)
        assert (s.dt_min, s.dt_max) == (min(expected), max(expected)), (name, s, expected)
        assert s.dt_mean == pytest.approx(math.fsum(expected) / count, rel=1e-12, abs=0.0), (name, s)
        assert (s.lateness_p50, s.lateness_p99, s.lateness_max) == (0.0, 0.0, 0.0), (name, s)
        assert s.skipped == 0


@pytest.mark.rule("observe.stats-values")
def test_virtual_lateness_is_zero_past_the_window() -> None:
    """> lateness_p50 and lateness_p99 are over the node's last 1024 updates, and lateness_max
    over all its updates [...] Under the virtual timer every lateness is 0.0."""
    calls = Calls()
    net = Single(Probe(1 / 1024, calls))
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(2.5)
        stats = run.stats().nodes["node"]
    assert stats.updates == 2560
    assert (stats.lateness_p50, stats.lateness_p99, stats.lateness_max) == (0.0, 0.0, 0.0), stats
    assert stats.dt_min == stats.dt_mean == stats.dt_max == 1 / 1024, stats


class SlowAndFast(Net):
    def __init__(self, calls: Calls) -> None:
        super().__init__()
        self.fast = Probe(0.125, calls)
        self.slow = Probe(1.0, calls)


def assert_zero_before_first_update(node: mujou.NodeStats, what: str) -> None:
    values = (node.dt_min, node.dt_mean, node.dt_max, node.lateness_p50, node.lateness_p99, node.lateness_max)
    assert node.updates == 0, f"{what}: {node}"
    assert values == (0.0,) * 6, f"{what}: dt and lateness statistics before the first update: {node}"


@pytest.mark.rule("observe.stats-values")
def test_statistics_are_zero_before_the_first_update() -> None:
    """> Before a node's first update, its dt and lateness statistics are 0.0."""
    calls = Calls()
    net = SlowAndFast(calls)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        for name, node in run.stats().nodes.items():
            assert_zero_before_first_update(node, f"{name} at t=0")
        run.sleep(0.5)
        stats = run.stats()
        assert_zero_before_first_update(stats.nodes["slow"], "slow at t=0.5")
        assert stats.nodes["fast"].dt_min == 0.125, stats
        run.sleep(0.5)  # t = 1.0: the slow node's first update has run
        slow = run.stats().nodes["slow"]
    assert (slow.updates, slow.dt_min, slow.dt_mean, slow.dt_max) == (1, 1.0, 1.0, 1.0), slow


@pytest.mark.rule("observe.stats-values")
def test_statistics_are_zero_before_the_first_update_real_time() -> None:
    """> Before a node's first update, its dt and lateness statistics are 0.0 (under the
    real-time timer too: this node is due after 1000 s)."""
    calls = Calls()
    net = Single(Probe(1000.0, calls))
    with mujou.run(net, workers=1) as run:
        run.sleep(0.02)
        assert_zero_before_first_update(run.stats().nodes["node"], "during the run")
    assert_zero_before_first_update(run.stats().nodes["node"], "after the run")


class Hog(Node):
    """Holds its worker: each of its first ``blocking`` updates sleeps ``hold`` real seconds."""

    def __init__(self, period: float, blocking: int, hold: float) -> None:
        super().__init__(period=period, seed=0)
        self.blocking = blocking
        self.hold = hold
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if self.updates <= self.blocking:
            time.sleep(self.hold)  # lateness for the victim; its size is never asserted


class Victim(Node):
    """Records the dt of each of its updates; signals when it has ``wanted`` of them."""

    def __init__(self, period: float, wanted: int) -> None:
        super().__init__(period=period, seed=0)
        self.wanted = wanted
        self.dts: list[float] = []
        self.done = threading.Event()

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        if len(self.dts) >= self.wanted:
            self.done.set()


class HogNet(Net):
    def __init__(self, period: float, wanted: int) -> None:
        super().__init__()
        self.hog = Hog(4 * period, blocking=20, hold=0.004)
        self.victim = Victim(period, wanted)


def assert_percentile(reported: float, values: list[float], q: float, what: str) -> None:
    """``reported`` is a ``q`` quantile of ``values``, whatever the percentile definition.

    At least a fraction q - 0.5 % of the values are <= it, and at most q + 0.5 % are < it.
    """
    n = len(values)
    at_most = sum(1 for v in values if v <= reported) / n
    below = sum(1 for v in values if v < reported) / n
    ordered = sorted(values)
    context = (
        f"{what}: {reported!r} with {n} values, around the rank: {ordered[int(q * n) - 3 : int(q * n) + 3]}"
    )
    assert at_most >= q - 0.005, context
    assert below <= q + 0.005, context


@pytest.mark.rule("observe.stats-values")
def test_real_time_statistics_match_what_the_run_recorded(tmp_path: Path) -> None:
    """> The dt statistics are over every update of the run; lateness_p50 and lateness_p99 are
    over the node's last 1024 updates, and lateness_max over all its updates.

    One worker; a hog holds it in its first 20 updates, so that the victim's early updates are
    late. The statistics are compared with the dt's the victim received and with the lateness
    of each update in the trace (observe.trace), not with any expected duration."""
    period = 0.004  # timer seconds; 1 ms of real time at scale 4
    net = HogNet(period, wanted=1300)
    path = tmp_path / "t.json"
    with mujou.run(net, workers=1, timer=mujou.RealTimeTimer(scale=4.0), trace=path) as run:
        wait_event(net.victim.done, "1300 victim updates")
    stats = run.stats().nodes["victim"]
    dts = list(net.victim.dts)
    assert stats.updates == len(dts) >= 1300, (stats, len(dts))
    assert (stats.dt_min, stats.dt_max) == (min(dts), max(dts)), (stats, min(dts), max(dts))
    assert stats.dt_mean == pytest.approx(math.fsum(dts) / len(dts), rel=1e-9), stats

    updates = sorted(check_chrome_trace(path).of("victim", "on_update"), key=lambda e: e["args"]["t"])
    assert [e["args"]["dt"] for e in updates] == dts, "the trace's dt's differ from those the node received"
    lateness = [float(e["args"]["lateness"]) for e in updates]
    assert min(lateness) >= 0.0, min(lateness)
    assert stats.lateness_max == pytest.approx(max(lateness), rel=1e-9, abs=1e-12), (stats, max(lateness))
    window = lateness[-1024:]
    assert_percentile(stats.lateness_p50, window, 0.50, "lateness_p50 over the last 1024 updates")
    assert_percentile(stats.lateness_p99, window, 0.99, "lateness_p99 over the last 1024 updates")
    assert stats.lateness_p50 <= stats.lateness_p99 <= stats.lateness_max, stats


# --- observe.worker-busy --------------------------------------------------------------------


@pytest.mark.rule("observe.worker-busy")
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_worker_busy_one_fraction_per_worker(workers: int) -> None:
    """> Each entry of worker_busy is a fraction in [0, 1]: the real time the worker spent in
    hooks, divided by the real time since the timer started."""
    calls = Calls()
    net = Mixed(calls)  # its dedicated node counts in no entry
    with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        during = run.stats().worker_busy
    after = run.stats().worker_busy
    for busy in (during, after):
        assert len(busy) == workers, busy
        assert all(type(b) is float for b in busy), busy
    assert sum(after) > 0.0, f"no worker was ever busy: {after}"


class Holder(Node):
    """Its first update holds its worker until the host releases it."""

    def __init__(self) -> None:
        super().__init__(period=0.05, seed=0)
        self.started = threading.Event()
        self.release = threading.Event()
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
        if len(self.dts) == 1:
            self.started.set()
            self.release.wait(HANG)


class HolderNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.holder = Holder()
        self.victim = Victim(0.01, wanted=1 << 30)


@pytest.mark.rule("observe.worker-busy")
def test_worker_busy_counts_a_long_hook() -> None:
    """> [...] the real time the worker spent in hooks, divided by the real time since the timer
    started.

    The only worker is held in one hook from its start (at timer time s) until the host has seen
    the timer at 0.5; the timer runs at real speed, so the worker was busy at least 0.5 - s of the
    T seconds since the timer started (T: the stats' time). The 10 % margin absorbs only the
    two clocks being read at slightly different instants."""
    net = HolderNet()
    with mujou.run(net, workers=1) as run:
        try:
            wait_event(net.holder.started, "the holder's first update")
            sleep_until(run, 0.5, 0.01)
        finally:
            net.holder.release.set()
        seen = len(net.victim.dts)
        guard = time.monotonic() + HANG
        while len(net.victim.dts) <= seen:  # the worker has left the holder's hook
            assert time.monotonic() < guard, "hang guard: the victim never ran after the release"
            run.sleep(0.01)
        stats = run.stats()
    start = net.holder.dts[0]
    busy = stats.worker_busy[0]
    assert busy >= 0.9 * (0.5 - start) / stats.time, (busy, start, stats.time)


# --- observe.trace --------------------------------------------------------------------------


@pytest.mark.rule("observe.trace")
@pytest.mark.parametrize("as_str", [False, True], ids=["Path", "str"])
def test_trace_is_a_chrome_trace_with_one_slice_per_hook_call(tmp_path: Path, as_str: bool) -> None:
    """> mujou.run(net, trace=path) writes, when the run ends, a JSON file in the Chrome trace
    event format ({"traceEvents": [...]}) [...]: one complete event ("ph": "X", with "ts" and
    "dur" in microseconds of real time) per hook call, named after the node, with "cat" the
    hook's name, on the track ("tid") of the thread that ran it. A "thread_name" metadata event
    ("ph": "M") names each track after its thread (mujou-worker-N, mujou-node-NAME, …). The
    events of on_update carry "args" with "dt" and "lateness" (timer seconds) and "t" (the
    timer time of the update)."""
    calls = Calls()
    net = Mixed(calls)
    path = tmp_path / "t.json"
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer(), trace=str(path) if as_str else path) as run:
        run.sleep(1.0)
        assert not path.exists(), "the trace is written when the run ends, not before"
    stats = run.stats()
    trace = check_chrome_trace(path)
    assert_one_slice_per_hook_call(trace, calls.snapshot())
    for name, node in worker_nodes(net).items():
        assert (calls.snapshot()[(name, "on_start")], calls.snapshot()[(name, "on_stop")]) == (1, 1)
        updates = sorted(trace.of(name, "on_update"), key=lambda e: e["ts"])
        assert len(updates) == stats.nodes[name].updates == len(node.dts), (name, len(updates), stats)
        assert all(isinstance(e.get("args"), dict) for e in updates), f"{name}: on_update without args"
        args: list[dict[str, Any]] = [e["args"] for e in updates]
        assert node.period is not None
        assert [a["t"] for a in args] == due_times(node.period, len(node.dts)), f"{name}: t {args}"
        assert [a["dt"] for a in args] == node.dts, f"{name}: dt in the trace {args} vs {node.dts}"
        assert all(a["lateness"] == 0.0 for a in args), f"{name}: lateness {args}"
        if node.dedicated_thread:
            expected = {f"mujou-node-{name}"}
            assert {trace.track(e) for e in trace.slices if e["name"] == name} == expected, trace.tracks
        else:
            tracks = {trace.track(e) for e in updates} - {
                threading.current_thread().name
            }  # the host's: threads.host-runs-updates
            assert all(re.fullmatch(r"mujou-worker-\d+", t) for t in tracks), f"{name}: on tracks {tracks}"
        assert_no_overlap([e for e in trace.slices if e["name"] == name], f"node {name}")
    worker_tracks = {t for t in trace.tracks.values() if t.startswith("mujou-worker-")}
    assert len(worker_tracks) <= 2, f"more worker tracks than the 2 workers: {worker_tracks}"
    for track in set(trace.tracks.values()):
        assert_no_overlap([e for e in trace.slices if trace.track(e) == track], f"track {track}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"], "a temporary file was left"


@pytest.mark.rule("observe.trace")
def test_trace_replaces_an_existing_file_whole(tmp_path: Path) -> None:
    """> The file is written atomically: an existing file at the path is replaced by the whole
    trace when the run ends, and no other file is left beside it."""
    path = tmp_path / "t.json"
    path.write_text('{"old": [' + "0, " * 10000 + "0]}", encoding="utf-8")
    calls = Calls()
    with mujou.run(Single(Probe(0.125, calls)), timer=mujou.VirtualTimer(), trace=path) as run:
        run.sleep(1.0)
        assert json.loads(path.read_text(encoding="utf-8")).keys() == {"old"}, "written before the end"
    trace = check_chrome_trace(path)
    assert_one_slice_per_hook_call(trace, calls.snapshot())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"], "a temporary file was left"


@pytest.mark.rule("observe.trace")
@pytest.mark.parametrize("hook", ["on_start", "on_update", "on_stop"])
def test_trace_is_written_after_a_failed_hook(tmp_path: Path, hook: str) -> None:
    """> mujou.run(net, trace=path) writes, when the run ends (when stop() returns, also after a
    failed hook), a JSON file [...]: one complete event [...] per hook call."""
    calls = Calls()
    net = Mixed(calls)
    net.inner.y.fail_in, net.inner.y.fail_at = hook, 1 if hook != "on_update" else 5
    path = tmp_path / "t.json"
    failed = rf"^node 'inner.y' raised ValueError in {hook} "
    with (
        pytest.raises(mujou.HookError, match=failed),
        mujou.run(net, workers=2, timer=mujou.VirtualTimer(), trace=path) as run,
    ):
        run.sleep(1.0)
    trace = check_chrome_trace(path)
    recorded = calls.snapshot()
    assert recorded[("inner.y", hook)] >= 1, recorded  # the failing call is a hook call too
    assert_one_slice_per_hook_call(trace, recorded)
    if hook != "on_start":
        stats = run.stats()
        for name in Mixed.ORDER:
            assert len(trace.of(name, "on_update")) == stats.nodes[name].updates, (name, stats)


# --- observe.profiler-ranges ----------------------------------------------------------------


def all_threads() -> torch._C._profiler._ExperimentalConfig:
    """A profiler configuration that records every thread, Mujou's workers included."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:  # torch releases before profile_all_threads
        pytest.skip(f"torch {torch.__version__} cannot profile all threads")


def profiled_ranges(prof: profile) -> collections.Counter[str]:
    """How many times each name of the form NODE.HOOK was recorded by the profiler."""
    events = prof.events()  # type: ignore[no-untyped-call]  # untyped in torch
    return collections.Counter(e.name for e in events if e.name.endswith(HOOKS))


@pytest.mark.rule("observe.profiler-ranges")
# torch 2.11's profiler warns of its cycles on every start (seen on a GPU machine's image); 2.13 does not
@pytest.mark.filterwarnings("ignore:.*Profiler clears events at the end of each cycle:UserWarning")
def test_hooks_are_named_ranges_while_the_profiler_is_active() -> None:
    """> While torch's profiler is active (torch.profiler.profile), each hook runs inside a
    torch.profiler.record_function range named NODE.HOOK (for example
    robot.camera.on_update)."""
    calls = Calls()
    net = Mixed(calls)
    with (
        profile(activities=[ProfilerActivity.CPU], experimental_config=all_threads()) as prof,
        mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run,
    ):
        run.sleep(1.0)
    ranges = profiled_ranges(prof)
    expected = collections.Counter({f"{node}.{hook}": n for (node, hook), n in calls.snapshot().items()})
    assert ranges == expected, (
        f"profiler ranges {sorted(ranges.items())} != hook calls {sorted(expected.items())}"
    )
    averaged = {average.key for average in prof.key_averages()}
    assert "inner.x.on_update" in averaged, sorted(k for k in averaged if "." in k)[:20]


@pytest.mark.rule("observe.profiler-ranges")
def test_only_hooks_run_while_the_profiler_is_active_are_ranges() -> None:
    """> While torch's profiler is active [...] each hook runs inside a [...] range named
    NODE.HOOK; while it is not, Mujou opens no range.

    The profiler is started in the middle of the run and stopped before its end: exactly the
    updates run meanwhile are ranges, and no on_start or on_stop is."""
    calls = Calls()
    net = Mixed(calls)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        before = run.stats()
        with profile(activities=[ProfilerActivity.CPU], experimental_config=all_threads()) as prof:
            run.sleep(0.5)
        after = run.stats()
        run.sleep(0.5)
    ranges = profiled_ranges(prof)
    expected = collections.Counter(
        {
            f"{name}.on_update": after.nodes[name].updates - before.nodes[name].updates
            for name in Mixed.ORDER
            if after.nodes[name].updates > before.nodes[name].updates
        }
    )
    assert ranges == expected, f"profiler ranges {sorted(ranges.items())} != {sorted(expected.items())}"


@pytest.mark.rule("observe.profiler-ranges")
def test_without_the_profiler_hooks_run_as_usual() -> None:
    """> while it is not [active], Mujou opens no range: hooks run, and nothing breaks."""
    calls = Calls()
    net = Mixed(calls)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        stats = run.stats()
    for name, node in worker_nodes(net).items():
        assert node.period is not None
        assert stats.nodes[name].updates == len(node.dts) == updates_by(node.period, 1.0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(2).sum()
    assert not profiled_ranges(prof), "ranges of the ended run appeared in a later profile"


# --- observe.info ---------------------------------------------------------------------------

INFO_KEYS: dict[str, type | tuple[type, ...]] = {
    "compiled_engine": bool,
    "python": str,
    "free_threaded_build": bool,
    "gil_enabled": bool,
    "affinity_cpus": int,
    "quota_cpus": (int, type(None)),
    "usable_cpus": int,
    "physical_cores": int,
    "default_workers": int,
    "default_workers_reason": str,
    "torch": str,
    "torch_threads": int,
    "advice": str,
    "cuda_devices": list,
}


def python_m_mujou(*args: str, cpus: set[int] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mujou ARGS`` (on the CPUs ``cpus`` when given) and return its result."""
    environ = checkout_environ(quiet=True)  # torch's own warnings on import
    if cpus is None:
        command = [sys.executable, "-m", "mujou", *args]
    else:  # the same as -m, after narrowing the affinity
        code = (
            f"import os, runpy, sys; os.sched_setaffinity(0, {sorted(cpus)!r}); "
            f"sys.argv = ['mujou', *{list(args)!r}]; runpy.run_module('mujou', run_name='__main__')"
        )
        command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=environ, check=False)


def gil_enabled_here() -> bool:
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def check_info(info: object, affinity: set[int]) -> dict[str, Any]:
    """Check the keys, the types and the values of ``info --json`` on a process with ``affinity``."""
    assert isinstance(info, dict), info
    assert set(INFO_KEYS) <= set(info), f"missing keys: {sorted(set(INFO_KEYS) - set(info))}"
    for key, kind in INFO_KEYS.items():
        value = info[key]
        assert isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), (key, value)
    assert platform.python_version() in info["python"], info["python"]
    assert info["free_threaded_build"] == bool(sysconfig.get_config_var("Py_GIL_DISABLED")), info
    assert info["gil_enabled"] == gil_enabled_here(), info
    assert info["affinity_cpus"] == len(affinity), (info, sorted(affinity))
    quota = info["quota_cpus"]
    assert quota is None or quota >= 1, info
    usable = len(affinity) if quota is None else max(1, min(len(affinity), quota))
    assert info["usable_cpus"] == usable, info
    assert 1 <= info["physical_cores"] <= info["usable_cpus"], info
    # threads.default-workers, for a net with more nodes than CPUs.
    assert info["default_workers"] == (max(1, usable // 2) if info["gil_enabled"] else usable), info
    assert info["default_workers_reason"].strip(), info
    assert info["torch"] == torch.__version__, info
    assert info["torch_threads"] >= 1, info
    assert info["advice"].strip(), info
    assert all(isinstance(name, str) and name for name in info["cuda_devices"]), info
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert len(info["cuda_devices"]) == cuda, (info["cuda_devices"], cuda)
    return info


def affinity() -> set[int]:
    return (
        set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    )


@pytest.mark.rule("observe.info")
def test_info_json() -> None:
    """> python -m mujou info --json prints the same as one JSON object with the keys python,
    free_threaded_build, gil_enabled, affinity_cpus, quota_cpus (null without a quota),
    usable_cpus, physical_cores, default_workers, default_workers_reason, torch, torch_threads,
    advice and cuda_devices (a list of names)."""
    result = python_m_mujou("info", "--json")
    assert result.returncode == 0, result.stderr
    check_info(json.loads(result.stdout), affinity())


@pytest.mark.rule("observe.info")
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_info_json_on_one_cpu() -> None:
    """> [...] the CPUs the process may use (the affinity and a cgroup quota), the physical
    cores, the default number of workers [...]: on one CPU, each is 1."""
    one = {min(affinity())}
    result = python_m_mujou("info", "--json", cpus=one)
    assert result.returncode == 0, result.stderr
    info = check_info(json.loads(result.stdout), one)
    assert (info["usable_cpus"], info["physical_cores"], info["default_workers"]) == (1, 1, 1), info


@pytest.mark.rule("observe.info")
def test_info_text() -> None:
    """> python -m mujou info prints [...] whether its engine is compiled [...], the Python
    version and build, whether the GIL is enabled,
    the CPUs the process may use, the physical cores, the default number of workers and why,
    torch.get_num_threads() with the advice of the rule of thumb, and the CUDA devices."""
    text = python_m_mujou("info")
    data = python_m_mujou("info", "--json")
    assert text.returncode == 0 and data.returncode == 0, (text.stderr, data.stderr)
    info = json.loads(data.stdout)
    out = text.stdout
    for value in (info["python"], info["torch"], info["default_workers_reason"], info["advice"]):
        assert value in out, f"{value!r} not in:\n{out}"
    for device in info["cuda_devices"]:
        assert device in out, f"{device!r} not in:\n{out}"
    assert "GIL" in out, out
    engine = "compiled with mypyc" if info["compiled_engine"] else "pure Python"
    assert engine in out, f"{engine!r} not in:\n{out}"
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)  # the text is for people; --json is for programs


@pytest.mark.rule("observe.info")
@pytest.mark.parametrize("args", [(), ("bogus",), ("--json",)])
def test_no_or_unknown_command_prints_usage_and_exits_2(args: tuple[str, ...]) -> None:
    """> python -m mujou with no command or an unknown one prints the usage and exits with
    status 2."""
    result = python_m_mujou(*args)
    assert result.returncode == 2, (args, result.returncode, result.stdout, result.stderr)
    assert "usage" in (result.stdout + result.stderr).lower(), (result.stdout, result.stderr)


# --- observe.progress -----------------------------------------------------------------------

NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def numbers(line: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUMBER.findall(line)]


@pytest.mark.rule("observe.progress")
def test_progress_prints_a_last_line_when_the_run_ends(capfd: pytest.CaptureFixture[str]) -> None:
    """> mujou.run(net, progress=True) prints to stderr [...] a last line when the run ends
    [...] with the run time, the updates per second and the worst lateness. The lines start with
    "mujou "; elsewhere [than on a terminal] each is a line of its own."""
    calls = Calls()
    with mujou.run(Mixed(calls), workers=2, timer=mujou.VirtualTimer(), progress=True) as run:
        run.sleep(2.0)
        before = capfd.readouterr()
    after = capfd.readouterr()
    err = before.err + after.err
    assert before.out == after.out == "", "the progress goes to stderr only"
    assert after.err.strip(), f"no last line when the run ended (before the end: {before.err!r})"
    assert "\r" not in err and err.endswith("\n"), f"not a terminal: one line each: {err!r}"
    lines = err.splitlines()
    assert all(line.startswith("mujou ") for line in lines), lines
    last = numbers(lines[-1])
    assert any(abs(x - 2.0) < 0.01 for x in last), f"the run time 2.0 is not in {lines[-1]!r}"
    assert 0.0 in last, f"the worst lateness (0 under the virtual timer) is not in {lines[-1]!r}"


@pytest.mark.rule("observe.progress")
def test_progress_prints_while_the_run_runs(capfd: pytest.CaptureFixture[str]) -> None:
    """> mujou.run(net, progress=True) prints to stderr, about once a second of real time while
    the run runs, one progress line [...], and a last line when the run ends."""
    calls = Calls()
    seen = ""
    with mujou.run(Mixed(calls), workers=2, progress=True) as run:
        guard = time.monotonic() + HANG
        while "mujou " not in seen:
            assert time.monotonic() < guard, f"hang guard: no progress line while running: {seen!r}"
            run.sleep(0.05)
            seen += capfd.readouterr().err
        assert run.running
    last = capfd.readouterr().err
    assert last.strip(), "no last line when the run ended"
    for line in (seen + last).splitlines():
        assert line.startswith("mujou "), line


_PTY_CHILD = """
import sys, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
import mujou

class N(mujou.Node):
    def on_update(self, dt):
        pass

class One(mujou.Net):
    def __init__(self):
        super().__init__()
        self.n = N(period=0.01)

with mujou.run(One(), workers=1, progress=True) as run:
    sys.stdin.readline()  # the parent has seen a progress line
"""


def read_pty(master: int, until: str, data: str) -> str:
    """Read the terminal's output until ``until`` is in it (or the child closed it)."""
    guard = time.monotonic() + HANG
    while until not in data:
        assert time.monotonic() < guard, f"hang guard: {until!r} never came: {data!r}"
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            data += chunk.decode("utf-8", "replace")
    return data


@pytest.mark.rule("observe.progress")
@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_progress_on_a_terminal_replaces_the_line() -> None:
    """> The lines start with "mujou "; on a terminal each replaces the previous one ("\\r").

    A child process writes its stderr to a pseudo-terminal; once the parent has read one
    progress line there, it lets the child end its run, which prints the last line."""
    master, slave = os.openpty()
    environ = checkout_environ()
    child = subprocess.Popen(
        [sys.executable, "-c", _PTY_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=environ,
        text=True,
    )
    os.close(slave)
    try:
        data = read_pty(master, "mujou ", "")
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        data = read_pty(master, "\0never\0", data)  # to the end
        assert child.wait(HANG) == 0, data
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.close()
        os.close(master)
    lines = [line for line in data.replace("\r\n", "\n").split("\r") if line.strip()]
    assert len(lines) >= 2, f"a progress line and a last line: {data!r}"
    assert all(line.startswith("mujou ") for line in lines), lines
    assert all("\n" not in line.rstrip("\n") for line in lines), (
        f"a line did not replace the previous: {data!r}"
    )


@pytest.mark.rule("observe.progress")
def test_without_progress_mujou_prints_nothing(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """> without progress=True, Mujou prints nothing.

    A real-time run longer than the progress line's second, a virtual one with a trace, and a
    failed one."""
    calls = Calls()
    with mujou.run(Mixed(calls), workers=2) as run:
        sleep_until(run, 1.5, 0.05)
    with mujou.run(Mixed(calls), timer=mujou.VirtualTimer(), trace=tmp_path / "t.json") as run:
        run.sleep(1.0)
    failing = Single(Probe(0.125, calls, fail_in="on_update", fail_at=2))
    with pytest.raises(mujou.HookError), mujou.run(failing, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", ""), captured


# --- gaps found by mutation testing ---------------------------------------------------------


class BusyOutsideUpdates(Node):
    """Due only after a day: spends real time in on_start, state_dict and on_stop only."""

    def __init__(self, *, dedicated_thread: bool) -> None:
        super().__init__(period=86400.0, seed=0, dedicated_thread=dedicated_thread)

    def on_start(self) -> None:
        time.sleep(0.005)

    def state_dict(self) -> dict[str, Any]:
        time.sleep(0.005)
        return super().state_dict()

    def on_stop(self) -> None:
        time.sleep(0.005)


@pytest.mark.rule("observe.stats")
@pytest.mark.parametrize("dedicated", [False, True], ids=["worker", "dedicated"])
def test_busy_counts_every_hook(dedicated: bool) -> None:
    """> `busy` (the real seconds spent in the node's hooks, all hooks included): a node that
    never updates is busy in its on_start, its state_dict and its on_stop, each adding to it."""
    node = BusyOutsideUpdates(dedicated_thread=dedicated)
    with mujou.run(Single(node), timer=mujou.RealTimeTimer(), workers=1) as run:
        after_start = run.stats().nodes[node.name]
        run.state_dict()
        after_state = run.stats().nodes[node.name]
    after_stop = run.stats().nodes[node.name]
    assert after_stop.updates == 0, after_stop
    assert after_start.busy > 0.0, after_start
    assert after_state.busy > after_start.busy, (after_start, after_state)
    assert after_stop.busy > after_state.busy, (after_state, after_stop)
