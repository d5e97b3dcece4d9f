"""Instructions from a send to the start of the update it triggers, under callgrind: bench's
trigger-latency net (a periodic sender, a node triggered by it, one worker), or the plain
pool's (``--pool``), with a slow sender so that the triggered update runs before the sender
is due again (switching the instrumentation on flushes callgrind's translations: the path runs
slowly the first time after each switch).

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT/cg.%p \\
      python -m bench.trigger_callgrind [--pool | --send] [SENDS]

The instrumentation goes on just after the sender's time stamp (before ``send``, or the
pool's ``trigger``) and off at the triggered hook's first line, and each send's count is
dumped on its own (``CALLGRIND_DUMP_STATS``): the script prints the median of the dumps'
totals (the first few dropped: the path's first runs) and their spread. Each count holds the
two ctypes calls that switch callgrind, both sides alike. ``--send``: Mujou's send alone,
the instrumentation off as it returns in the sender's hook. A small C helper with the
``valgrind/callgrind.h`` macros is compiled with ``cc`` into a temporary directory.
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sized

import torch

_HELPER = r"""
#include <valgrind/callgrind.h>
void cg_on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_dump(void) { CALLGRIND_DUMP_STATS; }
"""

# Seconds: the triggered update runs well before the sender is due again, also on a loaded
# machine (at 0.2 s and load 8, most sends counted the sender's next update as well).
SENDER_PERIOD = 1.0
LOOK = 3.037  # seconds: the host looks this often, out of step with the sender (not counted)
SKIP = 10  # the first sends' dumps, dropped: CPython 3.11 specializes a function after 8 calls
SEND_ONLY = "--send" in sys.argv  # Mujou: off as the send returns, in the sender's hook


def _helper(directory: str) -> ctypes.CDLL:
    source = os.path.join(directory, "cg.c")
    with open(source, "w") as file:
        file.write(_HELPER)
    library = os.path.join(directory, "cg.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    return ctypes.CDLL(library)


def _wait(starts: Sized, sends: int, sleep: Callable[[float], object]) -> None:
    """Sleep until ``sends`` triggered updates started (valgrind makes a slot's sends late)."""
    for _ in range(sends * 10):  # bounded: about 10 s a send
        if len(starts) >= sends:
            return
        sleep(LOOK)


def _mujou(sends: int, cg: ctypes.CDLL) -> None:
    import mujou
    from bench import mujou_system
    from bench._common import Events

    on, off, dump = cg.cg_on, cg.cg_off, cg.cg_dump

    class Sender(mujou_system.Sender):
        def on_update(self, dt: float) -> None:
            sent = self.events.sent
            message = torch.full((1,), float(len(sent)))
            sent.append(time.perf_counter())
            on()
            self.y.send(message, copy=False)
            if SEND_ONLY:
                off()
                dump()

    class Reader(mujou_system.Reader):
        def on_update(self, dt: float) -> None:
            if not SEND_ONLY:
                off()
                dump()
            self.events.starts.append(time.perf_counter())
            self.messages.append(self.x.read())

    events = Events()
    net = mujou_system.Chain(Sender(SENDER_PERIOD, events), 1, Reader(events))
    with mujou.run(net, workers=1) as run:
        _wait(events.sent if SEND_ONLY else events.starts, sends, run.sleep)


def _pool(sends: int, cg: ctypes.CDLL) -> None:
    from bench.baselines.heap_pool import Pool

    on, off, dump = cg.cg_on, cg.cg_off, cg.cg_dump
    sent: list[float] = []
    starts: list[float] = []
    boxes: list[object] = [None]
    perf_counter = time.perf_counter
    pool: Pool

    def send(due: float) -> None:
        k = len(sent)
        sent.append(perf_counter())
        on()
        boxes[0] = k
        pool.trigger(1)

    def record(due: float) -> None:
        off()
        dump()
        starts.append(perf_counter())
        boxes.append(boxes[0])  # read, as the bench's record does

    pool = Pool([(SENDER_PERIOD, send), (None, record)])
    pool.start()
    _wait(starts, sends, time.sleep)
    pool.stop()


def main(argv: list[str]) -> None:
    pool = "--pool" in argv
    numbers = [int(arg) for arg in argv if arg.isdigit()]
    sends = numbers[0] if numbers else 30
    with tempfile.TemporaryDirectory() as directory:
        cg = _helper(directory)
        (_pool if pool else _mujou)(sends, cg)
    pid = os.getpid()
    totals = []
    for path in glob.glob(f"*.{pid}.*") + glob.glob(f"*/*.{pid}.*"):  # the dumps: OUT.PID.N
        with open(path) as file:
            for line in file:
                if line.startswith("totals:"):
                    totals.append((int(path.rsplit(".", 1)[1]), int(line.split()[1])))
                    break
    counts = [count for _, count in sorted(totals)][SKIP:]
    if counts:
        name = "pool" if pool else "mujou"
        median, least, most = statistics.median(counts) / 1000, min(counts) / 1000, max(counts) / 1000
        print(f"{name}: {len(counts)} sends, median {median:.1f}k instructions", end="")
        print(f", min {least:.1f}k, max {most:.1f}k")
    else:
        print("no dumps found (run it under valgrind --tool=callgrind --instr-atstart=no)")


if __name__ == "__main__":
    main(sys.argv[1:])
