"""What several conformance modules share: small nets and nodes built on the public API only."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import pytest
import torch

import mujou
from mujou import Input, Net, Node
from mujou.testing import state_difference

HANG_GUARD = 30.0  # seconds; only ever reached when something hangs
# The whole test's guard (conftest.py): longer than HANG_GUARD, so a guarded wait fails first,
# with its own message; this one catches the waits nobody guarded.
TEST_HANG_GUARD = 60.0
assert TEST_HANG_GUARD > HANG_GUARD


class HangError(Exception):
    """A test ran past its hang guard: something it waited for never came."""


def dump_all_stacks() -> None:
    """Print the stack of every live thread to stderr, each under its name."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    chunks = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        chunks.append(f"--- thread {names.get(ident, '?')!r} (ident {ident}):\n{stack}")
    print("\n".join(chunks), file=sys.stderr, flush=True)


@contextlib.contextmanager
def hang_guard(seconds: float) -> Iterator[None]:
    """Raise HangError in the main thread, after printing every thread's stack, if the block
    lasts more than ``seconds``.

    SIGALRM interrupts the main thread's waits (lock and event waits included, on POSIX).
    Where there is no SIGALRM (Windows), or off the main thread, this does nothing. Nested
    guards work: leaving the inner one re-arms the outer one for the time it has left.
    """
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        dump_all_stacks()
        raise HangError(
            f"hang guard: the test still ran after {seconds} s; the stacks of all threads are "
            "in its captured stderr (a run it started may have left daemon threads behind)"
        )

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    began = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:  # an outer guard was armed: it gets the time it has left (at least a tick)
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - began), 0.001))


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail after HANG_GUARD seconds (a hang, not slowness)."""
    event = threading.Event()
    for _ in range(int(HANG_GUARD / 0.001)):
        if condition():
            return
        event.wait(0.001)
    pytest.fail(f"timed out waiting for {what}")


def vt() -> mujou.VirtualTimer:
    """A fresh virtual timer."""
    return mujou.VirtualTimer()


class Bag(Net):
    """A net holding the nodes and nets given as keywords, in that order."""

    def __init__(self, **members: object) -> None:
        super().__init__()
        for attr, member in members.items():
            setattr(self, attr, member)


class Plain(Node):
    """A node that overrides no hook."""


class DtRecorder(Node):
    """Records the ``dt`` of each of its updates."""

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)


class FirstValueReader(Node):
    """Records what it reads on ``x`` at each update (None, or the first value)."""

    x = Input(optional=True)

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.seen: list[float | None] = []

    def on_update(self, dt: float) -> None:
        m = self.x.read()
        self.seen.append(None if m is None else float(m[0]))


class Blocker(Node):
    """Triggered by ``go``: holds the thread that runs its update until ``release`` is set
    (``inside`` tells that it is in)."""

    go = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("go"), seed=0)
        self.inside = threading.Event()
        self.release = threading.Event()

    def on_update(self, dt: float) -> None:
        self.inside.set()
        self.release.wait(HANG_GUARD)


class Drawer(Node):
    """Draws from its generator at each update and keeps the last draw (a tensor of its state)."""

    state_exclude: ClassVar[tuple[str, ...]] = ("log",)  # the test's list, shared: not state

    def __init__(self, device: str = "cpu", log: list[str] | None = None) -> None:
        super().__init__(period=0.25, seed=3, device=device)
        self.last = torch.zeros(4, device=device)
        self.log = log

    def on_start(self) -> None:
        if self.log is not None:
            self.log.append("on_start")

    def on_update(self, dt: float) -> None:
        self.last = torch.randn(4, generator=self.generator, device=self.device)


def is_dead(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie, not reaped yet, counts), without reaping it."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped between the open and the read
        return True
    return status.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T). ``kill(SIGSTOP)`` returns
    before that: one thread takes the signal when it next runs, and stops the others then."""
    try:
        states = [(task / "stat").read_text() for task in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return False
    return all(state.rsplit(")", 1)[1].split()[0] == "T" for state in states)


@contextlib.contextmanager
def sigstopped(pid: int) -> Iterator[None]:
    """Process ``pid`` stopped (SIGSTOP), every thread of it, inside the block; SIGCONT after."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: all_threads_stopped(pid), f"every thread of process {pid} to stop")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


CHECKOUT = Path(__file__).resolve().parent.parent
"""The checkout these tests belong to."""


def checkout_environ(*, quiet: bool = False) -> dict[str, str]:
    """``os.environ`` for a child Python that imports this checkout's mujou (first on
    ``PYTHONPATH``); ``quiet``: with ``PYTHONWARNINGS=ignore`` (torch's own warnings on import)."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [environ.get("PYTHONPATH")])])
    if quiet:
        environ["PYTHONWARNINGS"] = "ignore"
    return environ


def assert_same(first: Any, second: Any, what: str) -> None:
    """Equal, tensors bit for bit (``mujou.testing.state_difference`` walks any nest)."""
    difference = state_difference({what: first}, {what: second})
    assert difference is None, difference


# --- fixtures both suites' conftest.py take (imported there by name) ------------------------


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Each test runs with torch on one intra-op thread (a process-wide setting the host makes,
    as the spec asks) and without the oversubscription warning, whatever the machine's cores
    (``pytest.warns()`` inside a test still sees it: it resets the filters it needs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mujou.OversubscriptionWarning)
        yield
    torch.set_num_threads(before)


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread (_thread.interrupt_main needs a handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
