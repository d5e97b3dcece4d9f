"""CUDA benchmark: do CUDA nodes overlap on their streams, and do their messages stay on the GPU?

    python bench/cuda_overlap.py [--rounds R] [--ms MS] [--nodes K]

(a) Overlap. K CUDA nodes (default 8) on one device, each of whose ``on_update`` queues about
    MS milliseconds (default 2) of kernels (``torch.cuda._sleep``, calibrated on this GPU) on
    its own stream, run R rounds under the virtual timer (every round, all K updates are due at
    once). With one worker per node the kernels of a round overlap on their streams, so the wall
    time per round is close to MS, well under K × MS; with one worker they run one after the
    other (the serial reference). See the rules cuda.stream-current and cuda.wait-after-update.

(b) Where messages travel. Two CUDA nodes on one device connected by a port run R rounds
    under ``torch.profiler``; the trace's memcpy events show that every message is copied
    device to device (``DtoD``) and never through host memory (``HtoD``/``DtoH``). The same
    sender read by a CPU node is shown for contrast (cuda.host-memory-route: ``DtoH``).
    See cuda.send-stays-on-device and cuda.device-to-device.

Needs a CUDA device: without one it says so and exits 0. Nothing here asserts; it prints a
small table and a verdict per part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

import mujou

PERIOD = 0.01  # virtual seconds between two rounds
WARMUP = 10  # rounds run before the measured ones (streams made, kernels loaded)
KERNELS = 4  # kernels each update queues; together they take about --ms milliseconds
CALIBRATION_CYCLES = 20_000_000  # a calibration kernel: about 10 ms on current GPUs
MESSAGE = 1 << 18  # float32 elements of a message in (b): 1 MiB


def sleep_kernel(cycles: int) -> None:
    """Queue one kernel that spins for ``cycles`` GPU clock cycles on the current stream."""
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # untyped in torch


def cycles_per_ms() -> float:
    """How many ``torch.cuda._sleep`` cycles take one millisecond on the current GPU."""
    sleep_kernel(CALIBRATION_CYCLES // 10)  # warm-up: the kernel is loaded
    torch.cuda.synchronize()
    timings = []
    for _ in range(5):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # untyped
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # untyped
        start.record()
        sleep_kernel(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        timings.append(float(start.elapsed_time(end)))
    return CALIBRATION_CYCLES / statistics.median(timings)


# --------------------------------------------------------------------------------------------
# (a) overlap


class Busy(mujou.Node):
    """A CUDA node whose update queues ``KERNELS`` kernels of ``cycles`` cycles each."""

    def __init__(self, cycles: int) -> None:
        super().__init__(period=PERIOD, seed=0, device="cuda")
        self.cycles = cycles

    def on_update(self, dt: float) -> None:
        for _ in range(KERNELS):
            sleep_kernel(self.cycles)


class Fleet(mujou.Net):
    def __init__(self, count: int, cycles: int) -> None:
        super().__init__()
        for i in range(count):
            setattr(self, f"busy{i}", Busy(cycles))


def wall_per_round(count: int, cycles: int, workers: int, rounds: int) -> float:
    """Wall seconds per round of ``count`` Busy nodes on ``workers`` workers."""
    with mujou.run(Fleet(count, cycles), workers=workers, timer=mujou.VirtualTimer()) as run:
        run.sleep(WARMUP * PERIOD)
        began = time.perf_counter()
        run.sleep(rounds * PERIOD)
        ended = time.perf_counter()
    return (ended - began) / rounds


# --------------------------------------------------------------------------------------------
# (b) where messages travel


class Sender(mujou.Node):
    """Sends a fresh 1 MiB CUDA tensor at each update."""

    y = mujou.Output()

    def __init__(self) -> None:
        super().__init__(period=PERIOD, seed=0, device="cuda")

    def on_update(self, dt: float) -> None:
        self.y.send(torch.randn(MESSAGE, generator=self.generator, device=self.device))


class Reader(mujou.Node):
    """Reads the message at each update and reduces it on its own device."""

    x = mujou.Input()

    def __init__(self, device: str) -> None:
        super().__init__(period=PERIOD, seed=0, device=device)
        self.total = torch.zeros((), device=device)

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None:
            self.total = self.total + message.sum()


class Pair(mujou.Net):
    def __init__(self, reader_device: str) -> None:
        super().__init__()
        self.sender = Sender()
        self.reader = Reader(reader_device)
        self.connect(self.sender.y, self.reader.x)


def memcpy_counts(reader_device: str, rounds: int) -> Counter[str]:
    """The memcpy events, by direction, of ``rounds`` rounds of a Pair (and the kernels)."""
    net = Pair(reader_device)
    with mujou.run(net, workers=2, timer=mujou.VirtualTimer()) as run:
        run.sleep(WARMUP * PERIOD)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.profiler.profile(activities=activities) as profiler:
                run.sleep(rounds * PERIOD)
                torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "trace.json"
                profiler.export_chrome_trace(str(path))
                events = json.loads(path.read_text())["traceEvents"]
    counts: Counter[str] = Counter()
    for event in events:
        name = str(event.get("name", ""))
        category = str(event.get("cat", "")).lower()
        if category == "kernel":
            counts["kernels"] += 1
        elif category == "gpu_memcpy" or name.startswith("Memcpy "):
            kind = next((k for k in ("HtoD", "DtoH", "DtoD", "PtoP", "HtoH") if k in name), "other")
            counts["DtoD" if kind == "PtoP" else kind] += 1
    return counts


# --------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="measured rounds (default 200)")
    parser.add_argument("--ms", type=float, default=2.0, help="kernel milliseconds per update (default 2)")
    parser.add_argument("--nodes", type=int, default=8, help="CUDA nodes in (a) (default 8)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"cuda_overlap: CUDA is not available here (torch {torch.__version__}); nothing to measure")
        return 0
    torch.set_num_threads(1)  # the host's setting of the whole process, as the spec asks
    warnings.simplefilter("ignore", mujou.OversubscriptionWarning)
    device = torch.cuda.current_device()
    print(
        f"Mujou {mujou.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"{torch.cuda.get_device_name(device)}"
    )

    rate = cycles_per_ms()
    cycles = max(1, round(args.ms * rate / KERNELS))
    count, rounds = args.nodes, args.rounds
    serial = count * args.ms
    overlapped = wall_per_round(count, cycles, count, rounds) * 1e3
    one_worker = wall_per_round(count, cycles, 1, rounds) * 1e3
    print()
    print(
        f"(a) overlap: {count} CUDA nodes, each update queues {KERNELS} kernels of "
        f"{args.ms / KERNELS:.2f} ms ({args.ms:.2f} ms; {rate / 1e3:.0f} k cycles per ms), "
        f"{rounds} rounds"
    )
    print(f"    {'workers':>7} | {'wall per round':>14} | {f'/ ({count} × {args.ms:g} ms)':>16}")
    for workers, wall in ((count, overlapped), (1, one_worker)):
        print(f"    {workers:>7} | {wall:>11.2f} ms | {wall / serial:>16.2f}")
    verdict = "overlap: yes" if overlapped < 0.5 * serial else "overlap: NOT well under the serial time"
    print(f"    {verdict} ({overlapped:.2f} ms per round against {serial:g} ms one after the other)")

    print()
    print(f"(b) where messages travel: {rounds} updates of a {MESSAGE * 4 >> 20} MiB message, profiled")
    print(f"    {'sender -> reader':<28} | {'DtoD':>5} | {'HtoD':>5} | {'DtoH':>5} | {'kernels':>7}")
    rows = {}
    for label, reader in (("cuda -> cuda, same device", f"cuda:{device}"), ("cuda -> cpu (contrast)", "cpu")):
        counts = rows[label] = memcpy_counts(reader, rounds)
        print(
            f"    {label:<28} | {counts['DtoD']:>5} | {counts['HtoD']:>5} | {counts['DtoH']:>5} | "
            f"{counts['kernels']:>7}"
        )
    device_row = rows["cuda -> cuda, same device"]
    if device_row["kernels"] == 0:
        print("    the profiler recorded no kernel (CUPTI unavailable?): no verdict")
    elif device_row["HtoD"] == device_row["DtoH"] == 0 and device_row["DtoD"] > 0:
        print("    device to device: yes (no message passed through host memory)")
    else:
        print("    device to device: NO (host-memory copies between two CUDA nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
