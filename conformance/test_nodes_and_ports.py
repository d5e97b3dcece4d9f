"""Conformance tests for the spec page "Nodes and ports" (spec/en/nodes-and-ports.md).

Every test runs under the virtual timer unless it needs real time; none asserts on wall-clock
timing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest
import torch
from _support import HANG_GUARD, Bag, DtRecorder, FirstValueReader, Plain, vt, wait_until

import mujou
from mujou import Input, Net, Node, Output


class Source(Node):
    """Sends its update count (1, 2, ...) as a tensor at each update."""

    y = Output()

    def __init__(self, period: float = 0.25, *, dedicated_thread: bool = False) -> None:
        super().__init__(period=period, seed=0, dedicated_thread=dedicated_thread)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.y.send(torch.tensor([float(self.count)]))


class Sink(Node):
    """Reads x at each update and records what it read (None or the float value)."""

    x = Input()

    def __init__(self, period: float = 0.25) -> None:
        super().__init__(period=period, seed=0)
        self.seen: list[float | None] = []
        self.devices: list[torch.device] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        self.seen.append(None if x is None else float(x[0]))
        if x is not None:
            self.devices.append(x.device)


class OptionalSink(Sink):
    """A sink whose input is optional."""

    x = Input(optional=True)


# --------------------------------------------------------------------------------------------
# nodes.hook-defaults


@pytest.mark.rule("nodes.hook-defaults")
def test_default_hooks_do_nothing() -> None:
    """> `Node` provides the hooks on_start(), on_update(dt), on_stop(), state_dict(),
    > load_state_dict(state); the first three do nothing by default."""
    node = Plain(seed=1)
    before = dict(vars(node))
    assert node.on_start() is None  # type: ignore[func-returns-value]  # checks the default
    assert node.on_update(0.01) is None  # type: ignore[func-returns-value]  # checks the default
    assert node.on_stop() is None  # type: ignore[func-returns-value]  # checks the default
    assert vars(node) == before
    state = node.state_dict()
    assert isinstance(state, dict)
    node.load_state_dict(state)
    for hook in ("on_start", "on_update", "on_stop", "state_dict", "load_state_dict"):
        assert getattr(Plain, hook) is getattr(Node, hook)


@pytest.mark.rule("nodes.hook-defaults")
def test_node_without_overrides_runs() -> None:
    """> a subclass overrides those it needs."""
    net = Bag(a=Plain(period=0.5), b=Plain(period=0.25))
    with mujou.run(net, timer=vt()) as run:
        run.sleep(2.0)
        stats = run.stats()
    assert stats.nodes["a"].updates == 4
    assert stats.nodes["b"].updates == 8


# --------------------------------------------------------------------------------------------
# nodes.hook-order


class Recorder(Node):
    """Records its hooks in a shared log as (name, hook); optionally fails in one hook."""

    def __init__(
        self,
        log: list[tuple[str, str]],
        lock: threading.Lock,
        *,
        fail_in: str = "",
        period: float = 0.25,
        dedicated_thread: bool = False,
    ) -> None:
        super().__init__(period=period, seed=0, dedicated_thread=dedicated_thread)
        self.log = log
        self.lock = lock
        self.fail_in = fail_in

    def _record(self, hook: str) -> None:
        with self.lock:
            self.log.append((self.name, hook))
        if hook == self.fail_in:
            raise ValueError(f"failing in {hook}")

    def on_start(self) -> None:
        self._record("on_start")

    def on_update(self, dt: float) -> None:
        self._record("on_update")

    def on_stop(self) -> None:
        self._record("on_stop")


def _hooks_of(log: list[tuple[str, str]], name: str) -> list[str]:
    return [hook for who, hook in log if who == name]


def _check_order(hooks: list[str], *, started_ok: bool) -> None:
    """on_start once first, then updates, then on_stop once last iff on_start returned."""
    assert hooks[:1] == ["on_start"], hooks
    assert hooks.count("on_start") == 1, hooks
    if started_ok:
        assert hooks.count("on_stop") == 1, hooks
        assert hooks[-1] == "on_stop", hooks
        assert set(hooks[1:-1]) <= {"on_update"}, hooks
    else:
        assert hooks == ["on_start"], hooks


@pytest.mark.rule("nodes.hook-order")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_hook_order(timer: str) -> None:
    """> For each run, a node's on_start runs once before any of its updates; on_update runs
    > zero or more times; on_stop runs once, last. No hook of the node runs after its on_stop."""
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    net = Bag(
        fast=Recorder(log, lock, period=0.01 if timer == "realtime" else 0.25),
        slow=Recorder(log, lock, period=1e6),  # never updates: zero updates is fine
        own=Recorder(log, lock, period=0.01, dedicated_thread=True),
    )
    for _ in range(2):  # the same holds for each run of the net
        log.clear()
        the_timer = vt() if timer == "virtual" else mujou.RealTimeTimer()
        with mujou.run(net, timer=the_timer, workers=2) as run:
            run.sleep(1.0 if timer == "virtual" else 0.05)
        after_stop = list(log)
        for name in ("fast", "slow", "own"):
            _check_order(_hooks_of(after_stop, name), started_ok=True)
        assert _hooks_of(after_stop, "slow") == ["on_start", "on_stop"]
        if timer == "virtual":
            assert _hooks_of(after_stop, "fast").count("on_update") == 4
        # No hook after on_stop: the log does not grow once stop() returned.
        threading.Event().wait(0.02)
        assert log == after_stop


@pytest.mark.rule("nodes.hook-order")
@pytest.mark.parametrize("failing", ["on_update", "on_stop"])
def test_on_stop_after_failures_in_later_hooks(failing: str) -> None:
    """> on_stop runs once, last, if and only if its on_start returned normally."""
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    net = Bag(bad=Recorder(log, lock, fail_in=failing), good=Recorder(log, lock))
    with pytest.raises(mujou.HookError), mujou.run(net, timer=vt()) as run:
        run.sleep(2.0)
    _check_order(_hooks_of(log, "bad"), started_ok=True)
    _check_order(_hooks_of(log, "good"), started_ok=True)


@pytest.mark.rule("nodes.hook-order")
def test_no_on_stop_when_on_start_raised() -> None:
    """> on_stop runs once, last, if and only if its on_start returned normally."""
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    net = Bag(
        a=Recorder(log, lock),
        bad=Recorder(log, lock, fail_in="on_start"),
        c=Recorder(log, lock, dedicated_thread=True),
    )
    with pytest.raises(mujou.HookError):
        mujou.run(net, timer=vt())
    assert _hooks_of(log, "bad") == ["on_start"]
    for name in ("a", "c"):
        hooks = _hooks_of(log, name)
        # Either on_start never ran, or it returned and on_stop followed; no update ran.
        assert hooks in ([], ["on_start", "on_stop"]), (name, hooks)


# --------------------------------------------------------------------------------------------
# nodes.init-required


class ForgetsSuper(Node):
    def __init__(self) -> None:
        self.value = 1


@pytest.mark.rule("nodes.init-required")
def test_node_without_super_init_is_rejected_when_registered() -> None:
    """> A node whose class's `__init__` did not call `super().__init__()` is rejected with
    > TypeError naming the class and the fix, when it is registered in a net."""
    node = ForgetsSuper()  # making it is not an error yet
    net = Bag()
    with pytest.raises(
        TypeError,
        match=r"^ForgetsSuper was not initialized as a mujou\.Node: call super\(\)\.__init__\(\) "
        r"at the start of ForgetsSuper\.__init__$",
    ):
        net.member = node
    assert list(net.nodes()) == []


# --------------------------------------------------------------------------------------------
# nodes.name


class Arm(Net):
    def __init__(self) -> None:
        super().__init__()
        self.joint = Plain()
        self.hand = Plain()


class Robot(Net):
    def __init__(self) -> None:
        super().__init__()
        self.base = Plain()
        self.arm = Arm()


@pytest.mark.rule("nodes.name")
def test_node_name_is_dotted_path() -> None:
    """> A node's `name` is its dotted path in the outermost net that contains it (attribute
    > names joined by "."), e.g. "arm.joint"; "" while it is in no net."""
    assert Plain().name == ""
    arm = Arm()
    assert arm.joint.name == "joint"  # arm is outermost for now
    assert arm.name == ""
    robot = Bag(left=arm)
    assert arm.joint.name == "left.joint"
    assert arm.hand.name == "left.hand"
    assert arm.name == "left"
    assert robot.name == ""
    r = Robot()
    assert [n.name for n in r.nodes()] == ["base", "arm.joint", "arm.hand"]
    outer = Bag(robot=r)
    assert [n.name for n in outer.nodes()] == ["robot.base", "robot.arm.joint", "robot.arm.hand"]
    assert r.arm.joint.name == "robot.arm.joint"
    assert outer.name == ""


@pytest.mark.rule("nodes.name")
def test_port_names_follow_node_names() -> None:
    """> A node's `name` is its dotted path in the outermost net (ports: the node's name, a dot,
    > the attribute)."""
    src, sink = Source(), Sink()
    net = Bag(inner=Bag(src=src, sink=sink))
    assert src.name == "inner.src"
    assert src.y.name == "inner.src.y"
    assert sink.x.name == "inner.sink.x"
    assert net.name == ""


# --------------------------------------------------------------------------------------------
# nodes.dt


@pytest.mark.rule("nodes.dt")
@pytest.mark.parametrize("workers", [1, 3])
def test_dt_under_virtual_timer(workers: int) -> None:
    """> `dt` passed to on_update is the timer time in seconds from the start of the node's
    > previous update (or from the start of the run, for its first update) to the start of this
    > one; always > 0."""
    quarter, tenth, three = DtRecorder(0.25), DtRecorder(0.1), DtRecorder(3.0)
    net = Bag(quarter=quarter, tenth=tenth, three=three)
    with mujou.run(net, timer=vt(), workers=workers) as run:
        run.sleep(2.0)
    # Under the virtual timer each update starts exactly when it is due (k * period).
    assert quarter.dts == [0.25] * 8
    assert len(tenth.dts) == 20
    assert tenth.dts == pytest.approx([0.1] * 20)
    assert sum(tenth.dts) == pytest.approx(2.0)
    assert three.dts == []


@pytest.mark.rule("nodes.dt")
def test_dt_under_realtime_timer() -> None:
    """> `dt` ... is the timer time in seconds from the start of the node's previous update (or
    > from the start of the run) to the start of this one; always > 0."""
    node = DtRecorder(0.005)
    net = Bag(node=node)
    with mujou.run(net) as run:
        wait_until(lambda: len(node.dts) >= 5, "five updates")
        # The updates so far started before now: their dts sum to at most run.time.
        dts = list(node.dts)
        now = run.time
    assert len(dts) >= 5, dts
    assert all(dt > 0 for dt in dts), dts
    assert sum(dts) <= now + 1e-9, (sum(dts), now)


# --------------------------------------------------------------------------------------------
# ports.declare


class TwoPorts(Node):
    x = Input(optional=True)
    y = Output()


@pytest.mark.rule("ports.declare")
def test_ports_are_per_node() -> None:
    """> on an instance, `node.x` is that node's own port (a different object for each node,
    > always the same object for one node)."""
    a, b = TwoPorts(), TwoPorts()
    assert isinstance(a.x, Input)
    assert isinstance(a.y, Output)
    assert a.x is a.x
    assert a.y is a.y
    assert a.x is not b.x
    assert a.y is not b.y
    assert a.x.node is a
    assert b.y.node is b
    assert a.x.optional is True
    assert a.x.source is None


@pytest.mark.rule("ports.declare")
@pytest.mark.parametrize("attr", ["x", "y"])
def test_ports_cannot_be_reassigned(attr: str) -> None:
    """> ports cannot be reassigned (AttributeError)."""
    node, other = TwoPorts(), TwoPorts()
    port = getattr(node, attr)
    for value in (getattr(other, attr), None, torch.zeros(1), Output(), Input()):
        with pytest.raises(
            AttributeError,
            match=rf"^port '{attr}' of TwoPorts cannot be assigned; ports are declared once",
        ):
            setattr(node, attr, value)
        assert getattr(node, attr) is port


# --------------------------------------------------------------------------------------------
# ports.send-snapshot


class SnapshotSource(Node):
    """Sends self.buf, then overwrites it with garbage; also sends a grad-requiring tensor."""

    y = Output()
    g = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.n = 0
        self.buf = torch.zeros(3)
        self.weight = torch.ones(3, requires_grad=True)

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.buf.fill_(float(self.n))
        self.y.send(self.buf)
        self.buf.fill_(-1.0)
        self.g.send(self.weight * self.n)


class SnapshotReader(Node):
    x = Input()
    g = Input()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.seen: list[list[float]] = []
        self.grads: list[bool] = []

    def on_update(self, dt: float) -> None:
        x, g = self.x.read(), self.g.read()
        if x is not None and g is not None:
            self.seen.append(x.tolist())
            self.grads.append(g.requires_grad)


@pytest.mark.rule("ports.send-snapshot")
def test_send_stores_a_snapshot() -> None:
    """> `Output.send(tensor)` stores a snapshot (a detached copy): changing the tensor after
    > send does not change the message."""
    src, reader = SnapshotSource(), SnapshotReader()
    net = Bag(src=src, reader=reader)
    net.connect(src.y, reader.x)
    net.connect(src.g, reader.g)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        host = run.read(src.y)
        grad_msg = run.read(src.g)
    assert host is not None
    assert host.tolist() == [4.0, 4.0, 4.0]
    assert src.buf.tolist() == [-1.0, -1.0, -1.0]
    # The reader at t = 0.5, 0.75, 1.0 saw the messages sent at 0.25, 0.5, 0.75.
    assert reader.seen == [[1.0] * 3, [2.0] * 3, [3.0] * 3]
    assert reader.grads == [False, False, False]
    assert grad_msg is not None
    assert grad_msg.requires_grad is False
    assert grad_msg.grad_fn is None


# --------------------------------------------------------------------------------------------
# ports.send-type


class Opaque:
    """An object that is neither a tensor, a scalar nor a container of messages."""


class BadSender(Node):
    y = Output()

    BAD: tuple[tuple[object, str], ...] = (
        (1.0, r"a float: a message is not a bare scalar; send a tensor \(torch\.tensor\(x\)\)"),
        (None, r"a NoneType: a message is not a bare scalar; send a tensor \(torch\.tensor\(x\)\)"),
        ("tensor", r"a str: a message is not a bare scalar; send a tensor \(torch\.tensor\(x\)\)"),
        (Opaque(), r"a test_nodes_and_ports\.Opaque at the top"),
        ({"a": [torch.zeros(1), Opaque()]}, r"a test_nodes_and_ports\.Opaque at \['a'\]\[1\]"),
        ({1: torch.zeros(1)}, r"the dict key 1 at the top \(dict keys are str\)"),
    )

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.errors: list[tuple[str, BaseException | None]] = []

    def on_update(self, dt: float) -> None:
        for value, pattern in self.BAD:
            try:
                self.y.send(value)  # type: ignore[arg-type]  # the wrong type on purpose
            except TypeError as exc:
                self.errors.append((pattern, exc))
            else:
                self.errors.append((pattern, None))
        self.y.send(torch.zeros(1))


@pytest.mark.rule("ports.send-type")
def test_send_accepts_only_messages() -> None:
    """> `send` accepts a message only; anything else raises TypeError naming the port, what it
    > received and where in the nest."""
    node = BadSender()
    net = Bag(sender=node)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
        assert run.read(node.y) is not None
    assert len(node.errors) == len(BadSender.BAD)
    for pattern, exc in node.errors:
        assert exc is not None, f"send() accepted what {pattern!r} describes"
        full = (
            r"^port 'sender\.y' sends a tensor, or a nest \(.*\) of tensors and bool, int, float, "
            rf"str or None; got {pattern}$"
        )
        assert re.search(full, str(exc)), str(exc)


# --------------------------------------------------------------------------------------------
# ports.read-latest


@pytest.mark.rule("ports.read-latest")
def test_read_returns_latest_visible_message() -> None:
    """> `Input.read()` returns the latest visible message of the port's source (sample and
    > hold: the same message until a newer one is visible), or None when no message is visible
    > yet."""
    src, sink = Source(period=1.0), Sink(period=0.25)
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(3.0)
    # src sends k at t = k; a message sent at t is visible to updates due after t.
    expected: list[float | None] = [None] * 4 + [1.0] * 4 + [2.0] * 4
    assert sink.seen == expected


class DoubleReader(Node):
    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)
        self.same: list[bool] = []

    def on_update(self, dt: float) -> None:
        first, second = self.x.read(), self.x.read()
        self.same.append(
            (first is None and second is None)
            or (first is not None and second is not None and torch.equal(first, second))
        )


@pytest.mark.rule("ports.read-latest")
def test_read_holds_within_a_hook() -> None:
    """> sample and hold: the same message until a newer one is visible."""
    src, reader = Source(period=0.05), DoubleReader()
    net = Bag(src=src, reader=reader)
    net.connect(src.y, reader.x)
    with mujou.run(net, timer=vt(), workers=2) as run:
        run.sleep(2.0)
    assert len(reader.same) == 20
    assert all(reader.same)


# --------------------------------------------------------------------------------------------
# ports.read-device


@pytest.mark.rule("ports.read-device")
def test_read_on_cpu_node() -> None:
    """> `read()` returns the message on the reading node's device."""
    src, sink = Source(), Sink()
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
    assert sink.devices
    assert all(d == sink.device == torch.device("cpu") for d in sink.devices)


class CudaSource(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0, device="cuda")

    def on_update(self, dt: float) -> None:
        self.y.send(torch.ones(1, device=self.device))


class CudaSink(Sink):
    def __init__(self) -> None:
        Node.__init__(self, period=0.25, seed=0, device="cuda")
        self.seen = []
        self.devices = []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.rule("ports.read-device")
def test_read_device_with_cuda() -> None:
    """> `read()` returns the message on the reading node's device."""
    cpu_src, cuda_src = Source(), CudaSource()
    cpu_from_cuda, cuda_from_cpu, cuda_from_cuda = Sink(), CudaSink(), CudaSink()
    net = Bag(a=cpu_src, b=cuda_src, c=cpu_from_cuda, d=cuda_from_cpu, e=cuda_from_cuda)
    net.connect(cuda_src.y, cpu_from_cuda.x)
    net.connect(cpu_src.y, cuda_from_cpu.x)
    net.connect(cuda_src.y, cuda_from_cuda.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
    assert cpu_from_cuda.devices and cuda_from_cpu.devices and cuda_from_cuda.devices
    assert all(d.type == "cpu" for d in cpu_from_cuda.devices)
    assert all(d == cuda_from_cpu.device for d in cuda_from_cpu.devices)
    assert all(d == cuda_from_cuda.device for d in cuda_from_cuda.devices)


# --------------------------------------------------------------------------------------------
# ports.send-no-copy


class HandOver(Node):
    """Sends a new tensor each update with copy=False, and remembers what it sent.

    ``change`` > 0: changes the tensor it sent in place afterwards, from update ``change`` on.
    """

    y = Output()

    def __init__(self, *, change: int = 0, copy: object = False) -> None:
        super().__init__(period=0.25, seed=0)
        self.change = change
        self.copy = copy
        self.sent: list[torch.Tensor] = []
        self.weight = torch.ones(2, requires_grad=True)

    def on_update(self, dt: float) -> None:
        value = self.weight * float(len(self.sent) + 1)  # requires grad
        self.y.send(value, copy=self.copy)  # type: ignore[arg-type]  # a bad copy is tested
        self.sent.append(value)
        if self.change and len(self.sent) >= self.change:
            with torch.no_grad():
                value.add_(100.0)


class Taker(Node):
    """Records the messages it read."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.got: list[torch.Tensor] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.got.append(x)


def _hand_over_net(src: HandOver, taker: Taker) -> Bag:
    net = Bag(src=src, taker=taker)
    net.connect(src.y, taker.x)
    return net


@pytest.mark.rule("ports.send-no-copy")
def test_send_without_copy_hands_the_tensor_itself_over() -> None:
    """> `send(tensor, copy=False)` makes the tensor itself (detached) the message wherever no
    > copy is needed, as `Tensor.to(copy=False)` does: on the CPU, ..."""
    src, taker = HandOver(), Taker()
    with mujou.run(_hand_over_net(src, taker), timer=vt()) as run:
        run.sleep(1.0)
    # The taker at t = 0.5, 0.75, 1.0 read what was sent at 0.25, 0.5, 0.75.
    assert [x.tolist() for x in taker.got] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    for got, sent in zip(taker.got, src.sent, strict=False):
        assert got.requires_grad is False  # detached ...
        assert got.untyped_storage().data_ptr() == sent.untyped_storage().data_ptr()  # ... not copied
    # The default still copies.
    src, taker = HandOver(copy=True), Taker()
    with mujou.run(_hand_over_net(src, taker), timer=vt()) as run:
        run.sleep(0.5)
    assert taker.got[0].untyped_storage().data_ptr() != src.sent[0].untyped_storage().data_ptr()


@pytest.mark.rule("ports.send-no-copy")
@pytest.mark.parametrize("timer", ["virtual", "real-time"])
def test_changing_a_tensor_sent_without_copy_fails_the_next_read(timer: str) -> None:
    """> The node hands the tensor over and must not change it afterwards; a change in place
    > fails the next read of the port, also when it comes before the message is visible."""
    src, taker = HandOver(change=2), Taker()
    clock = vt() if timer == "virtual" else mujou.RealTimeTimer(scale=50.0)
    net = _hand_over_net(src, taker)
    with pytest.raises(mujou.HookError) as info, mujou.run(net, timer=clock, workers=1) as run:
        run.sleep(HANG_GUARD if timer == "virtual" else 50.0 * HANG_GUARD)
    err = info.value
    assert err.node == "taker"
    assert isinstance(err.__cause__, RuntimeError)
    message = str(err.__cause__)
    assert message.startswith("the latest message on 'src.y' was changed in place after it was sent")
    assert "send(copy=False)" in message
    assert [x.tolist() for x in taker.got] == [[1.0, 1.0]]  # the first, never changed


@pytest.mark.rule("ports.send-no-copy")
def test_copy_must_be_a_bool() -> None:
    """> A `copy` that is not a bool raises `TypeError`."""
    src, taker = HandOver(copy=0), Taker()
    with pytest.raises(mujou.HookError) as info, mujou.run(_hand_over_net(src, taker), timer=vt()) as run:
        run.sleep(1.0)
    assert isinstance(info.value.__cause__, TypeError)
    assert str(info.value.__cause__) == "copy must be a bool, got int: 0"
    assert src.sent == []


# --------------------------------------------------------------------------------------------
# ports.message-read-only


class InPlaceReader(Node):
    x = Input()

    def __init__(self, *, clone: bool) -> None:
        super().__init__(period=0.25, seed=0)
        self.clone = clone
        self.changed = 0

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            if self.clone:
                x = x.clone()
            x.add_(1.0)
            self.changed += 1


@pytest.mark.rule("ports.message-read-only")
def test_changing_a_read_message_in_place_fails() -> None:
    """> A received message is shared with the other readers and must not be changed in place;
    > a hook that changes a message it read in place fails (RuntimeError naming the node and the
    > port, raised as the hook's error)."""
    src, bad, other = Source(), InPlaceReader(clone=False), Sink()
    net = Bag(src=src, bad=bad, other=other)
    net.connect(src.y, bad.x)
    net.connect(src.y, other.x)
    with pytest.raises(mujou.HookError) as info, mujou.run(net, timer=vt()) as run:
        run.sleep(5.0)
    err = info.value
    assert err.node == "bad"
    assert err.hook == "on_update"
    assert err.time == 0.5  # the first update that read a message
    cause = err.__cause__
    assert isinstance(cause, RuntimeError), repr(cause)
    assert re.search(
        r"^node 'bad' changed in place, in on_update, a message it read from 'bad\.x'; messages "
        r"are shared with the other readers and read-only: clone it first \(message\.clone\(\)\)$",
        str(cause),
    ), str(cause)
    assert str(err).startswith("node 'bad' raised RuntimeError in on_update at t=0.500: "), str(err)
    # The other reader never saw a changed message (the run stopped at t=0.5).
    assert set(other.seen) <= {None, 1.0}, other.seen


@pytest.mark.rule("ports.message-read-only")
def test_changing_a_clone_is_fine() -> None:
    """> A received message ... must not be changed in place (a copy may be)."""
    src, reader = Source(), InPlaceReader(clone=True)
    net = Bag(src=src, reader=reader)
    net.connect(src.y, reader.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(2.0)
        assert run.read(src.y) == torch.tensor([8.0])
    assert reader.changed == 7


# --------------------------------------------------------------------------------------------
# ports.only-in-own-hooks

_OUTSIDE = (
    r"^port '[\w.]+': (send|read)\(\) was called outside the hooks of node '[\w.]*'; a port is "
    r"used only from its node's hooks, and the host uses run\.read\(\) and run\.write\(\)$"
)


class Meddler(Node):
    """Uses another node's ports, and its own from a thread of its own making."""

    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.victim: TwoPorts | None = None
        self.errors: dict[str, BaseException | None] = {}

    def _try(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except RuntimeError as exc:
            self.errors[what] = exc
        else:
            self.errors[what] = None

    def on_update(self, dt: float) -> None:
        victim = self.victim
        assert victim is not None
        self._try("other.send", lambda: victim.y.send(torch.zeros(1)))
        self._try("other.read", victim.x.read)
        thread = threading.Thread(
            target=self._try, args=("own.send.thread", lambda: self.y.send(torch.zeros(1)))
        )
        thread.start()
        thread.join(HANG_GUARD)
        self.y.send(torch.ones(1))  # its own port from its own hook works


@pytest.mark.rule("ports.only-in-own-hooks")
def test_ports_outside_own_hooks_raise() -> None:
    """> `send` and `read` may be called only from the hooks of the port's own node (on the
    > thread running that hook); elsewhere they raise RuntimeError saying to use run.read /
    > run.write from the host."""
    meddler, victim = Meddler(), TwoPorts()
    meddler.victim = victim
    net = Bag(meddler=meddler, victim=victim)
    # From the host, before the run:
    with pytest.raises(RuntimeError, match=_OUTSIDE):
        victim.y.send(torch.zeros(1))
    with pytest.raises(RuntimeError, match=_OUTSIDE):
        victim.x.read()
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
        # From the host, during the run:
        with pytest.raises(RuntimeError, match=_OUTSIDE):
            victim.y.send(torch.zeros(1))
        with pytest.raises(RuntimeError, match=_OUTSIDE):
            victim.x.read()
        assert run.read(meddler.y) == torch.ones(1)
    # From the host, after the run:
    with pytest.raises(RuntimeError, match=_OUTSIDE):
        meddler.y.send(torch.zeros(1))
    assert set(meddler.errors) == {"other.send", "other.read", "own.send.thread"}
    for what, exc in meddler.errors.items():
        assert exc is not None, f"{what} did not raise"
        assert re.search(_OUTSIDE, str(exc)), (what, str(exc))


# --------------------------------------------------------------------------------------------
# ports.input-optional


@pytest.mark.rule("ports.input-optional")
def test_optional_input() -> None:
    """> `Input(optional=True)` declares an input that may have no source and no host message;
    > read() then returns None until the host writes it."""
    sink = OptionalSink()
    assert sink.x.optional is True
    assert Sink().x.optional is False
    net = Bag(sink=sink)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        assert sink.seen == [None] * 4
        run.write(sink.x, torch.tensor([7.0]))
        run.sleep(1.0)
    assert sink.seen == [None] * 4 + [7.0] * 4


# --------------------------------------------------------------------------------------------
# net.register


@pytest.mark.rule("net.register")
def test_registration_order_and_nesting() -> None:
    """> Assigning a Node or a Net to an attribute of a Net registers it under that attribute
    > name, in assignment order (the registration order); sub-nets nest."""
    a, b, c, d = Plain(), Plain(), Plain(), Plain()
    inner = Bag(c=c)
    net = Bag(b=b)
    net.inner = inner
    net.a = a
    inner.d = d  # a sub-net may grow after it was registered
    net.number = 3  # other attributes are ordinary attributes
    assert list(net.nodes()) == [b, c, d, a]
    assert list(inner.nodes()) == [c, d]
    assert [n.name for n in net.nodes()] == ["b", "inner.c", "inner.d", "a"]
    assert getattr(net, "inner") is inner  # noqa: B009 - Net declares no such attribute
    assert getattr(net, "number") == 3  # noqa: B009 - Net declares no such attribute
    assert inner.name == "inner"


# --------------------------------------------------------------------------------------------
# net.init-required


class NetForgetsSuper(Net):
    def __init__(self) -> None:
        self.a = Plain()


@pytest.mark.rule("net.init-required")
def test_net_without_super_init() -> None:
    """> Assigning a node to a Net whose `__init__` did not call `super().__init__()` raises
    > TypeError naming the class and the fix."""
    with pytest.raises(
        TypeError,
        match=r"^NetForgetsSuper was not initialized as a mujou\.Net: call super\(\)\.__init__\(\) "
        r"at the start of NetForgetsSuper\.__init__",
    ):
        NetForgetsSuper()


# --------------------------------------------------------------------------------------------
# net.one-parent


@pytest.mark.rule("net.one-parent")
def test_node_in_two_nets() -> None:
    """> A node or sub-net is registered in at most one net, once; registering it again (same
    > or another net, another attribute) raises ValueError naming both places."""
    node = Plain()
    first = Bag(inner=Bag(first_home=node))
    second = Bag()
    with pytest.raises(
        ValueError,
        match=r"^Plain is already registered as 'inner\.first_home'; it cannot also be "
        r"'second_home': a node or net belongs to one net, once$",
    ):
        second.second_home = node
    assert node.name == "inner.first_home"
    assert list(second.nodes()) == []
    with pytest.raises(
        ValueError,
        match=r"^Plain is already registered as 'inner\.first_home'; it cannot also be "
        r"'other_attr'",
    ):
        first.other_attr = node
    assert list(first.nodes()) == [node]


@pytest.mark.rule("net.one-parent")
def test_subnet_in_two_nets() -> None:
    """> A node or sub-net is registered in at most one net, once."""
    sub = Bag(n=Plain())
    Bag(first_home=sub)
    other = Bag()
    with pytest.raises(
        ValueError,
        match=r"^Bag is already registered as 'first_home'; it cannot also be 'second_home'",
    ):
        other.second_home = sub
    assert list(other.nodes()) == []
    assert sub.name == "first_home"


# --------------------------------------------------------------------------------------------
# net.connect


@pytest.mark.rule("net.connect")
def test_connect_fans_out() -> None:
    """> `net.connect(output, input)` connects an Output to an Input of nodes; an output may
    > feed any number of inputs."""
    src, s1, s2, s3 = Source(), Sink(), Sink(), Sink()
    net = Bag(src=src, s1=s1, s2=s2, s3=s3)
    for sink in (s1, s2, s3):
        net.connect(src.y, sink.x)
        assert sink.x.source is src.y
    with mujou.run(net, timer=vt(), workers=2) as run:
        run.sleep(1.0)
    for sink in (s1, s2, s3):
        assert sink.seen == [None, 1.0, 2.0, 3.0]


@pytest.mark.rule("net.connect")
def test_connect_rejects_wrong_kinds() -> None:
    """> arguments of the wrong kind (swapped, class attributes instead of a node's ports,
    > non-ports) raise TypeError."""
    src, sink = Source(), Sink()
    net = Bag(src=src, sink=sink)
    first = r"^connect\(output, input\) takes an Output first, got "
    second = r"^connect\(output, input\) takes an Input second, got "
    unbound = r" is the class attribute; connect the ports of node instances \(node\.port\)$"
    wrong: list[tuple[object, object, str]] = [
        (sink.x, src.y, first + r"Input 'sink\.x' \(the arguments are swapped\)$"),
        (Source.y, sink.x, r"^Output 'y'" + unbound),  # a class attribute
        (src.y, Sink.x, r"^Input 'x'" + unbound),
        (Source.y, Sink.x, r"^Output 'y'" + unbound),
        (src.y, src.y, second + r"Output 'src\.y'$"),  # output to output
        (sink.x, sink.x, first + r"Input 'sink\.x'"),  # input to input
        (torch.zeros(1), sink.x, first + r"Tensor: tensor\(\[0\.\]\)$"),
        (src.y, None, second + r"NoneType: None$"),
        (src, sink, first + r"Source: "),  # nodes, not ports
        ("src.y", "sink.x", first + r"str: 'src\.y'$"),
    ]
    for output, input_, message in wrong:
        with pytest.raises(TypeError, match=message):
            net.connect(output, input_)  # type: ignore[arg-type]  # the wrong kinds on purpose
    assert sink.x.source is None


# --------------------------------------------------------------------------------------------
# net.one-source


@pytest.mark.rule("net.one-source")
def test_input_has_one_source() -> None:
    """> An input has at most one source: connecting a second output to it raises ValueError
    > naming the input and its current source."""
    first, second, sink = Source(), Source(), Sink()
    net = Bag(first=first, second=second, sink=sink)
    net.connect(first.y, sink.x)
    with pytest.raises(
        ValueError,
        match=r"^input 'sink\.x' already has the source 'first\.y'; an input has at most one "
        r"source$",
    ):
        net.connect(second.y, sink.x)
    assert sink.x.source is first.y


# --------------------------------------------------------------------------------------------
# net.validate


@pytest.mark.rule("net.validate")
def test_run_rejects_an_empty_net() -> None:
    """> `mujou.run` rejects, with ValueError ...: a net with no node."""
    with pytest.raises(ValueError, match=r"^the net Bag has no node; assign nodes to it first$"):
        mujou.run(Bag(), timer=vt())
    with pytest.raises(ValueError, match=r"^the net Bag has no node; assign nodes to it first$"):
        mujou.run(Bag(empty=Bag()), timer=vt())


@pytest.mark.rule("net.validate")
def test_run_rejects_a_connection_outside_the_net() -> None:
    """> `mujou.run` rejects, with ValueError naming the offending port or node: ... a
    > connection whose node is not in the net."""
    src, sink = Source(), Sink()
    outsider = Sink()
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    net.connect(src.y, outsider.x)
    with pytest.raises(
        ValueError,
        match=r"^output 'src\.y' is connected to input Sink\.x \(in no net\), "
        r"whose node is not in this net$",
    ):
        mujou.run(net, timer=vt())
    # The same net without the outsider's connection runs; run a fresh one to be sure.
    src2, sink2, far = Source(), Sink(), Source()
    net2 = Bag(src=src2, sink=sink2)
    net2.connect(far.y, sink2.x)
    with pytest.raises(
        ValueError,
        match=r"^input 'sink\.x' is connected to output Source\.y \(in no net\), "
        r"whose node is not in this net$",
    ):
        mujou.run(net2, timer=vt())


@pytest.mark.rule("net.validate")
def test_run_rejects_an_unfed_input() -> None:
    """> `mujou.run` rejects ...: an input with no source that is neither optional nor given a
    > first message in `inputs=`."""
    sink, other = Sink(), OptionalSink()
    net = Bag(inner=Bag(sink=sink), other=other)
    with pytest.raises(
        ValueError,
        match=r"^input 'inner\.sink\.x' has no source: connect it with net\.connect\(output, "
        r"input\), give it a first message with mujou\.run\(\.\.\., inputs=\{port: tensor\}\), "
        r"or declare it Input\(optional=True\)$",
    ):
        mujou.run(net, timer=vt())
    with mujou.run(net, timer=vt(), inputs={sink.x: torch.tensor([5.0])}) as run:
        run.sleep(0.5)
    assert sink.seen == [5.0, 5.0]
    assert other.seen == [None, None]


class Keeper(Node):
    """Keeps the message it read, and changes it in place in a later update."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=1.0)
        self.kept: torch.Tensor | None = None

    def on_update(self, dt: float) -> None:
        if self.kept is None:
            self.kept = self.x.read()
        else:
            self.kept.add_(1.0)


class SlowSource(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=10.0)

    def on_start(self) -> None:
        self.y.send(torch.zeros(3))


@pytest.mark.rule("ports.message-read-only")
def test_a_message_changed_after_its_read_fails_the_next_read() -> None:
    """> A message changed in place later (kept from an earlier read, or a view of it) fails the
    > next read of that port, by a node or the host."""
    src, keeper = SlowSource(), Keeper()
    net = Bag(src=src, keeper=keeper)
    net.connect(src.y, keeper.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(2.0)  # read at t=1, changed at t=2: the hook itself read nothing then
        with pytest.raises(RuntimeError, match=r"^the latest message on 'src\.y' was changed in place"):
            run.read(src.y)


# --- gaps found by mutation testing ---------------------------------------------------------


class SendsTwice(Node):
    """Sends 2k - 1 and then 2k on ``y`` in its k-th update (all updates, or only the first)."""

    y = Output()

    def __init__(self, *, every_update: bool) -> None:
        super().__init__(period=0.25, seed=0)
        self.every_update = every_update
        self.k = 0
        self.sent = threading.Event()  # set after the second send of the first update

    def on_update(self, dt: float) -> None:
        if self.k and not self.every_update:
            return
        self.k += 1
        self.y.send(torch.tensor([2.0 * self.k - 1]))
        self.y.send(torch.tensor([2.0 * self.k]))
        self.sent.set()


@pytest.mark.rule("ports.read-latest", "visibility.virtual")
def test_the_last_of_two_sends_in_an_update_is_the_latest_virtual() -> None:
    """> `Input.read()` returns the latest visible message of the port's source: of two messages
    > sent in one update, the second, for the readers of the next updates and for the host."""
    src, sink = SendsTwice(every_update=True), FirstValueReader(0.25)
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    with mujou.run(net, timer=vt(), workers=1) as run:
        run.sleep(1.0)
        assert run.read(src.y).tolist() == [8.0]  # type: ignore[union-attr]
        assert run.read(sink.x).tolist() == [8.0]  # type: ignore[union-attr]
    assert sink.seen == [None, 2.0, 4.0, 6.0]


@pytest.mark.rule("ports.read-latest", "visibility.realtime")
def test_the_last_of_two_sends_in_an_update_is_the_latest_real_time() -> None:
    """> `Input.read()` returns the latest visible message of the port's source (sample and hold):
    > once the second of two sends returned, every read sees it until a newer one.

    The source sends only in its first update. The reader's update that records after the one
    in progress when the sends were done started after them."""
    src, sink = SendsTwice(every_update=False), FirstValueReader(0.002)
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    with mujou.run(net, workers=2) as run:
        assert src.sent.wait(HANG_GUARD), "hang guard: the source's first update"
        assert run.read(src.y).tolist() == [2.0]  # type: ignore[union-attr]
        n = len(sink.seen)
        wait_until(lambda: len(sink.seen) > n + 1, "two more updates of the reader")
        assert sink.seen[n + 1] == 2.0, sink.seen
        assert run.read(sink.x).tolist() == [2.0]  # type: ignore[union-attr]
