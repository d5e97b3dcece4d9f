"""Instructions a virtual tag costs each side, under callgrind: tags-virtual-2p's net
(``mujou_processes.Rally``, ``pong`` in a process of its own), the instrumentation on around
the measured sleeps only, every read blocking instead of polling so that no poll is counted.

    valgrind --tool=callgrind --instr-atstart=no --trace-children=yes \\
      --trace-children-skip='*callgrind_control*,*perl*' --callgrind-out-file=OUT/cg.%p \\
      python -m bench.tags_callgrind 30

prints the tags run and the process ids; each of the two ``OUT/cg.PID`` files of those ids has
its instructions on its ``totals:`` line: divide by the tags. Read where they go with
``callgrind_annotate --inclusive=yes OUT/cg.PID`` (NOTE [ the exchange ] in
``mujou/_processes/_lockstep.py`` quotes the figures).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import mujou
from bench.mujou_processes import Rally
from mujou._processes import _child, _group

# Blocking reads: no poll counted. At the top, so that the process, which imports this module
# as its main one, blocks too.
_child.SPIN = 0.0  # type: ignore[attr-defined]  # the name each module took from _spin
_group.SPIN = 0.0  # type: ignore[attr-defined]  # the same


def _instrument(pids: list[int], on: bool) -> None:
    for pid in pids:
        subprocess.run(
            ["callgrind_control", "-i", "on" if on else "off", str(pid)], capture_output=True, check=False
        )


def main(sleeps: int) -> None:
    net = Rally()
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer(), processes={"pong": net.pong}) as run:
        run.sleep(0.05)
        pids = [os.getpid()] + [child.pid for child in multiprocessing.active_children() if child.pid]
        before = run.stats().nodes["ping"].updates
        _instrument(pids, True)
        for _ in range(sleeps):
            run.sleep(0.01)
        _instrument(pids, False)
        tags = run.stats().nodes["ping"].updates - before
    print("TAGS", tags, "PIDS", pids)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
