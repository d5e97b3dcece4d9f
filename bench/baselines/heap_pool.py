"""A plain heap and a pool of worker threads (1 by default): heapq of (due, node), a condition wait."""

from __future__ import annotations

import heapq
import threading
import time

from .._common import (
    DISPATCH_PERIOD,
    GRACE,
    PERIOD,
    Counter,
    Metrics,
    Record,
    Update,
    Window,
    echo_on,
    fleet_metrics,
    idle_on,
    next_slot,
    ring_updates,
)


class Pool:
    """Workers that take the node due earliest from a heap, run it, and put it back."""

    def __init__(self, nodes: list[tuple[float, Update]], workers: int = 1) -> None:
        self.nodes = nodes
        self.slots = [1] * len(nodes)
        self.origin = 0.0
        self.stopped = False
        self._cond = threading.Condition()
        self._heap = [(period, i) for i, (period, _) in enumerate(nodes)]
        heapq.heapify(self._heap)
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(workers)]

    def _worker(self) -> None:
        cond, heap, slots, nodes = self._cond, self._heap, self.slots, self.nodes
        perf_counter, heappop, heappush = time.perf_counter, heapq.heappop, heapq.heappush
        previous = -1
        while True:
            with cond:
                if previous >= 0:
                    heappush(heap, (slots[previous] * nodes[previous][0], previous))
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
            update(due)
            slots[i] = next_slot(slots[i], period, now)
            previous = i

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
