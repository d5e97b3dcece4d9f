"""What the callgrind harnesses share (``trigger_callgrind``, ``fleet_callgrind``): a small C
helper with valgrind's client requests, reached through ctypes, that switches callgrind's
instrumentation and collection, empties the simulated caches, and dumps a region's counts;
and the reading of those dumps.

A region is what runs between two dumps: the instrumentation goes on once (its switch
empties the simulated caches and flushes callgrind's translations, so it is not switched per
region) and collection stays on; ``cg_gap()`` dumps what ran since the last dump (not counted),
``cg_region()`` the region that ends there. (Collection switched by
``CALLGRIND_TOGGLE_COLLECT`` instead counted the wrong parts here, where the two switches
sit at different depths of the call stack, a send's and the triggered hook's: the state set
in the send did not outlast the return from it, as seen in the dumps.) A region's counts
hold the return from one ctypes call and the entry of the next. ``dumps`` reads the
regions' counts back.

With ``--cache-sim=yes`` callgrind counts, beside the instructions (``Ir``), the misses of
its simulated first-level caches (``I1mr``; ``D1mr`` and ``D1mw``, reads and writes) and of
its last level (``ILmr``, ``DLmr``, ``DLmw``). ``flush`` empties the caches (its own counts
fall in a gap): it writes a byte of each line of ``FLUSH_BYTES``, more than the last level
holds, then runs ``FLUSH_CODE`` bytes of straight code, more than the first-level instruction
cache holds. ``CACHES`` are the valgrind options for this machine's caches (2-core AMD EPYC, Zen 4:
32 KiB L1 instruction and data caches, 8-way; 1 MiB L2 per core, 8-way, simulated as the
last level: the one that the other work on the core empties while a worker sleeps; the L3
of 32 MiB, shared, is not simulated). ``PAGES`` runs the same simulator with pages for
lines, a stand-in for the TLBs. With ``--branch-sim=yes`` as well, callgrind counts the
mispredicted conditional branches (``Bcm``) and indirect jumps (``Bim``: the interpreter
dispatches each bytecode through one) of its simple predictors, which ``flush`` empties too.
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import subprocess
import tempfile

# valgrind's options for this machine's caches (the last level: a core's L2).
CACHES = "--cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,8,64"
# The same simulator with 4 KiB lines stands for the TLBs (Zen 4: 64 instruction and 72 data
# entries at the first level, 3,072 at the second): a miss is a page the path touched that
# was not among the last 64 (2,048) touched, a page walk in the second level's case.
PAGES = "--cache-sim=yes --I1=262144,64,4096 --D1=262144,64,4096 --LL=8388608,16,4096"
# A byte written in each line of FLUSH_BYTES, and FLUSH_CODE bytes of straight code run (a
# 3-byte add each): more than the caches hold, also with PAGES (pages as lines).
FLUSH_BYTES = 16 << 20
FLUSH_CODE = 3 << 17

_SOURCE = r"""
#include <stddef.h>
#include <valgrind/callgrind.h>
static volatile unsigned char buffer[%(bytes)d];
void cg_instrument(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_instrument_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_gap(void) { CALLGRIND_DUMP_STATS_AT("gap"); }
void cg_region(void) { CALLGRIND_DUMP_STATS_AT("region"); }
void cg_flush(void) {
    for (size_t i = 0; i < sizeof buffer; i += 64) buffer[i] += 1;
    __asm__ volatile(".rept %(adds)d\n\taddl $1, %%%%eax\n\t.endr" ::: "eax");
    /* The branch predictors of --branch-sim=yes: a conditional branch at each of 16,384
       addresses (its table's size), then 1,024 indirect jumps (twice its 512 targets). */
    __asm__ volatile(".rept 16384\n\ttestl %%%%eax, %%%%eax\n\tjne .+2\n\t.endr" ::: "eax", "cc");
    __asm__ volatile(".rept 1024\n\tleaq 1f(%%%%rip), %%%%rcx\n\tjmp *%%%%rcx\n1:\n\t.endr" ::: "rcx");
}
"""


def helper() -> ctypes.PyDLL:
    """The C helper, compiled with ``cc`` into a temporary directory (valgrind's headers needed)."""
    folder = tempfile.mkdtemp(prefix="cg-helper-")
    source, library = os.path.join(folder, "cg.c"), os.path.join(folder, "cg.so")
    with open(source, "w") as file:
        file.write(_SOURCE % {"bytes": FLUSH_BYTES, "adds": FLUSH_CODE // 3})
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", library, source], check=True)
    return ctypes.PyDLL(library)  # the GIL held across each call: no thread switch inside


def dumps(pid: int) -> list[dict[str, int]]:
    """The counts of each region process ``pid`` dumped (``OUT.PID.N``, in order of N), by event."""
    found = []
    for path in glob.glob(f"*.{pid}.*") + glob.glob(f"*/*.{pid}.*"):
        events: list[str] = []
        region = False
        with open(path) as file:
            for line in file:
                if line.startswith("desc: Trigger:"):
                    region = line.rstrip().endswith(": region")
                elif line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith("totals:") and region:
                    values = [int(value) for value in line.split()[1:]]  # trailing zeros left out
                    counts = dict(zip(events, values + [0] * (len(events) - len(values)), strict=True))
                    found.append((int(path.rsplit(".", 1)[1]), counts))
                    break
    return [counts for _, counts in sorted(found)]


def summary(regions: list[dict[str, int]], per: float = 1.0) -> str:
    """Each figure of ``regions`` (divided by ``per``): its median, min and max, one line each;
    with the cache simulator, the first-level misses (instructions, data) and the last
    level's, summed from callgrind's events."""
    if not regions:
        return "no regions counted"
    figures = {
        "instructions": ("Ir",),
        "I1 misses": ("I1mr",),
        "D1 misses": ("D1mr", "D1mw"),
        "LL misses (instructions)": ("ILmr",),
        "LL misses (data)": ("DLmr", "DLmw"),
        "branches mispredicted": ("Bcm",),
        "indirect jumps mispredicted": ("Bim",),
    }
    lines = []
    for name, events in figures.items():
        if not all(event in regions[0] for event in events):
            continue
        values = [sum(region[event] for event in events) / per for region in regions]
        median = statistics.median(values)
        lines.append(f"  {name:26} median {median:10.1f}  min {min(values):10.1f}  max {max(values):10.1f}")
    return "\n".join(lines)
