"""Instructions and cache misses an update of the fleet costs, under callgrind: bench's
fleet (N ring nodes, one worker) on Mujou or on the plain heap pool, counted from node 0's
update ``ON`` to its update ``ON + ROUNDS``, about ``ROUNDS`` × N updates:

    valgrind --tool=callgrind --instr-atstart=no --cache-sim=yes --I1=32768,8,64 \\
      --D1=32768,8,64 --LL=1048576,8,64 --callgrind-out-file=OUT/cg.%p \\
      python -m bench.fleet_callgrind mujou 1000

(``heap_pool`` for the pool; ``bench._callgrind.CACHES``: this machine's caches; without
``--cache-sim=yes`` and the sizes, the instructions alone) prints the updates counted and the
figures of one update: the instructions, and the misses of the first-level caches and of the
last level (a core's L2, 1 MiB), which the updates of 1,000 nodes in a row overflow. The
instrumentation goes on at node 0's update ``ON - 1`` (a round before the count, so the
caches are as a round leaves them), and the regions are marked by dumps
(``bench._callgrind``), which the script reads back. Read where the counts go with
``callgrind_annotate --inclusive=yes`` on the dump whose ``desc: Trigger:`` line ends in
``region`` (NOTEs [ the cost of an update ] and [ the memory an update touches ] in
``mujou/_engine/_update.py`` quote the figures). At the bench's 10 ms period every update
runs late under callgrind, so both systems take their skip path at every update; see
``PERIOD``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable

import torch

from bench import _callgrind

ON = 3  # node 0's update at which the count starts (the first rounds are cold)
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


class Counted:
    """Marks the counted rounds from node 0's updates and counts the updates between."""

    def __init__(self, total: Callable[[], int]) -> None:
        cg = _callgrind.helper()
        self.instrument, self.gap, self.region = cg.cg_instrument, cg.cg_gap, cg.cg_region
        self.total = total
        self.seen = 0
        self.began = 0
        self.updates = 0

    def tick(self) -> None:
        """Called at the start of node 0's update."""
        self.seen += 1
        if self.seen == ON - 1:
            self.instrument()
        elif self.seen == ON:
            self.began = self.total()
            if not COLLECT:
                gc.disable()
            self.gap()
        elif self.seen == ON + ROUNDS:
            self.region()
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
    print(f"{system}: {updates} updates counted; one update:")
    print(_callgrind.summary(_callgrind.dumps(os.getpid()), per=updates))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mujou", int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
