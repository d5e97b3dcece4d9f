"""Recording (``mujou.run(net, record=...)``): the recorder's throughput beside ``mcap``'s writer
alone on the same messages, and what recording every output adds to the fleet's lateness.

Throughput: a node sends ``count`` messages of ``nbytes`` (a float32 tensor, sent with
``copy=False`` so that the sender's copy is not measured), ``PER_UPDATE`` in each update, under
the virtual timer, so that nothing is dropped and every message reaches the file; the time is
from the first update until ``run.stop()`` returned (the file complete). ``mcap`` alone writes
the same payload (the message's bytes, encoded once) ``count`` times with the same chunk size
and compression, until ``finish()``; where h5py installs and nothing is compressed, h5py
appends the same payloads to an HDF5 file as a rosbag2-like log would (a dataset of rows, one
per message, grown 1,024 rows at a time, and one of their times), until the file is closed. The
CPU time is taken apart too: the run's process, recorded and not (the sends; the difference is
the tap), and the recorder process.
"""

from __future__ import annotations

import functools
import math
import os
import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import mujou
from mujou import Node, Output

from ._common import GRACE, Metrics, Record, weights, zeros
from ._common import PERIOD as FLEET_PERIOD
from .mujou_system import Ring, RingNode, _origin

PER_UPDATE = 100  # messages sent in one update
PERIOD = 0.001  # timer seconds between the sender's updates


class Sender(Node):
    """Sends the same tensor ``PER_UPDATE`` times in each update, until ``count`` are sent."""

    out = Output()

    def __init__(self, tensor: torch.Tensor, count: int) -> None:
        super().__init__(period=PERIOD, seed=0)
        self.tensor = tensor
        self.left = count
        self.began = 0.0  # perf_counter at the first update
        self.began_cpu = 0.0  # process_time then

    def on_update(self, dt: float) -> None:
        if not self.began:
            self.began, self.began_cpu = time.perf_counter(), time.process_time()
        for _ in range(min(PER_UPDATE, self.left)):
            self.out.send(self.tensor, copy=False)
        self.left = max(0, self.left - PER_UPDATE)


def _children_cpu() -> float:
    """CPU seconds of the child processes that ended (the recorder process, once reaped)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run(tensor: torch.Tensor, count: int, record: mujou.Recorder | None) -> tuple[float, float, float]:
    """Wall seconds from the first update until ``count`` messages are sent (and, with
    ``record``, written: until the file is complete); the run's process's CPU seconds (every
    thread) over the same span; and the recorder process's CPU seconds, its start included.
    The run's start (with ``record``, the recorder process's start) is not in the wall time, as
    mcap alone's imports are not."""
    sender = Sender(tensor, count)
    net = mujou.Net()
    net.sender = sender
    children = _children_cpu()
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer(), record=record) as run:
        run.sleep(PERIOD * (count // PER_UPDATE + 2))
    wall = time.perf_counter() - sender.began
    cpu = time.process_time() - sender.began_cpu
    assert sender.left == 0
    return wall, cpu, _children_cpu() - children


def _mcap_alone(path: Path, payload: bytes, count: int, compression: str | None, chunk_size: int) -> float:
    from mcap.writer import CompressionType, Writer

    from mujou._record._encoding import tensor_schema

    kind = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4, None: CompressionType.NONE}[compression]
    began = time.perf_counter()
    with open(path, "wb") as stream:
        writer = Writer(stream, chunk_size=chunk_size, compression=kind)
        writer.start(profile="mujou", library="bench")
        schema = writer.register_schema("mujou.Tensor", "protobuf", tensor_schema())
        channel = writer.register_channel("/sender/out", "protobuf", schema, {})
        for i in range(count):
            time_ns = i * 1000
            writer.add_message(channel, time_ns, payload, time_ns, 0)
        writer.finish()  # type: ignore[no-untyped-call]  # mcap's own method, unannotated
    return time.perf_counter() - began


def _h5py_alone(path: Path, payload: bytes, count: int) -> float | None:
    """Seconds for h5py to append ``count`` copies of ``payload``, one row each, with their
    times, until the file is closed; None where h5py does not install."""
    try:
        import h5py
    except ImportError:
        return None
    import numpy

    row, grow = numpy.frombuffer(payload, dtype=numpy.uint8), 1024
    began = time.perf_counter()
    with h5py.File(path, "w") as stored:
        data = stored.create_dataset(
            "data",
            (grow, len(row)),
            maxshape=(None, len(row)),
            dtype="u1",
            chunks=(max(1, (1 << 20) // len(row)), len(row)),
        )
        times = stored.create_dataset("log_time", (grow,), maxshape=(None,), dtype="i8", chunks=(grow,))
        for i in range(count):
            if i == len(times):
                data.resize(i + grow, axis=0)
                times.resize(i + grow, axis=0)
            data[i] = row
            times[i] = i * 1000
        data.resize(count, axis=0)
        times.resize(count, axis=0)
    return time.perf_counter() - began


def record_throughput(nbytes: int, count: int, compression: str | None = None) -> Metrics:
    """Messages per second and MB/s through a recorded run, beside mcap's writer alone."""
    from mujou._record._encoding import encode_tensor
    from mujou._record._recorder import DEFAULT_CHUNK_SIZE

    tensor = torch.rand(nbytes // 4)
    payload = encode_tensor(tensor)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.mcap"
        _run(tensor, max(1, count // 10), mujou.Recorder(path, compression=compression))  # warm-up
        recorded, run_cpu, recorder_cpu = _run(tensor, count, mujou.Recorder(path, compression=compression))
        file_bytes = os.path.getsize(path)
        sends, sends_cpu, _ = _run(tensor, count, None)
        began = time.process_time()
        alone = _mcap_alone(Path(folder) / "alone.mcap", payload, count, compression, DEFAULT_CHUNK_SIZE)
        alone_cpu = time.process_time() - began
        h5 = _h5py_alone(Path(folder) / "alone.h5", payload, count) if compression is None else None
    return {
        "nbytes": nbytes,
        "count": count,
        "messages_per_second": count / recorded,
        "mb_per_second": count * nbytes / recorded / 1e6,
        "mcap_messages_per_second": count / alone,
        "mcap_mb_per_second": count * nbytes / alone / 1e6,
        "ratio": alone / recorded,
        "sends_us": 1e6 * sends / count,
        "mcap_us": 1e6 * alone / count,
        "recorded_us": 1e6 * recorded / count,
        # CPU µs a message: the run's process recorded and plain (their difference is the tap),
        # the recorder process (its start included), mcap alone
        "run_cpu_us": 1e6 * run_cpu / count,
        "sends_cpu_us": 1e6 * sends_cpu / count,
        "recorder_cpu_us": 1e6 * recorder_cpu / count,
        "mcap_cpu_us": 1e6 * alone_cpu / count,
        "file_bytes": file_bytes,
        **(
            {}
            if h5 is None
            else {"h5py_messages_per_second": count / h5, "h5py_mb_per_second": count * nbytes / h5 / 1e6}
        ),
    }


def fleet_recorded(n: int, seconds: float, rounds: int = 1) -> Metrics:
    """The fleet (bench/mujou_system.py's ring of ``n`` nodes on one worker), plain and with
    every output recorded, in ``rounds`` rounds of three runs of ``seconds`` each: plain,
    recorded, plain, so that a slow minute of the shared machine falls on all three; each p99
    is that of every update of its runs pooled ("plain": the first plain runs).

    How far the added p99 can be trusted: ``added_p99_low_ms``/``added_p99_high_ms``, the 5th
    and 95th percentiles of the recorded runs' p99 minus the plain runs' (both of each round)
    over the rounds drawn again with replacement (a bootstrap, seeded); and the control,
    ``control_p99_ms`` with ``control_p99_low_ms``/``control_p99_high_ms``: each round's second
    plain run against its first, drawn again the same way (what an added p99 of 0 looks like:
    the wall clock's noise on this machine). Where a slot's lateness comes from:
    ``*_wake_p99_ms``, the p99 of each slot's first update's lateness (the worker woken late:
    the machine, or a copy of the tap under way), and ``*_spread_p99_ms``, that of the span
    from its first update's start to its last's (the updates before the last, with their sends
    and taps). Also what one send costs the hook that sends ``n`` in a row (as the fleet's
    nodes due together on one worker do), plain and recorded, and the run's process's CPU per
    send (``tap_cpu_us_per_send``: the tap and its deferred copy), which the load moves far
    less than the lateness.
    """
    plain: list[torch.Tensor] = []
    recorded: list[torch.Tensor] = []
    again: list[torch.Tensor] = []  # each round's second plain run: the control
    shares: dict[bool, list[float]] = {False: [], True: []}
    # Each slot's lateness taken apart: its first update's (the worker's wake-up) and the time
    # from its first update's start to its last's (the updates before the last, taps included).
    parts: dict[bool, tuple[list[torch.Tensor], list[torch.Tensor]]] = {False: ([], []), True: ([], [])}
    with tempfile.TemporaryDirectory() as folder:
        for k in range(rounds):
            # plain, recorded, plain: the recorded run between two plain ones, so that a drift
            # of the machine over the round falls on the control (plain against plain) too.
            for record, runs in ((False, plain), (True, recorded), (False, again)):
                path = str(Path(folder) / f"fleet-{k}.mcap") if record else None
                lateness, share, wake, spread = _fleet_lateness(n, seconds, path)
                runs.append(lateness)
                shares[record].append(share)
                parts[record][0].append(wake)
                parts[record][1].append(spread)
        send_plain, cpu_plain = send_cost(n, seconds / 2, None)
        send_recorded, cpu_recorded = send_cost(n, seconds / 2, mujou.Recorder(Path(folder) / "sends.mcap"))
    found: dict[str, Any] = {"n": n, "seconds": seconds, "rounds": rounds}
    for name, runs in (("plain", plain), ("recorded", recorded)):
        pooled = torch.cat(runs)
        found[f"{name}_lateness_p50_ms"] = 1e3 * _quantile(pooled, 0.50)
        found[f"{name}_lateness_p99_ms"] = 1e3 * _quantile(pooled, 0.99)
        found[f"{name}_lateness_max_ms"] = 1e3 * float(pooled.max())
        found[f"{name}_share"] = sum(shares[name == "recorded"]) / len(shares[name == "recorded"])
        found[f"{name}_updates"] = len(pooled)
        wake, spread = (torch.cat(part) for part in parts[name == "recorded"])
        found[f"{name}_wake_p99_ms"] = 1e3 * _quantile(wake, 0.99)
        found[f"{name}_spread_p99_ms"] = 1e3 * _quantile(spread, 0.99)
    found["added_p99_ms"] = found["recorded_lateness_p99_ms"] - found["plain_lateness_p99_ms"]
    each = sorted(
        1e3 * (_quantile(r, 0.99) - _quantile(p, 0.99)) for p, r in zip(plain, recorded, strict=True)
    )
    found["added_p99_per_pair_median_ms"] = each[len(each) // 2]
    if rounds >= 2:
        both = [torch.cat(pair) for pair in zip(plain, again, strict=True)]
        low, high = _bootstrap_added_p99(both, recorded)
        found["added_p99_low_ms"], found["added_p99_high_ms"] = low, high
        # The control: each round's second plain run against its first, drawn again the same
        # way; its interval is what the machine alone moves the p99 by (an added p99 of 0).
        found["control_p99_ms"] = 1e3 * (
            _quantile(torch.cat(again), 0.99) - _quantile(torch.cat(plain), 0.99)
        )
        low, high = _bootstrap_added_p99(plain, again)
        found["control_p99_low_ms"], found["control_p99_high_ms"] = low, high
    found["send_us_plain"] = send_plain
    found["send_us_recorded"] = send_recorded
    # The tap's CPU per send (the run's process: the tap and its deferred copy), which the
    # machine's load moves far less than the wall clock's lateness.
    found["send_cpu_us_plain"] = cpu_plain
    found["send_cpu_us_recorded"] = cpu_recorded
    found["tap_cpu_us_per_send"] = cpu_recorded - cpu_plain
    return found


def _fleet_lateness(
    n: int, seconds: float, record_to: str | None
) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
    """The lateness (seconds) of every update of one fleet run due in (0, ``seconds``] and
    started by ``seconds + GRACE``, and their share of those due (as the fleet workload counts);
    and, for each slot, its first update's lateness and the span of its updates' starts."""
    zero = zeros()
    nodes = [RingNode(w, zero) for w in weights(n)]
    with mujou.run(Ring(nodes), workers=1, record=record_to) as run:
        origin = _origin(run)
        run.sleep(max(0.0, seconds + GRACE - run.time))
    record = Record()
    for node in nodes:
        node.record(record)
    limit, last_start = seconds + 1e-9, origin + seconds + GRACE
    lateness = []
    slots: dict[float, list[float]] = {}
    for start, due in zip(record.starts, record.dues, strict=True):
        if due <= limit and start <= last_start:
            lateness.append(start - origin - due)
            slots.setdefault(due, []).append(start - origin - due)
    wake = [min(slot) for slot in slots.values()]
    spread = [max(slot) - min(slot) for slot in slots.values()]
    share = len(lateness) / (n * math.floor(seconds / FLEET_PERIOD + 1e-9))
    as_tensor = functools.partial(torch.tensor, dtype=torch.float64)
    return as_tensor(lateness), share, as_tensor(wake), as_tensor(spread)


def _quantile(values: torch.Tensor, q: float) -> float:
    """The ``q``-quantile, nearest rank (as bench/_common.py's percentile)."""
    rank = min(len(values), max(1, math.ceil(q * len(values))))
    return float(values.kthvalue(rank).values)


def _bootstrap_added_p99(
    plain: list[torch.Tensor], recorded: list[torch.Tensor], draws: int = 200
) -> tuple[float, float]:
    """The 5th and 95th percentiles (ms) of the pooled added p99 over the pairs of runs drawn
    again with replacement (a pair's two runs drawn together: they shared the machine's minute)."""
    chosen = random.Random(0)
    added = []
    for _ in range(draws):
        pairs = [chosen.randrange(len(plain)) for _ in plain]
        p99_plain = _quantile(torch.cat([plain[i] for i in pairs]), 0.99)
        p99_recorded = _quantile(torch.cat([recorded[i] for i in pairs]), 0.99)
        added.append(1e3 * (p99_recorded - p99_plain))
    added.sort()
    return added[draws // 20], added[draws - 1 - draws // 20]


class Sends(Node):
    """Sends ``n`` small tensors in a row in each update, timing them."""

    out = Output()

    def __init__(self, n: int) -> None:
        super().__init__(period=0.01, seed=0)
        self.tensors = [torch.rand(16) for _ in range(n)]
        self.times: list[float] = []

    def on_update(self, dt: float) -> None:
        send = self.out.send
        began = time.perf_counter()
        for tensor in self.tensors:
            send(tensor, copy=False)
        self.times.append(time.perf_counter() - began)


def send_cost(n: int, seconds: float, record: mujou.Recorder | None) -> tuple[float, float]:
    """The median µs of one send of ``n`` in a row in a hook (real-time timer, one worker), and
    the µs of the run's process's CPU (``process_time``: all its threads, the recorder's
    process not included) per send after the first tenth of ``seconds``."""
    sends = Sends(n)
    net = mujou.Net()
    net.sends = sends
    with mujou.run(net, workers=1, record=record) as run:
        run.sleep(seconds / 10)
        began_cpu, began_count = time.process_time(), len(sends.times)
        run.sleep(seconds * 9 / 10)
        cpu, count = time.process_time() - began_cpu, len(sends.times) - began_count
    times = sorted(sends.times[len(sends.times) // 10 :])  # the first updates warm up
    return 1e6 * times[len(times) // 2] / n, 1e6 * cpu / max(1, count * n)
