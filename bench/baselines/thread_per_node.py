"""A thread per node: each thread sleeps (time.sleep) until its next due time (fixed rate, skipping).

In the trigger workloads a triggered node is a bare thread waiting on a ``threading.Condition``
(:class:`Box`): the event-driven way to write it with threads.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from .._common import (
    CHAIN_LENGTH,
    CHAIN_PERIOD,
    GRACE,
    PERIOD,
    TRIGGER_PERIOD,
    WARM_UP,
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


# -- the trigger workloads -------------------------------------------------------------------


class Box:
    """The latest message for a triggered thread, and the condition it waits on (latest-value)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value: Any = None
        self._stopped = False

    def put(self, value: Any) -> None:
        with self._cond:
            self._value = value
            self._cond.notify()

    def take(self) -> Any:
        """The next message, waiting for it; None once stopped."""
        with self._cond:
            while self._value is None:
                if self._stopped:
                    return None
                self._cond.wait()
            value, self._value = self._value, None
            return value

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


def _forward(box: Box, to: Box) -> None:
    """A triggered node in the middle of a chain: hands each message on."""
    while (value := box.take()) is not None:
        to.put(value)


def _record(box: Box, events: Events) -> None:
    """The last triggered node: records its start, then the message's k."""
    perf_counter, starts, keys = time.perf_counter, events.starts, events.keys
    while (value := box.take()) is not None:
        starts.append(perf_counter())
        keys.append(value)


def _send(box: Box, events: Events, period: float, seconds: float) -> None:
    """The sender, in this thread: k into ``box`` every ``period`` (fixed rate, skipping)."""
    perf_counter, sleep, sent = time.perf_counter, time.sleep, events.sent
    origin = perf_counter()
    slot = 1
    while slot * period <= WARM_UP + seconds:
        delay = origin + slot * period - perf_counter()
        if delay > 0:
            sleep(delay)
        start = perf_counter() - origin
        sent.append(perf_counter())
        box.put(len(sent) - 1)
        slot = next_slot(slot, period, start)


def _chain(length: int, period: float, seconds: float) -> Metrics:
    events = Events()
    boxes = [Box() for _ in range(length)]
    threads = [
        threading.Thread(target=_forward, args=(boxes[i], boxes[i + 1]), daemon=True)
        for i in range(length - 1)
    ]
    threads.append(threading.Thread(target=_record, args=(boxes[-1], events), daemon=True))
    for thread in threads:
        thread.start()
    _send(boxes[0], events, period, seconds)
    time.sleep(0.05)
    for box in boxes:
        box.stop()
    for thread in threads:
        thread.join()
    return events.metrics()


def trigger_latency(seconds: float) -> Metrics:
    """The sender (this thread) puts k in a box; the reader thread waits on its condition."""
    return _chain(1, TRIGGER_PERIOD, seconds)


def chain(seconds: float) -> Metrics:
    """CHAIN_LENGTH threads, each waiting on its box and putting the message in the next one."""
    return _chain(CHAIN_LENGTH, CHAIN_PERIOD, seconds)


def echo_triggered(seconds: float) -> Metrics:
    """The echo is a thread waiting on a condition for the host's next message."""
    host, box = EchoHost(), Box()

    def echo() -> None:
        while (message := box.take()) is not None:
            host.deliver(message)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    try:
        return round_trips(lambda value: box.put(torch.full((1,), value)), host.wait, seconds)
    finally:
        box.stop()
        thread.join()
