"""Mujou's side of each workload: the nodes and the host's calls, through the public API only."""

from __future__ import annotations

import time
from array import array
from functools import partial
from typing import Any

import torch

import mujou
from mujou import Input, Net, Node, Output

from ._common import (
    CHAIN_LENGTH,
    CHAIN_PERIOD,
    DISPATCH_PERIOD,
    ECHO_PERIOD,
    GRACE,
    PERIOD,
    TRIGGER_PERIOD,
    VIRTUAL_PERIOD,
    WARM_UP,
    Events,
    Metrics,
    Record,
    Window,
    echo_phases,
    fleet_metrics,
    idle_metrics,
    latency_metrics,
    next_slot,
    round_trips,
    weights,
    zeros,
)


class RingNode(Node):
    """``y = tanh(W @ x)`` on the latest ``x`` of the previous node of the ring.

    Records when each update started (perf_counter) and its ``dt``. The due times are worked
    out after the run (``record``): the running sum of ``dt`` is the timer time at which the
    engine started each update, and the slot follows Mujou's own rule (sched.skip) applied to
    those times, so it is the slot the engine ran; the hook does no more bookkeeping than the
    baselines' updates.
    """

    x = Input()
    y = Output()

    def __init__(self, w: torch.Tensor, zero: torch.Tensor, period: float = PERIOD) -> None:
        super().__init__(period=period, seed=0)  # another period: bench/fleet_callgrind.py
        self.w = w
        self.zero = zero
        self.starts = array("d")
        self.dts = array("d")

    def on_update(self, dt: float) -> None:
        self.starts.append(time.perf_counter())
        self.dts.append(dt)
        x = self.x.read()
        if x is None:
            x = self.zero
        self.y.send(torch.tanh(self.w @ x), copy=False)  # a new tensor, as the baselines keep

    def record(self, into: Record) -> None:
        """Add this node's starts and due times to ``into``."""
        slot = 1
        timer = 0.0  # the timer time at which the engine started the update: the sum of dt
        for start, dt in zip(self.starts, self.dts, strict=True):
            timer += dt
            into.starts.append(start)
            into.dues.append(slot * PERIOD)
            slot = next_slot(slot, PERIOD, timer)


class Ring(Net):
    """N ring nodes, node i reading node i - 1."""

    def __init__(self, nodes: list[RingNode]) -> None:
        super().__init__()
        for i, node in enumerate(nodes):
            setattr(self, f"n{i}", node)
        for i, node in enumerate(nodes):
            self.connect(nodes[i - 1].y, node.x)


class Empty(Node):
    """A node whose update does nothing."""

    def on_update(self, dt: float) -> None:
        pass


class Flock(Net):
    """N empty nodes of one period."""

    def __init__(self, n: int, period: float) -> None:
        super().__init__()
        for i in range(n):
            setattr(self, f"n{i}", Empty(period=period, seed=0))


def _origin(run: mujou.Run) -> float:
    """The perf_counter time at which the run's timer started (timer time 0)."""
    before = time.perf_counter()
    now = run.time
    after = time.perf_counter()
    return (before + after) / 2 - now


def _updates(run: mujou.Run) -> int:
    return sum(stats.updates for stats in run.stats().nodes.values())


def fleet(n: int, seconds: float, workers: int, record_to: str | None = None) -> Metrics:
    zero = zeros()
    nodes = [RingNode(w, zero) for w in weights(n)]
    net = Ring(nodes)
    window = Window()
    with mujou.run(net, workers=workers, record=record_to) as run:
        origin = _origin(run)
        window.start()
        run.sleep(max(0.0, seconds + GRACE - run.time))
        window.stop()
        stats = run.stats()
    record = Record()
    for node in nodes:
        node.record(record)
    metrics = fleet_metrics(record, origin, n, seconds, cpu_seconds=window.cpu, wall_seconds=window.wall)
    counts = stats.nodes.values()
    metrics["engine_updates"] = sum(node.updates for node in counts)
    metrics["engine_skipped"] = sum(node.skipped for node in counts)
    metrics["engine_max_lateness_ms"] = 1e3 * max(node.lateness_max for node in counts)
    return metrics


def dispatch(n: int, seconds: float, timer: str) -> Metrics:
    """Empty updates per second on one worker, every node always due (or virtual time)."""
    if timer == "virtual":
        net = Flock(n, VIRTUAL_PERIOD)
        with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
            run.sleep(0.02)  # warm up
            done = _updates(run)
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                run.sleep(0.01)
            wall = time.perf_counter() - began
            done = _updates(run) - done
    else:
        net = Flock(n, DISPATCH_PERIOD)
        with mujou.run(net, workers=1) as run:
            run.sleep(0.2)  # warm up
            done = _updates(run)
            began = time.perf_counter()
            run.sleep(seconds)
            done = _updates(run) - done
            wall = time.perf_counter() - began
    return {"updates_per_second": done / wall, "updates": done, "wall_seconds": wall}


class Echo(Node):
    """Sends back each new message of the host."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=ECHO_PERIOD, seed=0)
        self.last: torch.Tensor | None = None

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None and message is not self.last:
            self.last = message
            self.y.send(message)


class EchoNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo()


def _equals(value: float, message: torch.Tensor) -> bool:
    return bool(message.item() == value)


def echo(seconds: float) -> Metrics:
    """The host writes k, waits for the echo node to send k back, and does it again."""
    net = EchoNet()
    latencies: list[float] = []
    phases = echo_phases()
    with mujou.run(net, workers=1, inputs={net.echo.x: torch.zeros(1)}) as run:
        run.sleep(0.1)  # warm up
        began = time.perf_counter()
        k = 0
        while time.perf_counter() - began < seconds:
            k += 1
            value = float(k)
            time.sleep(phases.random() * ECHO_PERIOD)  # a random phase of the echo's period
            sent = time.perf_counter()
            run.write(net.echo.x, torch.full((1,), value))
            run.wait_for(net.echo.y, partial(_equals, value), timeout=1.0)
            latencies.append(time.perf_counter() - sent)
    return latency_metrics(latencies)


def idle(seconds: float) -> Metrics:
    """The process CPU time one 100 Hz node with an empty update costs."""
    net = Flock(1, PERIOD)
    window = Window()
    with mujou.run(net, workers=1) as run:
        run.sleep(0.2)
        done = _updates(run)
        window.start()
        run.sleep(seconds)
        window.stop()
        done = _updates(run) - done
    return idle_metrics(window.cpu, window.wall, done)


# -- the trigger workloads -------------------------------------------------------------------


class Sender(Node):
    """Sends k (a new one-element tensor) at each update; records the time just before the send."""

    y = Output()

    def __init__(self, period: float, events: Events) -> None:
        super().__init__(period=period, seed=0)
        self.events = events

    def on_update(self, dt: float) -> None:
        sent = self.events.sent
        message = torch.full((1,), float(len(sent)))
        sent.append(time.perf_counter())
        self.y.send(message, copy=False)


class Ticker(Node):
    """The periodic source of the microsteps workload: sends one tensor (not changed) each update."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=VIRTUAL_PERIOD, seed=0)
        self.message = torch.zeros(1)

    def on_update(self, dt: float) -> None:
        self.y.send(self.message, copy=False)


class Link(Node):
    """Triggered by its input (no period): hands each message on, unchanged."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None:
            self.y.send(message, copy=False)


class Reader(Node):
    """Triggered by its input (no period): records its start first, then the k it read."""

    x = Input()

    def __init__(self, events: Events) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.events = events
        self.messages: list[torch.Tensor | None] = []

    def on_update(self, dt: float) -> None:
        self.events.starts.append(time.perf_counter())
        self.messages.append(self.x.read())

    def keys(self) -> None:
        """Decode the k of each message read into the events (after the run)."""
        starts = self.events.starts
        kept = array("d")
        for start, message in zip(starts, self.messages, strict=True):
            if message is not None:
                kept.append(start)
                self.events.keys.append(int(message.item()))
        self.events.starts = kept


class Chain(Net):
    """A periodic source, then ``length`` triggered nodes in a row, the last one ``last``."""

    def __init__(self, source: Sender | Ticker, length: int, last: Link | Reader) -> None:
        super().__init__()
        self.source = source
        links = [Link() for _ in range(length - 1)]
        for i, node in enumerate([*links, last]):
            setattr(self, f"t{i + 1}", node)
        previous = source.y
        for link in links:
            self.connect(previous, link.x)
            previous = link.y
        self.connect(previous, last.x)


def _chain(length: int, period: float, seconds: float, workers: int) -> Metrics:
    events = Events()
    reader = Reader(events)
    net = Chain(Sender(period, events), length, reader)
    with mujou.run(net, workers=workers) as run:
        run.sleep(WARM_UP + seconds)
    reader.keys()
    return events.metrics()


def trigger_latency(seconds: float, workers: int) -> Metrics:
    """A periodic node sends; a node triggered by it (no period) starts: send to start."""
    return _chain(1, TRIGGER_PERIOD, seconds, workers)


def chain(seconds: float, workers: int) -> Metrics:
    """A periodic source and CHAIN_LENGTH triggered nodes: the source's send to the last one's start."""
    return _chain(CHAIN_LENGTH, CHAIN_PERIOD, seconds, workers)


class TriggeredEchoNet(Net):
    """The echo node of ``echo``, triggered by its input instead of a period (a ``Link``)."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = Link()


def echo_triggered(seconds: float) -> Metrics:
    """``run.write`` wakes the echo node, ``run.wait_for`` waits for what it sends back."""
    net = TriggeredEchoNet()
    with mujou.run(net, workers=1, inputs={net.echo.x: torch.zeros(1)}) as run:

        def write(value: float) -> None:  # a fresh tensor each trip, handed over as the peers do
            run.write(net.echo.x, torch.full((1,), value), copy=False)

        def wait(value: float) -> None:
            run.wait_for(net.echo.y, partial(_equals, value), timeout=1.0)

        return round_trips(write, wait, seconds)


def microsteps(seconds: float) -> Metrics:
    """Virtual timer: each tick of the source wakes CHAIN_LENGTH triggered nodes, one microstep each."""
    net = Chain(Ticker(), CHAIN_LENGTH, Link())
    triggered = [name for name, _ in net.named_nodes() if name != "source"]
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.02)  # warm up

        def count() -> tuple[int, int]:
            nodes = run.stats().nodes
            return sum(nodes[name].updates for name in triggered), nodes["source"].updates

        steps, ticks = count()
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            run.sleep(0.01)
        wall = time.perf_counter() - began
        after = count()
    steps, ticks = after[0] - steps, after[1] - ticks
    return {
        "microsteps_per_second": steps / wall,
        "updates_per_second": (steps + ticks) / wall,
        "microsteps": steps,
        "ticks": ticks,
        "wall_seconds": wall,
    }


def describe() -> dict[str, Any]:
    return {"mujou": mujou.__version__}
