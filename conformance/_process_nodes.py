"""Nodes and nets for conformance/test_processes.py that run in processes of their own.

The processes of a run are started with ``spawn``: each imports the classes of its nodes by
name, so they live here, at the top level of a module on ``sys.path`` (multiprocessing passes
the host's ``sys.path`` to the new interpreter, and the conformance directory is on it under
pytest). Everything a test reads back from a process goes through the public API
(``run.state_dict()``, ``run.read``) or, for ``on_stop`` in a process that has exited, a
marker file whose path the node holds.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

import mujou
from mujou import Input, Net, Node, NodeDict, NodeList, Output

# --- the virtual-timer net: periodic and triggered nodes drawing from their generators ------


class Source(Node):
    """Periodic: sends a vector drawn from its generator."""

    out = Output()

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.last = torch.zeros(3)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.last = torch.rand(3, generator=self.generator)
        self.count += 1
        self.out.send(self.last)


class Relay(Node):
    """Triggered by ``x`` (after ``delay``): mixes what it read with a draw and sends it on."""

    x = Input()
    out = Output()

    def __init__(self, seed: int, delay: float = 0.0) -> None:
        super().__init__(trigger=mujou.on("x"), delay=delay, seed=seed)
        self.acc = torch.zeros(3)
        self.log: list[tuple[float, bool, float]] = []  # (stamp, fresh, dt) of each update

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        assert message is not None  # triggered by it
        stamp = self.x.stamp
        assert stamp is not None
        self.log.append((stamp, self.x.fresh, dt))
        self.acc = 0.5 * self.acc + message + 0.1 * torch.randn(3, generator=self.generator)
        self.out.send(self.acc)


class Join(Node):
    """Triggered when both ``a`` and ``b`` have a new message: sends a nest."""

    a = Input()
    b = Input()
    out: Output[dict[str, Any]] = Output()

    def __init__(self, seed: int) -> None:
        super().__init__(trigger=mujou.on_all("a", "b"), seed=seed)
        self.count = 0
        self.log: list[tuple[float, float]] = []

    def on_update(self, dt: float) -> None:
        a, b = self.a.read(), self.b.read()
        assert a is not None and b is not None
        assert self.a.stamp is not None and self.b.stamp is not None
        self.log.append((self.a.stamp, self.b.stamp))
        self.count += 1
        noise = torch.rand((), generator=self.generator)
        self.out.send({"v": a + b + noise, "n": self.count})


class Sampler(Node):
    """Periodic: samples its optional input ``x`` (a tensor or a nest with ``"v"``)."""

    x = Input(optional=True)

    def __init__(self, period: float, seed: int) -> None:
        super().__init__(period=period, seed=seed)
        self.total = torch.zeros(())
        self.log: list[tuple[float | None, bool]] = []

    def on_update(self, dt: float) -> None:
        message: Any = self.x.read()
        self.log.append((self.x.stamp, self.x.fresh))
        if message is not None:
            value = message["v"] if isinstance(message, dict) else message
            self.total = self.total + value.sum() * torch.rand((), generator=self.generator)


class Left(Net):
    """A sub-net: one process group of :class:`Chain`."""

    def __init__(self) -> None:
        super().__init__()
        self.src_b = Source(0.15, seed=2)
        self.relay1 = Relay(seed=11, delay=0.02)
        self.sink = Sampler(0.05, seed=6)


class Chain(Net):
    """Ports crossing between the host and two groups in every direction.

    The triggered chain ``src_a -> left.relay1 -> right[0] -> back`` crosses three times
    (host -> left -> right -> host); ``back -> left.sink`` and ``right[1] -> sampler`` cross
    too, and ``left.src_b -> right[1]`` feeds an ``on_all`` trigger across processes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.src_a = Source(0.1, seed=1)
        self.left = Left()
        self.right: NodeList[Any] = NodeList([Relay(seed=12), Join(seed=14)])
        self.back = Relay(seed=13)
        self.sampler = Sampler(0.07, seed=5)
        self.connect(self.src_a.out, self.left.relay1.x)
        self.connect(self.left.relay1.out, self.right[0].x)
        self.connect(self.right[0].out, self.back.x)
        self.connect(self.left.src_b.out, self.right[1].a)
        self.connect(self.right[0].out, self.right[1].b)
        self.connect(self.right[1].out, self.sampler.x)
        self.connect(self.back.out, self.left.sink.x)


# --- the host's calls on a child's nodes ------------------------------------------------------


class Counter(Node):
    """Periodic: counts, scales its tensor in place, sends ``buf * cmd``."""

    cmd = Input()
    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=4)
        self.count = 0
        self.started = False
        self.buf = torch.ones(2)

    def on_start(self) -> None:
        self.started = True

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.buf.add_(1.0)
        command = self.cmd.read()
        assert command is not None  # given by inputs=
        self.out.send(self.buf * command)


class Ticker(Node):
    """Periodic: sends its update count."""

    tick = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.tick.send(torch.tensor(float(self.count)))


class Echo(Node):
    """Triggered by ``x``: keeps what it read, sends it on."""

    x = Input()
    out = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        assert message is not None
        self.seen.append(float(message))
        self.out.send(message * 2)


class HostCalls(Net):
    def __init__(self) -> None:
        super().__init__()
        self.ticker = Ticker()
        self.counter = Counter()
        self.echo = Echo()
        self.connect(self.ticker.tick, self.echo.x)


# --- messages under the real-time timer ---------------------------------------------------------

SHAPE_CHANGE = 60  # from this message on, ``a`` has another shape (the ring is re-allocated)


class Sender(Node):
    """Periodic: message ``i`` is ``i`` in every element of every tensor, on three outputs."""

    a = Output()  # float32, 4096 elements, then (32, 200)
    b: Output[dict[str, Any]] = Output()  # a nest: {"t": float64 (16,), "n": i}
    c = Output()  # int64 (3, 3)

    def __init__(self) -> None:
        super().__init__(period=0.002, seed=0)
        self.i = 0

    def on_update(self, dt: float) -> None:
        self.i += 1
        i = self.i
        shape = (4096,) if i < SHAPE_CHANGE else (32, 200)
        self.a.send(torch.full(shape, float(i)))
        self.b.send({"t": torch.full((16,), float(i), dtype=torch.float64), "n": i})
        self.c.send(torch.full((3, 3), i, dtype=torch.int64))


class StampLog(Node):
    """Triggered by ``a`` in the sender's process: the stamp of each value it saw."""

    a = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a"), seed=0)
        self.stamps: dict[int, float] = {}

    def on_update(self, dt: float) -> None:
        message = self.a.read()
        assert message is not None and self.a.stamp is not None
        self.stamps[int(message.reshape(-1)[0])] = self.a.stamp


def _uniform(tensor: torch.Tensor) -> bool:
    flat = tensor.reshape(-1)
    return bool((flat == flat[0]).all())


class Checker(Node):
    """Triggered by any of its inputs in another process: checks every message it reads."""

    a = Input()
    b: Input[dict[str, Any]] = Input()
    c = Input()
    seen = Output()  # the newest value of ``a`` it read

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a", "b", "c"), seed=0)
        self.torn = 0  # messages not filled with one value (or a nest whose parts disagree)
        self.back = 0  # reads of a value older than the one before on the same input
        self.wrong = 0  # a dtype or shape that the sender never sent with that value
        self.last = {"a": 0, "b": 0, "c": 0}
        self.stamps: dict[int, float] = {}  # value of ``a`` -> its stamp
        self.same_stamp = 0  # reads where a, b, c hold one message number and one stamp
        self.shapes: list[tuple[int, ...]] = []

    def _value(self, name: str, message: Any) -> int:
        if name == "b":
            tensor, number = message["t"], message["n"]
            if not _uniform(tensor) or int(tensor[0]) != number:
                self.torn += 1
            if tensor.dtype != torch.float64 or tuple(tensor.shape) != (16,):
                self.wrong += 1
            return int(number)
        if not _uniform(message):
            self.torn += 1
        value = int(message.reshape(-1)[0])
        if name == "c":
            if message.dtype != torch.int64 or tuple(message.shape) != (3, 3):
                self.wrong += 1
        else:
            shape = (4096,) if value < SHAPE_CHANGE else (32, 200)
            if message.dtype != torch.float32 or tuple(message.shape) != shape:
                self.wrong += 1
            if tuple(message.shape) not in self.shapes:
                self.shapes.append(tuple(message.shape))
        return value

    def on_update(self, dt: float) -> None:
        values: dict[str, int] = {}
        stamps: dict[str, float | None] = {}
        for name in ("a", "b", "c"):
            port: Input[Any] = getattr(self, name)
            message = port.read()
            stamps[name] = port.stamp
            if message is None:
                continue
            value = values[name] = self._value(name, message)
            if value < self.last[name]:
                self.back += 1
            self.last[name] = value
        if "a" in values:
            stamp = stamps["a"]
            assert stamp is not None
            self.stamps[values["a"]] = stamp
            if values.get("b") == values["a"] == values.get("c") and stamps["b"] == stamp == stamps["c"]:
                self.same_stamp += 1
            self.seen.send(torch.tensor(float(values["a"])))


class Pinger(Node):
    """Triggered by the host's ``kick`` or by ``back``: sends ``ball`` one higher."""

    kick = Input(optional=True)
    back = Input()
    ball = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("kick", "back"), seed=0)

    def on_update(self, dt: float) -> None:
        back = self.back.read()
        self.ball.send(torch.tensor(1.0) if back is None else back + 1)


class Ponger(Node):
    """Triggered by ``ball`` in another process: sends it straight back (after a microsecond:
    a cycle of triggers needs a delay)."""

    ball = Input()
    back = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("ball"), delay=1e-6, seed=0)

    def on_update(self, dt: float) -> None:
        ball = self.ball.read()
        assert ball is not None
        self.back.send(ball)


class Wire(Net):
    def __init__(self) -> None:
        super().__init__()
        self.sender = Sender()
        self.stamp_log = StampLog()
        self.checker = Checker()
        self.pinger = Pinger()
        self.ponger = Ponger()
        self.connect(self.sender.a, self.stamp_log.a)
        self.connect(self.sender.a, self.checker.a)
        self.connect(self.sender.b, self.checker.b)
        self.connect(self.sender.c, self.checker.c)
        self.connect(self.pinger.ball, self.ponger.ball)
        self.connect(self.ponger.back, self.pinger.back)


# --- failures -----------------------------------------------------------------------------------


class Marker(Node):
    """Periodic; its ``on_stop`` writes the file ``path`` (readable after its process ended)."""

    def __init__(self, path: str) -> None:
        super().__init__(period=0.1, seed=0)
        self.path = path
        self.updates = 0
        self.stopped = False

    def on_update(self, dt: float) -> None:
        self.updates += 1

    def on_stop(self) -> None:
        self.stopped = True
        Path(self.path).write_text(f"stopped after {self.updates} updates")


def check_wire(net: Wire, processes: dict[str, Any], round_trips: int) -> None:
    """Run ``net`` placed by ``processes`` under the real-time timer for ``round_trips`` of
    its ping-pong, and check what crossed: every message whole and in order, both layouts of
    ``a``, each stamp the sender's."""
    with mujou.run(net, timer=mujou.RealTimeTimer(), workers=1, processes=processes) as run:
        # A ping-pong of triggered nodes: each hop is a wake-up of the other side.
        run.write(net.pinger.kick, torch.tensor(0.0))
        ball = run.wait_for(net.pinger.ball, lambda m: float(m) >= round_trips, timeout=20.0)
        assert float(ball) >= round_trips
        seen = run.wait_for(net.checker.seen, lambda m: float(m) >= 150.0, timeout=20.0)
        assert float(seen) >= 150.0
        tree = run.state_dict()
        stats = run.stats()
    checker, stamp_log = tree["checker"], tree["stamp_log"]
    assert (checker["torn"], checker["back"], checker["wrong"]) == (0, 0, 0), checker
    # Both layouts of ``a`` came through: the ring was re-allocated mid-run (proc.transport).
    assert checker["shapes"] == [(4096,), (32, 200)]
    # Each stamp is the sender's: the one a reader in the sender's process saw for that message.
    common = set(checker["stamps"]) & set(stamp_log["stamps"])
    assert common, "no message seen by both readers"
    assert all(checker["stamps"][v] == stamp_log["stamps"][v] for v in common)
    assert checker["same_stamp"] > 0
    assert stats.nodes["checker"].updates > 0 and set(stats.nodes["checker"].coalesced) == {"a", "b", "c"}


def explode_in_child(count: int) -> None:
    raise ValueError(f"count reached {count}")


class Third(Node):
    """Periodic; counts its updates, and in its third does ``act``: "raise" (a ValueError),
    "exit" (its process ends, ``os._exit(7)``), "linger" (half a second of real time, a
    sleep), or nothing ("")."""

    def __init__(self, act: str = "") -> None:
        super().__init__(period=0.1, seed=0)
        self.act = act
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        if self.count != 3:
            return
        if self.act == "raise":
            explode_in_child(self.count)
        elif self.act == "exit":
            os._exit(7)
        elif self.act == "linger":
            time.sleep(0.5)


class DiesInATag(Net):
    """A node whose process dies at the tag 0.2, and two of the host's due then: the first
    is still in its update when the death is noticed."""

    def __init__(self) -> None:
        super().__init__()
        self.lingering = Third("linger")
        self.counted = Third()
        self.doomed = Third("exit")


class Counts(Node):
    """Periodic (1 ms): sends 1, 2, ... up to ``limit``, then nothing. ``kind``: each count as
    a 0-d tensor ("tensor"); in a nest that also says it in words, a structure that changes
    its size ("nest"); or as ``arange(count)``, a new shape each time ("grow")."""

    out: Output[Any] = Output()

    def __init__(self, limit: int, kind: str = "tensor") -> None:
        super().__init__(period=0.001, seed=0)
        self.limit = limit
        self.kind = kind
        self.count = 0

    def on_update(self, dt: float) -> None:
        if self.count < self.limit:
            self.count += 1
            count = torch.tensor(self.count)
            if self.kind == "nest":
                self.out.send({"count": count, "words": f"count {self.count}" * (self.count % 7)})
            elif self.kind == "grow":
                self.out.send(torch.arange(self.count))
            else:
                self.out.send(count)


def count_of(message: Any, kind: str) -> int:
    """The count a message of ``Counts(kind=kind)`` says, checking its structure or shape."""
    if message is None:
        return -1
    if kind == "nest":
        count = int(message["count"])
        assert message["words"] == f"count {count}" * (count % 7), message  # its own structure
        return count
    if kind == "grow":
        assert torch.equal(message, torch.arange(len(message))), message
        return len(message)
    return int(message)


class Keeps(Node):
    """Triggered by ``x``: keeps nothing but what it read last (its input does)."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)

    def on_update(self, dt: float) -> None:
        self.x.read()


class Twice(Node):
    """Periodic (1 ms): sends its count on ``often`` every update, and on ``once`` twice: at
    the first update (which lays out its ring) and when the count reaches ``mark``."""

    often = Output()
    once = Output()

    def __init__(self, mark: int) -> None:
        super().__init__(period=0.001, seed=0)
        self.mark = mark
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.often.send(torch.tensor(self.count))
        if self.count in (1, self.mark):
            self.once.send(torch.tensor(self.count))


class Both(Node):
    """Triggered by either input."""

    often = Input()
    once = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("often", "once"), seed=0)

    def on_update(self, dt: float) -> None:
        self.often.read()
        self.once.read()


class TwoStalls(Net):
    """Two outputs of one process read by one node of another: one wake pipe for both."""

    def __init__(self, mark: int) -> None:
        super().__init__()
        self.sender = Twice(mark)
        self.reader = Both()
        self.connect(self.sender.often, self.reader.often)
        self.connect(self.sender.once, self.reader.once)


class Stalls(Net):
    """A sender of ``limit`` messages and their reader, for a process of each."""

    def __init__(self, limit: int, kind: str = "tensor") -> None:
        super().__init__()
        self.sender = Counts(limit, kind)
        self.reader = Keeps()
        self.connect(self.sender.out, self.reader.x)


class ManyReaders(Net):
    """A sender of ``limit`` messages and three readers of its output: for a process each, but
    the last, in the host's."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.sender = Counts(limit)
        self.first = Keeps()
        self.second = Keeps()
        self.third = Keeps()
        for reader in (self.first, self.second, self.third):
            self.connect(self.sender.out, reader.x)


class SendsThenFails(Net):
    """A periodic source and a periodic sampler of it, and a node that fails at the tag 0.3
    (its third update), at which the source sends too."""

    def __init__(self) -> None:
        super().__init__()
        self.source = Source(0.1, seed=3)
        self.sampler = Sampler(0.1, seed=4)
        self.failer = Third("raise")
        self.connect(self.source.out, self.sampler.x)


class RefusalError(Exception):
    """An exception that pickles but cannot be unpickled (its ``__init__`` takes two arguments)."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(f"{text} (code {code})")


class StartFailer(Node):
    """Its on_start raises."""

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_start(self) -> None:
        raise RefusalError("no device here", 3)


class Failing(Net):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.host_marker = Marker(str(directory / "host"))
        self.failer = Third("raise")
        self.bad_marker = Marker(str(directory / "bad"))
        self.ok_marker = Marker(str(directory / "ok"))


class Unstartable(Net):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.host_marker = Marker(str(directory / "host"))
        self.ok_marker = Marker(str(directory / "ok"))
        self.start_failer = StartFailer()


# --- inside a process ---------------------------------------------------------------------------

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("TAG")


def worker_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith("mujou-worker-"))


class Dedicated(Node):
    """``dedicated_thread=True``: records the thread of every hook (on_stop's in a file)."""

    def __init__(self, path: str) -> None:
        super().__init__(period=0.1, seed=0, dedicated_thread=True)
        self.path = path
        self.threads: list[int] = []
        self.pid = 0
        self.workers = -1

    def on_start(self) -> None:
        self.pid = os.getpid()
        self.threads.append(threading.get_ident())

    def on_update(self, dt: float) -> None:
        self.threads.append(threading.get_ident())
        self.workers = worker_threads()

    def on_stop(self) -> None:
        Path(self.path).write_text(f"{threading.get_ident()} {self.threads[0]}")


class Contextual(Node):
    """Sets a context variable in on_start and checks it in every update; draws from its
    generator; checks that its hooks never overlap."""

    def __init__(self, tag: str, seed: int) -> None:
        super().__init__(period=0.05, seed=seed)
        self.tag = tag
        self.pid = 0
        self.tags: list[str] = []
        self.last = torch.zeros(4)
        self.inside = False
        self.overlaps = 0
        self.workers = -1
        self.settings: tuple[torch.dtype, int, bool] | None = None

    def on_start(self) -> None:
        self.pid = os.getpid()
        self.settings = (
            torch.get_default_dtype(),
            torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(),
        )
        TAG.set(self.tag)

    def on_update(self, dt: float) -> None:
        if self.inside:
            self.overlaps += 1
        self.inside = True
        self.tags.append(TAG.get("unset"))
        self.last = torch.randn(4, generator=self.generator)
        self.workers = worker_threads()
        self.inside = False


class Inner(Net):
    def __init__(self) -> None:
        super().__init__()
        self.first = Contextual("first", seed=7)
        self.second = Contextual("second", seed=7)
        self.extra = NodeDict({"third": Contextual("third", seed=8)})


class Inside(Net):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.home = Contextual("home", seed=7)
        self.solo = NodeList([Dedicated(str(directory / "dedicated"))])
        self.inner = Inner()


class Leaker(Node):
    """Leaves grad mode off: Mujou warns about it (rules.hook-settings-warning)."""

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_update(self, dt: float) -> None:
        torch.set_grad_enabled(False)


class Locked(Node):
    """Holds a lock, which cannot be pickled."""

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)
        self.lock = threading.Lock()


# --- a process whose every worker is busy (proc.wake) ---------------------------------------------

HOLD = 20.0  # seconds Hog holds its worker at most: only reached when the messages do not come
_HOG_SAW: list[int] = []  # in a process of the run: the count Hog read as it began to hold
_WATCHED = threading.Event()  # set there by Watcher once it read a count sent during the hold


class Pulse(Node):
    """Periodic (5 ms): sends its count."""

    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.005, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.tensor(self.count))


class Hog(Node):
    """Triggered by ``x``, on a worker: its first update holds that worker until ``Watcher``,
    on a thread of its own, read a count sent two after the one Hog read (HOLD seconds at
    most), then sends whether it did."""

    x = Input()
    held = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.first = True

    def on_update(self, dt: float) -> None:
        if self.first:
            self.first = False
            count = self.x.read()
            assert count is not None  # triggered by it
            _HOG_SAW.append(int(count))
            self.held.send(torch.tensor(_WATCHED.wait(HOLD)))


class Watcher(Node):
    """Triggered by ``x``, on a thread of its own: sets ``_WATCHED`` once it reads a count sent
    while Hog holds the worker."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), dedicated_thread=True, seed=0)

    def on_update(self, dt: float) -> None:
        count = self.x.read()
        if count is not None and _HOG_SAW and int(count) >= _HOG_SAW[0] + 2:
            _WATCHED.set()


class Hogged(Net):
    def __init__(self) -> None:
        super().__init__()
        self.pulse = Pulse()
        self.hog = Hog()
        self.watcher = Watcher()
        self.connect(self.pulse.out, self.hog.x)
        self.connect(self.pulse.out, self.watcher.x)
