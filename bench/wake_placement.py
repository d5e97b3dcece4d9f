"""Where the reader's thread of a hand-off across hosts is woken: on the CPU of the Gloo thread
that woke it, or on another one, and how long it took to run in each case.

::

    python -m bench.wake_placement mujou_hosts cross_host 256     # Mujou's data plane
    python -m bench.wake_placement mujou_hosts gloo_handoff 256   # bare Gloo, the reference

Runs ``python -m bench._one SYSTEM WORKLOAD '{"nbytes": N, "seconds": 2}'`` under ``perf
record`` (the scheduler's ``sched_waking`` and ``sched_switch`` events on every CPU; needs
``perf`` and the right to trace: root, or ``kernel.perf_event_paranoid`` at -1). Gloo reads a
socket on a thread of its own (``gloo_tcp_loop``), which wakes the thread that waits for the
receive: Mujou's receiver thread, or bare Gloo's main thread. For each thread such wake-ups
went to, the script prints how many landed on the waker's CPU and how many on another, and the
p50 and p90 from the wake-up to the thread running, in µs; then the workload's own p50.

Why it matters on a small virtual machine: a thread woken on an idle virtual CPU runs only once
the hypervisor has woken that CPU (about 30 µs on the 2-core machine of bench/RESULTS.md),
where one woken on the waker's CPU runs as soon as the waker sleeps. Which one the kernel
picks follows from where the thread ran last and from whether the waker's CPU has other work
(NOTE [ where the reader's thread is woken ] in ``mujou/_hosts/_plane.py``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

WAKER = "gloo_tcp_loop"
SECONDS = 2
_EVENT = re.compile(r"\s*(\S+)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)")
_FIELD = re.compile(r"(\w+)=(\S+)")


def record(system: str, workload: str, nbytes: int, data: str) -> float | None:
    """Run the workload under ``perf record`` into ``data``; its p50 in µs, if it gave one."""
    params = json.dumps({"nbytes": nbytes, "seconds": SECONDS})
    command = [
        *("perf", "record", "-q", "-k", "mono", "-a", "-o", data),
        *("-e", "sched:sched_waking", "-e", "sched:sched_switch"),
        *("--", sys.executable, "-m", "bench._one", system, workload, params),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            metrics = json.loads(line.removeprefix("BENCH-RESULT ")).get("metrics", {})
            p50 = metrics.get("latency_p50_us")
            return float(p50) if p50 is not None else None
    return None


def placements(data: str) -> dict[int, tuple[list[float], list[float]]]:
    """For each thread a Gloo loop woke: the µs from each wake-up to its running, on the
    waker's CPU and on another."""
    script = subprocess.run(
        ["perf", "script", "-i", data, "--ns", "-F", "comm,tid,cpu,time,event,trace"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    woken: dict[int, tuple[float, int]] = {}  # a woken thread: when, and the waker's CPU
    found: dict[int, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for line in script.stdout.splitlines():
        event = _EVENT.match(line)
        if event is None:
            continue
        comm, cpu, at, kind = event.group(1), int(event.group(3)), float(event.group(4)), event.group(5)
        fields = dict(_FIELD.findall(event.group(6)))
        if kind == "sched_waking" and comm == WAKER and fields.get("comm") != WAKER:
            woken[int(fields["pid"])] = (at, cpu)
        elif kind == "sched_switch" and (tid := int(fields.get("next_pid", -1))) in woken:
            since, waker = woken.pop(tid)
            same, other = found[tid]
            (same if cpu == waker else other).append((at - since) * 1e6)
    return found


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    p90 = sorted(values)[int(0.9 * len(values))]
    return f"{len(values)}, p50 {statistics.median(values):.1f} µs, p90 {p90:.1f} µs"


def main(argv: list[str]) -> None:
    system, workload, nbytes = argv[0], argv[1], int(argv[2]) if len(argv) > 2 else 256
    with tempfile.TemporaryDirectory() as folder:
        data = os.path.join(folder, "perf.data")
        p50 = record(system, workload, nbytes, data)
        found = placements(data)
    for tid, (same, other) in sorted(found.items(), key=lambda item: -sum(map(len, item[1]))):
        if len(same) + len(other) < 10:  # a thread woken now and then, not once a message
            continue
        print(f"thread {tid}: on the waker's CPU {_spread(same)}; on another CPU {_spread(other)}")
    print(f"{system} {workload} {nbytes} B: p50 " + ("none" if p50 is None else f"{p50:.1f} µs"))


if __name__ == "__main__":
    main(sys.argv[1:])
