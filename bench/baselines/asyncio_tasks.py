"""asyncio, a task per node: each task sleeps until its node's next due time (fixed rate, skipping).

In the trigger workloads a triggered node is a task awaiting ``asyncio.Queue.get()``: the
event-driven way to write it with asyncio.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import torch

from .._common import (
    CHAIN_LENGTH,
    CHAIN_PERIOD,
    DISPATCH_PERIOD,
    ECHO_PERIOD,
    GRACE,
    PERIOD,
    TRIGGER_PERIOD,
    WARM_UP,
    Counter,
    EchoHost,
    Events,
    Metrics,
    Record,
    Update,
    Window,
    fleet_metrics,
    idle_metrics,
    next_slot,
    ring_updates,
    round_trips,
)


class Loop:
    """The node tasks of one run, on the running event loop."""

    def __init__(self) -> None:
        self.origin = 0.0
        self.stopped = False
        self.tasks: list[asyncio.Task[None]] = []

    async def _node(self, period: float, update: Update) -> None:
        perf_counter, sleep = time.perf_counter, asyncio.sleep
        slot = 1
        while True:
            await sleep(self.origin + slot * period - perf_counter())
            if self.stopped:
                return
            start = perf_counter() - self.origin
            update(slot * period)
            slot = next_slot(slot, period, start)

    def start(self, nodes: list[tuple[float, Update]]) -> None:
        self.tasks = [asyncio.create_task(self._node(period, update)) for period, update in nodes]
        self.origin = time.perf_counter()

    async def stop(self) -> None:
        self.stopped = True
        await asyncio.gather(*self.tasks)


def _run(main: Callable[[], Coroutine[Any, Any, Metrics]]) -> Metrics:
    return asyncio.run(main())


def fleet(n: int, seconds: float) -> Metrics:
    record = Record()
    updates = ring_updates(n, record)

    async def main() -> Metrics:
        loop = Loop()
        loop.start([(PERIOD, update) for update in updates])
        window = Window()
        window.start()
        await asyncio.sleep(loop.origin + seconds + GRACE - time.perf_counter())
        window.stop()
        await loop.stop()
        return fleet_metrics(
            record, loop.origin, n, seconds, cpu_seconds=window.cpu, wall_seconds=window.wall
        )

    return _run(main)


def dispatch(n: int, seconds: float) -> Metrics:
    counter = Counter()

    async def main() -> Metrics:
        loop = Loop()
        loop.start([(DISPATCH_PERIOD, counter.update) for _ in range(n)])
        await asyncio.sleep(0.2)
        done = counter.count
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        done = counter.count - done
        wall = time.perf_counter() - began
        await loop.stop()
        return {"updates_per_second": done / wall, "updates": done, "wall_seconds": wall}

    return _run(main)


def echo(seconds: float) -> Metrics:
    """The echo task runs on an event loop in a thread of its own; the host is this thread."""
    host = EchoHost()
    started = threading.Event()
    control: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def serve() -> None:
        loop = Loop()
        loop.start([(ECHO_PERIOD, host.update)])
        stop = asyncio.Event()
        control.append((asyncio.get_running_loop(), stop))
        started.set()
        await stop.wait()
        await loop.stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    started.wait()
    try:
        return host.round_trips(seconds)
    finally:
        event_loop, stop = control[0]
        event_loop.call_soon_threadsafe(stop.set)
        thread.join()


def idle(seconds: float) -> Metrics:
    counter = Counter()

    async def main() -> Metrics:
        loop = Loop()
        loop.start([(PERIOD, counter.update)])
        await asyncio.sleep(0.2)
        done = counter.count
        window = Window()
        window.start()
        await asyncio.sleep(seconds)
        window.stop()
        await loop.stop()
        return idle_metrics(window.cpu, window.wall, counter.count - done)

    return _run(main)


# -- the trigger workloads -------------------------------------------------------------------


async def _forward(queue: asyncio.Queue[int | None], to: asyncio.Queue[int | None]) -> None:
    """A triggered node in the middle of a chain: hands each message on."""
    while (value := await queue.get()) is not None:
        to.put_nowait(value)
    to.put_nowait(None)


async def _record(queue: asyncio.Queue[int | None], events: Events) -> None:
    """The last triggered node: records its start, then the message's k."""
    perf_counter, starts, keys = time.perf_counter, events.starts, events.keys
    while (value := await queue.get()) is not None:
        starts.append(perf_counter())
        keys.append(value)


async def _chain(length: int, period: float, seconds: float) -> Metrics:
    """A sender task puts k in the first queue every ``period``; ``length`` tasks await theirs."""
    events = Events()
    queues: list[asyncio.Queue[int | None]] = [asyncio.Queue() for _ in range(length)]
    tasks = [asyncio.create_task(_forward(queues[i], queues[i + 1])) for i in range(length - 1)]
    tasks.append(asyncio.create_task(_record(queues[-1], events)))
    perf_counter, sleep, sent, first = time.perf_counter, asyncio.sleep, events.sent, queues[0]
    origin = perf_counter()
    slot = 1
    while slot * period <= WARM_UP + seconds:
        await sleep(origin + slot * period - perf_counter())
        start = perf_counter() - origin
        sent.append(perf_counter())
        first.put_nowait(len(sent) - 1)
        slot = next_slot(slot, period, start)
    first.put_nowait(None)
    await asyncio.gather(*tasks)
    return events.metrics()


def trigger_latency(seconds: float) -> Metrics:
    return asyncio.run(_chain(1, TRIGGER_PERIOD, seconds))


def chain(seconds: float) -> Metrics:
    return asyncio.run(_chain(CHAIN_LENGTH, CHAIN_PERIOD, seconds))


def echo_triggered(seconds: float) -> Metrics:
    """The echo task awaits a queue on an event loop in a thread of its own; the host is this thread.

    The host hands each message to the loop with ``call_soon_threadsafe`` (the way another
    thread wakes an asyncio task).
    """
    host = EchoHost()
    started = threading.Event()
    control: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[torch.Tensor | None]]] = []

    async def serve() -> None:
        queue: asyncio.Queue[torch.Tensor | None] = asyncio.Queue()
        control.append((asyncio.get_running_loop(), queue))
        started.set()
        while (message := await queue.get()) is not None:
            host.deliver(message)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    started.wait()
    event_loop, queue = control[0]

    def write(value: float) -> None:
        event_loop.call_soon_threadsafe(queue.put_nowait, torch.full((1,), value))

    try:
        return round_trips(write, host.wait, seconds)
    finally:
        event_loop.call_soon_threadsafe(queue.put_nowait, None)
        thread.join()
