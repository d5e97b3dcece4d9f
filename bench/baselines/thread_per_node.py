"""A thread per node: each thread sleeps (time.sleep) until its next due time (fixed rate, skipping)."""

from __future__ import annotations

import threading
import time

from .._common import (
    GRACE,
    PERIOD,
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

STACK = 512 * 1024  # 10,000 threads of the default 8 MiB would reserve 80 GiB of address space


class Threads:
    """One thread per node; they start together at ``origin``."""

    def __init__(self, nodes: list[tuple[float, Update]]) -> None:
        self.origin = 0.0
        self.stopped = False
        # One lock per thread to start it: a shared Event would make thousands of threads
        # queue for its one lock at the start, which is not what is measured here.
        self._gates = [threading.Lock() for _ in nodes]
        for gate in self._gates:
            gate.acquire()
        previous = threading.stack_size(STACK)
        try:
            self.threads = [
                threading.Thread(target=self._node, args=(*node, gate), daemon=True)
                for node, gate in zip(nodes, self._gates, strict=True)
            ]
            for thread in self.threads:
                thread.start()
        finally:
            threading.stack_size(previous)

    def _node(self, period: float, update: Update, gate: threading.Lock) -> None:
        perf_counter, sleep = time.perf_counter, time.sleep
        gate.acquire()
        slot = 1
        while True:
            delay = self.origin + slot * period - perf_counter()
            if delay > 0:
                sleep(delay)
            if self.stopped:
                return
            start = perf_counter() - self.origin
            update(slot * period)
            slot = next_slot(slot, period, start)

    def start(self) -> None:
        self.origin = time.perf_counter()
        for gate in self._gates:
            gate.release()

    def stop(self, join: bool = True) -> None:
        """Stop the threads; without ``join``, leave them to end on their own (they are daemons).

        Thousands of overdue threads each need a turn of the GIL to see the flag: joining
        them can take minutes, which is not what is measured here.
        """
        self.stopped = True
        if join:
            for thread in self.threads:
                thread.join()


def fleet(n: int, seconds: float) -> Metrics:
    record = Record()
    threads = Threads([(PERIOD, update) for update in ring_updates(n, record)])
    window = Window()
    threads.start()
    window.start()
    time.sleep(max(0.0, threads.origin + seconds + GRACE - time.perf_counter()))
    window.stop()
    threads.stop(join=False)
    return fleet_metrics(
        record.snapshot(), threads.origin, n, seconds, cpu_seconds=window.cpu, wall_seconds=window.wall
    )


def echo(seconds: float) -> Metrics:
    return echo_on(Threads, seconds)


def idle(seconds: float) -> Metrics:
    return idle_on(Threads, seconds)
