"""A plain heap and a pool of worker threads (1 by default): heapq of (due, node), a condition wait.

In the trigger workloads a triggered node has no period: ``Pool.trigger`` pushes it on the
heap, due now, and notifies the condition (the event-driven way to write it with a pool).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from .._common import (
    CHAIN_LENGTH,
    CHAIN_PERIOD,
    DISPATCH_PERIOD,
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
    echo_on,
    fleet_metrics,
    idle_on,
    next_slot,
    ring_updates,
    round_trips,
)


class Pool:
    """Workers that take the node due earliest from a heap, run it, and put it back.

    A node whose period is None is triggered only: it goes on the heap when ``trigger`` is
    called (once until it starts: the triggers meanwhile coalesce), not after its update.
    """

    def __init__(self, nodes: Sequence[tuple[float | None, Update]], workers: int = 1) -> None:
        self.nodes = nodes
        self.slots = [1] * len(nodes)
        self.origin = 0.0
        self.stopped = False
        self._cond = threading.Condition()
        self._heap = [(period, i) for i, (period, _) in enumerate(nodes) if period is not None]
        heapq.heapify(self._heap)
        self._queued = [False] * len(nodes)
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(workers)]

    def _worker(self) -> None:
        cond, heap, slots, nodes = self._cond, self._heap, self.slots, self.nodes
        perf_counter, heappop, heappush = time.perf_counter, heapq.heappop, heapq.heappush
        previous = -1
        while True:
            with cond:
                if previous >= 0 and (period := nodes[previous][0]) is not None:
                    heappush(heap, (slots[previous] * period, previous))
                entry, now = None, 0.0
                while entry is None:
                    if self.stopped:
                        return
                    now = perf_counter() - self.origin
                    if heap and heap[0][0] <= now:
                        entry = heappop(heap)
                    else:
                        cond.wait(heap[0][0] - now if heap else None)
                if heap and len(self.threads) > 1:
                    cond.notify()
            due, i = entry
            period, update = nodes[i]
            if period is None:
                self._queued[i] = False
                update(due)
            else:
                update(due)
                slots[i] = next_slot(slots[i], period, now)
            previous = i

    def trigger(self, i: int) -> None:
        """Node i (triggered only) is due now: on the heap, and a waiting worker woken."""
        with self._cond:
            if not self._queued[i]:
                self._queued[i] = True
                heapq.heappush(self._heap, (time.perf_counter() - self.origin, i))
                self._cond.notify()

    def start(self) -> None:
        self.origin = time.perf_counter()
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()
        for thread in self.threads:
            thread.join()


def fleet(n: int, seconds: float, workers: int = 1) -> Metrics:
    record = Record()
    pool = Pool([(PERIOD, update) for update in ring_updates(n, record)], workers)
    window = Window()
    pool.start()
    window.start()
    time.sleep(max(0.0, pool.origin + seconds + GRACE - time.perf_counter()))
    window.stop()
    pool.stop()
    return fleet_metrics(record, pool.origin, n, seconds, cpu_seconds=window.cpu, wall_seconds=window.wall)


def dispatch(n: int, seconds: float) -> Metrics:
    counter = Counter()
    pool = Pool([(DISPATCH_PERIOD, counter.update) for _ in range(n)])
    pool.start()
    time.sleep(0.2)
    done = counter.count
    began = time.perf_counter()
    time.sleep(seconds)
    done = counter.count - done
    wall = time.perf_counter() - began
    pool.stop()
    return {"updates_per_second": done / wall, "updates": done, "wall_seconds": wall}


def echo(seconds: float) -> Metrics:
    return echo_on(Pool, seconds)


def idle(seconds: float) -> Metrics:
    return idle_on(Pool, seconds)


# -- the trigger workloads -------------------------------------------------------------------


def _chain(length: int, period: float, seconds: float) -> Metrics:
    """A periodic sender and ``length`` triggered nodes in a row, all on the pool's one worker."""
    events = Events()
    boxes: list[Any] = [None] * length  # the latest message of each triggered node
    perf_counter, sent, starts, keys = time.perf_counter, events.sent, events.starts, events.keys
    pool: Pool

    def send(due: float) -> None:
        k = len(sent)
        sent.append(perf_counter())
        boxes[0] = k
        pool.trigger(1)

    def forward(i: int) -> Update:
        def update(due: float) -> None:
            boxes[i + 1] = boxes[i]
            pool.trigger(i + 2)

        return update

    def record(due: float) -> None:
        starts.append(perf_counter())
        keys.append(boxes[-1])

    nodes: list[tuple[float | None, Update]] = [(period, send)]
    nodes += [(None, forward(i)) for i in range(length - 1)]
    nodes.append((None, record))
    pool = Pool(nodes)
    pool.start()
    time.sleep(WARM_UP + seconds)
    pool.stop()
    return events.metrics()


def trigger_latency(seconds: float) -> Metrics:
    return _chain(1, TRIGGER_PERIOD, seconds)


def chain(seconds: float) -> Metrics:
    return _chain(CHAIN_LENGTH, CHAIN_PERIOD, seconds)


def echo_triggered(seconds: float) -> Metrics:
    """The host puts its message in the box and triggers the echo node."""
    host = EchoHost()
    pool = Pool([(None, lambda due: host.deliver(host.box))])
    pool.start()

    def write(value: float) -> None:
        host.box = torch.full((1,), value)
        pool.trigger(0)

    try:
        return round_trips(write, host.wait, seconds)
    finally:
        pool.stop()
