"""Instructions and cache misses from a send to the start of the update it triggers, under
callgrind: bench's trigger-latency net (a periodic sender, a node triggered by it, one
worker), or the plain pool's (``--pool``), with a slow sender so that the triggered update
runs before the sender is due again.

    valgrind --tool=callgrind --instr-atstart=no --cache-sim=yes --branch-sim=yes \\
      --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,8,64 --callgrind-out-file=OUT/cg.%p \\
      python -m bench.trigger_callgrind [--pool | --send] [SENDS]

(``bench._callgrind.CACHES``: this machine's caches; ``PAGES`` for pages as lines; without
the simulators' options, the instructions alone.) The instrumentation goes on once, at the
sender's first update, and stays on; each later send is a region, from just after the
sender's time stamp (before ``send``, or the pool's ``trigger``) to the triggered hook's
first line, marked by dumps (``bench._callgrind``): the script prints the median of the
regions' counts (the first few dropped: the path's first runs) and their spread. Each
region holds the ends of the two ctypes calls that mark it, both sides alike. ``--send``:
Mujou's send alone, the region ending as it returns in the sender's hook.

The caches are emptied (``bench._callgrind``'s ``flush``, not counted) at the end of each
triggered update, as the worker goes back to wait for the sender: a stand-in for the other
work that runs on the core while the worker sleeps a millisecond in the bench. What runs
from there to the send (the wait, the wake-up, the sender's update up to its send) warms
what it touches, as it does in the bench; so the misses counted are those of the path
itself. ``FLUSH=send``: the caches emptied just before each send instead (every line the
path touches is a miss: the memory the path touches); ``FLUSH=0``: not emptied (the path
run warm, as in a loop).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable, Sized

import torch

from bench import _callgrind

# Seconds: the triggered update runs well before the sender is due again, also on a loaded
# machine (at 0.2 s and load 8, most sends counted the sender's next update as well).
SENDER_PERIOD = 1.0
LOOK = 3.037  # seconds: the host looks this often, out of step with the sender (not counted)
SKIP = 10  # the first sends' dumps, dropped: CPython 3.11 specializes a function after 8 calls
SEND_ONLY = "--send" in sys.argv  # Mujou: off as the send returns, in the sender's hook
# Where the caches are emptied: "end", at the end of each triggered update; "send", just
# before each send (the whole path cold); "0", nowhere.
FLUSH = os.environ.get("FLUSH", "end")


def _wait(starts: Sized, sends: int, sleep: Callable[[float], object]) -> None:
    """Sleep until ``sends`` triggered updates started (valgrind makes a slot's sends late)."""
    for _ in range(sends * 10):  # bounded: about 10 s a send
        if len(starts) >= sends:
            return
        sleep(LOOK)


class _Switches:
    """The helper's calls around each send: ``sending`` before it, ``started`` at the
    triggered hook's first line, ``done`` at its end: the caches emptied there."""

    def __init__(self, cg: ctypes.PyDLL) -> None:
        self.gap, self.region = cg.cg_gap, cg.cg_region
        self.instrument, self.flush = cg.cg_instrument, cg.cg_flush
        self.instrumented = False
        self.counting = False

    def sending(self) -> None:
        if not self.instrumented:  # once, a send before the first counted
            self.instrumented = True
            self.instrument()
            return
        self.counting = True
        if FLUSH == "send":
            self.flush()
        self.gap()

    def started(self) -> None:
        if self.counting:
            self.region()
            self.counting = False

    def done(self) -> None:
        if FLUSH == "end" and self.instrumented:
            self.flush()


def _mujou(sends: int, cg: _Switches) -> None:
    import mujou
    from bench import mujou_system
    from bench._common import Events

    class Sender(mujou_system.Sender):
        def on_update(self, dt: float) -> None:
            sent = self.events.sent
            message = torch.full((1,), float(len(sent)))
            sent.append(time.perf_counter())
            cg.sending()
            self.y.send(message, copy=False)
            if SEND_ONLY:
                cg.started()
                cg.done()

    class Reader(mujou_system.Reader):
        def on_update(self, dt: float) -> None:
            if not SEND_ONLY:
                cg.started()
            self.events.starts.append(time.perf_counter())
            self.messages.append(self.x.read())
            if not SEND_ONLY:
                cg.done()

    events = Events()
    net = mujou_system.Chain(Sender(SENDER_PERIOD, events), 1, Reader(events))
    with mujou.run(net, workers=1) as run:
        _wait(events.sent if SEND_ONLY else events.starts, sends, run.sleep)


def _pool(sends: int, cg: _Switches) -> None:
    from bench.baselines.heap_pool import Pool

    sent: list[float] = []
    starts: list[float] = []
    boxes: list[object] = [None]
    perf_counter = time.perf_counter
    pool: Pool

    def send(due: float) -> None:
        k = len(sent)
        sent.append(perf_counter())
        cg.sending()
        boxes[0] = k
        pool.trigger(1)

    def record(due: float) -> None:
        cg.started()
        starts.append(perf_counter())
        boxes.append(boxes[0])  # read, as the bench's record does
        cg.done()

    pool = Pool([(SENDER_PERIOD, send), (None, record)])
    pool.start()
    _wait(starts, sends, time.sleep)
    pool.stop()


def main(argv: list[str]) -> None:
    pool = "--pool" in argv
    numbers = [int(arg) for arg in argv if arg.isdigit()]
    sends = numbers[0] if numbers else 30
    (_pool if pool else _mujou)(sends, _Switches(_callgrind.helper()))
    regions = _callgrind.dumps(os.getpid())[SKIP:]
    if regions:
        name = "pool" if pool else "mujou"
        print(f"{name}: {len(regions)} sends, caches emptied: {FLUSH}")
        print(_callgrind.summary(regions))
    else:
        print("no dumps found (run it under valgrind --tool=callgrind --instr-atstart=no)")


if __name__ == "__main__":
    main(sys.argv[1:])
