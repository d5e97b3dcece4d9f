"""Conformance tests for the CUDA rules (``cuda.*``) of "Threads and devices".

The page is spec/en/threads-and-devices.md.

The tests check what a user sees, through the public API only:

- GPU tests carry ``@pytest.mark.cuda`` and :data:`needs_cuda` (or :data:`needs_two_gpus`), so
  they skip with a reason where CUDA (or a second GPU) is missing; the CPU-side parts of the
  rules run everywhere.
- A missing wait shows as wrong values, never as a time: a sender queues a slow kernel
  (``torch.cuda._sleep``) before it writes a message, so a reader that does not wait for it
  reads a half-written tensor; the streams Mujou makes (pool streams) do not synchronize with
  the default stream, so nothing else hides such a bug.
- Where a rule says where a message travels, the CUDA profiler's memcpy events show it
  (:func:`memcpy_trace`): device to device (``DtoD``/``PtoP``), or through host memory
  (``HtoD``/``DtoH``).
- Most runs use the virtual timer. The one that needs a reader to read while the sender is
  still in its hook uses the real-time timer, with events for the order; no test asserts on
  wall-clock time. A few checks rely on a long kernel still running while Mujou does
  something quick; a correct Mujou passes them however slow the machine is, they only lose
  their power to catch a bug when the host is stalled for longer than the kernel.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from _support import HANG_GUARD, Bag, Drawer, Plain, checkout_environ, vt

import mujou
from mujou import Input, Node, Output

HAS_CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if HAS_CUDA else 0
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device; CUDA is not available here")
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA devices; {GPUS} available here")

N = 1 << 16  # elements of a message: large enough that a half-written one shows
SLOW = 100_000_000  # GPU clock cycles of a slow kernel: tens of milliseconds
LONG = 1_000_000_000  # GPU clock cycles of a long kernel: half a second or more
ROUNDS = 4


# --------------------------------------------------------------------------------------------
# GPU helpers


def slow_kernel(cycles: int = SLOW) -> None:
    """Queue a kernel that only spins for ``cycles`` GPU clock cycles, on the current stream."""
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # untyped in torch


def slow_full(value: float, device: torch.device | str) -> torch.Tensor:
    """A tensor of ``N`` times ``value`` whose fill is queued behind a slow kernel.

    Until the current stream of ``device`` has run the slow kernel, the tensor holds whatever
    its memory held: a reader that does not wait for that stream sees other values.
    """
    out = torch.empty(N, device=device)
    with torch.cuda.device(out.device):
        slow_kernel()
    out.fill_(value)
    return out


def record(stream: torch.cuda.Stream | None = None) -> torch.cuda.Event:
    """An event recorded on ``stream`` (the current stream): done once its work queued so far is."""
    event: torch.cuda.Event = (stream or torch.cuda.current_stream()).record_event()
    return event


def done(event: torch.cuda.Event) -> bool:
    """Whether the work queued before ``event`` was recorded has finished (it does not wait)."""
    return bool(event.query())  # type: ignore[no-untyped-call]  # untyped in torch


def handle(stream: torch.cuda.Stream) -> int:
    """The CUDA stream's handle: equal handles are the same stream."""
    return int(stream.cuda_stream)


def values(tensor: torch.Tensor) -> tuple[float, float]:
    """The smallest and largest element of ``tensor`` (equal for a whole message)."""
    cpu = tensor.detach().to("cpu")
    return float(cpu.min()), float(cpu.max())


def whole(tensor: torch.Tensor, value: float) -> bool:
    """Whether every element of ``tensor`` is ``value``: a whole, not a half-written, message."""
    return values(tensor) == (value, value)


def cpu_tensors(tree: object) -> Iterator[torch.Tensor]:
    """Every tensor in a nested state tree."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, Mapping):
        for item in tree.values():
            yield from cpu_tensors(item)
    elif isinstance(tree, list | tuple):
        for item in tree:
            yield from cpu_tensors(item)


@contextlib.contextmanager
def keeping_host_streams() -> Iterator[None]:
    """Restore the host thread's current CUDA device and streams after the block.

    Used around a host call that runs a CUDA node's hook on the host's thread (state_dict once
    the run has ended), so that what the hook made current does not leak into later tests.
    """
    device = torch.cuda.current_device()
    streams = [torch.cuda.current_stream(index) for index in range(torch.cuda.device_count())]
    try:
        yield
    finally:
        for stream in streams:
            torch.cuda.set_stream(stream)
        torch.cuda.set_device(device)


def memcpy_kinds(trace: Path) -> Counter[str]:
    """The device activity of a chrome trace: memcpy by direction, and kernels.

    ``HtoD``/``DtoH`` pass through host memory; ``DtoD`` (``PtoP`` counts as one) do not.
    """
    counts: Counter[str] = Counter()
    for event in json.loads(trace.read_text())["traceEvents"]:
        name = str(event.get("name", ""))
        category = str(event.get("cat", "")).lower()
        if category == "kernel":
            counts["kernel"] += 1
        elif category == "gpu_memcpy" or name.startswith("Memcpy "):
            for kind in ("HtoD", "DtoH", "DtoD", "HtoH"):
                if kind in name:
                    counts[kind] += 1
            if "PtoP" in name:
                counts["DtoD"] += 1
    return counts


@contextlib.contextmanager
def memcpy_trace(path: Path) -> Iterator[Counter[str]]:
    """Profile the block's CUDA activity; the yielded counter is filled when the block ends.

    Skips the test when the profiler records no kernel at all (no CUPTI on this machine).
    """
    counts: Counter[str] = Counter()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's own notices are not the test's subject
        with torch.profiler.profile(activities=activities) as profiler:
            yield counts
        profiler.export_chrome_trace(str(path))
    counts.update(memcpy_kinds(path))
    if counts["kernel"] == 0:
        pytest.skip("the CUDA profiler recorded no kernel here (CUPTI unavailable): cannot see memcpy")


def run_script(code: str) -> str:
    """Run ``code`` in a fresh Python process (Mujou importable); return its last output line."""
    environ = checkout_environ()
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
        check=False,
    )
    assert result.returncode == 0, f"the script failed:\n{result.stderr}\n--- script ---\n{code}"
    return result.stdout.strip().splitlines()[-1]


# --------------------------------------------------------------------------------------------
# Nodes used by several tests


class SlowSender(Node):
    """Sends ``k`` (1, 2, ...) at each update, written behind a slow kernel; keeps the last.

    It sends on ``y``, and on ``z`` too with ``both_ports``; with ``host_tensor`` it sends a
    CPU tensor on ``y`` instead.
    """

    y = Output()
    z = Output()

    def __init__(self, device: str, *, both_ports: bool = False, host_tensor: bool = False) -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.k = 0
        self.both_ports = both_ports
        self.host_tensor = host_tensor
        self.last = torch.zeros(N, device=device)
        self.stream = 0

    def on_start(self) -> None:
        self.stream = handle(torch.cuda.current_stream())

    def on_update(self, dt: float) -> None:
        self.k += 1
        if self.host_tensor:
            self.y.send(torch.full((N,), float(self.k)))  # a CPU tensor from a CUDA node
            return
        message = slow_full(self.k, self.device)
        self.y.send(message)
        if self.both_ports:
            self.z.send(message)
        message.fill_(-1.0)  # after send: the message is a snapshot
        self.last = slow_full(self.k, self.device)


class Keeper(Node):
    """Keeps every message it reads on ``x`` (messages are read-only; keeping them is fine)."""

    x = Input()

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.got.append(x)


def check_got(reader: Keeper, first: float, device: torch.device | str) -> None:
    """The reader read whole messages ``first``, ``first + 1``, ... on ``device``."""
    assert reader.got, f"{reader.name} read nothing"
    for i, message in enumerate(reader.got):
        assert message.device == torch.device(device), (reader.name, i, message.device)
        assert whole(message, first + i), (reader.name, i, values(message))


# --------------------------------------------------------------------------------------------
# cuda.index-pinned


@pytest.mark.rule("cuda.index-pinned", "devices.valid")
@pytest.mark.skipif(HAS_CUDA, reason="checks the error where CUDA is not available; it is here")
@pytest.mark.parametrize("device", ["cuda", torch.device("cuda"), "cuda:0"])
def test_cuda_without_cuda_raises(device: str | torch.device) -> None:
    """> `"cuda"` without an index is fixed to the host's current CUDA device when the node is
    > made. (devices.valid: CUDA raises ValueError when it is not available.)"""
    with pytest.raises(ValueError, match=r"^device .*CUDA") as info:
        Plain(device=device)
    assert "not available" in str(info.value), str(info.value)


class DeviceProbe(Node):
    def __init__(self, device: str = "cuda") -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.current: list[int] = []

    def on_update(self, dt: float) -> None:
        self.current.append(torch.cuda.current_device())


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.index-pinned")
def test_cuda_without_index_is_the_current_device() -> None:
    """> `"cuda"` without an index is fixed to the host's current CUDA device when the node is
    > made."""
    current = torch.cuda.current_device()
    node = DeviceProbe("cuda")
    assert node.device == torch.device("cuda", current), node.device
    assert Plain(device=torch.device("cuda")).device == torch.device("cuda", current)


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.rule("cuda.index-pinned")
def test_cuda_without_index_stays_on_the_device_current_when_made() -> None:
    """> `"cuda"` without an index is fixed to the host's current CUDA device when the node is
    > made."""
    with torch.cuda.device(1):
        node = DeviceProbe("cuda")
    assert node.device == torch.device("cuda", 1), node.device
    with torch.cuda.device(0), mujou.run(Bag(probe=node), timer=vt()) as run:
        run.sleep(0.5)
    assert node.device == torch.device("cuda", 1)
    assert node.current == [1, 1], node.current


# --------------------------------------------------------------------------------------------
# cuda.stream-current


class StreamProbe(Node):
    """Records, in each hook: the hook, the current device, stream, default stream, thread."""

    state_exclude: ClassVar[tuple[str, ...]] = ("seen",)  # what the hooks saw, not state

    def __init__(self, device: str = "cuda:0", *, dedicated: bool = False) -> None:
        super().__init__(period=0.25, seed=0, device=device, dedicated_thread=dedicated)
        self.seen: list[tuple[str, int, int, int, str]] = []

    def probe(self, hook: str) -> None:
        stream = torch.cuda.current_stream()
        default = torch.cuda.default_stream()
        thread = threading.current_thread().name
        self.seen.append((hook, torch.cuda.current_device(), handle(stream), handle(default), thread))

    def on_start(self) -> None:
        self.probe("on_start")

    def on_update(self, dt: float) -> None:
        self.probe("on_update")

    def on_stop(self) -> None:
        self.probe("on_stop")

    def state_dict(self) -> dict[str, Any]:
        self.probe("state_dict")
        return super().state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.probe("load_state_dict")
        super().load_state_dict(state)


@pytest.mark.cuda
@pytest.mark.rule("cuda.stream-current")
@pytest.mark.parametrize(
    ("device", "dedicated"),
    [
        pytest.param("cuda:0", False, marks=needs_cuda, id="worker"),
        pytest.param("cuda:0", True, marks=needs_cuda, id="dedicated"),
        pytest.param("cuda:1", False, marks=needs_two_gpus, id="second-gpu"),
    ],
)
def test_each_hook_runs_on_the_node_device_and_own_stream(device: str, dedicated: bool) -> None:
    """> Mujou makes the node's device and a CUDA stream of the node's own current in each of its
    > hooks, so every operation of the node goes on its stream."""
    first, second = StreamProbe(device, dedicated=dedicated), StreamProbe(device, dedicated=dedicated)
    net = Bag(first=first, second=second)
    with torch.cuda.device(0), mujou.run(net, workers=1, timer=vt()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    with keeping_host_streams():
        run.state_dict()  # once the run has ended, on the host's thread
    restored = [StreamProbe(device, dedicated=dedicated), StreamProbe(device, dedicated=dedicated)]
    with mujou.run(Bag(first=restored[0], second=restored[1]), workers=1, timer=vt(), state=tree):
        pass
    index = torch.device(device).index
    for node in [first, second, *restored]:
        hooks = [hook for hook, *_ in node.seen]
        assert "on_start" in hooks and "on_stop" in hooks, hooks
        for hook, current, stream, default, thread in node.seen:
            assert current == index, (node.name, hook, current)
            assert stream != default, f"{node.name}.{hook} ran on the default stream ({thread})"
        streams = {stream for _, _, stream, _, _ in node.seen}
        assert len(streams) == 1, f"{node.name} changed streams between hooks: {node.seen}"
    assert [hook for hook, *_ in first.seen] == [
        "on_start",
        "on_update",
        "on_update",
        "state_dict",
        "on_stop",
        "state_dict",
    ]
    assert [hook for hook, *_ in restored[0].seen] == ["on_start", "load_state_dict", "on_stop"]
    # Two nodes (far fewer than the pool's 32 streams): a stream each.
    assert first.seen[0][2] != second.seen[0][2], (first.seen, second.seen)
    assert restored[0].seen[0][2] != restored[1].seen[0][2]


# --------------------------------------------------------------------------------------------
# cuda.wait-after-update


class QueuesLate(Node):
    """Queues a slow kernel at the end of each update (or restore) and records an event after it."""

    state_exclude: ClassVar[tuple[str, ...]] = ("updated", "restored")  # CUDA events: not state

    def __init__(self, device: str = "cuda:0") -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.updated: list[torch.cuda.Event] = []
        self.restored: list[torch.cuda.Event] = []

    def on_update(self, dt: float) -> None:
        slow_kernel()
        self.updated.append(record())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        slow_kernel()
        self.restored.append(record())


class ChecksEvents(Node):
    """A CPU node that records whether the other node's last event is done, in each update."""

    def __init__(self, other: QueuesLate) -> None:
        super().__init__(period=0.25, seed=0)
        self.other = other
        self.done: list[bool] = []

    def on_update(self, dt: float) -> None:
        self.done.append(done(self.other.updated[-1]))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.wait-after-update")
def test_the_stream_is_waited_for_after_each_update() -> None:
    """> Mujou waits for the work queued on the node's stream after each `on_update` and after
    > the state is restored (the worker waits meanwhile, as in a hook that blocks)."""
    late = QueuesLate()
    checker = ChecksEvents(late)  # after `late` on the one worker: it runs once late's wait is over
    with mujou.run(Bag(late=late, checker=checker), workers=1, timer=vt()) as run:
        run.sleep(1.0)
        # The updates are over, the slow kernels too (right after run.sleep returned).
        finished = [done(event) for event in late.updated]
    assert len(late.updated) == 4
    assert finished == [True] * 4, finished
    assert checker.done == [True] * 4, checker.done


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.wait-after-update")
def test_the_stream_is_waited_for_after_the_restore() -> None:
    """> Mujou waits for the work queued on the node's stream after each `on_update` and after
    > the state is restored."""
    with mujou.run(Bag(late=QueuesLate()), timer=vt()) as run:
        run.sleep(0.25)
        tree = run.state_dict()
    late = QueuesLate()
    with mujou.run(Bag(late=late), timer=vt(), state=tree):
        # mujou.run returned after the restore: its slow kernel is over.
        finished = [done(event) for event in late.restored]
    assert finished == [True], finished


class LongKernel(Node):
    """A CUDA node on a thread of its own that queues a long kernel in its first update."""

    def __init__(self, queued: threading.Event) -> None:
        super().__init__(period=0.25, seed=0, device="cuda:0", dedicated_thread=True)
        self.queued = queued
        self.events: list[torch.cuda.Event] = []

    def on_update(self, dt: float) -> None:
        if not self.events:
            slow_kernel(LONG)
            self.events.append(record())
            self.queued.set()


class AfterLong(Node):
    """A CUDA node that queues nothing; its update starts once the long kernel is queued."""

    def __init__(self, queued: threading.Event) -> None:
        super().__init__(period=0.25, seed=0, device="cuda:0")
        self.queued = queued

    def on_update(self, dt: float) -> None:
        assert self.queued.wait(HANG_GUARD), "the long kernel was never queued"


class LongQuery(Node):
    """A CPU node that records whether the long kernel is done."""

    def __init__(self, other: LongKernel) -> None:
        super().__init__(period=0.25, seed=0)
        self.other = other
        self.done: list[bool] = []

    def on_update(self, dt: float) -> None:
        self.done.append(done(self.other.events[0]))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.wait-after-update")
def test_the_wait_is_for_the_node_stream_only() -> None:
    """> It waits for that stream only."""
    queued = threading.Event()
    long = LongKernel(queued)
    after = AfterLong(queued)
    query = LongQuery(long)  # on the one worker after `after`: it runs once after's wait is over
    with mujou.run(Bag(long=long, after=after, query=query), workers=1, timer=vt()) as run:
        run.sleep(0.25)
    # Waiting for the whole device after `after` would have waited for the long kernel.
    assert query.done == [False], "the wait after a node's update waited for another node's stream"


# --------------------------------------------------------------------------------------------
# cuda.wait-state-dict


class SlowState(Node):
    """A CUDA node whose state_dict returns a tensor it writes behind a slow kernel."""

    state_exclude: ClassVar[tuple[str, ...]] = ("stream",)  # a CUDA stream: not state

    def __init__(self, *, dedicated: bool = False) -> None:
        super().__init__(period=0.25, seed=0, device="cuda:0", dedicated_thread=dedicated)
        self.k = 0
        self.stream: torch.cuda.Stream | None = None
        self.threads: list[str] = []
        self.idle_at_start: list[bool] = []

    def on_start(self) -> None:
        self.stream = torch.cuda.current_stream()

    def on_update(self, dt: float) -> None:
        self.k += 1

    def state_dict(self) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        self.idle_at_start.append(torch.cuda.current_stream().query())
        return {**super().state_dict(), "out": slow_full(self.k, self.device)}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.wait-state-dict")
@pytest.mark.parametrize("dedicated", [False, True], ids=["worker", "dedicated"])
def test_state_dict_waits_for_the_node_stream_off_the_workers(dedicated: bool) -> None:
    """> Mujou waits for the node's stream before and after `state_dict`, on a thread of its own
    > (on the host's thread once the run has ended), so no worker waits for it."""
    node = SlowState(dedicated=dedicated)
    with mujou.run(Bag(node=node), workers=1, timer=vt()) as run:
        run.sleep(0.5)
        # Work on the node's stream that no hook of the node waited for: the wait before
        # state_dict does.
        assert node.stream is not None
        with torch.cuda.stream(node.stream):
            slow_kernel()
        tree = run.state_dict()
        assert node.idle_at_start == [True], "state_dict started before the node's stream was done"
        assert whole(tree["node"]["out"], 2.0), values(tree["node"]["out"])
        assert not node.threads[0].startswith("mujou-worker-"), node.threads
        run.sleep(0.25)
    with keeping_host_streams():
        ended = run.state_dict()
    assert whole(ended["node"]["out"], 3.0), values(ended["node"]["out"])
    assert node.threads[1] == threading.current_thread().name, node.threads
    assert all(t.device.type == "cpu" for t in cpu_tensors(ended))


# --------------------------------------------------------------------------------------------
# cuda.send-stays-on-device: the readers read while the sender is still in its hook


class Rounds:
    """Round k: the sender sent message k and waits until every reader has read it."""

    def __init__(self, readers: int) -> None:
        self.readers = readers
        self.cond = threading.Condition()
        self.sent = 0
        self.reads: Counter[int] = Counter()

    def publish(self, k: int) -> None:
        with self.cond:
            self.sent = k

    def current(self) -> int:
        with self.cond:
            return self.sent

    def ack(self, k: int) -> None:
        with self.cond:
            self.reads[k] += 1
            self.cond.notify_all()

    def wait_reads(self, k: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.reads[k] >= self.readers, HANG_GUARD)


class RoundSender(Node):
    """Sends round k behind a slow kernel, then stays in its hook until every reader read it."""

    y = Output()

    def __init__(self, rounds: Rounds, go: threading.Event, *, copy: bool = True) -> None:
        super().__init__(period=0.005, seed=0, device="cuda:0", dedicated_thread=True)
        self.rounds = rounds
        self.go = go
        self.copy = copy
        self.k = 0

    def on_update(self, dt: float) -> None:
        if self.k == ROUNDS:
            return
        if not self.go.wait(HANG_GUARD):
            raise RuntimeError("the host never started the rounds")
        self.k += 1
        message = slow_full(self.k, self.device)
        self.y.send(message, copy=self.copy)
        if self.copy:
            message.fill_(-1.0)  # queued after send: the message is a snapshot
        self.rounds.publish(self.k)
        if not self.rounds.wait_reads(self.k):
            raise RuntimeError(f"round {self.k} was not read by every reader")


class RoundReader(Node):
    """Reads each round once, while the sender waits in its hook, and keeps a CPU copy."""

    x = Input()

    def __init__(self, device: str, rounds: Rounds) -> None:
        super().__init__(period=0.005, seed=0, device=device)
        self.rounds = rounds
        self.read_rounds = 0
        self.got: list[tuple[int, torch.device, torch.Tensor]] = []

    def on_update(self, dt: float) -> None:
        k = self.rounds.current()  # before the read: the message read is round k's
        if k == self.read_rounds:
            return
        x = self.x.read()
        assert x is not None, f"round {k} was published but there is no message"
        self.got.append((k, x.device, x.to("cpu", copy=True)))
        self.read_rounds = k
        self.rounds.ack(k)


@pytest.mark.cuda
@pytest.mark.rule("cuda.send-stays-on-device", "cuda.cpu-readers-get-cpu-copy", "ports.send-no-copy")
@pytest.mark.parametrize("copy", [True, False], ids=["copy", "no-copy"])
@pytest.mark.parametrize(
    "readers",
    [
        pytest.param(["cuda:0", "cpu"], marks=needs_cuda, id="cuda-and-cpu"),
        pytest.param(["cuda:0"], marks=needs_cuda, id="cuda"),
        pytest.param(["cuda:0", "cuda:1", "cpu"], marks=needs_two_gpus, id="two-gpus"),
    ],
)
def test_readers_never_see_a_half_written_message(readers: list[str], copy: bool) -> None:
    """> Mujou keeps a tensor that the node sends on its own device there, when a node on CUDA
    > reads the port: `send` copies it on the node's stream and waits for that stream before
    > the peers can read it.

    With ``copy=False`` (ports.send-no-copy) the tensor itself is the message, and the
    stream is waited for all the same."""
    rounds, go = Rounds(len(readers)), threading.Event()
    sender = RoundSender(rounds, go, copy=copy)
    nodes = [RoundReader(device, rounds) for device in readers]
    net = Bag(sender=sender, **{f"r{i}": node for i, node in enumerate(nodes)})
    for node in nodes:
        net.connect(sender.y, node.x)
    with mujou.run(net, workers=len(nodes)) as run:  # the real-time timer: reads within the round
        subscription = run.subscribe(sender.y)
        go.set()
        assert rounds.wait_reads(ROUNDS), f"the rounds did not finish: {rounds.reads}"
        last = run.read(sender.y)
        hosted = subscription.drain()
    for node, device in zip(nodes, readers, strict=True):
        assert [k for k, _, _ in node.got] == list(range(1, ROUNDS + 1)), (device, node.got)
        for k, where, got in node.got:
            assert where == torch.device(device), (device, k, where)
            assert whole(got, k), f"reader on {device} read a half-written round {k}: {values(got)}"
    # The host: CPU copies of whole messages.
    assert last is not None and last.device.type == "cpu" and whole(last, ROUNDS)
    assert [m.device.type for m in hosted] == ["cpu"] * ROUNDS
    assert [values(m) for m in hosted] == [(k, k) for k in range(1, ROUNDS + 1)]


# --------------------------------------------------------------------------------------------
# cuda.device-to-device


@pytest.mark.cuda
@pytest.mark.rule("cuda.device-to-device", "cuda.send-stays-on-device")
@pytest.mark.parametrize(
    "reader_device",
    [pytest.param("cuda:0", marks=needs_cuda, id="same-gpu"), pytest.param("cuda:1", marks=needs_two_gpus)],
)
def test_cuda_peers_copy_device_to_device(reader_device: str, tmp_path: Path) -> None:
    """> A peer on CUDA copies the message from device to device, without host memory in
    > between (between two GPUs without peer access, the CUDA driver may still stage the copy
    > through the host)."""
    sender, reader = SlowSender("cuda:0"), Keeper(reader_device)
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.y, reader.x)
    with memcpy_trace(tmp_path / "trace.json") as counts:
        with mujou.run(net, timer=vt()) as run:
            run.sleep(1.0)
        torch.cuda.synchronize()  # the host, after the run: every copy is in the trace
    check_got(reader, 1.0, reader_device)
    assert counts["DtoD"] >= 3, counts
    peer = reader_device == "cuda:0" or torch.cuda.can_device_access_peer(1, 0)
    if peer:
        assert counts["HtoD"] == counts["DtoH"] == 0, f"a message went through host memory: {counts}"


# --------------------------------------------------------------------------------------------
# cuda.cpu-readers-get-cpu-copy


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.cpu-readers-get-cpu-copy")
def test_cpu_nodes_and_the_host_get_cpu_copies() -> None:
    """> A node on the CPU, and the host (`run.read`, `subscribe`, `wait_for`, `state_dict`), get
    > a CPU copy when they read a message of a node on CUDA."""
    sender = SlowSender("cuda:0", both_ports=True)
    gpu, cpu_device_route, cpu_host_route = Keeper("cuda:0"), Keeper("cpu"), Keeper("cpu")
    net = Bag(sender=sender, gpu=gpu, cpu1=cpu_device_route, cpu2=cpu_host_route)
    net.connect(sender.y, gpu.x)  # y: a CUDA node reads it too
    net.connect(sender.y, cpu_device_route.x)
    net.connect(sender.z, cpu_host_route.x)  # z: only a CPU node reads it
    seen_by_predicate: list[torch.device] = []

    def predicate(message: torch.Tensor) -> bool:
        seen_by_predicate.append(message.device)
        return whole(message, 4.0)

    with mujou.run(net, timer=vt()) as run:
        subscriptions = [run.subscribe(sender.y), run.subscribe(sender.z)]
        run.sleep(1.0)
        found = run.wait_for(sender.y, predicate, timeout=0.0)
        reads = [run.read(sender.y), run.read(sender.z), run.read(gpu.x), run.read(cpu_device_route.x)]
        hosted = [subscription.drain() for subscription in subscriptions]
        tree = run.state_dict()
    check_got(gpu, 1.0, "cuda:0")
    check_got(cpu_device_route, 1.0, "cpu")
    check_got(cpu_host_route, 1.0, "cpu")
    assert found.device.type == "cpu" and whole(found, 4.0)
    assert seen_by_predicate and {d.type for d in seen_by_predicate} == {"cpu"}, seen_by_predicate
    for message in reads:
        assert message is not None and message.device.type == "cpu" and whole(message, 4.0)
    for messages in hosted:
        assert [m.device.type for m in messages] == ["cpu"] * 4
        assert [values(m) for m in messages] == [(k, k) for k in (1.0, 2.0, 3.0, 4.0)]
    tensors = list(cpu_tensors(tree))
    assert tensors and all(t.device.type == "cpu" for t in tensors), [t.device for t in tensors]
    assert whole(tree["sender"]["last"], 4.0), values(tree["sender"]["last"])


# --------------------------------------------------------------------------------------------
# cuda.host-memory-route


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.host-memory-route")
def test_a_port_only_cpu_nodes_read_goes_through_host_memory(tmp_path: Path) -> None:
    """> A port that only nodes on the CPU (or only the host) read sends through host memory,
    > which is faster for them."""
    sender, reader = SlowSender("cuda:0", both_ports=True), Keeper("cpu")
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.y, reader.x)  # y: read by a CPU node only; z: read by no node
    with memcpy_trace(tmp_path / "trace.json") as counts, mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
    check_got(reader, 1.0, "cpu")
    # Each send copied to the host at once (y and z); no copy stayed on the device.
    assert counts["DtoH"] >= 8, counts
    assert counts["DtoD"] == 0, f"a message read only on the CPU was kept on the device: {counts}"


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.host-memory-route")
def test_a_tensor_on_another_device_goes_through_host_memory(tmp_path: Path) -> None:
    """> ... and so does a tensor on another device than the sender's."""
    sender, reader = SlowSender("cuda:0", host_tensor=True), Keeper("cuda:0")
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.y, reader.x)  # a CUDA node reads it, but the message is a CPU tensor
    with memcpy_trace(tmp_path / "trace.json") as counts, mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
    check_got(reader, 1.0, "cuda:0")
    assert counts["HtoD"] >= 3, counts
    assert counts["DtoD"] == 0, counts


# --------------------------------------------------------------------------------------------
# cuda.other-device-current


class SendsUnderAnotherDevice(SlowSender):
    """Sends a tensor of its own device while the hook has made device 1 current."""

    def on_update(self, dt: float) -> None:
        self.k += 1
        message = slow_full(self.k, self.device)
        with torch.cuda.device(1):
            self.y.send(message)
        message.fill_(-1.0)


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.rule("cuda.other-device-current")
def test_message_stays_on_the_device_while_another_is_current(tmp_path: Path) -> None:
    """> The message stays on the device also while the hook has made another device current
    > (`torch.cuda.device(...)`)."""
    sender, reader = SendsUnderAnotherDevice("cuda:0"), Keeper("cuda:0")
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.y, reader.x)
    with memcpy_trace(tmp_path / "trace.json") as counts:
        with mujou.run(net, timer=vt()) as run:
            run.sleep(1.0)
        torch.cuda.synchronize()
    check_got(reader, 1.0, "cuda:0")
    assert counts["HtoD"] == counts["DtoH"] == 0, f"a message went through host memory: {counts}"
    assert counts["DtoD"] >= 3, counts


# --------------------------------------------------------------------------------------------
# cuda.stream-pool (each in a fresh process: the pool of streams is the process's)

_POOL_SCRIPT = """
import json, torch, mujou

class Probe(mujou.Node):
    def __init__(self):
        super().__init__(period=0.25, seed=0, device="cuda:0")
        self.stream = 0
    def on_start(self):
        self.stream = torch.cuda.current_stream().cuda_stream

class Src(Probe):
    y = mujou.Output()

class Gpu(Probe):
    x = mujou.Input()

class CpuReader(mujou.Node):
    x = mujou.Input()
    def __init__(self):
        super().__init__(period=0.25, seed=0)
        self.stream = 0
    def on_start(self):
        self.stream = torch.cuda.current_stream(0).cuda_stream

class Bag(mujou.Net):
    def __init__(self, nodes):
        super().__init__()
        for i, node in enumerate(nodes):
            setattr(self, f"n{i:02d}", node)

def streams(count, reader):
    if reader:
        src, gpu, cpu = Src(), Gpu(), CpuReader()
        cuda = [src, gpu] + [Probe() for _ in range(count - 2)]
        net = Bag(cuda + [cpu])
        net.connect(src.y, gpu.x)
        net.connect(src.y, cpu.x)
    else:
        cuda, cpu = [Probe() for _ in range(count)], None
        net = Bag(cuda)
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(0.25)
    return [node.stream for node in cuda], (cpu.stream if cpu else None)

default = torch.cuda.default_stream(0).cuda_stream
result = {"default": default}
for name, count, reader in [("forty", 40, False), ("31+copy", 31, True), ("32+copy", 32, True)]:
    result[name] = streams(count, reader)
print(json.dumps(result))
"""


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.stream-pool")
def test_past_32_streams_on_a_device_nodes_share() -> None:
    """> A device has a pool of 32 streams, so past 32 streams on one device, some nodes share a
    > stream. The streams for copies of the nodes that read another device (below) count too."""
    result = json.loads(run_script(_POOL_SCRIPT))
    default = result["default"]
    forty, _ = result["forty"]
    assert default not in forty
    assert len(forty) == 40 and len(set(forty)) == 32, Counter(forty)
    # 31 CUDA nodes and the copy stream of a CPU reader: 32 streams, none shared.
    nodes, copy = result["31+copy"]
    assert len(set(nodes)) == 31 and copy not in nodes and copy != default, (nodes, copy)
    # 32 CUDA nodes and the copy stream: 33, so the copy stream shares a node's stream.
    nodes, copy = result["32+copy"]
    assert len(set(nodes)) == 32 and copy in nodes, (nodes, copy)


_HOST_STREAMS_SCRIPT = """
import json, torch, mujou

class Probe(mujou.Node):
    def __init__(self):
        super().__init__(period=0.25, seed=0, device="cuda:0")
        self.stream = 0
    def on_start(self):
        self.stream = torch.cuda.current_stream().cuda_stream

class Bag(mujou.Net):
    def __init__(self, nodes):
        super().__init__()
        for i, node in enumerate(nodes):
            setattr(self, f"n{i}", node)

def streams(count):
    nodes = [Probe() for _ in range(count)]
    with mujou.run(Bag(nodes), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.25)
    return [node.stream for node in nodes]

first = streams(1)
mine = [torch.cuda.Stream(device=0) for _ in range(31)]  # the host's own streams
second = streams(2)
print(json.dumps({"first": first, "second": second, "mine": [s.cuda_stream for s in mine]}))
"""


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.stream-pool", "cuda.stream-current")
def test_nodes_keep_streams_of_their_own_when_the_host_makes_streams() -> None:
    """> A device has a pool of 32 streams, so past 32 streams on one device, some nodes share a
    > stream. (cuda.stream-current: a CUDA stream of the node's own.) The streams the host makes
    > with torch.cuda.Stream(), before a run or between two, are none of the nodes' streams.

    Needs Mujou to take its pool from streams the host does not draw from by default (the
    high-priority streams): torch hands out its default-priority streams in turn."""
    result = json.loads(run_script(_HOST_STREAMS_SCRIPT))
    first, second, mine = result["first"], result["second"], set(result["mine"])
    assert len(set(second)) == 2, f"two CUDA nodes share a stream: {result}"
    assert not set(first) & mine, f"a stream the host made is the node's of the first run: {result}"
    assert not set(second) & mine, f"a stream the host made is a node's: {result}"


# --------------------------------------------------------------------------------------------
# cuda.run-syncs-host-stream


class MadeInInit(Node):
    """Makes a CUDA tensor in __init__, on the host's stream, behind a slow kernel."""

    def __init__(self, *, slow: bool = True) -> None:
        super().__init__(period=0.25, seed=0, device="cuda:0")
        self.t = slow_full(7.0, self.device) if slow else torch.full((1,), 7.0, device=self.device)
        self.seen: torch.Tensor | None = None
        self.stream = 0  # the node's current stream in on_start

    def on_start(self) -> None:
        self.stream = torch.cuda.current_stream().cuda_stream
        self.seen = self.t.clone()  # on the node's stream


def a_stream_not_the_nodes() -> torch.cuda.Stream:
    """A stream of the host's that is not the stream a lone MadeInInit node gets in a run.

    torch hands its streams out in turn, so a stream the host makes may be a node's: then the
    node's work would follow the host's on it, synchronized or not. A run of the same net tells
    the node's stream; of two streams made in a row, one differs from it."""
    probe = MadeInInit(slow=False)
    with mujou.run(Bag(node=probe), timer=vt()):
        pass
    for _ in range(2):
        side = torch.cuda.Stream(device=0)  # type: ignore[no-untyped-call]  # untyped in torch
        if side.cuda_stream != probe.stream:
            return side
    raise AssertionError("two streams made in a row were both the node's")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.run-syncs-host-stream")
@pytest.mark.parametrize("host_stream", ["default", "side"])
def test_run_synchronizes_the_host_stream_before_the_nodes_start(host_stream: str) -> None:
    """> `mujou.run` synchronizes the host's current stream before it starts the nodes.

    The host's side stream is not the node's: on the node's own stream the node's work would
    follow the host's without any synchronization."""
    side = a_stream_not_the_nodes() if host_stream == "side" else None
    with torch.cuda.stream(side):  # None: the default stream stays current
        node = MadeInInit()
        with mujou.run(Bag(node=node), timer=vt()):
            pass
    host = torch.cuda.default_stream(0) if side is None else side
    assert node.stream != host.cuda_stream, "the node ran on the host's stream: this tests nothing"
    assert node.seen is not None and whole(node.seen, 7.0), values(node.t)


# --------------------------------------------------------------------------------------------
# cuda.copy-stream


class CopyStreamProbe(Keeper):
    """Records, in each hook, the current device and the current stream of ``source``."""

    def __init__(self, device: str, source: int) -> None:
        super().__init__(device)
        self.source = source
        self.seen: list[tuple[str, int, int]] = []

    def probe(self, hook: str) -> None:
        own = torch.cuda.current_device() if self.device.type == "cuda" else -1
        self.seen.append((hook, own, handle(torch.cuda.current_stream(self.source))))

    def on_start(self) -> None:
        self.probe("on_start")

    def on_update(self, dt: float) -> None:
        self.probe("on_update")
        super().on_update(dt)

    def on_stop(self) -> None:
        self.probe("on_stop")


@pytest.mark.cuda
@pytest.mark.rule("cuda.copy-stream")
@pytest.mark.parametrize(
    "reader_device",
    [pytest.param("cpu", marks=needs_cuda), pytest.param("cuda:1", marks=needs_two_gpus)],
)
def test_reader_of_another_device_copies_on_a_stream_of_its_own(reader_device: str) -> None:
    """> A node that reads messages from a CUDA node on another device (a node on the CPU, or on
    > another GPU) copies them on a stream of its own on that device, which Mujou makes
    > current in each of its hooks too."""
    sender, peer = SlowSender("cuda:0"), Keeper("cuda:0")
    reader = CopyStreamProbe(reader_device, source=0)
    net = Bag(sender=sender, peer=peer, reader=reader)
    net.connect(sender.y, peer.x)  # a CUDA node reads y: it stays on cuda:0
    net.connect(sender.y, reader.x)
    with mujou.run(net, workers=1, timer=vt()) as run:
        run.sleep(1.0)
    check_got(reader, 1.0, reader_device)
    assert [hook for hook, _, _ in reader.seen] == ["on_start"] + ["on_update"] * 4 + ["on_stop"]
    copy_streams = {stream for _, _, stream in reader.seen}
    assert len(copy_streams) == 1, reader.seen
    (copy_stream,) = copy_streams
    assert copy_stream != handle(torch.cuda.default_stream(0)), "the copy stream is the default stream"
    assert copy_stream != sender.stream, "the reader copies on the sender's stream"
    if reader_device != "cpu":
        assert {own for _, own, _ in reader.seen} == {1}, reader.seen


# --------------------------------------------------------------------------------------------
# cuda.write-on-device


class HostFed(Node):
    """Keeps every message the host gives its input."""

    x = Input()

    def __init__(self, device: str) -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.got.append(x)


@pytest.mark.cuda
@pytest.mark.rule("cuda.write-on-device")
@pytest.mark.parametrize(
    ("host_stream", "current"),
    [
        pytest.param("default", 0, marks=needs_cuda, id="default-stream"),
        pytest.param("side", 0, marks=needs_cuda, id="side-stream"),
        pytest.param("default", 1, marks=needs_two_gpus, id="another-device-current"),
    ],
)
def test_write_leaves_a_tensor_on_the_node_device(host_stream: str, current: int, tmp_path: Path) -> None:
    """> `run.write` (and `inputs=`) leaves a tensor on the CUDA device of the port's node there
    > too: it copies the tensor on the host's current stream of that device and waits for that
    > stream, so the host need not synchronize, whichever device is current."""
    node = HostFed("cuda:0")
    side = torch.cuda.Stream(device=0) if host_stream == "side" else None  # type: ignore[no-untyped-call]
    with (
        memcpy_trace(tmp_path / "trace.json") as counts,
        torch.cuda.device(current),
        torch.cuda.stream(side),
    ):
        first = slow_full(1.0, "cuda:0")  # queued on the host's current stream of cuda:0
        with mujou.run(Bag(node=node), timer=vt(), inputs={node.x: first}) as run:
            first.fill_(-1.0)  # after inputs=: the message is a snapshot
            run.sleep(0.25)
            second = slow_full(2.0, "cuda:0")
            run.write(node.x, second)
            second.fill_(-1.0)
            run.sleep(0.25)
        torch.cuda.synchronize(0)
    assert [m.device for m in node.got] == [torch.device("cuda", 0)] * 2
    assert [values(m) for m in node.got] == [(1.0, 1.0), (2.0, 2.0)]
    assert counts["HtoD"] == counts["DtoH"] == 0, f"a host message went through host memory: {counts}"


class Cloning(HostFed):
    """Clones every message the host gives its input, on its own stream, in the update."""

    def __init__(self, device: str) -> None:
        super().__init__(device)
        self.handed: list[int] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.handed.append(x.data_ptr())
        self.got.append(x.clone())


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("run.write-no-copy", "cuda.write-on-device")
def test_a_write_without_copy_hands_a_cuda_tensor_over_once_the_host_stream_is_done() -> None:
    """> `run.write(input, message, copy=False)` makes each tensor of the message that is already
    > on the input's node's device the message itself (detached) ...; on a CUDA device, once the
    > host's current stream of that device has done its work. A tensor on another device ... is
    > copied as with `copy=True`."""
    node, cpu = Cloning("cuda:0"), HostFed("cpu")
    side = torch.cuda.Stream(device=0)  # type: ignore[no-untyped-call]
    start = {node.x: torch.zeros(N, device="cuda:0"), cpu.x: torch.zeros(N)}
    with mujou.run(Bag(node=node, cpu=cpu), timer=vt(), inputs=start) as run, torch.cuda.stream(side):
        handed = slow_full(2.0, "cuda:0")  # its fill queued on the host's side stream
        run.write(node.x, handed, copy=False)
        run.sleep(0.25)  # the node's update clones it (before the CPU write below, whose copy
        # to host memory would wait for the side stream and hide a write that did not)
        run.write(cpu.x, handed, copy=False)  # another device: a CPU copy
        run.sleep(0.25)
    first = node.handed.index(handed.data_ptr())  # the first update that read the write
    assert values(node.got[first]) == (2.0, 2.0)  # its clone read the fill, not what came before it
    assert node.got[first].device == torch.device("cuda", 0) and cpu.got[-1].device.type == "cpu"
    assert values(cpu.got[-1]) == (2.0, 2.0)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.write-on-device")
def test_no_node_waits_for_the_host_work_after_a_write() -> None:
    """> ... so that no node waits for the GPU work the host queues after it writes."""
    near, cpu = HostFed("cuda:0"), HostFed("cpu")
    start = {near.x: slow_full(1.0, "cuda:0"), cpu.x: slow_full(1.0, "cuda:0")}
    with mujou.run(Bag(near=near, cpu=cpu), timer=vt(), inputs=start) as run:
        run.write(near.x, slow_full(2.0, "cuda:0"))
        run.write(cpu.x, slow_full(2.0, "cuda:0"))
        slow_kernel(LONG)  # the host's work after the writes, on its (default) stream
        host_work = record()
        run.sleep(0.25)
        # The updates have read the messages (and were waited for) while the host's work runs.
        still_running = not done(host_work)
    assert still_running, "an update waited for the GPU work the host queued after it wrote"
    assert [values(m) for m in near.got] == [(2.0, 2.0)]
    assert [values(m) for m in cpu.got] == [(2.0, 2.0)]


@pytest.mark.cuda
@pytest.mark.rule("cuda.write-on-device")
@pytest.mark.parametrize(
    "node_device",
    [pytest.param("cpu", marks=needs_cuda), pytest.param("cuda:1", marks=needs_two_gpus)],
)
def test_write_of_a_tensor_of_another_device_goes_through_host_memory(node_device: str) -> None:
    """> Any other tensor (for a node on the CPU, or on another device than the node's) goes
    > through host memory."""
    node = HostFed(node_device)
    with mujou.run(Bag(node=node), timer=vt(), inputs={node.x: slow_full(1.0, "cuda:0")}) as run:
        run.sleep(0.25)
        run.write(node.x, slow_full(2.0, "cuda:0"))
        run.sleep(0.25)
    assert [m.device for m in node.got] == [torch.device(node_device)] * 2
    assert [values(m) for m in node.got] == [(1.0, 1.0), (2.0, 2.0)]


@pytest.mark.rule("cuda.write-on-device")
def test_write_to_a_cpu_node_gives_it_a_host_copy() -> None:
    """> Any other tensor (for a node on the CPU, ...) goes through host memory. (On the CPU:
    > the node gets a CPU copy that shares no memory with the host's tensor.)"""
    node = HostFed("cpu")
    first, second = torch.full((4,), 1.0), torch.full((4,), 2.0)
    with mujou.run(Bag(node=node), timer=vt(), inputs={node.x: first}) as run:
        first.fill_(-1.0)
        run.sleep(0.25)
        run.write(node.x, second)
        second.fill_(-1.0)
        run.sleep(0.25)
    assert [m.device.type for m in node.got] == ["cpu", "cpu"]
    assert [values(m) for m in node.got] == [(1.0, 1.0), (2.0, 2.0)]


# --------------------------------------------------------------------------------------------
# cuda.cpu-node-no-cuda

_CPU_ONLY_SCRIPT = """
import os, tempfile, torch, mujou
from mujou import Input, Net, Node, Output

class Src(Node):
    y = Output()
    def __init__(self, dedicated=False):
        super().__init__(period=0.25, seed=0, dedicated_thread=dedicated)
        self.w = torch.zeros(3)
    def on_update(self, dt):
        self.w += torch.randn(3, generator=self.generator)
        self.y.send(self.w)

class Dst(Node):
    x = Input()
    cmd = Input()
    def __init__(self):
        super().__init__(period=0.1, seed=1)
        self.seen = 0
    def on_update(self, dt):
        if self.x.read() is not None:
            self.seen += 1
        self.cmd.read()

class Pair(Net):
    def __init__(self):
        super().__init__()
        self.src = Src()
        self.own = Src(dedicated=True)
        self.dst = Dst()
        self.connect(self.src.y, self.dst.x)

assert not torch.cuda.is_initialized()
net = Pair()
with mujou.run(net, workers=2, timer=mujou.VirtualTimer(), inputs={net.dst.cmd: torch.zeros(1)}) as run:
    subscription = run.subscribe(net.src.y)
    run.sleep(1.0)
    run.write(net.dst.cmd, torch.ones(1))
    run.wait_for(net.src.y, lambda m: True, timeout=1.0)
    run.read(net.dst.x)
    subscription.drain()
    tree = run.state_dict()
run.state_dict()
path = os.path.join(tempfile.mkdtemp(), "state.pt")
mujou.save(tree, path)
net = Pair()
restored = mujou.load(path)
with mujou.run(net, timer=mujou.VirtualTimer(), state=restored, inputs={net.dst.cmd: torch.ones(1)}) as run:
    run.sleep(0.5)
net = Pair()
with mujou.run(net, workers=1, inputs={net.dst.cmd: torch.zeros(1)}) as run:
    run.sleep(0.05)
print("initialized" if torch.cuda.is_initialized() else "untouched")
"""


@pytest.mark.rule("cuda.cpu-node-no-cuda")
def test_a_cpu_only_run_never_initializes_cuda() -> None:
    """> A node on the CPU that reads no CUDA node does not touch CUDA. (A process whose nets
    > hold only CPU nodes never initializes CUDA, host calls, save, load and resume included.)"""
    assert run_script(_CPU_ONLY_SCRIPT) == "untouched"


class CpuSender(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.ones(2))


class CurrentStreamProbe(Node):
    """A CPU node that records the current stream of cuda:0 in each hook, and what it reads."""

    x = Input()
    z = Input()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.seen: list[tuple[str, int]] = []
        self.got: list[torch.Tensor] = []

    def probe(self, hook: str) -> None:
        self.seen.append((hook, handle(torch.cuda.current_stream(0))))

    def on_start(self) -> None:
        self.probe("on_start")

    def on_update(self, dt: float) -> None:
        self.probe("on_update")
        for port in (self.x, self.z):
            message = port.read()
            if message is not None:
                self.got.append(message)

    def on_stop(self) -> None:
        self.probe("on_stop")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.cpu-node-no-cuda")
def test_a_cpu_node_leaves_the_current_stream_alone() -> None:
    """> A node on the CPU that reads no CUDA node does not touch CUDA: on a worker that ran a
    > CUDA node just before, that node's stream is still current, which a CPU node does not
    > use."""
    gpu = SlowSender("cuda:0", both_ports=True)  # only the CPU node reads z
    cpu_sender, probe = CpuSender(), CurrentStreamProbe()
    net = Bag(gpu=gpu, cpu_sender=cpu_sender, probe=probe)
    net.connect(cpu_sender.y, probe.x)
    net.connect(gpu.z, probe.z)  # read by a CPU node only: through host memory, no copy stream
    # One worker runs gpu, cpu_sender and probe. In no_grad the host's thread runs no update
    # (threads.host-thread-settings), so all of them run on that worker, as the rule's case
    # asks, and none on the host's thread, whose own streams each update there puts back.
    with mujou.run(net, workers=1, timer=vt()) as run, torch.no_grad():
        run.sleep(1.0)
    assert [hook for hook, _ in probe.seen] == ["on_start"] + ["on_update"] * 4 + ["on_stop"]
    assert {stream for _, stream in probe.seen} == {gpu.stream}, (probe.seen, gpu.stream)
    assert probe.got and {m.device.type for m in probe.got} == {"cpu"}


# --------------------------------------------------------------------------------------------
# cuda.state-restores-on-cuda-only


def saved_as_cuda(tree: dict[str, Any], name: str) -> dict[str, Any]:
    """``tree`` with its metadata saying that node ``name`` was on CUDA."""
    meta = dict(tree["@mujou"])
    nodes = dict(meta["nodes"])
    entry = dict(nodes[name])
    assert entry.get("device") == "cpu", f"the tree's metadata of {name!r} names no device: {entry}"
    entry["device"] = "cuda"
    nodes[name] = entry
    meta["nodes"] = nodes
    return {**tree, "@mujou": meta}


@pytest.mark.rule("cuda.state-restores-on-cuda-only")
def test_a_tree_saved_from_cuda_is_refused_by_a_cpu_node() -> None:
    """> A tree saved from nodes on CUDA restores only into nodes on CUDA (on another machine
    > with a GPU too); a node on the CPU gets `ValueError`."""
    with mujou.run(Bag(drawer=Drawer()), timer=vt()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    log: list[str] = []
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(Bag(drawer=Drawer(log=log)), timer=vt(), state=saved_as_cuda(tree, "drawer"))
    message = str(info.value)
    assert "'drawer'" in message and "CUDA" in message, message
    assert log == [], "nothing starts when the tree is refused"
    # The tree as saved (from a CPU node) restores into a CPU node.
    with mujou.run(Bag(drawer=Drawer()), timer=vt(), state=tree) as run:
        run.sleep(0.25)


def draws_after(tree: dict[str, Any], device: str) -> tuple[torch.device, list[torch.Tensor]]:
    """Resume a Drawer on ``device`` from ``tree``: where its tensor is, and its next two draws."""
    node = Drawer(device)
    draws: list[torch.Tensor] = []
    with mujou.run(Bag(drawer=node), timer=vt(), state=tree) as run:
        restored_on = node.last.device  # right after the restore, before any update
        for _ in range(2):
            run.sleep(0.25)
            draws.append(node.last.to("cpu"))
    return restored_on, draws


@pytest.mark.cuda
@needs_cuda
@pytest.mark.rule("cuda.state-restores-on-cuda-only")
def test_a_tree_saved_from_cuda_restores_into_cuda_only() -> None:
    """> The state of a random generator differs between the CPU and CUDA, though, so a tree saved
    > from nodes on CUDA restores only into nodes on CUDA (on another machine with a GPU too);
    > a node on the CPU gets `ValueError`."""
    node = Drawer("cuda:0")
    with mujou.run(Bag(drawer=node), timer=vt()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
        went_on = []
        for _ in range(2):
            run.sleep(0.25)
            went_on.append(node.last.to("cpu"))
    assert all(t.device.type == "cpu" for t in cpu_tensors(tree))
    restored_on, draws = draws_after(tree, "cuda:0")
    assert restored_on == torch.device("cuda", 0), restored_on
    assert all(torch.equal(a, b) for a, b in zip(draws, went_on, strict=True)), (draws, went_on)
    log: list[str] = []
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state for net") as info:
        mujou.run(Bag(drawer=Drawer("cpu", log=log)), timer=vt(), state=tree)
    assert "'drawer'" in str(info.value) and "CUDA" in str(info.value), str(info.value)
    assert log == [], "nothing starts when the tree is refused"


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.rule("cuda.state-restores-on-cuda-only")
def test_a_tree_saved_on_one_gpu_restores_on_another() -> None:
    """> ... a tree saved from nodes on CUDA restores only into nodes on CUDA (on another machine
    > with a GPU too)."""
    with mujou.run(Bag(drawer=Drawer("cuda:0")), timer=vt()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    node = Drawer("cuda:1")
    with mujou.run(Bag(drawer=node), timer=vt(), state=tree):
        state = node.generator.get_state()
        last = node.last
    assert torch.equal(state, tree["drawer"]["generator"])
    assert last.device == torch.device("cuda", 1) and torch.equal(last.to("cpu"), tree["drawer"]["last"])
