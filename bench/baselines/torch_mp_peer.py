"""torch.multiprocessing, the usual way to hand tensors from one Python process to another.

- ``cross_process``: a spawned sender process puts a fresh float64 tensor in a
  ``torch.multiprocessing.Queue`` every CROSS_PERIOD, or ``period`` (the time just before
  ``put`` in [0], the number in [1]); this process gets them. The queue moves each tensor's storage into
  shared memory and passes its file descriptor (torch's default ``file_descriptor``
  strategy), the receiver fetching it from the sender.
- ``fleet_processes``: the planners' updates with no framework at all, back to back in one
  process, then half of them in each of two processes: the ceiling of what two processes
  give on this machine (no messages, no scheduling).
"""

from __future__ import annotations

import queue
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from .._common import (
    CROSS_PERIOD,
    FLEET_PROCESSES_N,
    PYTHON_STEPS,
    WARM_UP,
    Metrics,
    cross_metrics,
    python_work,
    stamped_messages,
)

READY_TIMEOUT = 60.0  # seconds for a spawned process to import torch and start


def _send(q: Any, ready: Any, nbytes: int, seconds: float, period: float) -> None:
    """The sender process: a fresh tensor every ``period`` for ``seconds``, then None."""
    torch.set_num_threads(1)
    ready.put(True)
    for message in stamped_messages(max(2, nbytes // 8), seconds, period):
        q.put(message)
    q.put(None)
    q.close()
    q.join_thread()  # the feeder thread has handed every message to the pipe
    ready.get(timeout=READY_TIMEOUT)  # keep the descriptors until the reader took them


def cross_process(nbytes: int, seconds: float, period: float = CROSS_PERIOD) -> Metrics:
    """A message every ``period`` from a spawned process to this one: send to ``get``, in µs."""
    context = mp.get_context("spawn")
    q = context.Queue()
    ready = context.Queue()
    sender = context.Process(target=_send, args=(q, ready, nbytes, WARM_UP + seconds, period), daemon=True)
    sender.start()
    ready.get(timeout=READY_TIMEOUT)
    sent, read, keys = [], [], []
    monotonic = time.monotonic
    while True:
        try:
            message = q.get(timeout=5.0)
        except queue.Empty:
            break
        now = monotonic()
        if message is None:
            break
        read.append(now)
        sent.append(float(message[0]))
        keys.append(int(message[1]))
        del message
    ready.put(True)
    sender.join(10.0)
    return cross_metrics(sent, read, keys, nbytes)


def _updates(n: int, seconds: float, counts: Any, index: int, barrier: Any = None) -> None:
    """Run ``n`` planners' updates back to back for ``seconds``; their rate into ``counts[index]``."""
    torch.set_num_threads(1)
    if barrier is not None:  # both processes measure the same window
        barrier.wait(READY_TIMEOUT)
    values = [0.5] * n
    done = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for i in range(n):
            values[i] = python_work(values[i - 1], PYTHON_STEPS)
        done += n
    counts[index] = done / (time.perf_counter() - began)


def fleet_processes(seconds: float, n: int = FLEET_PROCESSES_N) -> Metrics:
    """Updates per second, back to back: ``n`` in this process, then ``n / 2`` in each of two."""
    context = mp.get_context("spawn")
    one = context.Array("d", 1)
    _updates(n, seconds, one, 0)
    two = context.Array("d", 2)
    barrier = context.Barrier(2)
    workers = [
        context.Process(target=_updates, args=(n // 2, seconds, two, i, barrier), daemon=True)
        for i in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(seconds + READY_TIMEOUT)
    total = two[0] + two[1]
    return {
        "n": n,
        "one_process_updates_per_second": one[0],
        "two_processes_updates_per_second": total,
        "ratio": total / one[0],
        "update_us_one_process": 1e6 / one[0],
    }
