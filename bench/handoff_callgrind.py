"""Instructions the cross-process hand-off costs each side, under callgrind: the bench's
cross_process net (a sender in a process of its own, a triggered reader in the host's, one
worker), or the floor's bare slot and pipe, with callgrind collecting only inside the two
regions of each message:

- the sender's, from its stamp to the write of its wake byte (``os.write`` entered);
- the reader's, from its wake-up (Mujou: its worker's epoll returned with a pipe ready; the
  floor: its blocking ``os.read`` returned) to the message read (Mujou: ``Input.read``
  returned in ``on_update``; the floor: its ``clone`` done).

::

    valgrind --tool=callgrind --collect-atstart=no --trace-children=yes \\
      --trace-children-skip='*gcc*,*cc1*,*as,*collect2*,*ld' --callgrind-out-file=OUT/cg.%p \\
      python -m bench.handoff_callgrind mujou 256 120

(``floor`` for the floor; the bytes; the messages) prints the regions counted and the process
ids of each side: the ``totals:`` line of ``OUT/cg.PID`` divided by that side's regions is its
instructions a message (each region includes the two ctypes calls that switch collection, a
few hundred instructions). ``callgrind_annotate --inclusive=yes OUT/cg.PID`` says where they go.
With ``HANDOFF_END=park`` in the environment, Mujou's sender's region ends where its worker
parks (``Parking.wait`` entered) instead of at the wake byte: all of its update after the
stamp, which a reader woken on the sender's CPU waits for on a busy machine.
The first ``SKIP`` messages are not counted (the ring's announcement, first records, caches).
Collection is switched per thread by a client request (``CALLGRIND_TOGGLE_COLLECT``) from a
small C helper this script compiles once with ``cc`` (valgrind's headers needed).
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import torch

import mujou
from bench.mujou_processes import Handoff, Stamped, Stamper
from mujou._engine import _threads
from mujou._processes import _inbox, _wire

SKIP = 20  # messages not counted at the start
PERIOD = 0.06  # seconds between messages: each hand-off alone, even run 50 times slower on a busy machine
# Where the sender's region ends: "write" (its record's os.write), or "park" (its worker's wait).
END = os.environ.get("HANDOFF_END", "write")
SETTLED = 0.03  # seconds a woken reader waits before it counts (``_Poll.poll``)

_SOURCE = r"""
#include <valgrind/callgrind.h>
static __thread int on_;
void cg_on(void) { if (!on_) { on_ = 1; CALLGRIND_TOGGLE_COLLECT; } }
int cg_off(void) { if (on_) { on_ = 0; CALLGRIND_TOGGLE_COLLECT; return 1; } return 0; }
"""


def _helper() -> Any:
    """The C helper (compiled once into the temporary directory, by the source's hash)."""
    digest = hashlib.sha1(_SOURCE.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"cgtoggle-{digest}.so")
    if not os.path.exists(path):
        source = path[:-3] + ".c"
        with open(source, "w") as file:
            file.write(_SOURCE)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", path + ".tmp", source], check=True)
        os.replace(path + ".tmp", path)
    library = ctypes.CDLL(path)
    library.cg_on.restype = None
    library.cg_off.restype = ctypes.c_int
    return library


_cg = _helper()
on, off = _cg.cg_on, _cg.cg_off
armed = threading.Event()  # set: the reader counts regions from now on (after SKIP messages)


# -- Mujou's side: the probes, put in at import (the sender's process imports this module too)


class _Poll:
    """A gate's epoll that switches collection on when it returns with a pipe ready."""

    __slots__ = ("_event", "_poll")

    def __init__(self, poll: Any, event: int) -> None:
        self._poll, self._event = poll, event

    def poll(self, timeout: float = -1) -> list[tuple[int, int]]:
        ready: list[tuple[int, int]] = self._poll.poll(timeout)
        if armed.is_set():
            for fd, _ in ready:
                if fd != self._event:
                    # The sender's copy done: under callgrind it runs 50 times slower, after
                    # its record (NOTE [ the wake before the copy ]), and a reader that came
                    # first would count its wait for it.
                    time.sleep(SETTLED)
                    on()
                    break
        return ready

    def register(self, *args: Any) -> None:
        self._poll.register(*args)

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)

    def close(self) -> None:
        self._poll.close()


_gate_init = _inbox.ListeningGate.__init__


def _probed_gate_init(self: Any, inbox: Any, worker: int) -> None:
    _gate_init(self, inbox, worker)
    self.poll = _Poll(self.poll, self._event)


class _Os:
    """``os`` for ``_wire``: collection off as a record's write begins."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def write(fd: int, data: Any) -> int:
        if END == "write":
            off()
        return os.write(fd, data)


def _parking(wait: Any) -> Any:
    def probed(*args: Any) -> Any:
        off()
        return wait(*args)

    return probed


def _install() -> None:
    """Put the probes in: a gate's epoll, and the write of a record (or the sender's wait)."""
    _inbox.ListeningGate.__init__ = _probed_gate_init  # type: ignore[method-assign]  # the probe
    setattr(_wire, "os", _Os())  # noqa: B010  # the probe: the module's own name for os
    if END == "park" and multiprocessing.parent_process() is not None:  # the sender's process
        _threads.Parking.wait = _parking(_threads.Parking.wait)  # type: ignore[method-assign]  # the probe


class ProbedStamper(Stamper):
    """The bench's sender, collecting from its stamp on past SKIP messages, for ``count`` in all."""

    def __init__(self, nbytes: int, count: int) -> None:
        super().__init__(nbytes, PERIOD)
        self.limit = count

    def on_update(self, dt: float) -> None:
        if self.count >= self.limit:
            return
        message = torch.empty(self.elements, dtype=torch.float64)
        message[1] = self.count
        counted = self.count >= SKIP
        self.count += 1
        message[0] = time.monotonic()
        if counted:
            on()
        self.y.send(message, copy=False)
        if END == "write":
            off()  # where no record was written


class ProbedStamped(Stamped):
    """The bench's reader, ending a region once it has read; counts the regions."""

    def __init__(self) -> None:
        super().__init__()
        self.regions = 0

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if off():
            self.regions += 1
        if message is None:
            return
        self.keys.append(int(message[1]))
        if int(message[1]) >= SKIP - 1:
            armed.set()


class ProbedHandoff(Handoff):
    def __init__(self, nbytes: int, count: int) -> None:
        mujou.Net.__init__(self)
        self.sender = ProbedStamper(nbytes, count)
        self.reader = ProbedStamped()
        self.connect(self.sender.y, self.reader.x)


def run_mujou(nbytes: int, count: int) -> None:
    net = ProbedHandoff(nbytes, count)
    with mujou.run(net, workers=1, processes={"sender": net.sender}) as run:
        deadline = time.monotonic() + 60.0 + count * PERIOD * 60
        while time.monotonic() < deadline and (not net.reader.keys or net.reader.keys[-1] < count - 1):
            run.sleep(0.1)
        pids = [child.pid for child in multiprocessing.active_children()]
    reader = net.reader
    assert isinstance(reader, ProbedStamped)
    print(
        f"READER pid {os.getpid()} regions {reader.regions} read {len(reader.keys)} "
        f"last {reader.keys[-1] if reader.keys else None}; SENDER pids {pids} regions {count - SKIP}"
    )


# -- the floor: bench.baselines.floor's cross_process, with the same probes


def _floor_send(slot: torch.Tensor, wake: Any, count: int) -> None:
    torch.set_num_threads(1)
    fd = wake.fileno()
    for k in range(count):
        time.sleep(PERIOD)
        message = torch.empty(slot.numel(), dtype=torch.float64)
        message[1] = k
        message[0] = time.monotonic()
        if k >= SKIP:
            on()
        slot.copy_(message)
        off()
        os.write(fd, b"m")
    os.write(fd, b"e")


def run_floor(nbytes: int, count: int) -> None:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    slot = torch.zeros(max(2, nbytes // 8), dtype=torch.float64)
    slot.share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    reading, wake = context.Pipe(duplex=False)
    sender = context.Process(target=_floor_send, args=(slot, wake, count), daemon=True)
    sender.start()
    wake.close()
    fd = reading.fileno()
    regions, keys = 0, list[int]()
    while True:
        got = os.read(fd, 1)
        if got == b"m" and keys and keys[-1] >= SKIP - 1:
            time.sleep(SETTLED)  # as Mujou's reader
            on()
        if got != b"m":
            break
        message = slot.clone()
        if off():
            regions += 1
        keys.append(int(message[1]))
    sender.join(60.0)
    print(f"READER pid {os.getpid()} regions {regions} read {len(keys)}; SENDER pids {[sender.pid]}", end=" ")
    print(f"regions {count - SKIP}")


def main(argv: list[str]) -> None:
    system, nbytes, count = argv[0], int(argv[1]), int(argv[2])
    (run_floor if system == "floor" else run_mujou)(nbytes, count)


if __name__ == "__main__":
    # Run as the module bench.handoff_callgrind, whose classes the sender's process imports
    # (it puts the probes in there too), not as __main__.
    import importlib

    importlib.import_module("bench.handoff_callgrind").main(sys.argv[1:])
else:
    _install()
