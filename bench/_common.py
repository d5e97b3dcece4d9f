"""What every system's workloads share: the constants, the schedule arithmetic and the measures.

Every system records the same two numbers for each update, in the update itself: when it
started (``time.perf_counter()`` at the top of the hook or task body) and when it was due
(the k-th update of a node is due ``k × PERIOD`` after the run's start). The summaries
below turn them into the figures of the table in the same way for every system.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

PERIOD = 0.01  # the period of every node of the fleet and of the idle node (100 Hz)
SIZE = 16  # W is SIZE × SIZE, x and y have SIZE elements
GRACE = 2 * PERIOD  # a fleet run stops this long after its last counted due time
ECHO_PERIOD = 0.001  # the echo node's period (1 kHz)
DISPATCH_PERIOD = 1e-6  # "no wait": every node is always due
VIRTUAL_PERIOD = 0.001  # the dispatch nodes' period under Mujou's virtual timer
TRIGGER_PERIOD = 0.001  # trigger-latency: the sender sends every millisecond
CHAIN_LENGTH = 10  # chain-10: the triggered nodes after the periodic source
CHAIN_PERIOD = 0.002  # chain-10: the source sends every 2 ms
WARM_UP = 0.2  # the events of the first 0.2 s of the trigger workloads are not counted
CROSS_SIZES = (256, 65536, 1 << 20)  # cross-process: the message sizes, in bytes
CROSS_PERIOD = 0.001  # cross-process: the sender sends every millisecond
PYTHON_STEPS = 5600  # fleet-processes: pure-Python steps per update, about 200 µs here
FLEET_PROCESSES_N = 8  # fleet-processes: the planners in the ring

Metrics = dict[str, Any]
Update = Callable[[float], None]  # a baseline's update, called with its due time (from the origin)


def next_slot(slot: int, period: float, start: float) -> int:
    """The slot after ``slot`` for an update that started at ``start`` (seconds from the origin).

    Fixed rate with skipping, as Mujou's ``sched.skip``: the next slot is the first one due at
    or after ``start``. Every system uses this, so all of them skip the same way.
    """
    following = slot + 1
    if following * period >= start:
        return following
    first = max(following, math.ceil(start / period))
    while first * period < start:
        first += 1
    return first


def setup_torch() -> None:
    """One torch thread per compute thread, as Mujou asks of its users."""
    import torch

    torch.set_num_threads(1)


def weights(n: int) -> list[Any]:
    """One seeded SIZE × SIZE weight matrix per node (scaled so tanh does not saturate)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    scale = 1.0 / math.sqrt(SIZE)
    return [torch.randn(SIZE, SIZE, generator=generator) * scale for _ in range(n)]


def zeros() -> Any:
    """The input of a node before its source sent anything."""
    import torch

    return torch.zeros(SIZE)


@dataclass
class Record:
    """The start (perf_counter seconds) and due time (seconds from the origin) of each update."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    dues: array[float] = field(default_factory=lambda: array("d"))

    def snapshot(self) -> Record:
        """A copy of the records so far, while updates may still append (start, then due)."""
        dues = self.dues[:]
        return Record(self.starts[: len(dues)], dues)


def percentile(ordered: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of an ascending list, nearest rank; NaN when it is empty."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def fleet_metrics(
    record: Record, origin: float, n: int, seconds: float, *, cpu_seconds: float, wall_seconds: float
) -> Metrics:
    """Share of the updates due in (0, seconds] that started by ``seconds + GRACE``, and their lateness.

    ``origin`` is the run's start on the perf_counter clock; a node's k-th update is due at
    ``origin + k × PERIOD``.
    """
    due_total = n * math.floor(seconds / PERIOD + 1e-9)
    last_start = origin + seconds + GRACE
    limit = seconds + 1e-9
    lateness = sorted(
        start - origin - due
        for start, due in zip(record.starts, record.dues, strict=True)
        if due <= limit and start <= last_start
    )
    return {
        "n": n,
        "seconds": seconds,
        "due": due_total,
        "made": len(lateness),
        "share": len(lateness) / due_total,
        "lateness_p50_ms": 1e3 * percentile(lateness, 0.50),
        "lateness_p99_ms": 1e3 * percentile(lateness, 0.99),
        "lateness_max_ms": 1e3 * (lateness[-1] if lateness else math.nan),
        "cpu_percent": 100.0 * cpu_seconds / wall_seconds,
    }


def echo_phases() -> random.Random:
    """When, in the echo node's period, the host writes: the same random phases in every system.

    Without them, the host would write just after each echo, and every round trip would
    last one period whatever the system.
    """
    return random.Random(0)


def latency_metrics(latencies: list[float]) -> Metrics:
    """Round trips per second of waiting (the inverse of the mean latency) and the percentiles."""
    ordered = sorted(latencies)
    return {
        "round_trips": len(ordered),
        "round_trips_per_second": len(ordered) / sum(ordered) if ordered else 0.0,
        "latency_p50_ms": 1e3 * percentile(ordered, 0.50),
        "latency_p99_ms": 1e3 * percentile(ordered, 0.99),
    }


def idle_metrics(cpu_seconds: float, wall_seconds: float, updates: int) -> Metrics:
    """The process's CPU time over the window, as a share of one core."""
    return {
        "cpu_percent": 100.0 * cpu_seconds / wall_seconds,
        "updates_per_second": updates / wall_seconds,
        "wall_seconds": wall_seconds,
    }


class Window:
    """Wall and process CPU time between ``start()`` and ``stop()``."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self._wall0 = 0.0
        self._cpu0 = 0.0

    def start(self) -> None:
        self._wall0 = time.perf_counter()
        self._cpu0 = time.process_time()

    def stop(self) -> None:
        self.cpu = time.process_time() - self._cpu0
        self.wall = time.perf_counter() - self._wall0


def ring_updates(n: int, record: Record) -> list[Update]:
    """The baselines' fleet: update i computes ``tanh(W_i @ x)`` on the latest output of node i - 1.

    Each records its start and due time first, as Mujou's ``RingNode`` does.
    """
    import torch

    starts, dues = record.starts, record.dues
    zero = zeros()
    latest: list[Any] = [None] * n
    perf_counter, tanh = time.perf_counter, torch.tanh

    def ring_update(i: int, w: Any) -> Update:
        def update(due: float) -> None:
            starts.append(perf_counter())
            dues.append(due)
            x = latest[i - 1]
            if x is None:
                x = zero
            latest[i] = tanh(w @ x)

        return update

    return [ring_update(i, w) for i, w in enumerate(weights(n))]


class Counter:
    """Counts empty updates (the dispatch and idle workloads)."""

    def __init__(self) -> None:
        self.count = 0

    def update(self, due: float) -> None:
        self.count += 1


class EchoHost:
    """The echo workload for systems whose host is a plain thread (all but Mujou and ezmsg).

    The host puts k in ``box`` (a reference replaced, as Mujou's ``run.write``), the echo
    node's update (``update``, at ECHO_PERIOD) hands each new message back with ``deliver``,
    and the host, waiting on a condition, measures the round trip.
    """

    def __init__(self) -> None:
        import torch

        self.box: Any = torch.zeros(1)
        self._last: Any = None
        self._back: Any = None
        self._arrived = threading.Condition()

    def update(self, due: float) -> None:
        """The echo node's update: send back what is new."""
        message = self.box
        if message is not self._last:
            self._last = message
            self.deliver(message)

    def deliver(self, message: Any) -> None:
        """A message is back at the host."""
        with self._arrived:
            self._back = message
            self._arrived.notify_all()

    def _has(self, value: float) -> bool:
        return self._back is not None and float(self._back.item()) == value

    def round_trips(self, seconds: float) -> Metrics:
        """Write, wait for the echo, again, for ``seconds``."""
        import torch

        with self._arrived:
            if not self._arrived.wait_for(lambda: self._back is not None, timeout=30.0):
                raise TimeoutError("the echo node did not start within 30 s")
        latencies: list[float] = []
        phases = echo_phases()
        began = time.perf_counter()
        k = 0
        while time.perf_counter() - began < seconds:
            k += 1
            value = float(k)
            time.sleep(phases.random() * ECHO_PERIOD)  # a random phase of the echo's period
            sent = time.perf_counter()
            self.box = torch.full((1,), value)
            self.wait(value)
            latencies.append(time.perf_counter() - sent)
        return latency_metrics(latencies)

    def wait(self, value: float) -> None:
        """Until the echo has handed ``value`` back (1 s at most)."""
        with self._arrived:
            if not self._arrived.wait_for(partial(self._has, value), timeout=1.0):
                raise TimeoutError("the echo did not come back within 1 s")


def round_trips(write: Callable[[float], None], wait: Callable[[float], None], seconds: float) -> Metrics:
    """The triggered echo workload's host loop, for every system whose host is a plain thread.

    ``write(v)`` hands the echo a new message holding ``v`` (which wakes it), ``wait(v)``
    returns once the echo has sent ``v`` back. Between round trips the host waits a random
    fraction of ECHO_PERIOD (the seeded phases of the periodic echo), so that each write finds
    the echo idle. The round trips of the first WARM_UP seconds are not counted.
    """
    latencies: list[float] = []
    phases = echo_phases()
    perf_counter = time.perf_counter
    began = perf_counter()
    k = 0
    while (elapsed := perf_counter() - began) < WARM_UP + seconds:
        k += 1
        value = float(k)
        time.sleep(phases.random() * ECHO_PERIOD)
        sent = perf_counter()
        write(value)
        wait(value)
        if elapsed >= WARM_UP:
            latencies.append(perf_counter() - sent)
    return latency_metrics(latencies)


@dataclass
class Events:
    """Sends and triggered starts (perf_counter seconds): the trigger-latency and chain workloads.

    The k-th send puts ``k`` in its message and appends its time to ``sent`` just before the
    send; the triggered node appends its start first thing in its update, and then the ``k``
    of the message it read to ``keys``.
    """

    sent: array[float] = field(default_factory=lambda: array("d"))
    starts: array[float] = field(default_factory=lambda: array("d"))
    keys: array[int] = field(default_factory=lambda: array("q"))

    def metrics(self) -> Metrics:
        """The send-to-start latencies of the sends after WARM_UP, in µs.

        ``missed`` counts those sends (but the last 50 ms of them) that no start saw: a
        trigger lost or coalesced. A send seen by several starts counts its first.
        """
        sent, count = self.sent, min(len(self.starts), len(self.keys))
        if not sent:
            return {"events": 0, "missed": 0, **micro([])}
        first, last = sent[0] + WARM_UP, sent[-1] - 0.05
        seen: set[int] = set()
        latencies: list[float] = []
        for start, key in zip(self.starts[:count], self.keys[:count], strict=True):
            if key in seen or not 0 <= key < len(sent):
                continue
            seen.add(key)
            if sent[key] >= first:
                latencies.append(start - sent[key])
        expected = [k for k, t in enumerate(sent) if first <= t <= last]
        missed = sum(1 for k in expected if k not in seen)
        return {"events": len(latencies), "missed": missed, **micro(latencies)}


def micro(latencies: list[float]) -> Metrics:
    ordered = sorted(latencies)
    return {
        "latency_p50_us": 1e6 * percentile(ordered, 0.50),
        "latency_p99_us": 1e6 * percentile(ordered, 0.99),
        "latency_max_us": 1e6 * (ordered[-1] if ordered else math.nan),
    }


def python_work(x: float, steps: int) -> float:
    """A Python-bound update: ``steps`` of plain float arithmetic, holding the GIL throughout."""
    for _ in range(steps):
        x = x * 0.999 + 0.001
    return x


def stamped_messages(elements: int, seconds: float, period: float) -> Iterator[Any]:
    """The cross-process senders' messages: a fresh float64 tensor of ``elements`` every
    ``period`` for ``seconds``, [0] the monotonic time just before it is yielded (to be
    sent at once), [1] its number."""
    import torch

    began = time.monotonic()
    k = 0
    while (due := began + k * period) - began <= seconds:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        message = torch.empty(elements, dtype=torch.float64)
        message[1] = k
        message[0] = time.monotonic()
        yield message
        k += 1


def cross_metrics(sent: Sequence[float], read: Sequence[float], keys: Sequence[int], nbytes: int) -> Metrics:
    """Send-to-read latencies (µs) of the messages read after WARM_UP, from the monotonic
    times carried in them (``sent``) and taken by the reader (``read``).

    ``missed`` counts the numbers (``keys``) between the first and the last message read
    that no read saw: coalesced, the reader having been late.
    """
    if not sent:
        return {"bytes": nbytes, "events": 0, "missed": 0, **micro([])}
    first = sent[0] + WARM_UP
    latencies = [r - s for s, r in zip(sent, read, strict=True) if s >= first]
    counted = [k for s, k in zip(sent, keys, strict=True) if s >= first]
    missed = (counted[-1] - counted[0] + 1 - len(set(counted))) if counted else 0
    return {"bytes": nbytes, "events": len(latencies), "missed": missed, **micro(latencies)}


def open_fds(pid: int) -> int:
    """How many descriptors process ``pid`` has open (Linux: /proc/PID/fd)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def shm_segments() -> int:
    """How many named shared-memory segments exist (/dev/shm), of every process."""
    try:
        return len(os.listdir("/dev/shm"))
    except OSError:
        return 0


class Runner(Protocol):
    """A thread-based system running (period, update) pairs: the heap pool, a thread per node."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def echo_on(make: Callable[[list[tuple[float, Update]]], Runner], seconds: float) -> Metrics:
    """The echo workload on a thread-based system that ``make`` builds from its nodes."""
    host = EchoHost()
    runner = make([(ECHO_PERIOD, host.update)])
    runner.start()
    try:
        return host.round_trips(seconds)
    finally:
        runner.stop()


def idle_on(make: Callable[[list[tuple[float, Update]]], Runner], seconds: float) -> Metrics:
    """The idle workload (one node at PERIOD) on a thread-based system that ``make`` builds."""
    counter = Counter()
    runner = make([(PERIOD, counter.update)])
    runner.start()
    time.sleep(0.2)
    done = counter.count
    window = Window()
    window.start()
    time.sleep(seconds)
    window.stop()
    runner.stop()
    return idle_metrics(window.cpu, window.wall, counter.count - done)


START_STOP_PROCESSES = 2  # the processes each run of start-stop-2p starts and stops


def start_stop_metrics(starts: Sequence[float], stops: Sequence[float]) -> Metrics:
    """The start-stop-2p figures of ``runs`` starts and stops (seconds each): p50 and the
    largest, and the first start apart (Mujou's includes starting its fork server)."""
    ordered_starts, ordered_stops = sorted(starts), sorted(stops)
    return {
        "runs": len(starts),
        "start_first_s": starts[0],
        "start_p50_s": percentile(ordered_starts, 0.5),
        "start_max_s": ordered_starts[-1],
        "stop_p50_s": percentile(ordered_stops, 0.5),
        "stop_max_s": ordered_stops[-1],
    }
