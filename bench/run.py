"""Mujou's benchmark runner: every workload, Mujou and its peers, side by side, in one run.

    python bench/run.py [--quick] [--out DIR] [--repeats K] [--only W,...] [--systems S,...]

The workloads (``--only``): fleet-10, fleet-100, fleet-1000, fleet-10000, dispatch,
dispatch-virtual, echo, idle; and those of event-triggered nodes: trigger-latency (send to
start of a triggered node), echo-triggered (the host round trip through a triggered echo),
chain-10 (10 triggered nodes in a row, end to end), microsteps (triggered updates per second
under the virtual timer); replay-virtual (a net replayed with its sources replaced, under the
virtual timer, against the net's own rate: bench/mujou_replay.py); and those of processes
(``mujou.run(net, processes=...)``):
cross-process-256B, cross-process-64KiB, cross-process-1MiB (send to read, a sender in one
process and a triggered reader in another), fleet-processes (Python-bound nodes in one
process, then over two), tags-virtual-2p (virtual-timer tags per second with a node in each
of two processes), start-stop-2p (the start and the stop of a run over two processes, beside a
bare multiprocessing spawn of two processes that import torch) and soak (the hand-off for
``--soak-seconds``, counting the descriptors and shared-memory segments); and those of
recording (``mujou.run(net, record=...)``): record-256B and record-1MiB (the recorder's
throughput beside ``mcap``'s writer alone on the same messages and, where h5py installs,
h5py's appends of them) and record-fleet-100 (the fleet
at N=100, plain and with every output recorded); and record-seek-1GB (the seek to a time
in a 1 GB recording, Mujou's reader beside mcap's; the file is written once, in about 3
minutes, and kept in the temporary folder).

Each measurement runs in a fresh process (``python -m bench._one``); the repeats are
interleaved (all systems once, then all again), so that a slow minute of the machine does
not fall on one system only. Writes ``DIR/results.jsonl`` (the machine, then one object per
system × workload × repeat, then the medians and the targets) and ``DIR/results.md`` (the
tables), and prints the tables. The default run takes about 24 minutes on 2 cores (9 of them the
workloads of processes), ``--quick`` about 7.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(ROOT))

from bench._one import MARKER  # noqa: E402

FLEET_SIZES = (10, 100, 1000, 10000)
MUJOU_1, MUJOU_2 = "Mujou, workers=1", "Mujou, workers=2"
ASYNCIO, THREADS, POOL = (
    "asyncio, a task per node",
    "a thread per node",
    "a plain heap + worker pool, 1 worker",
)
HOLOSCAN, EZMSG = "NVIDIA Holoscan, Python operators", "ezmsg"
TORCH_MP, TORCH_MP_SLOW = "torch.multiprocessing", "torch.multiprocessing, 100 Hz"
FLOOR = "the machine's floor (no framework)"  # bench/baselines/floor.py: the least any library can do
RAY = "a synchronous Ray actor call"  # issue 26's other reference, where Ray installs
SYSTEMS = (MUJOU_1, MUJOU_2, ASYNCIO, THREADS, POOL, HOLOSCAN, EZMSG, TORCH_MP, TORCH_MP_SLOW, FLOOR, RAY)
PROCESS_PEERS = (TORCH_MP, TORCH_MP_SLOW)  # in the tables of processes only
PEERS = {  # label: (system, module)
    HOLOSCAN: ("holoscan", "holoscan"),
    EZMSG: ("ezmsg", "ezmsg.core"),
    RAY: ("ray", "ray"),
}
MODULE_OF = {
    MUJOU_1: "mujou",
    MUJOU_2: "mujou",
    ASYNCIO: "asyncio",
    THREADS: "threads",
    POOL: "heap_pool",
    HOLOSCAN: "holoscan",
    EZMSG: "ezmsg",
    TORCH_MP: "torch_mp",
    TORCH_MP_SLOW: "torch_mp",
    FLOOR: "floor",
    RAY: "ray",
}


@dataclass(frozen=True)
class Durations:
    sizes: tuple[int, ...]  # the fleet sizes run
    fleet: float  # seconds of each fleet run
    fleet_largest: float  # at N=10,000
    dispatch: float
    echo: float
    idle: float
    trigger: float  # each of the trigger workloads, after a 0.2 s warm-up
    repeats: int
    limit: float  # a process still running after this many seconds did not finish
    cross: float = 2.0  # each cross-process run, after a 0.2 s warm-up
    fleet_processes: float = 3.0  # each of its two runs (one process, two)
    tags: float = 2.0  # each of the two runs of tags-virtual-2p
    soak: float = 10.0  # the soak (--soak-seconds); run once, not repeated
    start_stops: int = 10  # the runs started and stopped in each start-stop-2p case
    record_bytes: int = 200 << 20  # bytes recorded in each record-* case (of each of its runs)
    record_pairs: int = 10  # record-fleet-100: rounds of runs (plain, recorded, plain)


FULL = Durations(
    FLEET_SIZES,
    fleet=5.0,
    fleet_largest=3.0,
    dispatch=2.0,
    echo=2.0,
    idle=5.0,
    trigger=2.0,
    repeats=3,
    limit=60.0,
)
QUICK = Durations(
    (10, 100, 1000),
    fleet=2.0,
    fleet_largest=1.0,
    dispatch=1.0,
    echo=1.0,
    idle=2.0,
    trigger=1.0,
    repeats=1,
    limit=30.0,
    cross=1.0,
    fleet_processes=1.5,
    tags=1.0,
    soak=5.0,
    start_stops=5,
    record_pairs=6,
)
START_STOP_LIMIT = 30.0  # seconds more of a start-stop-2p case's limit per run (spawn: seconds a run)
SLOW = 20.0  # a run that took longer than this (set-up) is not repeated: its one run is its median


# Peers whose set-up alone is too slow to run the largest fleet here (measured on 2 cores:
# Holoscan did not reach its first update within 200 s at N=10,000; ezmsg takes 20 s to set
# up N=1,000 and grows quadratically).
PEER_MAX_N = {HOLOSCAN: 1000, EZMSG: 1000}
NOT_RUN_LARGE = "not run (set-up takes minutes)"

# The workloads of event-triggered nodes (issue 13): workload -> (function, the systems that run it).
TRIGGER_WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "trigger-latency": ("trigger_latency", (MUJOU_1, MUJOU_2, ASYNCIO, THREADS, POOL)),
    "echo-triggered": ("echo_triggered", (MUJOU_1, ASYNCIO, THREADS, POOL, HOLOSCAN, EZMSG, FLOOR)),
    "chain-10": ("chain", (MUJOU_1, MUJOU_2, ASYNCIO, THREADS, POOL)),
    "microsteps": ("microsteps", (MUJOU_1,)),
}

# The workloads of processes: workload -> message size in bytes (the cross-process hand-off).
CROSS_WORKLOADS = {"cross-process-256B": 256, "cross-process-64KiB": 65536, "cross-process-1MiB": 1 << 20}
PROCESS_WORKLOADS = (*CROSS_WORKLOADS, "fleet-processes", "tags-virtual-2p", "start-stop-2p", "soak")
# The workloads of recording: workload -> message size in bytes; and the fleet recorded.
RECORD_WORKLOADS = {"record-256B": 256, "record-1MiB": 1 << 20}
RECORD_FLEET_N = 100
# Reading a recording (issue 25): the seek, and the seconds more its first run may take to
# write the 1 GB file it reads.
RECORD_SEEK = "record-seek-1GB"
SEEK_WRITE_LIMIT = 600.0
# Over SLOW by their own length: repeated.
MEASURED_LONG = {"fleet_processes", "tags_virtual", "start_stop", "soak"}


@dataclass(frozen=True)
class Case:
    """One system × workload: what ``bench._one`` runs in a fresh process."""

    system: str  # a label of SYSTEMS
    workload: str  # fleet-N, dispatch, dispatch-virtual, echo, idle, or one of TRIGGER_WORKLOADS
    function: str  # the module's function
    params: dict[str, Any]
    timeout: float
    module: str | None = None  # bench._one's system, when not MODULE_OF[system]


def plan(durations: Durations, systems: list[str]) -> list[Case]:
    """Every measurement of one repeat, in the order they run."""
    found: list[Case] = []
    limit = durations.limit
    every = systems
    systems = [system for system in systems if system not in (*PROCESS_PEERS, RAY)]  # theirs come last
    periodic = [system for system in systems if system != FLOOR]  # the floor has no periodic case
    for n in durations.sizes:
        seconds = durations.fleet_largest if n >= 10000 else durations.fleet
        for system in periodic:
            if n > PEER_MAX_N.get(system, n):
                continue
            params: dict[str, Any] = {"n": n, "seconds": seconds}
            if system in (MUJOU_1, MUJOU_2):
                params["workers"] = 1 if system == MUJOU_1 else 2
            found.append(Case(system, f"fleet-{n}", "fleet", params, limit))
    dispatch: dict[str, Any] = {"n": 100, "seconds": durations.dispatch}
    for system in periodic:
        if system == MUJOU_1:
            found.append(Case(system, "dispatch", "dispatch", {**dispatch, "timer": "realtime"}, limit))
            found.append(
                Case(system, "dispatch-virtual", "dispatch", {**dispatch, "timer": "virtual"}, limit)
            )
        elif system not in (MUJOU_2, THREADS):  # a thread per node has no dispatcher to measure
            found.append(Case(system, "dispatch", "dispatch", dispatch, limit))
    for workload, seconds in (("echo", durations.echo), ("idle", durations.idle)):
        for system in periodic:
            if system != MUJOU_2:
                found.append(Case(system, workload, workload, {"seconds": seconds}, limit))
    for workload, (function, runs) in TRIGGER_WORKLOADS.items():
        for system in systems:
            if system not in runs:
                continue
            given: dict[str, Any] = {"seconds": durations.trigger}
            if system in (MUJOU_1, MUJOU_2) and workload in ("trigger-latency", "chain-10"):
                given["workers"] = 1 if system == MUJOU_1 else 2
            found.append(Case(system, workload, function, given, limit))
    if MUJOU_1 in systems:
        seek = {"gigabytes": 1.0, "seeks": 30}
        found.append(Case(MUJOU_1, RECORD_SEEK, "seek", seek, limit + SEEK_WRITE_LIMIT, "mujou_record_read"))
    if MUJOU_1 in systems:  # issue 25: the replay under the virtual timer, as fast as it goes
        replay = {"seconds": 2.0}
        found.append(Case(MUJOU_1, "replay-virtual", "replay_virtual", replay, limit, "mujou_replay"))
    return (
        found
        + plan_processes(durations, every)
        + plan_record(durations, every)
        + plan_hosts(durations, every)
    )


def plan_processes(durations: Durations, systems: list[str]) -> list[Case]:
    """The cases of processes: Mujou (one worker per process), torch.multiprocessing, ezmsg."""
    found: list[Case] = []
    limit = durations.limit
    for workload, nbytes in CROSS_WORKLOADS.items():
        params = {"nbytes": nbytes, "seconds": durations.cross}
        for system in systems:
            if system == MUJOU_1:
                found.append(Case(system, workload, "cross_process", params, limit, "mujou_processes"))
            elif system in (TORCH_MP, EZMSG, FLOOR):
                found.append(Case(system, workload, "cross_process", params, limit))
            elif system == TORCH_MP_SLOW:
                found.append(Case(system, workload, "cross_process", {**params, "period": 0.01}, limit))
    fleet = {"seconds": durations.fleet_processes}
    tags = {"seconds": durations.tags}
    soak = {"seconds": durations.soak}
    starts = {"runs": durations.start_stops}
    starts_limit = limit + START_STOP_LIMIT * durations.start_stops
    for system in systems:
        if system == MUJOU_1:
            found.append(Case(system, "fleet-processes", "fleet_processes", fleet, limit, "mujou_processes"))
            found.append(Case(system, "tags-virtual-2p", "tags_virtual", tags, limit, "mujou_processes"))
            found.append(Case(system, "start-stop-2p", "start_stop", starts, starts_limit, "mujou_processes"))
            found.append(Case(system, "soak", "soak", soak, limit + durations.soak, "mujou_processes"))
        elif system == TORCH_MP:
            found.append(Case(system, "fleet-processes", "fleet_processes", fleet, limit))
        elif system == FLOOR:
            found.append(Case(system, "tags-virtual-2p", "tags_virtual", tags, limit))
            found.append(Case(system, "start-stop-2p", "start_stop", starts, starts_limit))
    return found


def plan_record(durations: Durations, systems: list[str]) -> list[Case]:
    """The cases of recording: Mujou only (mcap's writer alone is measured in the same case)."""
    if MUJOU_1 not in systems:
        return []
    found: list[Case] = []
    for workload, nbytes in RECORD_WORKLOADS.items():
        count = max(100, min(100_000, durations.record_bytes // nbytes))
        sizes: dict[str, Any] = {"nbytes": nbytes, "count": count, "compression": None}
        found.append(Case(MUJOU_1, workload, "record_throughput", sizes, durations.limit, "mujou_record"))
    # Rounds of plain, recorded and plain runs, record_pairs of them (about 2.5 s a run more than
    # its seconds: the start, the grace, the tap's cost measured after them).
    pairs = durations.record_pairs
    fleet: dict[str, Any] = {"n": RECORD_FLEET_N, "seconds": durations.fleet, "rounds": pairs}
    limit = durations.limit + pairs * 3 * (durations.fleet + 2.5)
    found.append(Case(MUJOU_1, "record-fleet-100", "fleet_recorded", fleet, limit, "mujou_record"))
    return found


# -- the child processes ---------------------------------------------------------------------


def _site_dirs() -> Iterator[Path]:
    for entry in sys.path:
        if entry and Path(entry).is_dir():
            yield Path(entry)


def child_env(system: str) -> dict[str, str]:
    """The environment of a measurement: this one, plus what Holoscan needs to load on a CPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    if system == HOLOSCAN:  # libcudart from the nvidia-cuda-runtime-cu12 wheel, if installed
        libs = [str(d / "nvidia" / "cuda_runtime" / "lib") for d in _site_dirs()]
        libs = [lib for lib in libs if Path(lib).is_dir()]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [*libs, env.get("LD_LIBRARY_PATH", "")]))
    return env


def _holoscan_stack() -> None:  # pragma: no cover - runs in the child before exec
    """Holoscan asks for a 32 MiB stack (it warns, and may crash, with Linux's default 8 MiB)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    wanted = 32 * 1024 * 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_STACK, (limit, hard))


def _preexec(system: str) -> Callable[[], None] | None:
    return _holoscan_stack if system == HOLOSCAN else None


def probe(system: str) -> str | None:
    """None when the peer imports here, else why not."""
    module = PEERS[system][1]
    try:
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(system),
            preexec_fn=_preexec(system),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "import timed out"
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"import failed ({done.returncode})"


QUIET_WINDOW = 3.0  # seconds: --quiet waits for this long a window under its limit
QUIET_WAIT = 180.0  # seconds: the longest it waits before running a case anyway
QUIET_TRIES = 3  # runs of a case at most, while others disturb it


def wait_quiet(limit: float) -> float | None:
    """Wait until the machine was busy for under ``limit`` cores during QUIET_WINDOW (at most
    QUIET_WAIT); the last window's figure, or None where /proc/stat cannot tell."""
    deadline = time.monotonic() + QUIET_WAIT
    while True:
        before = _busy_seconds()
        time.sleep(QUIET_WINDOW)
        after = _busy_seconds()
        if before is None or after is None:
            return None
        busy = (after - before) / QUIET_WINDOW
        if busy < limit or time.monotonic() > deadline:
            return busy


def measure_quietly(case: Case, limit: float | None) -> dict[str, Any]:
    """``measure``; with a ``limit`` (--quiet), after a quiet moment, and again (QUIET_TRIES
    in all) while the rest of the machine used more than ``limit`` cores during the run."""
    if limit is None:
        return measure(case)
    result: dict[str, Any] = {}
    for attempt in range(1, QUIET_TRIES + 1):
        wait_quiet(limit)
        result = measure(case)
        result["attempt"] = attempt
        others = result.get("others_cpu")
        if not result.get("ok") or others is None or others < limit:
            break
    return result


def _busy_seconds() -> float | None:
    """CPU seconds the whole machine spent busy since boot (Linux: /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(value) for value in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds of this process's ended children (and of their ended children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(case: Case) -> dict[str, Any]:
    """Run one case in a fresh process; its result object (``ok``, ``metrics`` or ``error``).

    ``others_cpu`` is the CPU the rest of the machine used meanwhile, in cores: the machine's
    busy time less the case's own (its processes' and theirs), over the case's wall time. A
    figure measured while others used a good part of a core is disturbed: rerun it.
    """
    busy, own = _busy_seconds(), _own_seconds()
    command = [
        sys.executable,
        "-m",
        "bench._one",
        case.module or MODULE_OF[case.system],
        case.function,
        json.dumps(case.params),
    ]
    began = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=case.timeout,
            env=child_env(case.system),
            preexec_fn=_preexec(case.system),
            check=False,
        )
    except subprocess.TimeoutExpired:
        error = f"did not finish within {case.timeout:.0f} s"
        return {"ok": False, "error": error, "timeout": True, "wall_seconds": case.timeout}
    wall = time.perf_counter() - began
    after = _busy_seconds()
    others = (
        None if busy is None or after is None else max(0.0, (after - busy) - (_own_seconds() - own)) / wall
    )
    result: dict[str, Any] | None = None
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER) :])
    if result is None:
        tail = done.stderr.strip().splitlines()[-5:]
        result = {"ok": False, "error": f"exit status {done.returncode}: " + " | ".join(tail)}
    elif not result["ok"]:
        result["stderr_tail"] = done.stderr[-2000:]
    result["wall_seconds"] = wall
    result["others_cpu"] = others
    return result


# -- the machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return done.stdout.strip()


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def mujou_source() -> str:
    """A hash of the mujou package's source: to notice a change during a run."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "mujou").glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def machine() -> dict[str, Any]:
    """What the table was measured on."""
    import torch

    import mujou

    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", "mujou"))
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "gil": "enabled" if is_gil_enabled is None or is_gil_enabled() else "disabled",
        "torch": torch.__version__,
        "torch_threads": 1,
        "mujou": mujou.__version__,
        "commit": commit,
        "mujou_modified": dirty,
        "mujou_file": mujou.__file__,
        "mujou_source": mujou_source(),
        "holoscan": _version("holoscan-cu12") or _version("holoscan"),
        "ezmsg": _version("ezmsg"),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


# -- medians and targets ---------------------------------------------------------------------


@dataclass
class Outcome:
    """The runs of one system × workload and their medians."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None  # why it was not run

    @property
    def ok_runs(self) -> list[dict[str, Any]]:
        return [run["metrics"] for run in self.runs if run.get("ok")]

    @property
    def failed(self) -> bool:
        return bool(self.runs) and not self.ok_runs

    def error(self) -> str:
        errors = [run.get("error", "") for run in self.runs if not run.get("ok")]
        return errors[0] if errors else ""

    def median(self) -> dict[str, float]:
        runs = self.ok_runs
        if not runs:
            return {}
        keys = [key for key, value in runs[0].items() if isinstance(value, int | float)]
        result: dict[str, float] = {}
        for key in keys:
            values = [float(run[key]) for run in runs if not math.isnan(float(run[key]))]
            result[key] = statistics.median(values) if values else math.nan
        return result


Results = dict[tuple[str, str], Outcome]


@dataclass(frozen=True)
class Target:
    name: str
    measured: str
    peers: str
    met: bool | None  # None: not measured


def _fleet(results: Results, system: str, n: int) -> dict[str, float]:
    outcome = results.get((system, f"fleet-{n}"))
    return outcome.median() if outcome else {}


def _best_fleet_peer(results: Results, n: int, systems: list[str]) -> str:
    best: tuple[float, float, str] | None = None
    for system in systems:
        if system in (MUJOU_1, MUJOU_2):
            continue
        m = _fleet(results, system, n)
        if m:
            key = (-m["share"], m["lateness_p99_ms"], system)
            best = key if best is None or key < best else best
    if best is None:
        return "—"
    return f"{best[2]}: {-best[0]:.3f} / {_ms(best[1])}"


def _best_rate_peer(results: Results, systems: list[str]) -> tuple[str, float]:
    best = ("—", 0.0)
    for system in systems:
        if system in (MUJOU_1, MUJOU_2):
            continue
        outcome = results.get((system, "dispatch"))
        m = outcome.median() if outcome else {}
        if m and m["updates_per_second"] > best[1]:
            best = (system, m["updates_per_second"])
    return best


def targets(results: Results, systems: list[str]) -> list[Target]:
    """The targets of the issue, each met or not by this run's medians."""
    found: list[Target] = []
    for system in (MUJOU_1, MUJOU_2):
        m = _fleet(results, system, 100)
        found.append(
            Target(
                f"Fleet N=100 ({system.split(', ')[1]}): every update made, p99 lateness ≤ 1 ms",
                f"{m['share']:.4f} / {_ms(m['lateness_p99_ms'])}" if m else "—",
                _best_fleet_peer(results, 100, systems),
                (m["made"] >= m["due"] and m["lateness_p99_ms"] <= 1.0) if m else None,
            )
        )
    for system in (MUJOU_1, MUJOU_2):
        m = _fleet(results, system, 1000)
        found.append(
            Target(
                f"Fleet N=1000 ({system.split(', ')[1]}): ≥ 0.98 of the updates made, p99 lateness ≤ 20 ms",
                f"{m['share']:.3f} / {_ms(m['lateness_p99_ms'])}" if m else "—",
                _best_fleet_peer(results, 1000, systems),
                (m["share"] >= 0.98 and m["lateness_p99_ms"] <= 20.0) if m else None,
            )
        )
    peer, rate = _best_rate_peer(results, systems)
    peer_text = f"{peer}: {_rate(rate)}" if rate else "—"
    for workload, label, floor in (
        ("dispatch-virtual", "virtual timer", 400_000),
        ("dispatch", "real-time timer", 300_000),
    ):
        outcome = results.get((MUJOU_1, workload))
        m = outcome.median() if outcome else {}
        value = m.get("updates_per_second")
        ratio = f" ({value / rate:.2f}× the best peer)" if value and rate else ""
        found.append(
            Target(
                f"Empty updates, {label}, one worker: ≥ {floor:,} per second",
                f"{_rate(value)}{ratio}" if value else "—",
                peer_text,
                (value >= floor) if value else None,
            )
        )
    outcome = results.get((MUJOU_1, "idle"))
    m = outcome.median() if outcome else {}
    peers = [
        f"{system}: {results[(system, 'idle')].median()['cpu_percent']:.2f} %"
        for system in systems
        if system not in (MUJOU_1, MUJOU_2)
        and (system, "idle") in results
        and results[(system, "idle")].median()
    ]
    found.append(
        Target(
            "One idle node at 100 Hz: ≤ 0.5 % of a core",
            f"{m['cpu_percent']:.2f} %" if m else "—",
            "; ".join(peers) or "—",
            (m["cpu_percent"] <= 0.5) if m else None,
        )
    )
    found += trigger_targets(results, systems)
    found += process_targets(results, systems)
    found += record_targets(results)
    m = _median(results, MUJOU_1, RECORD_SEEK)
    found.append(
        Target(
            "Seek to a time in a 1 GB recording (p50 / max of 30): max ≤ 50 ms",
            _format(RECORD_SEEK, m) if m else "—",
            f"mcap's reader: {_ms(m['mcap_seek_p50_ms'])} / {_ms(m['mcap_seek_max_ms'])}" if m else "—",
            (m["seek_max_ms"] <= 50.0) if m else None,
        )
    )
    found += replay_targets(results)
    found += ratio_targets(results)
    slower: list[str] = []
    compared = 0
    for n in FLEET_SIZES:
        one, two = _fleet(results, MUJOU_1, n), _fleet(results, MUJOU_2, n)
        if not (one and two):
            continue
        compared += 1
        if two["share"] < one["share"] - 0.01 or two["lateness_p99_ms"] > 1.1 * one["lateness_p99_ms"] + 0.5:
            slower.append(
                f"N={n}: {two['share']:.3f} / {_ms(two['lateness_p99_ms'])} vs "
                f"{one['share']:.3f} / {_ms(one['lateness_p99_ms'])}"
            )
    found.append(
        Target(
            "workers=2 never slower than workers=1 on the fleet",
            "slower at " + "; ".join(slower) if slower else f"not slower at any of {compared} sizes",
            "—",
            (not slower) if compared else None,
        )
    )
    return found


def _median(results: Results, system: str, workload: str) -> dict[str, float]:
    outcome = results.get((system, workload))
    return outcome.median() if outcome else {}


def _peer_cells(results: Results, systems: list[str], workload: str) -> str:
    """Each peer's figures of ``workload`` in this run, for the targets' table."""
    cells = [
        f"{system}: {_format(workload, m)}"
        for system in systems
        if system not in (MUJOU_1, MUJOU_2) and (m := _median(results, system, workload))
    ]
    return "; ".join(cells) or "—"


def trigger_targets(results: Results, systems: list[str]) -> list[Target]:
    """The targets of issue 13 (event-triggered nodes), each met or not by this run's medians."""
    found: list[Target] = []
    peers = _peer_cells(results, systems, "trigger-latency")
    for system in (MUJOU_1, MUJOU_2):
        m = _median(results, system, "trigger-latency")
        found.append(
            Target(
                f"Trigger to start, real-time timer ({system.split(', ')[1]}): p50 ≤ 15 µs, p99 ≤ 100 µs",
                _format("trigger-latency", m) if m else "—",
                peers,
                (m["latency_p50_us"] <= 15.0 and m["latency_p99_us"] <= 100.0) if m else None,
            )
        )
    m = _median(results, MUJOU_1, "echo-triggered")
    found.append(
        Target(
            "Host round trip through a triggered echo (workers=1): p50 ≤ 25 µs",
            _format("echo-triggered", m) if m else "—",
            _peer_cells(results, systems, "echo-triggered"),
            (m["latency_p50_ms"] <= 0.025) if m else None,
        )
    )
    peers = _peer_cells(results, systems, "chain-10")
    for system in (MUJOU_1, MUJOU_2):
        m = _median(results, system, "chain-10")
        found.append(
            Target(
                f"10 triggered nodes in a chain, end to end ({system.split(', ')[1]}): p50 ≤ 0.3 ms",
                _format("chain-10", m) if m else "—",
                peers,
                (m["latency_p50_us"] <= 300.0) if m else None,
            )
        )
    return found


def _ratio_target(
    name: str,
    mine: float | None,
    ref: float | None,
    ref_name: str,
    limit: float,
    *,
    at_least: bool,
    unit: str,
) -> Target:
    """One ratio target: Mujou's figure over the reference's in this run, against ``limit``."""
    if not (mine and ref):
        return Target(name, "—", "—", None)
    ratio = mine / ref

    def shown(value: float) -> str:
        return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"

    return Target(
        name,
        f"{shown(mine)} {unit} = {ratio:.2f}×",
        f"{ref_name}: {shown(ref)} {unit}",
        ratio >= limit if at_least else ratio <= limit,
    )


def _cpu_per_update_us(m: dict[str, float]) -> float | None:
    """The process CPU per update made of a fleet's run, in µs."""
    return m["cpu_percent"] / 100 * m["seconds"] / m["made"] * 1e6 if m and m["made"] else None


# The ratio targets of issues 24 and 26: (target, workload, metric, reference system, the
# reference's name in the table, limit, whether Mujou's figure is to be at least the limit
# times the reference's (a rate) or at most (a time), unit). "dispatch-virtual" is compared
# with the plain pool's "dispatch" (under the real-time timer).
GLOO = "a bare Gloo send/recv"
RATIO_TARGETS = (
    (
        "Host round trip (triggered echo) p50 ≤ 1.0× the floor's",
        "echo-triggered",
        "latency_p50_ms",
        FLOOR,
        FLOOR,
        1.0,
        False,
        "ms",
    ),
    (
        "Trigger to start p50 (workers=1) ≤ 1.2× the plain pool's",
        "trigger-latency",
        "latency_p50_us",
        POOL,
        POOL,
        1.2,
        False,
        "µs",
    ),
    (
        "Empty updates/s, real-time timer, ≥ 0.5× the plain pool's (real-time timer)",
        "dispatch",
        "updates_per_second",
        POOL,
        POOL,
        0.5,
        True,
        "/s",
    ),
    (
        "Empty updates/s, virtual timer, ≥ 1.0× the plain pool's (real-time timer)",
        "dispatch-virtual",
        "updates_per_second",
        POOL,
        POOL,
        1.0,
        True,
        "/s",
    ),
    (
        "Hand-off cross-process-256B p50 ≤ 1.5× the reference's",
        "cross-process-256B",
        "latency_p50_us",
        FLOOR,
        FLOOR,
        1.5,
        False,
        "µs",
    ),
    (
        "Hand-off cross-process-64KiB p50 ≤ 1.5× the reference's",
        "cross-process-64KiB",
        "latency_p50_us",
        FLOOR,
        FLOOR,
        1.5,
        False,
        "µs",
    ),
    (
        "Hand-off cross-host-256B p50 ≤ 1.5× the reference's",
        "cross-host-256B",
        "latency_p50_us",
        FLOOR,
        GLOO,
        1.5,
        False,
        "µs",
    ),
    (
        "Hand-off cross-host-64KiB p50 ≤ 1.5× the reference's",
        "cross-host-64KiB",
        "latency_p50_us",
        FLOOR,
        GLOO,
        1.5,
        False,
        "µs",
    ),
    (
        "Hand-off cross-host-256B p50 below a synchronous Ray actor call's",
        "cross-host-256B",
        "latency_p50_us",
        RAY,
        RAY,
        1.0,
        False,
        "µs",
    ),
    (
        "Hand-off cross-host-64KiB p50 below a synchronous Ray actor call's",
        "cross-host-64KiB",
        "latency_p50_us",
        RAY,
        RAY,
        1.0,
        False,
        "µs",
    ),
    (
        "Virtual tags/s across two processes ≥ 0.5× the floor's lockstep",
        "tags-virtual-2p",
        "two_processes_tags_per_second",
        FLOOR,
        FLOOR,
        0.5,
        True,
        "/s",
    ),
    (
        "Virtual tags/s across two hosts (loopback) ≥ 0.5× a bare lockstep over TCP",
        "tags-virtual-2h",
        "two_hosts_tags_per_second",
        FLOOR,
        "a bare two-process lockstep over loopback TCP",
        0.5,
        True,
        "/s",
    ),
)


def ratio_targets(results: Results) -> list[Target]:
    """The targets of issues 24 and 26: ratios against a reference measured in the same run
    (the plain pool, the machine's floor, a bare Gloo send/recv), each met or not."""

    def get(system: str, workload: str, key: str) -> float | None:
        return _median(results, system, workload).get(key)

    found = []
    for name, workload, key, reference, shown, limit, at_least, unit in RATIO_TARGETS:
        theirs = "dispatch" if workload == "dispatch-virtual" else workload
        mine, ref = get(MUJOU_1, workload, key), get(reference, theirs, key)
        found.append(_ratio_target(name, mine, ref, shown, limit, at_least=at_least, unit=unit))
    found.append(
        _ratio_target(
            "Fleet N=1000 (workers=1): CPU per update ≤ 1.2× the plain pool's",
            _cpu_per_update_us(_fleet(results, MUJOU_1, 1000)),
            _cpu_per_update_us(_fleet(results, POOL, 1000)),
            POOL,
            1.2,
            at_least=False,
            unit="µs",
        )
    )
    start = get(MUJOU_1, "start-2h", "start_p50_s")
    found.append(
        Target(
            "Start of a two-host run (an agent on loopback) ≤ 3 s",
            _format("start-2h", _median(results, MUJOU_1, "start-2h")) if start is not None else "—",
            "—",
            (start <= 3.0) if start is not None else None,
        )
    )
    return found


def replay_targets(results: Results) -> list[Target]:
    """The replay's target (issue 25), met or not by this run's median."""
    m = _median(results, MUJOU_1, "replay-virtual")
    return [
        Target(
            "Replay under the virtual timer, as fast as it goes: ≥ 0.5× the net's own rate, 0 lost",
            _format("replay-virtual", m) if m else "—",
            "—",
            (m["ratio"] >= 0.5 and m["lost"] == 0 and m["identical"] == 1.0) if m else None,
        )
    ]


def process_targets(results: Results, systems: list[str]) -> list[Target]:
    """The targets of processes, each met or not by this run's medians."""
    found: list[Target] = []
    for workload in ("cross-process-256B", "cross-process-64KiB"):
        m = _median(results, MUJOU_1, workload)
        found.append(
            Target(
                f"Hand-off to another process, {workload.rsplit('-', 1)[1]}: p50 ≤ 20 µs, p99 ≤ 100 µs",
                _format(workload, m) if m else "—",
                _peer_cells(results, systems, workload),
                (m["latency_p50_us"] <= 20.0 and m["latency_p99_us"] <= 100.0) if m else None,
            )
        )
    m = _median(results, MUJOU_1, "fleet-processes")
    found.append(
        Target(
            "Python-bound fleet over two processes: ≥ 1.7× the updates of one process",
            _format("fleet-processes", m) if m else "—",
            _peer_cells(results, systems, "fleet-processes"),
            (m["ratio"] >= 1.7) if m else None,
        )
    )
    m = _median(results, MUJOU_1, "tags-virtual-2p")
    found.append(
        Target(
            "Virtual-timer tags with two processes: ≥ 20,000 per second",
            _format("tags-virtual-2p", m) if m else "—",
            _peer_cells(results, systems, "tags-virtual-2p"),
            (m["two_processes_tags_per_second"] >= 20_000) if m else None,
        )
    )
    m = _median(results, MUJOU_1, "start-stop-2p")
    found.append(
        Target(
            "Start and stop of a run over two processes: start p50 ≤ 1 s, stop p50 ≤ 0.3 s",
            _format("start-stop-2p", m) if m else "—",
            _peer_cells(results, systems, "start-stop-2p"),
            (m["start_p50_s"] <= 1.0 and m["stop_p50_s"] <= 0.3) if m else None,
        )
    )
    return found


def record_targets(results: Results) -> list[Target]:
    """The targets of recording (issue 25), each met or not by this run's medians."""
    found: list[Target] = []
    for workload, floor, unit in (("record-256B", 80_000, "messages"), ("record-1MiB", 300, "MB")):
        m = _median(results, MUJOU_1, workload)
        if unit == "messages":
            name = "Recording 256 B tensors: ≥ 80,000 messages / s, ≥ 0.8× mcap's writer alone"
            met = m["messages_per_second"] >= floor and m["ratio"] >= 0.8 if m else None
        else:
            name = "Recording 1 MiB tensors: ≥ 300 MB / s, ≥ 0.8× mcap's writer alone"
            met = m["mb_per_second"] >= floor and m["ratio"] >= 0.8 if m else None
        cell = _format(workload, m) if m else "—"
        found.append(Target(name, cell, "—", met))
    m = _median(results, MUJOU_1, "record-fleet-100")
    found.append(
        Target(
            "Recording every output of the fleet (N = 100): added p99 lateness ≤ 0.1 ms",
            _format("record-fleet-100", m) if m else "—",
            "—",
            # Met only where the pairs redrawn keep it under 0.1 ms: not on a machine whose
            # noise (plain against plain) is larger than the target.
            (m.get("added_p99_high_ms", m["added_p99_ms"]) <= 0.1) if m else None,
        )
    )
    return found


# -- the tables ------------------------------------------------------------------------------


def _ms(value: float) -> str:
    if math.isnan(value):
        return "—"
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{round(value, -3):,.0f}" if value >= 10_000 else f"{value:,.0f}"


def _us(value: float) -> str:
    """A latency given in µs: in µs below a millisecond, else in ms."""
    if math.isnan(value):
        return "—"
    if value >= 1000:
        return _ms(value / 1000)
    return f"{value:.0f} µs" if value >= 100 else f"{value:.1f} µs"


def _format(workload: str, m: dict[str, Any]) -> str:
    """One cell's figures: a run's metrics or their medians."""
    if workload in HOSTS_WORKLOADS:
        return _format_hosts(workload, m)
    if workload in ("trigger-latency", "chain-10"):
        missed = f" ({m['missed']:.0f} missed)" if m.get("missed") else ""
        return f"{_us(m['latency_p50_us'])} / {_us(m['latency_p99_us'])}{missed}"
    if workload == "echo-triggered":
        return (
            f"{m['round_trips_per_second']:,.0f} / s, {_us(1e3 * m['latency_p50_ms'])} / "
            f"{_us(1e3 * m['latency_p99_ms'])}"
        )
    if workload == "microsteps":
        return _rate(m["microsteps_per_second"])
    if workload == "replay-virtual":
        return (
            f"{m['replay_rate']:.2f} s / s vs {m['own_rate']:.2f} s / s ({m['ratio']:.2f}×), "
            f"{m['lost']:.0f} lost of {m['messages']:,.0f}, identical: {bool(m['identical'])}"
        )
    if workload in CROSS_WORKLOADS:
        missed = f" ({m['missed']:.0f} missed)" if m.get("missed") else ""
        return f"{_us(m['latency_p50_us'])} / {_us(m['latency_p99_us'])}{missed}"
    if workload == "fleet-processes":
        return (
            f"{m['one_process_updates_per_second']:,.0f} / s → "
            f"{m['two_processes_updates_per_second']:,.0f} / s ({m['ratio']:.2f}×)"
        )
    if workload == "tags-virtual-2p":
        return (
            f"{_rate(m['two_processes_tags_per_second'])} (one process: "
            f"{_rate(m['one_process_tags_per_second'])})"
        )
    if workload == "start-stop-2p":
        return (
            f"{_ms(1e3 * m['start_p50_s'])} / {_ms(1e3 * m['stop_p50_s'])} (first start "
            f"{_ms(1e3 * m['start_first_s'])}, {m['runs']:.0f} runs)"
        )
    if workload == "soak":
        return (
            f"{m['seconds']:g} s, {m['messages']:,.0f} messages: descriptors of the host "
            f"{m['host_fds_first']:.0f} → {m['host_fds_last']:.0f} (max {m['host_fds_max']:.0f}), "
            f"of its process {m['child_fds_first']:.0f} → {m['child_fds_last']:.0f} "
            f"(max {m['child_fds_max']:.0f}); /dev/shm {m['shm_first']:.0f} → {m['shm_last']:.0f}"
        )
    if workload in RECORD_WORKLOADS:
        return (
            f"{_rate(m['messages_per_second'])} / s, {m['mb_per_second']:,.0f} MB / s "
            f"({m['ratio']:.2f}× mcap alone: {_rate(m['mcap_messages_per_second'])} / s, "
            f"{m['mcap_mb_per_second']:,.0f} MB / s); per message: {m['recorded_us']:.1f} µs "
            f"(mcap alone {m['mcap_us']:.1f} µs)"
            + (
                f"; h5py appends alone: {_rate(m['h5py_messages_per_second'])} / s, "
                f"{m['h5py_mb_per_second']:,.0f} MB / s"
                if "h5py_messages_per_second" in m
                else ""
            )
            + (
                f"; CPU per message: the run's process {m['run_cpu_us']:.1f} µs (without recording "
                f"{m['sends_cpu_us']:.1f}), the recorder process {m['recorder_cpu_us']:.1f}, mcap "
                f"alone {m['mcap_cpu_us']:.1f}"
                if "run_cpu_us" in m
                else ""
            )
        )
    if workload == "record-fleet-100":
        return (
            f"p99 {_ms(m['plain_lateness_p99_ms'])} → {_ms(m['recorded_lateness_p99_ms'])} "
            f"({1e3 * m['added_p99_ms']:+.0f} µs"
            + (
                f", 90% of rounds redrawn {1e3 * m['added_p99_low_ms']:+.0f} to "
                f"{1e3 * m['added_p99_high_ms']:+.0f} µs; control, plain against plain "
                f"{1e3 * m['control_p99_ms']:+.0f} µs, redrawn {1e3 * m['control_p99_low_ms']:+.0f} to "
                f"{1e3 * m['control_p99_high_ms']:+.0f} µs; {m['rounds']:.0f} rounds (plain, recorded, "
                f"plain) of {m['seconds']:g} s"
                if "control_p99_low_ms" in m
                else ""
            )
            + f"), share {m['plain_share']:.3f} → {m['recorded_share']:.3f}"
            + (
                f"; a slot's first update p99 {_ms(m['plain_wake_p99_ms'])} → "
                f"{_ms(m['recorded_wake_p99_ms'])}, its span p99 {_ms(m['plain_spread_p99_ms'])} → "
                f"{_ms(m['recorded_spread_p99_ms'])}"
                if "plain_wake_p99_ms" in m
                else ""
            )
            + (
                f"; a send of 100 in a row {m['send_us_plain']:.2f} → {m['send_us_recorded']:.2f} µs"
                if "send_us_plain" in m
                else ""
            )
            + (
                f"; the run's CPU per send {m['send_cpu_us_plain']:.2f} → {m['send_cpu_us_recorded']:.2f} µs "
                f"(the tap {m['tap_cpu_us_per_send']:+.2f} µs, {0.1 * m['tap_cpu_us_per_send']:.3f} ms "
                "a slot of 100 sends)"
                if "tap_cpu_us_per_send" in m
                else ""
            )
        )
    if workload == RECORD_SEEK:
        return (
            f"{_ms(m['seek_p50_ms'])} / {_ms(m['seek_max_ms'])} (open {_ms(m['open_ms'])}; "
            f"{m['file_gb']:.2f} GB, {m['chunks']:.0f} chunks)"
        )
    if workload.startswith("fleet-"):
        return f"{m['share']:.3f} / {_ms(m['lateness_p99_ms'])}"
    if workload.startswith("dispatch"):
        return _rate(m["updates_per_second"])
    if workload == "echo":
        return (
            f"{m['round_trips_per_second']:,.0f} / s, {_ms(m['latency_p50_ms'])} / {_ms(m['latency_p99_ms'])}"
        )
    return f"{m['cpu_percent']:.2f} %"


def _cell(results: Results, system: str, workload: str, unavailable: dict[str, str]) -> str:
    if system in unavailable:
        return unavailable[system]
    outcome = results.get((system, workload))
    if outcome is None:
        if workload[6:].isdigit() and int(workload[6:]) > PEER_MAX_N.get(system, 10**9):  # fleet-N
            return NOT_RUN_LARGE
        return "—"
    if outcome.note:
        return outcome.note
    if outcome.failed:
        return "did not finish" if "did not finish" in outcome.error() else "failed"
    ok, runs = len(outcome.ok_runs), len(outcome.runs)
    if ok < runs:
        return f"{_format(workload, outcome.median())} ({ok} of {runs} runs; the rest did not finish)"
    return _format(workload, outcome.median())


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def processes_section(
    results: Results, systems: list[str], unavailable: dict[str, str], durations: Durations
) -> list[str]:
    """The tables of the workloads of processes (none when none of them ran)."""
    if not any(workload in PROCESS_WORKLOADS for _, workload in results):
        return []
    lines = [
        "",
        "## Processes",
        "",
        "Send to read: a sender in one process sends a fresh float64 tensor every 1 ms (the peer "
        "row marked 100 Hz: every 10 ms), the time.monotonic() just before the send in it; the "
        "reader, in the measuring process, takes time.monotonic() once it has the message "
        f"(Mujou: a node triggered by its input, `mujou.on`, one worker per process); p50 / p99 "
        f"after a 0.2 s warm-up, each run {durations.cross:g} s. Fleet: "
        "8 always-due nodes in a ring, each update about 200 µs of pure-Python arithmetic, in one "
        "process, then 4 in each of two; updates per second over "
        f"{durations.fleet_processes:g} s each. Tags: two 1 ms nodes exchanging a message at "
        f"every tag under the virtual timer, wall-clock tags per second over {durations.tags:g} s. "
        f"Start / stop: {durations.start_stops} times, a run with each of two 10 ms nodes in a "
        "process of its own: start until `mujou.run` returns, stop until `run.stop()` returns "
        "(every process exited), p50 (the first start apart: Mujou's starts its fork server); "
        "the floor's row: a bare `multiprocessing` spawn of two processes that import torch and "
        "reply once, then exit when told.",
        "",
    ]
    header = ["system", *(f"hand-off, {w.rsplit('-', 1)[1]}: p50 / p99" for w in CROSS_WORKLOADS)]
    header += [
        "Python-bound fleet: one process → two",
        "virtual tags / s, two processes",
        "start / stop, two processes: p50",
    ]
    lines += [_row(header), _row(["---"] * len(header))]
    shown = (*CROSS_WORKLOADS, "fleet-processes", "tags-virtual-2p", "start-stop-2p")
    for system in systems:
        if not any((system, workload) in results for workload in shown):
            continue
        lines.append(_row([system, *(_cell(results, system, workload, unavailable) for workload in shown)]))
    soak = results.get((MUJOU_1, "soak"))
    if soak is not None and soak.ok_runs:
        text = _format("soak", soak.median())
        lines += ["", f"Soak (Mujou, the hand-off at 1 kHz, 64 KiB and 128 KiB by turns): {text}."]
    return lines


def markdown(
    info: dict[str, Any],
    *,
    results: Results,
    systems: list[str],
    unavailable: dict[str, str],
    durations: Durations,
    command: str,
) -> str:
    lines = ["# Mujou benchmarks", ""]
    commit = info["commit"][:12] + (" (mujou/ modified)" if info["mujou_modified"] else "")
    peers = ", ".join(
        f"{name} {info[key]}" for name, key in (("Holoscan", "holoscan"), ("ezmsg", "ezmsg")) if info[key]
    )
    lines += [
        f"Measured {info['date']} on {info['cpu']}, {info['cpus']} CPUs ({info['usable_cpus']} usable), "
        f"{info['platform']}; {info['implementation']} {info['python']} (GIL {info['gil']}), "
        f"torch {info['torch']} (1 thread), Mujou {info['mujou']} at {commit}"
        + (f"; {peers}" if peers else "")
        + ".",
        "",
        *(
            [
                f"**mujou/ changed during this run ({len(info['mujou_sources'])} versions): the "
                "figures mix versions; run it again.**",
                "",
            ]
            if len(info.get("mujou_sources", [])) > 1
            else []
        ),
        f"`{command}`: each figure is the median of {durations.repeats} run(s), each in a fresh "
        f"process; the fleet runs {durations.fleet:g} s ({durations.fleet_largest:g} s at "
        f"N=10,000); a process still running after {durations.limit:g} s did not finish. Fleet "
        "cells: share of the updates made / p99 lateness (update start minus due time). Every "
        "update computes `y = tanh(W @ x)` (16×16) on the latest output of the previous node "
        "of a ring, period 10 ms.",
        "",
    ]
    header = [
        "system",
        *(f"N={n:,}" for n in durations.sizes),
        "empty updates / s (N=100, no wait, 1 worker)",
        "host round trips (1 kHz echo): rate, p50 / p99",
        "one idle 100 Hz node: CPU",
    ]
    rows: list[str] = []
    periodic = ("dispatch", "dispatch-virtual", "echo", "idle", *(f"fleet-{n}" for n in durations.sizes))
    for system in systems:
        # A row for each system that ran a periodic case (the process peers and the floor run
        # none), or could not be installed.
        if system not in unavailable and not any((system, workload) in results for workload in periodic):
            continue
        if system == MUJOU_1:
            dispatch = (
                f"{_cell(results, system, 'dispatch', unavailable)} (real-time), "
                f"{_cell(results, system, 'dispatch-virtual', unavailable)} (virtual)"
            )
        else:
            dispatch = _cell(results, system, "dispatch", unavailable)
        rows.append(
            _row(
                [
                    system,
                    *(_cell(results, system, f"fleet-{n}", unavailable) for n in durations.sizes),
                    dispatch,
                    _cell(results, system, "echo", unavailable),
                    _cell(results, system, "idle", unavailable),
                ]
            )
        )
    if rows:  # none when only the trigger or process workloads ran
        lines += [_row(header), _row(["---"] * len(header)), *rows]
    lines += [
        "",
        "## Event-triggered nodes",
        "",
        "Real-time timer unless said otherwise; latencies p50 / p99 over the events after a "
        f"0.2 s warm-up, each run {durations.trigger:g} s. The sender sends every 1 ms "
        "(trigger to start) or every 2 ms (the chain); the host waits a random fraction of "
        "1 ms between round trips.",
        "",
    ]
    header = [
        "system",
        "trigger to start: p50 / p99",
        "host round trips (triggered echo): rate, p50 / p99",
        "10 triggered nodes, end to end: p50 / p99",
        "microsteps / s (virtual timer, 1 worker)",
    ]
    lines += [_row(header), _row(["---"] * len(header))]
    for system in systems:
        if not any(system in runs for _, runs in TRIGGER_WORKLOADS.values()):
            continue
        lines.append(
            _row([system, *(_cell(results, system, workload, unavailable) for workload in TRIGGER_WORKLOADS)])
        )
    lines += processes_section(results, systems, unavailable, durations)
    lines += ["", "## Targets", ""]
    lines += [_row(["target", "Mujou", "the peers, same run", "met"]), _row(["---"] * 4)]
    for target in targets(results, systems):
        met = "not measured" if target.met is None else "met" if target.met else "**not met**"
        lines.append(_row([target.name, target.measured, target.peers, met]))
    lines += [
        "",
        "workers=2 counts as slower when it makes a share of the updates lower by more than "
        "0.01, or has a p99 lateness above 1.1 × that of workers=1 + 0.5 ms, at any N.",
        "",
        "## The fleet in detail",
        "",
        _row(["system", "N", "share made", "p50", "p99", "max", "process CPU", "runs"]),
        _row(["---"] * 8),
    ]
    for n in durations.sizes:
        for system in systems:
            outcome = results.get((system, f"fleet-{n}"))
            if outcome is None or system in unavailable:
                continue
            m = outcome.median()
            if not m:
                lines.append(
                    _row([system, f"{n:,}", _cell(results, system, f"fleet-{n}", unavailable)] + [""] * 5)
                )
                continue
            lines.append(
                _row(
                    [
                        system,
                        f"{n:,}",
                        f"{m['share']:.3f}",
                        _ms(m["lateness_p50_ms"]),
                        _ms(m["lateness_p99_ms"]),
                        _ms(m["lateness_max_ms"]),
                        f"{m['cpu_percent']:.0f} %",
                        f"{len(outcome.ok_runs)}/{len(outcome.runs)}",
                    ]
                )
            )
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one short repeat (about 7 minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results", help="where to write the results")
    parser.add_argument("--repeats", type=int, help="repeats of each measurement (default 3, --quick 1)")
    parser.add_argument(
        "--only",
        help="comma-separated workloads to run: fleet-10, fleet-100, fleet-1000, fleet-10000, dispatch, "
        "dispatch-virtual, echo, idle, "
        + ", ".join((*TRIGGER_WORKLOADS, *PROCESS_WORKLOADS, *HOSTS_WORKLOADS)),
    )
    parser.add_argument("--soak-seconds", type=float, help="how long the soak runs (default 10, --quick 5)")
    parser.add_argument(
        "--quiet",
        type=float,
        metavar="CORES",
        help="on a shared machine: before each case wait for a moment when the machine uses under "
        f"CORES cores, and run a case again (up to {QUIET_TRIES} times) while the rest of the "
        "machine used more than CORES cores during it",
    )
    parser.add_argument(
        "--systems", help="comma-separated: mujou,asyncio,threads,heap_pool,holoscan,ezmsg,torch_mp,floor,ray"
    )
    args = parser.parse_args(argv)
    durations = QUICK if args.quick else FULL
    if args.repeats:
        durations = Durations(**{**durations.__dict__, "repeats": args.repeats})
    if args.soak_seconds:
        durations = Durations(**{**durations.__dict__, "soak": args.soak_seconds})
    systems = list(SYSTEMS)
    if args.systems:
        wanted = set(args.systems.split(","))
        systems = [system for system in systems if MODULE_OF[system] in wanted]
    command = shlex.join(["python", "bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl, md = args.out / "results.jsonl", args.out / "results.md"

    info = machine()
    unavailable: dict[str, str] = {}
    for system in systems:
        if system in PEERS:
            why = probe(system)
            if why is not None:
                unavailable[system] = "not installable here"
                print(f"{system}: not available ({why})", file=sys.stderr)
    info["unavailable"] = {system: why for system, why in unavailable.items()}
    runnable = [system for system in systems if system not in unavailable]
    cases = plan(durations, runnable)
    if args.only:
        cases = [case for case in cases if case.workload in set(args.only.split(","))]

    results: Results = {}
    began = time.perf_counter()
    with jsonl.open("w") as out:
        out.write(json.dumps({"type": "machine", **info}) + "\n")
        for repeat in range(durations.repeats):
            for case in cases:
                key = (case.system, case.workload)
                outcome = results.setdefault(key, Outcome())
                if _skip(results, case):
                    continue
                source = mujou_source()
                load = os.getloadavg()[0]  # a busy machine disturbs the figures: rerun them
                result = measure_quietly(case, args.quiet)
                result["mujou_source"] = source
                result["load_before"] = load
                others = result.get("others_cpu")
                outcome.runs.append(result)
                record = {
                    "type": "run",
                    "system": case.system,
                    "workload": case.workload,
                    "params": case.params,
                    "repeat": repeat,
                    **result,
                }
                out.write(json.dumps(record) + "\n")
                out.flush()
                elapsed = time.perf_counter() - began
                shown = _format(case.workload, result["metrics"]) if result["ok"] else result["error"]
                step = f"{repeat + 1}/{durations.repeats}"
                line = f"[{elapsed:5.0f} s] {step} {case.system:40} {case.workload:17} {shown}"
                busy = "" if others is None else f", others used {others:.2f} cores"
                if result.get("attempt", 1) > 1:
                    busy += f", run {result['attempt']} of the case"
                print(f"{line} (load {load:.2f}{busy})", flush=True)
        for (system, workload), outcome in results.items():
            out.write(
                json.dumps(
                    {
                        "type": "median",
                        "system": system,
                        "workload": workload,
                        "runs": len(outcome.runs),
                        "ok": len(outcome.ok_runs),
                        "metrics": outcome.median(),
                        "error": outcome.error() or None,
                    }
                )
                + "\n"
            )
        for target in targets(results, runnable):
            out.write(json.dumps({"type": "target", **target.__dict__}) + "\n")
    sources = {run.get("mujou_source") for outcome in results.values() for run in outcome.runs}
    info["mujou_sources"] = sorted(str(source) for source in sources)
    text = markdown(
        info, results=results, systems=systems, unavailable=unavailable, durations=durations, command=command
    )
    md.write_text(text)
    print()
    print(text)
    print(f"written: {jsonl} and {md} ({time.perf_counter() - began:.0f} s)")
    return 0


def _skip(results: Results, case: Case) -> bool:
    """Whether not to run this case: it failed in an earlier repeat, or a smaller fleet failed."""
    outcome = results[(case.system, case.workload)]
    if len(outcome.ok_runs) < len(outcome.runs):
        return True  # a run that did not finish once is not tried again
    if case.function == "soak" and outcome.runs:
        return True  # the soak runs once
    if case.function not in MEASURED_LONG and any(
        run["wall_seconds"] > SLOW for run in outcome.runs if run.get("ok")
    ):
        return True  # its set-up is too slow to repeat within the time budget
    if case.function == "fleet":
        for n in FLEET_SIZES:
            if n >= case.params["n"]:
                break
            smaller = results.get((case.system, f"fleet-{n}"))
            if smaller is not None and smaller.failed:
                outcome.note = f"not run (N={n:,} did not finish)"
                return True
    return False


# -- several machines (issue 26): bench/mujou_hosts.py, an agent on loopback ------------------------

CROSS_HOST_WORKLOADS = {"cross-host-256B": 256, "cross-host-64KiB": 65536}
HOSTS_WORKLOADS = (*CROSS_HOST_WORKLOADS, "tags-virtual-2h", "start-2h")
RAY_START_LIMIT = 60.0  # a local Ray cluster's start and stop, on top of a case's limit


def plan_hosts(durations: Durations, systems: list[str]) -> list[Case]:
    """The cases of several machines: Mujou with a group on another host (an agent on loopback);
    the floor is a bare Gloo send/recv of the same tensor (cross-host-*) and a bare lockstep of two
    processes over loopback TCP (tags-virtual-2h); where Ray installs, a synchronous Ray actor
    call with the same tensor (cross-host-*)."""
    found: list[Case] = []
    limit = durations.limit
    for workload, nbytes in CROSS_HOST_WORKLOADS.items():
        params = {"nbytes": nbytes, "seconds": durations.cross}
        if MUJOU_1 in systems:
            found.append(Case(MUJOU_1, workload, "cross_host", params, limit, "mujou_hosts"))
        if FLOOR in systems:
            found.append(Case(FLOOR, workload, "gloo_handoff", params, limit, "mujou_hosts"))
        if RAY in systems:
            ray_limit = limit + RAY_START_LIMIT
            found.append(Case(RAY, workload, "ray_actor_call", params, ray_limit, "mujou_hosts"))
    if MUJOU_1 in systems:
        tags = {"seconds": durations.tags}
        found.append(Case(MUJOU_1, "tags-virtual-2h", "tags_virtual_hosts", tags, limit, "mujou_hosts"))
    if FLOOR in systems:  # a bare lockstep of two processes over loopback TCP
        tags = {"seconds": durations.tags}
        found.append(Case(FLOOR, "tags-virtual-2h", "tcp_lockstep", tags, limit, "mujou_hosts"))
        starts = {"runs": durations.start_stops}
        starts_limit = limit + START_STOP_LIMIT * durations.start_stops
        found.append(Case(MUJOU_1, "start-2h", "start_two_hosts", starts, starts_limit, "mujou_hosts"))
    return found


def _format_hosts(workload: str, m: dict[str, Any]) -> str:
    if workload in CROSS_HOST_WORKLOADS:
        missed = f" ({m['missed']:.0f} missed)" if m.get("missed") else ""
        return f"{_us(m['latency_p50_us'])} / {_us(m['latency_p99_us'])}{missed}"
    if workload == "tags-virtual-2h" and "ratio" not in m:  # the bare TCP lockstep
        return f"{_rate(m['two_hosts_tags_per_second'])} (two processes over loopback TCP)"
    if workload == "tags-virtual-2h":
        return (
            f"{_rate(m['two_hosts_tags_per_second'])} (two processes of one host: "
            f"{_rate(m['two_processes_tags_per_second'])}, {m['ratio']:.2f}×)"
        )
    return f"start {m['start_p50_s']:.3f} s (max {m['start_max_s']:.3f} s), stop {m['stop_p50_s']:.3f} s"


if __name__ == "__main__":
    sys.exit(main())
