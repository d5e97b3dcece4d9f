"""Where the cross-process hand-off's time goes: the thread wake-ups a message costs each
side, and the time of each step from the sender's stamp to the reader's read.

::

    python -m bench.handoff_steps switches mujou 256   # or floor
    python -m bench.handoff_steps steps mujou 256      # or floor

``switches``: the bench's cross_process net (Mujou: one worker, the sender in a process of
its own; the floor: ``bench.baselines.floor``'s slot and pipe) for 2 s after a warm-up, and
the voluntary and involuntary context switches of every thread of both processes over that
time (``/proc/PID/task/*/status``), per message. A thread that blocks once a message shows
1.0: the floor's reader and sender each block once (its sender's sleep, its reader's read).

``steps``: the p50 of each step, cumulative from the sender's stamp (``time.monotonic`` just
before ``send``; ``perf_counter`` reads the same clock on Linux), and where each side ran
(``sched_getcpu``). Mujou's steps come from wrappers put in at import (this module is the
node classes' module, which the sender's process imports too): its ``os.write`` of the
record returned, the reader's worker woken (``Inbox.receive`` entered, out of its epoll),
``Inbox._publish`` (the pipe read, the ring's slot copied and published), ``Inbox._arrived``
(the update claimed), the hook entered, ``Input.read`` returned; and the sender's worker
parked (``Parking.wait`` entered), the end of its update: a reader woken on the sender's CPU
waited for it until the sender handed its core over once the message is whole (NOTE [ the
core handed to the reader ] in ``mujou/_processes/_handover.py``); the sender's ``send()``
now returns after the reader's update. Each wrapper is a Python
call of its own, about 0.5-1 µs run cold: the steps' sum is a little more than the bench's
p50.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import statistics
import sys
import threading
import time
from typing import Any

import torch

import mujou
from bench.mujou_processes import Handoff, Stamped, Stamper
from mujou._engine import _threads
from mujou._processes import _inbox, _wire

SECONDS = 2.0
WARM = 0.5  # s: not counted
STAMPS = "/tmp/mujou-handoff-steps-{}.txt"  # the sender's stamps, by the reader's pid

_cpu = ctypes.CDLL(None).sched_getcpu
_now = time.perf_counter
_stamps: list[tuple[str, float]] = []  # (step, time), this process's, in order


def _stamp(step: str) -> None:
    _stamps.append((step, _now()))


# -- Mujou's probes ----------------------------------------------------------------------------


class _Os:
    """``os`` for ``_wire``: a stamp once a record's write returned."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def write(fd: int, data: Any) -> int:
        written = os.write(fd, data)
        _stamp("record written")
        _stamps.append(("sender cpu", _cpu()))
        return written


def _after(cls: Any, name: str, step: str) -> None:
    method = getattr(cls, name)

    def probed(*args: Any) -> Any:
        result = method(*args)
        _stamp(step)
        return result

    setattr(cls, name, probed)


def _entered(cls: Any, name: str, step: str) -> None:
    method = getattr(cls, name)

    def probed(*args: Any) -> Any:
        _stamp(step)
        _stamps.append(("reader cpu", _cpu()))
        return method(*args)

    setattr(cls, name, probed)


def _parking(wait: Any) -> Any:
    """``Parking.wait`` stamped as it begins, in the sender's process: the end of its update."""

    def probed(*args: Any) -> Any:
        _stamp("sender parked")
        return wait(*args)

    return probed


def _install() -> None:
    setattr(_wire, "os", _Os())  # noqa: B010  # the probe: the module's own name for os
    if multiprocessing.parent_process() is not None:  # the sender's
        _threads.Parking.wait = _parking(_threads.Parking.wait)  # type: ignore[method-assign]  # the probe
    _entered(_inbox.Inbox, "receive", "woken")
    _after(_inbox.Inbox, "_publish", "published")
    _after(_inbox.Inbox, "_arrived", "claimed")


class StepsStamper(Stamper):
    """The bench's sender; its stamps go to a file as it stops."""

    def __init__(self, nbytes: int, reader: int) -> None:
        super().__init__(nbytes)
        self.reader = reader

    def on_update(self, dt: float) -> None:
        message = torch.empty(self.elements, dtype=torch.float64)
        message[1] = self.count
        self.count += 1
        message[0] = stamp = time.monotonic()
        _stamps.append(("stamp", stamp))
        self.y.send(message, copy=False)
        _stamp("send returned")

    def on_stop(self) -> None:
        with open(STAMPS.format(self.reader), "w") as file:
            file.writelines(f"{step}\t{value!r}\n" for step, value in _stamps)


class StepsStamped(Stamped):
    def on_update(self, dt: float) -> None:
        _stamp("hook")
        message = self.x.read()
        _stamp("read")
        if message is not None:
            _stamps.append(("sent", float(message[0])))
            self.keys.append(int(message[1]))


class StepsHandoff(Handoff):
    def __init__(self, nbytes: int) -> None:
        mujou.Net.__init__(self)
        self.sender = StepsStamper(nbytes, os.getpid())
        self.reader = StepsStamped()
        self.connect(self.sender.y, self.reader.x)


def _records(stamps: list[tuple[str, float]], first: str) -> list[dict[str, float]]:
    """The stamps cut into one record per message, each from a ``first`` step on."""
    records: list[dict[str, float]] = []
    for step, value in stamps:
        if step == first:
            records.append({})
        if records and step not in records[-1]:
            records[-1][step] = value
    return records


def mujou_steps(nbytes: int) -> None:
    net = StepsHandoff(nbytes)
    with mujou.run(net, workers=1, processes={"sender": net.sender}) as run:
        run.sleep(WARM)
        del _stamps[:]
        run.sleep(SECONDS)
        reader = list(_stamps)
    with open(STAMPS.format(os.getpid())) as file:
        sender = [(step, float(value)) for step, value in (line.rstrip("\n").split("\t") for line in file)]
    os.unlink(STAMPS.format(os.getpid()))
    sent = {record["stamp"]: record for record in _records(sender, "stamp")}
    steps = ["stamp", "record written", "woken", "published", "claimed", "hook", "read"]
    joined = []
    for record in _records(reader, "woken"):
        if "sent" in record and record["sent"] in sent and all(step in record for step in steps[2:]):
            joined.append({**sent[record["sent"]], **record})
    _report(joined, steps)


# -- the floor: bench.baselines.floor's cross_process, stamped -------------------------------


def _floor_send(slot: torch.Tensor, wake: Any, queue: Any, seconds: float) -> None:
    from bench._common import CROSS_PERIOD, stamped_messages

    torch.set_num_threads(1)
    fd = wake.fileno()
    out = []
    for message in stamped_messages(slot.numel(), seconds, CROSS_PERIOD):
        slot.copy_(message)
        os.write(fd, b"m")
        out.append((float(message[0]), _now(), _cpu()))
    os.write(fd, b"e")
    queue.put(out)


def floor_steps(nbytes: int) -> None:
    context = multiprocessing.get_context("spawn")
    slot = torch.zeros(max(2, nbytes // 8), dtype=torch.float64)
    slot.share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    reading, wake = context.Pipe(duplex=False)
    queue = context.Queue()
    sender = context.Process(target=_floor_send, args=(slot, wake, queue, WARM + SECONDS), daemon=True)
    sender.start()
    wake.close()
    fd = reading.fileno()
    got = []
    while os.read(fd, 1) == b"m":
        woken, cpu = _now(), _cpu()
        message = slot.clone()
        got.append((float(message[0]), woken, cpu, _now()))
    written = {stamp: (at, cpu) for stamp, at, cpu in queue.get(timeout=60.0)}
    sender.join(10.0)
    first = got[0][0] + WARM if got else 0.0
    joined = [
        {"stamp": s, "record written": written[s][0], "sender cpu": written[s][1]}
        | {"woken": w, "reader cpu": c, "read": r}
        for s, w, c, r in got
        if s >= first and s in written
    ]
    _report(joined, ["stamp", "record written", "woken", "read"])


def _report(records: list[dict[str, float]], steps: list[str]) -> None:
    if not records:
        print("no message measured")
        return
    print(f"{len(records)} messages; p50 from the stamp (µs), cumulative, and of each step:")
    for before, step in itertools.pairwise(steps):
        total = statistics.median([(r[step] - r["stamp"]) * 1e6 for r in records])
        alone = statistics.median([(r[step] - r[before]) * 1e6 for r in records])
        print(f"  {step:16s} {total:7.1f}   {alone:6.1f}")
    same = [r for r in records if r["reader cpu"] == r["sender cpu"]]
    print(f"the reader woke on the sender's CPU for {len(same)} of {len(records)}")
    for label, chosen in (("same CPU", same), ("other CPU", [r for r in records if r not in same])):
        if chosen:
            wake = statistics.median([(r["woken"] - r["record written"]) * 1e6 for r in chosen])
            whole = statistics.median([(r["read"] - r["stamp"]) * 1e6 for r in chosen])
            print(f"  {label}: the wake-up {wake:.1f}, the whole {whole:.1f}")
    tail = [r for r in records if "sender parked" in r and "send returned" in r]
    if tail:
        sent = statistics.median([(r["send returned"] - r["record written"]) * 1e6 for r in tail])
        parked = statistics.median([(r["sender parked"] - r["record written"]) * 1e6 for r in tail])
        print(
            f"after its write (p50), the sender's send() returned {sent:.1f}, its worker parked {parked:.1f}"
        )


# -- the wake-ups --------------------------------------------------------------------------------


def _switches(pids: list[int]) -> dict[tuple[int, int, str], tuple[int, int]]:
    """Each thread's voluntary and involuntary context switches so far, by (pid, tid, name)."""
    out = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as file:
                    name = file.read().strip()
                with open(f"/proc/{pid}/task/{tid}/status") as file:
                    fields = dict(line.split(":", 1) for line in file if ":" in line)
            except OSError:
                continue
            counts = int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])
            out[(pid, int(tid), name)] = counts
    return out


def switches(system: str, nbytes: int) -> None:
    ours = threading.get_native_id()
    if system == "mujou":
        net = Handoff(nbytes)
        with mujou.run(net, workers=1, processes={"sender": net.sender}) as run:
            run.sleep(WARM)
            pids = [os.getpid()] + [child.pid for child in multiprocessing.active_children() if child.pid]
            keys, before = len(net.reader.keys), _switches(pids)
            time.sleep(SECONDS)
            messages, after = len(net.reader.keys) - keys, _switches(pids)
    else:
        from bench.baselines import floor

        runner = threading.Thread(target=floor.cross_process, args=(nbytes, SECONDS + 2 * WARM))
        runner.start()
        time.sleep(WARM + 0.5)  # the sender's process started
        pids = [os.getpid()] + [child.pid for child in multiprocessing.active_children() if child.pid]
        began, before = time.monotonic(), _switches(pids)
        time.sleep(SECONDS)
        messages, after = round((time.monotonic() - began) / 0.001), _switches(pids)
        runner.join()
    print(f"{messages} messages; context switches per message, by thread (this one left out):")
    for key in sorted(after):
        (v0, n0), (v1, n1) = before.get(key, (0, 0)), after[key]
        if key[1] != ours and (v1 > v0 or n1 > n0):
            print(
                f"  pid {key[0]} tid {key[1]} {key[2]:16s} voluntary {(v1 - v0) / messages:.3f}  "
                f"involuntary {(n1 - n0) / messages:.3f}"
            )


def main(argv: list[str]) -> None:
    what, system, nbytes = argv[0], argv[1], int(argv[2])
    if what == "switches":
        switches(system, nbytes)
    else:
        (mujou_steps if system == "mujou" else floor_steps)(nbytes)


if __name__ == "__main__":
    # Run as the module bench.handoff_steps, whose classes the sender's process imports (it
    # puts the probes in there too), not as __main__.
    import importlib

    importlib.import_module("bench.handoff_steps").main(sys.argv[1:])
else:
    _install()
