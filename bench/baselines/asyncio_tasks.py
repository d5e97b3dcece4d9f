"""asyncio, a task per node: each task sleeps until its node's next due time (fixed rate, skipping)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .._common import (
    DISPATCH_PERIOD,
    ECHO_PERIOD,
    GRACE,
    PERIOD,
    Counter,
    EchoHost,
    Metrics,
    Record,
    Update,
    Window,
    fleet_metrics,
    idle_metrics,
    next_slot,
    ring_updates,
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
