"""ezmsg: a unit per node, each update one iteration of the unit's ``@ez.publisher`` task.

A unit's publisher sleeps until its next due time (fixed rate, skipping, as every system
here), computes, and yields its output; the next unit keeps the latest message its
``@ez.subscriber`` received. ezmsg's graph is acyclic, so the fleet is a chain rather than a
ring (unit 0 has no source and reads zeros). Everything runs in this process
(``force_single_process=True``), on ezmsg's event loop.
"""

# mypy: disallow-subclassing-any=False, disallow-untyped-decorators=False

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

import torch

from .._common import (
    CROSS_PERIOD,
    DISPATCH_PERIOD,
    ECHO_PERIOD,
    GRACE,
    PERIOD,
    WARM_UP,
    Metrics,
    Record,
    Window,
    cross_metrics,
    echo_phases,
    fleet_metrics,
    idle_metrics,
    latency_metrics,
    next_slot,
    weights,
    zeros,
)

ez: Any = importlib.import_module("ezmsg.core")
logging.getLogger("ezmsg").setLevel(logging.WARNING)


class Shared:
    """What the units of one run share with the measuring code (all in one process)."""

    origin = 0.0  # perf_counter time of the run's start, 0.0 until the stopper sets it
    period = PERIOD
    weights: list[torch.Tensor] = []  # noqa: RUF012  (set once per process, before the run)
    record = Record()
    count = 0
    window = Window()
    result: Metrics = {}  # noqa: RUF012
    seconds = 0.0
    sent: list[float] = []  # noqa: RUF012  (cross-process: the subscriber's records)
    read: list[float] = []  # noqa: RUF012
    keys: list[int] = []  # noqa: RUF012


async def _wait_for_origin() -> None:
    while not Shared.origin:
        await asyncio.sleep(0.001)


async def _until_next(slot: int) -> None:
    await asyncio.sleep(Shared.origin + slot * Shared.period - time.perf_counter())


class IndexSettings(ez.Settings):
    index: int = 0


class RingUnit(ez.Unit):
    SETTINGS = IndexSettings
    INPUT = ez.InputStream(torch.Tensor)
    OUTPUT = ez.OutputStream(torch.Tensor)

    async def initialize(self) -> None:
        self.latest: torch.Tensor | None = None
        self.zero = zeros()

    @ez.subscriber(INPUT)
    async def on_input(self, message: torch.Tensor) -> None:
        self.latest = message

    @ez.publisher(OUTPUT)
    async def update(self) -> AsyncGenerator[tuple[Any, torch.Tensor], None]:
        perf_counter, tanh = time.perf_counter, torch.tanh
        starts, dues = Shared.record.starts, Shared.record.dues
        w = Shared.weights[self.SETTINGS.index]
        await _wait_for_origin()
        slot = 1
        while True:
            await _until_next(slot)
            starts.append(perf_counter())
            dues.append(slot * PERIOD)
            start = perf_counter() - Shared.origin
            x = self.latest
            if x is None:
                x = self.zero
            yield self.OUTPUT, tanh(w @ x)
            slot = next_slot(slot, PERIOD, start)


class EmptyUnit(ez.Unit):
    """An update that does nothing but publish a one-element message (no subscriber)."""

    OUTPUT = ez.OutputStream(torch.Tensor)

    @ez.publisher(OUTPUT)
    async def update(self) -> AsyncGenerator[tuple[Any, torch.Tensor], None]:
        message = torch.zeros(1)
        await _wait_for_origin()
        slot = 1
        while True:
            await _until_next(slot)
            start = time.perf_counter() - Shared.origin
            Shared.count += 1
            yield self.OUTPUT, message
            slot = next_slot(slot, Shared.period, start)


class FleetStopper(ez.Unit):
    @ez.task
    async def stop(self) -> None:
        Shared.origin = time.perf_counter()
        Shared.window.start()
        await asyncio.sleep(Shared.seconds + GRACE)
        Shared.window.stop()
        raise ez.NormalTermination


class CountStopper(ez.Unit):
    """Counts the empty updates and the CPU time over ``Shared.seconds`` after a warm-up."""

    @ez.task
    async def stop(self) -> None:
        Shared.origin = time.perf_counter()
        await asyncio.sleep(0.2)
        done = Shared.count
        Shared.window.start()
        await asyncio.sleep(Shared.seconds)
        Shared.window.stop()
        Shared.result = {"updates": Shared.count - done}
        raise ez.NormalTermination


def _run(components: dict[str, Any], connections: list[tuple[Any, Any]]) -> None:
    ez.run(components=components, connections=connections, force_single_process=True)


def fleet(n: int, seconds: float) -> Metrics:
    Shared.weights = weights(n)
    Shared.seconds = seconds
    units = [RingUnit(IndexSettings(index=i)) for i in range(n)]
    components: dict[str, Any] = {f"n{i}": unit for i, unit in enumerate(units)}
    components["stopper"] = FleetStopper()
    _run(components, [(units[i - 1].OUTPUT, units[i].INPUT) for i in range(1, n)])
    window = Shared.window
    return fleet_metrics(
        Shared.record, Shared.origin, n, seconds, cpu_seconds=window.cpu, wall_seconds=window.wall
    )


def dispatch(n: int, seconds: float) -> Metrics:
    Shared.period = DISPATCH_PERIOD
    Shared.seconds = seconds
    components: dict[str, Any] = {f"n{i}": EmptyUnit() for i in range(n)}
    components["stopper"] = CountStopper()
    _run(components, [])
    done, wall = Shared.result["updates"], Shared.window.wall
    return {"updates_per_second": done / wall, "updates": done, "wall_seconds": wall}


def idle(seconds: float) -> Metrics:
    Shared.period = PERIOD
    Shared.seconds = seconds
    _run({"node": EmptyUnit(), "stopper": CountStopper()}, [])
    return idle_metrics(Shared.window.cpu, Shared.window.wall, Shared.result["updates"])


class EchoUnit(ez.Unit):
    INPUT = ez.InputStream(torch.Tensor)
    OUTPUT = ez.OutputStream(torch.Tensor)

    async def initialize(self) -> None:
        self.latest: torch.Tensor | None = None

    @ez.subscriber(INPUT)
    async def on_input(self, message: torch.Tensor) -> None:
        self.latest = message

    @ez.publisher(OUTPUT)
    async def update(self) -> AsyncGenerator[tuple[Any, torch.Tensor], None]:
        await _wait_for_origin()
        last: torch.Tensor | None = None
        slot = 1
        while True:
            await _until_next(slot)
            start = time.perf_counter() - Shared.origin
            message = self.latest
            if message is not None and message is not last:
                last = message
                yield self.OUTPUT, message
            slot = next_slot(slot, ECHO_PERIOD, start)


class HostUnit(ez.Unit):
    """The host: sends k to the echo unit, waits until k comes back, and again."""

    TO_ECHO = ez.OutputStream(torch.Tensor)
    FROM_ECHO = ez.InputStream(torch.Tensor)

    async def initialize(self) -> None:
        self.expected = -1.0
        self.back: asyncio.Event | None = None

    @ez.subscriber(FROM_ECHO)
    async def on_back(self, message: torch.Tensor) -> None:
        if self.back is not None and message.item() == self.expected:
            self.back.set()

    @ez.publisher(TO_ECHO)
    async def host(self) -> AsyncGenerator[tuple[Any, torch.Tensor], None]:
        Shared.origin = time.perf_counter()
        await asyncio.sleep(0.1)
        latencies: list[float] = []
        phases = echo_phases()
        began = time.perf_counter()
        k = 0
        while time.perf_counter() - began < Shared.seconds:
            k += 1
            self.expected = float(k)
            self.back = asyncio.Event()
            await asyncio.sleep(phases.random() * ECHO_PERIOD)  # a random phase of the echo's period
            sent = time.perf_counter()
            yield self.TO_ECHO, torch.full((1,), self.expected)
            await asyncio.wait_for(self.back.wait(), timeout=1.0)
            latencies.append(time.perf_counter() - sent)
        Shared.result = latency_metrics(latencies)
        raise ez.NormalTermination


def echo(seconds: float) -> Metrics:
    Shared.period = ECHO_PERIOD
    Shared.seconds = seconds
    echo_unit, host = EchoUnit(), HostUnit()
    _run(
        {"echo": echo_unit, "host": host},
        [(host.TO_ECHO, echo_unit.INPUT), (echo_unit.OUTPUT, host.FROM_ECHO)],
    )
    if not Shared.result:
        raise RuntimeError("the echo round trips did not complete")
    return Shared.result


class TriggeredEchoUnit(ez.Unit):
    """Event-driven: each message the subscriber receives is published back at once."""

    INPUT = ez.InputStream(torch.Tensor)
    OUTPUT = ez.OutputStream(torch.Tensor)

    @ez.subscriber(INPUT)
    @ez.publisher(OUTPUT)
    async def on_input(self, message: torch.Tensor) -> AsyncGenerator[tuple[Any, torch.Tensor], None]:
        yield self.OUTPUT, message


def echo_triggered(seconds: float) -> Metrics:
    """The host unit as in ``echo``; the echo unit answers from its subscriber (no period)."""
    Shared.seconds = seconds
    echo_unit, host = TriggeredEchoUnit(), HostUnit()
    _run(
        {"echo": echo_unit, "host": host},
        [(host.TO_ECHO, echo_unit.INPUT), (echo_unit.OUTPUT, host.FROM_ECHO)],
    )
    if not Shared.result:
        raise RuntimeError("the echo round trips did not complete")
    return Shared.result


# -- cross-process: ezmsg's process-to-process path ------------------------------------------


class CrossSettings(ez.Settings):
    nbytes: int = 256
    seconds: float = 1.0


class CrossPublisher(ez.Unit):
    """In a process of its own: publishes a fresh float64 tensor every CROSS_PERIOD, the
    monotonic time just before the publish in [0], its number in [1]."""

    SETTINGS = CrossSettings
    OUTPUT = ez.OutputStream(torch.Tensor)

    @ez.publisher(OUTPUT)
    async def send(self) -> AsyncGenerator[tuple[Any, torch.Tensor], None]:
        torch.set_num_threads(1)
        elements = max(2, self.SETTINGS.nbytes // 8)
        await asyncio.sleep(0.5)  # the subscriber's process connects
        began = time.monotonic()
        k = 0
        while True:
            delay = began + k * CROSS_PERIOD - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            message = torch.empty(elements, dtype=torch.float64)
            message[1] = k
            message[0] = time.monotonic()
            k += 1
            yield self.OUTPUT, message


class CrossSubscriber(ez.Unit):
    """In the measuring process: records the monotonic time of each message it receives."""

    SETTINGS = CrossSettings
    INPUT = ez.InputStream(torch.Tensor)

    async def initialize(self) -> None:
        self.first: float | None = None

    @ez.subscriber(INPUT)
    async def on_message(self, message: torch.Tensor) -> None:
        now = time.monotonic()
        Shared.read.append(now)
        Shared.sent.append(float(message[0]))
        Shared.keys.append(int(message[1]))
        if self.first is None:
            self.first = now
        elif now - self.first > WARM_UP + self.SETTINGS.seconds:
            raise ez.NormalTermination


def cross_process(nbytes: int, seconds: float) -> Metrics:
    """The publisher in a process of its own (``process_components``), the subscriber here."""
    Shared.sent, Shared.read, Shared.keys = [], [], []
    settings = CrossSettings(nbytes=nbytes, seconds=seconds)
    publisher, subscriber = CrossPublisher(settings), CrossSubscriber(settings)
    ez.run(
        components={"publisher": publisher, "subscriber": subscriber},
        connections=[(publisher.OUTPUT, subscriber.INPUT)],
        process_components=[publisher],
    )
    if not Shared.read:
        raise RuntimeError("no message crossed")
    return cross_metrics(Shared.sent, Shared.read, Shared.keys, nbytes)
