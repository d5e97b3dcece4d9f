"""Instructions an update of the fleet costs, under callgrind: bench's fleet (N ring nodes,
period 10 ms, one worker) on Mujou or on the plain heap pool, the instrumentation switched on
in node 0's update ``ON`` and off in its update ``ON + ROUNDS`` (a two-line C helper with
``CALLGRIND_START_INSTRUMENTATION`` and ``CALLGRIND_STOP_INSTRUMENTATION``, through ctypes),
so that it counts ``ROUNDS`` rounds of the ring, about ``ROUNDS`` × N updates:

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT/cg.%p \\
      python -m bench.fleet_callgrind mujou 1000

(``heap_pool`` for the pool) prints the updates counted; the ``totals:`` line of ``OUT/cg.PID``
divided by them is the figure. Read where they go with ``callgrind_annotate --inclusive=yes``
(NOTE [ the cost of an update ] in ``mujou/_engine/_update.py`` quotes the figures). Under
callgrind every update runs late, so both systems take their skip path at every update.
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

ON = 3  # node 0's update that switches the instrumentation on (the first ones are cold)
# The nodes' period in seconds. Under callgrind an update takes about a millisecond, so at the
# bench's 10 ms every update is late and skips, and which ones fall due together (the
# batches, their put-backs) changes from run to run with the timing: counts spread by 2-3 %.
# At 2 s a round of 1,000 updates fits in a period: each round is one batch due together,
# the path of a system that keeps up, and counts repeat within 0.2 %. PERIOD=0.01: the bench's.
PERIOD = float(os.environ.get("PERIOD", "2.0"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))  # rounds of the ring counted
# GC=0: no garbage collection while counting; a collection falls in some runs only (up to
# 1.5k instructions an update), so A/B comparisons are steadier without it.
COLLECT = os.environ.get("GC", "1") != "0"

_HELPER = """
#include <valgrind/callgrind.h>
void cg_on(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _toggles() -> tuple[Callable[[], None], Callable[[], None]]:
    """The helper's two calls, compiled into a temporary directory."""
    folder = tempfile.mkdtemp(prefix="fleet-cg-")
    source, library = os.path.join(folder, "cg.c"), os.path.join(folder, "cg.so")
    with open(source, "w") as file:
        file.write(_HELPER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", library, source], check=True)
    helper = ctypes.CDLL(library)
    return helper.cg_on, helper.cg_off


class Counted:
    """Switches callgrind on and off from node 0's updates and counts the updates between."""

    def __init__(self, total: Callable[[], int]) -> None:
        self.on, self.off = _toggles()
        self.total = total
        self.seen = 0
        self.began = 0
        self.updates = 0

    def tick(self) -> None:
        """Called at the start of node 0's update."""
        self.seen += 1
        if self.seen == ON:
            self.began = self.total()
            if not COLLECT:
                gc.disable()
            self.on()
        elif self.seen == ON + ROUNDS:
            self.off()
            gc.enable()
            self.updates = self.total() - self.began


def _mujou(n: int) -> int:
    import mujou
    from bench._common import weights, zeros
    from bench.mujou_system import Ring, RingNode

    class First(RingNode):
        def on_update(self, dt: float) -> None:
            counted.tick()
            super().on_update(dt)

    zero = zeros()
    ws = weights(n)
    nodes = [First(ws[0], zero, PERIOD)] + [RingNode(w, zero, PERIOD) for w in ws[1:]]
    counted = Counted(lambda: sum(len(node.starts) for node in nodes))
    with mujou.run(Ring(nodes), workers=1) as run:
        while not counted.updates:
            run.sleep(1.0)  # few wake-ups of the host: they count too
    return counted.updates


def _heap_pool(n: int) -> int:
    from bench._common import Record, ring_updates
    from bench.baselines.heap_pool import Pool

    record = Record()
    updates = ring_updates(n, record)
    counted = Counted(lambda: len(record.starts))
    first = updates[0]

    def update(due: float) -> None:
        counted.tick()
        first(due)

    updates[0] = update
    pool = Pool([(PERIOD, update) for update in updates])
    pool.start()
    while not counted.updates:
        time.sleep(1.0)
    pool.stop()
    return counted.updates


def main(system: str, n: int) -> None:
    torch.set_num_threads(1)
    updates = {"mujou": _mujou, "heap_pool": _heap_pool}[system](n)
    print("UPDATES", updates, "PID", os.getpid())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mujou", int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
