"""Mujou's side of the workloads of processes (``mujou.run(net, processes=...)``), public API only.

The node classes are at the top level of this module, which every process of a run imports
(proc.copied). Each function runs the whole case in the measuring process: the host's nodes
there, the placed ones in the processes ``mujou.run`` spawns.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from array import array
from typing import Any, ClassVar

import torch

import mujou
from mujou import Input, Net, Node, Output

from ._common import (
    CROSS_PERIOD,
    DISPATCH_PERIOD,
    FLEET_PROCESSES_N,
    PYTHON_STEPS,
    START_STOP_PROCESSES,
    VIRTUAL_PERIOD,
    WARM_UP,
    Metrics,
    cross_metrics,
    open_fds,
    python_work,
    shm_segments,
    start_stop_metrics,
)

# -- cross-process: one sender, one triggered reader in another process -----------------------


class Stamper(Node):
    """Sends a fresh float64 tensor of ``nbytes`` every CROSS_PERIOD: [0] the monotonic time
    just before the send, [1] the message's number. With ``resize_every``, every other run of
    that many messages is twice as long (another layout: a new ring, proc.transport)."""

    y = Output()

    def __init__(self, nbytes: int, period: float = CROSS_PERIOD, resize_every: int = 0) -> None:
        super().__init__(period=period, seed=0)
        self.elements = max(2, nbytes // 8)
        self.resize_every = resize_every
        self.count = 0

    def on_update(self, dt: float) -> None:
        longer = self.resize_every and (self.count // self.resize_every) % 2
        message = torch.empty(2 * self.elements if longer else self.elements, dtype=torch.float64)
        message[1] = self.count
        self.count += 1
        message[0] = time.monotonic()
        self.y.send(message, copy=False)  # a new tensor the node does not keep


class Stamped(Node):
    """Triggered by its input: records the monotonic time once it has read the message, and
    the message's send time and number."""

    x = Input()
    state_exclude: ClassVar[tuple[str, ...]] = ("read_at", "sent_at", "keys")  # records, not state

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.read_at = array("d")
        self.sent_at = array("d")
        self.keys = array("q")

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        now = time.monotonic()
        if message is None:
            return
        self.read_at.append(now)
        self.sent_at.append(float(message[0]))
        self.keys.append(int(message[1]))


class Handoff(Net):
    def __init__(self, nbytes: int, period: float = CROSS_PERIOD, resize_every: int = 0) -> None:
        super().__init__()
        self.sender = Stamper(nbytes, period, resize_every)
        self.reader = Stamped()
        self.connect(self.sender.y, self.reader.x)


def cross_process(nbytes: int, seconds: float) -> Metrics:
    """The sender in a process of its own, the reader in the host's: send to read, in µs."""
    net = Handoff(nbytes)
    with mujou.run(net, workers=1, processes={"sender": net.sender}) as run:
        run.sleep(WARM_UP + seconds)
    reader = net.reader
    return cross_metrics(reader.sent_at, reader.read_at, reader.keys, nbytes)


# -- fleet-processes: Python-bound nodes in one process, and over two -------------------------


class Planner(Node):
    """Always due; each update does PYTHON_STEPS of pure-Python arithmetic on the latest
    scalar of the previous node of the ring, and sends the result."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=DISPATCH_PERIOD, seed=0)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        value = python_work(0.5 if x is None else float(x), PYTHON_STEPS)
        self.y.send(torch.tensor(value), copy=False)


class Planners(Net):
    """A ring of ``n`` planners, node i reading node i - 1."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.planners = mujou.NodeList(Planner() for _ in range(n))
        for i, node in enumerate(self.planners):
            self.connect(self.planners[i - 1].y, node.x)


def _updates(run: mujou.Run) -> int:
    return sum(stats.updates for stats in run.stats().nodes.values())


def _rate(net: Planners, seconds: float, processes: dict[str, Any] | None) -> float:
    with mujou.run(net, workers=1, processes=processes) as run:
        run.sleep(WARM_UP)
        done = _updates(run)
        began = time.perf_counter()
        run.sleep(seconds)
        done = _updates(run) - done
        wall = time.perf_counter() - began
    return done / wall


def fleet_processes(seconds: float, n: int = FLEET_PROCESSES_N) -> Metrics:
    """Updates per second of the ring in the host's process, then split in two halves: the
    first in the host's process, the second in a process of its own (one worker each)."""
    one = _rate(Planners(n), seconds, None)
    net = Planners(n)
    two = _rate(net, seconds, {"half": list(net.planners)[n // 2 :]})
    return {
        "n": n,
        "one_process_updates_per_second": one,
        "two_processes_updates_per_second": two,
        "ratio": two / one,
        "update_us_one_process": 1e6 / one,
    }


# -- tags-virtual-2p: virtual-timer tags with a node in each process --------------------------


class Volley(Node):
    """Periodic (VIRTUAL_PERIOD): sends its count plus the latest it read from the other."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=VIRTUAL_PERIOD, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        self.count += 1
        self.y.send(torch.tensor(self.count + (0 if x is None else int(x))), copy=False)


class Rally(Net):
    def __init__(self) -> None:
        super().__init__()
        self.ping = Volley()
        self.pong = Volley()
        self.connect(self.ping.y, self.pong.x)
        self.connect(self.pong.y, self.ping.x)


def rally_tags(seconds: float, net: Rally, processes: Any, sleep: float = 0.01) -> tuple[float, int]:
    """Tags per second of wall time of ``net`` run with ``processes=`` in ``run.sleep(sleep)``
    calls, and ping's last count."""
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer(), processes=processes) as run:
        run.sleep(0.02)  # warm up
        done = run.stats().nodes["ping"].updates
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            run.sleep(sleep)
        wall = time.perf_counter() - began
        done = run.stats().nodes["ping"].updates - done
        final = run.read(net.ping.y)
    if final is None:
        raise RuntimeError("ping sent nothing")
    return done / wall, int(final)


def tags_virtual(seconds: float) -> Metrics:
    """Tags per second of wall time: the net in one process, then ``pong`` in a process of its own."""
    one, _ = rally_tags(seconds, Rally(), None)
    net = Rally()
    two, _ = rally_tags(seconds, net, {"pong": net.pong})
    return {"two_processes_tags_per_second": two, "one_process_tags_per_second": one, "ratio": two / one}


# -- soak: the hand-off for a while, with the descriptors and segments of every process ---------


def _children_fds() -> int:
    return sum(open_fds(child.pid) for child in multiprocessing.active_children() if child.pid)


def soak(seconds: float, nbytes: int = 65536, resize_every: int = 1000) -> Metrics:
    """The hand-off at 1 kHz for ``seconds``, the message's size changing every
    ``resize_every`` messages (a new ring each time, proc.transport), sampling once a second
    the open descriptors of the host and of the run's process and the segments in /dev/shm
    (the host takes the state and the stats once a second too)."""
    net = Handoff(nbytes, resize_every=resize_every)
    samples: list[tuple[int, int, int]] = []
    with mujou.run(net, workers=1, processes={"sender": net.sender}) as run:
        run.sleep(1.0)
        began = time.perf_counter()
        while (elapsed := time.perf_counter() - began) < seconds:
            samples.append((open_fds(os.getpid()), _children_fds(), shm_segments()))
            run.sleep(min(1.0, max(0.0, seconds - elapsed)))
            run.state_dict()  # the host's calls that cross, once a second
            run.stats()
        samples.append((open_fds(os.getpid()), _children_fds(), shm_segments()))
        sent = run.stats().nodes["sender"].updates
    first, last = samples[0], samples[-1]
    return {
        "seconds": seconds,
        "messages": sent,
        "host_fds_first": first[0],
        "host_fds_last": last[0],
        "host_fds_max": max(s[0] for s in samples),
        "child_fds_first": first[1],
        "child_fds_last": last[1],
        "child_fds_max": max(s[1] for s in samples),
        "shm_first": first[2],
        "shm_last": last[2],
        "shm_max": max(s[2] for s in samples),
    }


# -- start-stop-2p: a run over two processes, started and stopped again and again --------------


class Idle(Node):
    """Periodic (10 ms), sends a small tensor to the next: a node with nothing to compute."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.zeros(1), copy=False)


class Ring(Net):
    """``START_STOP_PROCESSES`` idle nodes in a ring, each to be placed in a process of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes_ = mujou.NodeList(Idle() for _ in range(START_STOP_PROCESSES))
        for i, node in enumerate(self.nodes_):
            self.connect(self.nodes_[i - 1].y, node.x)


def start_stop(runs: int) -> Metrics:
    """``runs`` times: ``mujou.run`` with each node in a process of its own (start: until it
    returns, the timers going), 50 ms of running, then ``run.stop()`` (stop: until it returns,
    every process exited)."""
    starts: list[float] = []
    stops: list[float] = []
    for _ in range(runs):
        net = Ring()
        processes = {f"p{i}": node for i, node in enumerate(net.nodes_)}
        began = time.perf_counter()
        run = mujou.run(net, workers=1, processes=processes)
        starts.append(time.perf_counter() - began)
        run.sleep(0.05)
        began = time.perf_counter()
        run.stop()
        stops.append(time.perf_counter() - began)
        if multiprocessing.active_children():
            raise RuntimeError(f"processes left after stop(): {multiprocessing.active_children()}")
    return start_stop_metrics(starts, stops)


def describe() -> dict[str, Any]:
    return {"mujou": mujou.__version__}
