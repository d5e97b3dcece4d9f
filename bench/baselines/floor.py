"""The machine's floor: what each hand-off costs here with no framework, no node and no check.

Not a peer to choose instead of Mujou: the least any library can do on this machine, measured
in the same run, so that a target can be read against it.

- ``echo_triggered``: the host sets a ``threading.Event`` that a thread waits on; the thread
  hands the message back and sets another that the host waits on. Two wake-ups of a thread, the
  least a host round trip through a node on another thread takes; the same host loop as the
  peers (``round_trips``: a random fraction of 1 ms between round trips, so each wake-up
  finds the other thread asleep), and the same message: the host makes a one-element tensor
  of the value (``torch.full``) and reads the echo's back (``item``), as the peers' hosts do,
  so that the workload's own two torch calls (about 10 µs here) are on both sides.
- ``cross_process``: a spawned sender copies its message into one preallocated shared-memory
  tensor and writes one byte to a pipe; this process, blocked in ``os.read`` of the pipe,
  copies the slot out and takes the time. No ring, no second slot, no record, no thread
  hand-off: the issue's "preallocated shared-memory slot with a pipe wake-up". Safe here only
  because the sender waits a period (1 ms) before it writes the slot again.
- ``tags_virtual``: two processes in lockstep, one tag at a time: each makes its update's
  tensor (the count plus the other's latest, as the tags workload's nodes do), sends its value
  to the other through a pipe, and waits for the other's. One pipe round trip per tag: the
  barrier that a tag across two processes needs. Its "one process" figure: both updates
  back to back, with no pipe.
- ``start_stop``: the reference of start-stop-2p: a bare ``multiprocessing`` spawn of two
  processes that import torch (this module) and reply once; start until both replied, stop from
  asking them to exit until both are joined.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from .._common import (
    CROSS_PERIOD,
    START_STOP_PROCESSES,
    WARM_UP,
    Metrics,
    cross_metrics,
    round_trips,
    stamped_messages,
    start_stop_metrics,
)

READY_TIMEOUT = 60.0  # seconds for a spawned process to import torch and start
_VALUE = struct.Struct("q")


def echo_triggered(seconds: float) -> Metrics:
    """The host wakes a thread with an Event; the thread wakes the host back with another."""
    request, reply = threading.Event(), threading.Event()
    box: list[torch.Tensor | None] = [torch.zeros(1)]
    back = [torch.zeros(1)]

    def echo() -> None:
        while True:
            request.wait()
            request.clear()
            message = box[0]
            if message is None:
                return
            back[0] = message
            reply.set()

    def write(value: float) -> None:
        box[0] = torch.full((1,), value)
        request.set()

    def wait(value: float) -> None:
        if not reply.wait(1.0):
            raise TimeoutError("the echo thread did not answer within 1 s")
        reply.clear()
        if float(back[0].item()) != value:
            raise RuntimeError(f"the echo thread answered {back[0]}, not {value}")

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    try:
        return round_trips(write, wait, seconds)
    finally:
        box[0] = None
        request.set()
        thread.join(5.0)


def _send(slot: torch.Tensor, wake: Any, ready: Any, seconds: float, period: float) -> None:
    """The sender process: every ``period``, a fresh message copied into ``slot``, then a byte."""
    torch.set_num_threads(1)
    fd = wake.fileno()
    ready.put(True)
    for message in stamped_messages(slot.numel(), seconds, period):
        slot.copy_(message)
        os.write(fd, b"m")
    os.write(fd, b"e")


def cross_process(nbytes: int, seconds: float, period: float = CROSS_PERIOD) -> Metrics:
    """A message every ``period`` from a spawned process: its send to this process's copy, in µs."""
    context = mp.get_context("spawn")
    slot = torch.zeros(max(2, nbytes // 8), dtype=torch.float64)
    slot.share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    reading, wake = context.Pipe(duplex=False)
    ready = context.Queue()
    sender = context.Process(target=_send, args=(slot, wake, ready, WARM_UP + seconds, period), daemon=True)
    sender.start()
    wake.close()
    ready.get(timeout=READY_TIMEOUT)
    fd = reading.fileno()
    sent, read, keys = [], [], []
    monotonic = time.monotonic
    while os.read(fd, 1) == b"m":
        message = slot.clone()
        now = monotonic()
        read.append(now)
        sent.append(float(message[0]))
        keys.append(int(message[1]))
    sender.join(10.0)
    return cross_metrics(sent, read, keys, nbytes)


def _volley(count: int, other: int) -> int:
    """One update of the tags workload's node: a tensor of its count plus the other's latest."""
    return int(torch.tensor(count + other))


def tag_rate(tag: Callable[[], None], seconds: float) -> float:
    """Calls of ``tag`` per second over ``seconds``, after ``WARM_UP`` seconds of them."""
    began = time.perf_counter()
    while time.perf_counter() - began < WARM_UP:
        tag()
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        tag()
        done += 1
    return done / (time.perf_counter() - began)


def _partner(inbound: Any, outbound: Any) -> None:
    """The other process of ``tags_virtual``: one update per value it gets, its value back."""
    torch.set_num_threads(1)
    fd_in, fd_out = inbound.fileno(), outbound.fileno()
    count = 0
    while data := os.read(fd_in, _VALUE.size):
        count += 1
        os.write(fd_out, _VALUE.pack(_volley(count, _VALUE.unpack(data)[0])))


def tags_virtual(seconds: float) -> Metrics:
    """Tags per second of two processes in lockstep, one pipe round trip per tag."""
    context = mp.get_context("spawn")
    partner_in, to_partner = context.Pipe(duplex=False)
    from_partner, partner_out = context.Pipe(duplex=False)
    partner = context.Process(target=_partner, args=(partner_in, partner_out), daemon=True)
    partner.start()
    partner_in.close()
    partner_out.close()
    fd_out, fd_in = to_partner.fileno(), from_partner.fileno()
    count, theirs = 0, 0

    def tag() -> None:
        nonlocal count, theirs
        count += 1
        mine = _volley(count, theirs)
        os.write(fd_out, _VALUE.pack(mine))
        theirs = _VALUE.unpack(os.read(fd_in, _VALUE.size))[0]

    tag()  # the partner has started
    two = tag_rate(tag, seconds)
    to_partner.close()
    partner.join(10.0)
    return {"two_processes_tags_per_second": two, "one_process_tags_per_second": _one_process(seconds)}


def _one_process(seconds: float) -> float:
    """Tags per second of both updates back to back in one process: no pipe, no barrier."""
    count, mine, theirs = 0, 0, 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        count += 1
        mine, theirs = _volley(count, theirs), _volley(count, mine)
    return count / (time.perf_counter() - began)


def _reply_once(connection: Any) -> None:
    """Reply once imported (torch with this module), then wait to be told to exit."""
    connection.send("ready")
    connection.recv()


def start_stop(runs: int) -> Metrics:
    """``runs`` times: spawn the processes, wait for each one's reply; tell them to exit, join them."""
    context = mp.get_context("spawn")
    starts: list[float] = []
    stops: list[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        started = []
        for _ in range(START_STOP_PROCESSES):
            ours, theirs = context.Pipe()
            process = context.Process(target=_reply_once, args=(theirs,), daemon=True)
            process.start()
            theirs.close()
            started.append((process, ours))
        for _, ours in started:
            if not ours.poll(READY_TIMEOUT):
                raise RuntimeError(f"a spawned process did not reply within {READY_TIMEOUT} s")
            ours.recv()
        starts.append(time.perf_counter() - began)
        time.sleep(0.05)
        began = time.perf_counter()
        for _, ours in started:
            ours.send("exit")
        for process, ours in started:
            process.join(READY_TIMEOUT)
            ours.close()
        stops.append(time.perf_counter() - began)
    return start_stop_metrics(starts, stops)
