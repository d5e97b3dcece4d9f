"""Conformance tests for structured messages: ``ports.message``, ``ports.message-leaf-by-leaf``
and ``state.port-messages`` (spec/en/nodes-and-ports.md, spec/en/state.md).

Every test runs under the virtual timer; the CUDA ones skip where no GPU is.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from _support import Bag, vt

import mujou
from mujou import Input, Node, Output


class Pose(NamedTuple):
    position: torch.Tensor
    confidence: float


@dataclasses.dataclass
class Detections:
    boxes: torch.Tensor
    scores: torch.Tensor
    frame: int
    label: str = "car"


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: torch.Tensor


class Renamed(NamedTuple):
    """A NamedTuple with other fields than Pose's."""

    x: torch.Tensor
    y: float


INITS = [0]  # how many times Counted.__init__ / __post_init__ ran


@dataclasses.dataclass
class Counted:
    value: torch.Tensor

    def __post_init__(self) -> None:
        INITS[0] += 1


def nest_of(step: int) -> dict[str, Any]:
    """A message with every kind of container and leaf, its tensors holding ``step``."""
    t = torch.full((2,), float(step))
    return {
        "pose": Pose(t + 1, 0.5),
        "detections": Detections(t.reshape(1, 2), t[:1], step),
        "frozen": Frozen(t * 2),
        "items": [t - 1, None, "tag", True, (step, 2.5)],
    }


class NestSource(Node):
    """Sends nest_of(count) at each update."""

    y: Output[dict[str, Any]] = Output()

    def __init__(self, period: float = 0.25) -> None:
        super().__init__(period=period, seed=0)
        self.count = torch.zeros((), dtype=torch.int64)  # a tensor: part of the node's state

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.y.send(nest_of(int(self.count)))


class NestReader(Node):
    """Reads x at each update and keeps what it read."""

    x: Input[Any] = Input()

    def __init__(self, period: float = 0.25) -> None:
        super().__init__(period=period, seed=0)
        self.seen: list[Any] = []

    def on_update(self, dt: float) -> None:
        self.seen.append(self.x.read())


def same(a: Any, b: Any) -> bool:
    """Whether two messages are equal: same containers (types, keys, order), equal leaves."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


# --------------------------------------------------------------------------------------------
# ports.message


@pytest.mark.rule("ports.message")
def test_nests_of_every_kind_travel_whole() -> None:
    """> A message is a torch.Tensor or a nest: a dict with str keys, a list, a tuple, a
    > NamedTuple or a dataclass instance, nested to any depth, whose leaves are tensors and the
    > scalars bool, int, float, str and None."""
    src, reader = NestSource(), NestReader()
    net = Bag(src=src, reader=reader)
    net.connect(src.y, reader.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        host = run.read(src.y)
    assert reader.seen[0] is None
    for step, message in enumerate(reader.seen[1:], start=1):
        assert same(message, nest_of(step)), (step, message)
    assert same(host, nest_of(4)), host


class RefusingSender(Node):
    y: Output[Any] = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.errors: list[str] = []

    def on_update(self, dt: float) -> None:
        refused: list[object] = [
            collections.OrderedDict(a=torch.zeros(1)),
            collections.defaultdict(lambda: torch.zeros(1), a=torch.zeros(1)),
            {"a": {1, 2}},
            [torch.zeros(1), Detections],  # a class, not an instance
        ]
        for value in refused:
            try:
                self.y.send(value)
            except TypeError as exc:
                self.errors.append(str(exc))
            else:
                self.errors.append("")


@pytest.mark.rule("ports.message")
def test_other_containers_are_refused() -> None:
    """> any other container (an OrderedDict, a subclass of dict, an object that is not a
    > dataclass) is refused."""
    node = RefusingSender()
    with mujou.run(Bag(sender=node), timer=vt()) as run:
        run.sleep(0.25)
    expected = [
        r"an OrderedDict container at the top",
        r"a defaultdict container at the top",
        r"a set at \['a'\]",
        r"a type at \[1\]",
    ]
    assert len(node.errors) == len(expected)
    for pattern, error in zip(expected, node.errors, strict=True):
        assert re.search(rf"^port 'sender\.y' sends .*; got {pattern}", error), error


# --------------------------------------------------------------------------------------------
# ports.message-leaf-by-leaf


class ChangingSender(Node):
    """Sends a nest of its buffers, then changes the buffers and the containers in place."""

    y: Output[dict[str, Any]] = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.buffer = torch.zeros(3)
        self.items: list[Any] = [self.buffer]
        self.message = {"buffer": self.buffer, "items": self.items}

    def on_update(self, dt: float) -> None:
        self.buffer.add_(1.0)
        self.y.send(self.message)
        self.buffer.mul_(100.0)  # the sender's tensor, changed after the send
        self.items.append("more")  # and its containers
        self.message["extra"] = 1


@pytest.mark.rule("ports.message-leaf-by-leaf", "ports.send-snapshot")
def test_send_snapshots_each_tensor_and_the_containers() -> None:
    """> send snapshots each ... The containers of a message are made by send: later changes to
    > the sender's containers do not change it."""
    node = ChangingSender()
    with mujou.run(Bag(sender=node), timer=vt()) as run:
        run.sleep(0.25)
        message = run.read(node.y)
    assert same(message, {"buffer": torch.ones(3), "items": [torch.ones(3)]}), message


class HandingSender(Node):
    """Sends a nest with copy=False, then (when told) changes the tensor it handed over."""

    y: Output[dict[str, Any]] = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.kept = torch.zeros(2)
        self.change = False

    def on_update(self, dt: float) -> None:
        if self.change:
            self.kept.add_(1.0)
            return
        self.y.send({"kept": self.kept, "n": 1}, copy=False)


@pytest.mark.rule("ports.message-leaf-by-leaf", "ports.send-no-copy")
def test_copy_false_hands_each_cpu_tensor_over() -> None:
    """> send snapshots each (ports.send-no-copy): with copy=False the tensor itself is the
    > message on the CPU, and a change in place fails the next read of the port."""
    node = HandingSender()
    with mujou.run(Bag(sender=node), timer=vt()) as run:
        run.sleep(0.25)
        first = run.read(node.y)
        assert first is not None and torch.equal(first["kept"], torch.zeros(2))
        node.change = True
        run.sleep(0.25)
        with pytest.raises(RuntimeError, match=r"^the latest message on 'sender\.y' was changed in place"):
            run.read(node.y)


class TensorChanger(Node):
    x: Input[dict[str, Any]] = Input()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None:
            message["pose"].position.add_(1.0)


@pytest.mark.rule("ports.message-leaf-by-leaf", "ports.message-read-only")
def test_a_hook_that_changes_a_tensor_of_a_nest_fails() -> None:
    """> each is read-only (ports.message-read-only): a hook that changes a message it read in
    > place fails, naming the node and the port."""
    src, bad = NestSource(), TensorChanger()
    net = Bag(src=src, bad=bad)
    net.connect(src.y, bad.x)
    with pytest.raises(mujou.HookError) as info, mujou.run(net, timer=vt()) as run:
        run.sleep(2.0)
    assert info.value.node == "bad"
    assert re.search(
        r"^node 'bad' changed in place, in on_update, a message it read from 'bad\.x'",
        str(info.value.__cause__),
    )


class ContainerChanger(Node):
    x: Input[dict[str, Any]] = Input()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.changes: list[str] = []

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None and not self.changes:
            self.changes.append("done")
            message["items"].append("mine")  # a container of the shared message


class Rare(NestSource):
    """Sends once, at its first update."""

    def on_update(self, dt: float) -> None:
        if int(self.count) == 0:
            super().on_update(dt)


@pytest.mark.rule("ports.message-leaf-by-leaf")
def test_a_container_changed_after_the_send_fails_the_next_read() -> None:
    """> Its readers share them: a container changed after the send (an item replaced, added or
    > removed) fails the next read of the port, by a node or the host."""
    src, changer = Rare(period=0.25), ContainerChanger()
    net = Bag(src=src, changer=changer)
    net.connect(src.y, changer.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.5)  # sent at 0.25, read and changed at 0.5
        assert changer.changes == ["done"]
        with pytest.raises(RuntimeError, match=r"^the latest message on 'src\.y' was changed in place"):
            run.read(src.y)


@pytest.mark.rule("ports.message-leaf-by-leaf", "run.read", "run.subscribe", "run.wait-for")
def test_the_host_gets_cpu_copies_it_owns() -> None:
    """> the host gets each as a CPU copy (run.read, run.subscribe, run.wait_for)."""
    src, reader = NestSource(), NestReader()
    net = Bag(src=src, reader=reader)
    net.connect(src.y, reader.x)
    with mujou.run(net, timer=vt()) as run, run.subscribe(src.y) as every:
        run.sleep(0.5)
        waited = run.wait_for(src.y, lambda m: bool(m["detections"].frame == 3), timeout=1.0)
        read = run.read(src.y)  # the message of 0.75, which the reader reads at 1.0
        got = every.drain()
        assert read is not None
        read["pose"].position.add_(100.0)  # the host's own copy: the nodes never see it
        read["items"].append("host")
        waited["frozen"].value.zero_()
        got[-1]["detections"].scores.add_(1.0)  # the message of 0.75 too, as drained
        run.sleep(0.5)
    assert same(waited, {**nest_of(3), "frozen": Frozen(torch.zeros(2))})
    assert [m["detections"].frame for m in got] == [1, 2, 3]
    assert all(same(m, nest_of(i + 1)) for i, m in enumerate(got[:2])), "the last one: changed above"
    for message in reader.seen[3:]:
        assert message["items"][-1] == (message["detections"].frame, 2.5)
    assert same(reader.seen[3], nest_of(3))


class CountedSender(Node):
    y: Output[dict[str, Counted]] = Output()

    def on_update(self, dt: float) -> None:
        self.y.send({"counted": Counted(torch.zeros(1))})


@pytest.mark.rule("ports.message-leaf-by-leaf")
def test_a_dataclass_is_copied_without_its_init() -> None:
    """> A dataclass in a message is a copy made as copy.copy makes one: its fields set, without
    > calling __init__."""
    src, reader = CountedSender(period=0.25), NestReader()
    net = Bag(src=src, reader=reader)
    net.connect(src.y, reader.x)
    with mujou.run(net, timer=vt()) as run:
        INITS[0] = 0
        run.sleep(1.0)
        message = run.read(src.y)
        assert INITS[0] == 4, "only the sender's own Counted(...) calls ran __post_init__"
    assert message is not None and isinstance(message["counted"], Counted)
    assert reader.seen[-1]["counted"] is not message["counted"]


class Echo(Node):
    """Sends what it reads on x, when there is something."""

    x: Input[Any] = Input(optional=True)
    y: Output[Any] = Output()

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None:
            self.y.send(message)


@pytest.mark.rule("ports.message-leaf-by-leaf", "run.write")
def test_the_host_writes_nests() -> None:
    """> run.write(input, message) sets the latest message of an input (a tensor or a nest);
    > the message is a snapshot."""
    echo = Echo(period=0.25)
    with mujou.run(Bag(echo=echo), timer=vt(), inputs={echo.x: nest_of(7)}) as run:
        run.sleep(0.25)
        assert same(run.read(echo.y), nest_of(7))
        written = nest_of(8)
        run.write(echo.x, written)
        written["pose"].position.zero_()  # the host's, after the write: not the message
        written["items"].clear()
        run.sleep(0.25)
        assert same(run.read(echo.y), nest_of(8))
        with pytest.raises(
            TypeError, match=r"^run\.write\(\) takes a tensor, or a nest .*; got a set at \['a'\]$"
        ):
            run.write(echo.x, {"a": {1}})
    with pytest.raises(TypeError, match=r"^inputs\['echo\.x'\] takes a tensor, or a nest .*; got a float"):
        other = Echo()
        mujou.run(Bag(echo=other), timer=vt(), inputs={other.x: 1.0})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; CUDA is not available here")
@pytest.mark.rule("ports.message-leaf-by-leaf", "ports.read-device", "cuda.cpu-readers-get-cpu-copy")
def test_each_tensor_of_a_nest_arrives_on_the_readers_device() -> None:
    """> read returns each on the reading node's device (ports.read-device and the CUDA rules)."""

    class GpuSource(Node):
        y: Output[dict[str, Any]] = Output()

        def on_update(self, dt: float) -> None:
            self.y.send({"gpu": torch.ones(2, device=self.device), "cpu": torch.ones(2), "n": 3})

    class Reader(NestReader):
        def __init__(self, device: str) -> None:
            Node.__init__(self, period=0.25, seed=0, device=device)
            self.seen = []

    src, cpu, gpu = GpuSource(period=0.25, device="cuda"), Reader("cpu"), Reader("cuda")
    net = Bag(src=src, cpu=cpu, gpu=gpu)
    net.connect(src.y, cpu.x)
    net.connect(src.y, gpu.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
        host = run.read(src.y)
    assert host is not None and {t.device.type for t in (host["gpu"], host["cpu"])} == {"cpu"}
    for message in cpu.seen[1:]:
        assert message["gpu"].device.type == "cpu" and message["cpu"].device.type == "cpu"
    for message in gpu.seen[1:]:
        assert message["gpu"].device.type == "cuda" and message["cpu"].device.type == "cuda"
        assert message["n"] == 3


# --------------------------------------------------------------------------------------------
# state.port-messages


class Mixer(Node):
    """Reads a nest, keeps a running sum of it in a tensor, and sends a nest of its own."""

    x: Input[dict[str, Any]] = Input()
    y = Output(spec=Pose)

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=1)
        self.total = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None and self.x.fresh:
            self.total += message["pose"].position * message["pose"].confidence
        noise = torch.randn(2, generator=self.generator)
        self.y.send(Pose(self.total + noise, float(self.x.stamp or 0.0)))


class MixNet(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.src = NestSource(period=0.25)
        self.mixer = Mixer()
        self.connect(self.src.y, self.mixer.x)


@pytest.mark.rule("state.port-messages", "state.resume")
def test_nests_resume_bit_for_bit_through_a_file(tmp_path: Path) -> None:
    """> The "@mujou" entry holds each port's latest message with its stamp ...; a nest is kept
    > as its leaves and its structure in plain values, which torch.load(weights_only=True)
    > reads back."""
    net = MixNet()
    with mujou.run(net, timer=vt(), workers=2) as run:
        run.sleep(1.05)
        tree = run.state_dict()
        run.sleep(1.0)
        went_on = run.state_dict()
        went_on_message = run.read(net.mixer.y)
    path = tmp_path / "state.pt"
    mujou.save(tree, path)
    buffer = io.BytesIO(path.read_bytes())
    assert isinstance(torch.load(buffer, weights_only=True), dict)
    loaded = mujou.load(path)
    again = MixNet()
    with mujou.run(again, timer=vt(), workers=1, state=loaded) as run:
        assert same(run.read(again.src.y), nest_of(4))
        run.sleep(1.0)
        resumed = run.state_dict()
        resumed_message = run.read(again.mixer.y)
    assert torch.equal(resumed["mixer"]["total"], went_on["mixer"]["total"])
    assert same(resumed_message, went_on_message)
    assert resumed["@mujou"]["fresh"] == went_on["@mujou"]["fresh"]
    assert same(resumed["@mujou"]["ports"], went_on["@mujou"]["ports"])


@pytest.mark.rule("state.port-messages", "state.mismatch")
def test_a_message_class_that_is_not_imported_is_a_mismatch() -> None:
    """> A restore rebuilds a NamedTuple or a dataclass from the class of that name in a module
    > already imported, never importing one; a class it does not find is a problem of
    > state.mismatch."""
    net = MixNet()
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.5)
        tree = run.state_dict()
    entry = tree["@mujou"]["ports"]["mixer.y"]
    entry["structure"]["namedtuple"] = ["mujou_no_such_module", "Pose"]
    again = MixNet()
    with pytest.raises(
        ValueError,
        match=r"^Error\(s\) in loading state for net:\n\tport 'mixer\.y' holds a "
        r"mujou_no_such_module\.Pose \(namedtuple with fields \['position', 'confidence'\]\), "
        r"which no imported module has",
    ):
        mujou.run(again, timer=vt(), state=tree)
    entry["structure"]["namedtuple"] = [Pose.__module__, "Renamed"]  # there, with other fields
    with pytest.raises(ValueError, match=r"\tport 'mixer\.y' holds a .*Renamed \(namedtuple with fields"):
        mujou.run(again, timer=vt(), state=tree)
    entry["structure"] = {"tuple": "*"}
    with pytest.raises(ValueError, match=r"\tport 'mixer\.y' has the structure"):
        mujou.run(again, timer=vt(), state=tree)
