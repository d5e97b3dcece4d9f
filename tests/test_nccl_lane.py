"""Unit tests of the NCCL lane of the data plane between hosts (mujou._hosts._nccl), without a
GPU or NCCL: which channels go by NCCL (hosts.nccl-lane), the fallback through host memory
where an end cannot run NCCL (hosts.nccl-fallback), and a lane's message end to end over a fake
group (the Gloo message signed and checked first, then the tensors' bytes)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from _agents import SECRET, LocalHost, one_local_host
from _process_nodes import Sender
from _support import HANG_GUARD, Bag, hang_guard, wait_until

import mujou
from mujou import HostStats
from mujou._hosts import _nccl as nccl
from mujou._hosts import _plane_wire as wire
from mujou._hosts._plane import Channel, _LaneOutbox
from mujou._stats import NodeStats, host_stats

KEY = b"k" * 32
CUDA0, CUDA1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
CHANNELS = (Channel("cam.frame", 1, 2, 0), Channel("cam.frame", 1, 0, 1), Channel("pol.act", 0, 1, 2))


@pytest.mark.rule("hosts.nccl-lane")
def test_a_channel_goes_by_nccl_when_its_writer_and_every_reader_there_are_on_cuda() -> None:
    """> [...] when the output's node is on a CUDA device and every node that reads it on the
    reader's host is on a CUDA device [...] onto the device of the first of those readers."""
    writers = {"cam.frame": CUDA0, "pol.act": CPU}
    readers = {
        ("cam.frame", 2): [CUDA1, CUDA0],  # all on CUDA: by NCCL, onto the first one's device
        ("cam.frame", 0): [CUDA0, CPU],  # a CPU reader there: through host memory
        ("pol.act", 1): [CUDA0],  # a CPU writer: through host memory
    }
    lanes = nccl.plan_lanes(CHANNELS, writers, readers)
    assert lanes == (nccl.Lane(0, 0, 1),), lanes
    assert nccl.plan_lanes(CHANNELS, writers, {}) == ()  # no reader known there: none


def test_the_devices_of_a_placement_are_each_outputs_node_and_each_ranks_readers() -> None:
    """``devices_of``: what ``plan_lanes`` is given on the run's host, from the placement."""
    from mujou._processes._placement import check_processes

    sender, reader, other = Sender(), Reader(), Reader()
    net = Bag(sender=sender, reader=reader, other=other)
    net.connect(sender.a, reader.a)
    net.connect(sender.c, other.a)
    placement = check_processes(list(net.nodes()), {"far": sender, "there": other})
    writers, readers = nccl.devices_of(placement, {"": 0, "far": 1, "there": 2})
    assert writers == {"sender.a": CPU, "sender.c": CPU}, writers
    assert readers == {("sender.a", 0): [CPU], ("sender.c", 2): [CPU]}, readers


@pytest.mark.rule("hosts.nccl-fallback")
def test_a_lane_goes_by_nccl_only_where_both_ends_can() -> None:
    """> [...] where either end's process cannot run NCCL [...] the channel goes through host
    memory as any other."""
    lanes = (nccl.Lane(0, 0, 1), nccl.Lane(2, 0, 0))
    channels = {channel.tag: channel for channel in CHANNELS}
    both = {0: True, 1: True, 2: True}
    assert nccl.chosen(lanes, channels, 1, both) == lanes  # rank 1 ends both
    assert nccl.chosen(lanes, channels, 2, both) == (lanes[0],)  # rank 2 ends the first only
    assert nccl.chosen(lanes, channels, 1, {**both, 2: False}) == (lanes[1],)
    assert nccl.chosen(lanes, channels, 0, {**both, 0: False}) == ()
    assert nccl.chosen(lanes, channels, 1, {1: True}) == ()  # an end that said nothing cannot


class FakeStore:
    """The plane's store, as far as ``agreed`` uses it."""

    def __init__(self, **values: bytes) -> None:
        self.values = dict(values)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key]

    def add(self, key: str, amount: int) -> int:
        value = int(self.values.get(key, 0)) + amount
        self.values[key] = value  # type: ignore[assignment]  # a count, as the real store keeps it
        return value


@pytest.mark.rule("hosts.nccl-fallback")
def test_without_nccl_here_every_lane_goes_through_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's torch has no NCCL (or no GPU): it says so in the store, and no lane is
    chosen even where the other end could; where it could, the lane is chosen."""
    lanes = (nccl.Lane(0, 0, 1),)
    channels = {channel.tag: channel for channel in CHANNELS}
    store = FakeStore(**{"nccl-able/1": b"1"})
    monkeypatch.setattr(nccl, "able", lambda: False)
    assert nccl.agreed(lanes, channels, 2, store) == ()
    assert store.values["nccl-able/2"] == b"0"
    monkeypatch.setattr(nccl, "able", lambda: True)
    assert nccl.agreed(lanes, channels, 2, store) == lanes
    assert store.values["nccl-able/2"] == b"1"
    assert nccl.agreed(lanes, channels, 0, FakeStore()) == ()  # not an end: nothing said nor read


def test_able_is_false_without_nccl_or_cuda() -> None:
    from torch import distributed

    if distributed.is_available() and distributed.is_nccl_available() and torch.cuda.is_available():
        pytest.skip("NCCL and CUDA are here")
    assert nccl.able() is False


class FakeGroup:
    """A group of two over a queue per direction: a send's bytes go to the next receive."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []
        self.posted = 0

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> Any:
        self.sent.append(tensors[0].clone())
        return Done()

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> Any:
        self.posted += 1
        tensors[0].copy_(self.sent.pop(0))
        return Done()


class Done:
    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        return True


def fake_lane(group: FakeGroup) -> nccl.NcclLane:
    """A lane whose "device" is the CPU and whose group is ``group``: the lane's logic, no NCCL."""
    lane = nccl.NcclLane.__new__(nccl.NcclLane)
    lane.lane = nccl.Lane(0, 0, 0)
    lane.device = CPU
    lane.stream = None  # type: ignore[assignment]  # torch.cuda.stream(None) does nothing
    lane.group = group
    lane._closing = threading.Event()
    lane._store = FakeStore(**{"nccl-sent/1": b"0"})
    lane._key = "nccl-sent/1"
    lane.sent_count = 0
    return lane


@pytest.mark.rule("hosts.nccl-lane")
def test_a_lane_message_crosses_whole_its_header_checked_before_its_tensors_are_received() -> None:
    """The Gloo message carries the places, dtypes and shapes of the tensors that go by NCCL
    in its signed structure; the reader receives each into a tensor made from them, and the
    message is joined as sent."""
    group = FakeGroup()
    sender, reader = fake_lane(group), fake_lane(group)
    sign = wire.signer(b"k" * 32)
    tensors = [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.tensor(True),
        torch.zeros(0, 2, dtype=torch.int16),
        torch.randn(3, dtype=torch.complex64).conj(),
    ]
    rest = (("skeleton", 0, 0, 0, 0), (1, 2, 3, 4))
    gloo, on_device = sender.outgoing(("out", tensors, rest, 2.5, 9))
    assert gloo[1] == [] and len(on_device) == 4
    works = sender.send(on_device)
    assert len(works) == 3  # an empty tensor has no bytes to send
    outgoing, incoming = wire.Outgoing(sign), wire.Incoming("out", sign)
    size = outgoing.layout(gloo)
    payload = outgoing.encode(wire.ROOM).clone()
    buffer = incoming.buffer(max(size, wire.ROOM))
    buffer[: payload.numel()] = payload
    assert reader.reading(lambda: None)() is None  # a control message: nothing to receive
    whole = reader.reading(incoming.read)()
    assert whole is not None
    name, got, got_rest, stamp, number = whole
    assert (name, got_rest, stamp, number) == ("out", rest, 2.5, 9)
    assert group.posted == 3 and not group.sent
    for sent, came in zip(tensors, got, strict=True):
        assert came.dtype == sent.dtype and came.shape == sent.shape, (sent, came)
        assert torch.equal(came, sent.resolve_conj()), (sent, came)
    for work in works:
        work.wait()
    assert sender.sent_count == 1 and reader.sent_count == 0  # counted once a message, by its sender
    assert sender._store.values["nccl-sent/1"] == 1


@pytest.mark.rule("hosts.nccl-lane")
def test_a_lane_refuses_a_forged_header_before_receiving_anything() -> None:
    group = FakeGroup()
    sender = fake_lane(group)
    gloo, _ = sender.outgoing(("out", [torch.arange(4.0)], None, 0.0, 1))
    outgoing = wire.Outgoing(wire.signer(b"x" * 32))  # not the run's key
    outgoing.layout(gloo)
    payload = outgoing.encode(wire.ROOM).clone()
    incoming = wire.Incoming("out", wire.signer(b"k" * 32))
    incoming.buffer(wire.ROOM)[: payload.numel()] = payload
    with pytest.raises(ValueError, match=r"^a message on 'out' is not signed with the run's key"):
        incoming.read()
    assert group.posted == 0


def test_a_kept_message_goes_to_host_memory_where_no_lane_was_agreed() -> None:
    crossing = ("out", [torch.arange(3.0)], None, 1.0, 2)
    assert nccl.on_host(crossing) is crossing  # nothing on a GPU: the same crossing


@pytest.mark.rule("hosts.stats")
def test_host_stats_count_the_messages_each_host_received_by_nccl() -> None:
    node = cast("NodeStats", SimpleNamespace(lateness_p50=0.0, lateness_p99=0.0, lateness_max=0.0))
    where = {"cam": "10.0.0.2:29400"}
    stats = host_stats({"cam": node, "pol": node}, where, {"10.0.0.2:29400": 0.5}, {"10.0.0.2:29400": 7})
    assert stats["10.0.0.2:29400"].nccl_messages == 7, stats
    assert stats[""].nccl_messages == 0, stats
    assert HostStats("", 0.0, (), 0.0, 0.0, 0.0).nccl_messages == 0


class Reader(mujou.Node):
    """Triggered by ``a``: the values it read (every element of message ``i`` is ``i``)."""

    a = mujou.Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a"), seed=0)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        message = self.a.read()
        assert message is not None
        self.seen.append(float(message.reshape(-1)[0]))


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHost]:
    yield from one_local_host(tmp_path_factory.mktemp("agent"))


def every_channel_a_lane(channels: Sequence[Any], *_: Any) -> tuple[nccl.Lane, ...]:
    """``plan_lanes`` as if every node were on a CUDA device (they are on the CPU here)."""
    return tuple(nccl.Lane(channel.tag, 0, 0) for channel in channels)


NCCL_HERE = pytest.mark.skipif(nccl.able(), reason="NCCL can run here: the lanes would start")


@NCCL_HERE
@pytest.mark.rule("hosts.nccl-fallback")
def test_a_lane_whose_ends_cannot_run_nccl_goes_through_host_memory_end_to_end(
    host: LocalHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: the lanes chosen whatever the ends said (``chosen`` returning them all): the
    run stops as its lane cannot start. Here neither end can run NCCL (no NCCL in this torch):
    both say so in the plane's store, and the messages cross through host memory, all of them,
    with no NCCL message counted."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    monkeypatch.setattr(nccl, "plan_lanes", every_channel_a_lane)  # the run's host plans the lanes
    sender, reader = Sender(), Reader()
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.a, reader.a)
    with (
        hang_guard(HANG_GUARD),
        mujou.run(net, workers=1, processes={"far": mujou.OnHost(sender, host.address)}) as run,
    ):
        wait_until(lambda: len(reader.seen) >= 5, "the reader's updates")
        hosts = run.stats().hosts
    assert all(later > earlier for earlier, later in itertools.pairwise(reader.seen)), reader.seen
    assert [each.nccl_messages for each in hosts.values()] == [0, 0], hosts
    host.wait_no_group_process()


@NCCL_HERE
@pytest.mark.rule("hosts.nccl-lane")
def test_a_lane_that_cannot_start_stops_the_run_naming_the_output_ranks_and_devices(
    host: LocalHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's host takes its lane as agreed, but cannot make its NCCL group (this torch has
    no NCCL): the run stops, and the host's next call raises that error as it is, not as an
    internal error. Planted: the error handed to ``crashed`` (a MujouInternalError then)."""
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    monkeypatch.setattr(nccl, "plan_lanes", every_channel_a_lane)
    monkeypatch.setattr(nccl, "agreed", lambda lanes, channels, rank, store: tuple(lanes))
    sender, reader = Sender(), Reader()
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.a, reader.a)
    with (
        hang_guard(HANG_GUARD),
        pytest.raises(
            RuntimeError,
            match=r"^output 'sender\.a' cannot cross by NCCL from rank 1 \(cuda:0\) to rank 0 \(cuda:0\): ",
        ),
        mujou.run(net, workers=1, processes={"far": mujou.OnHost(sender, host.address)}) as run,
    ):
        run.wait_for(sender.a, lambda message: False, timeout=HANG_GUARD)
    assert reader.seen == []
    host.wait_no_group_process()


class OrderedGroup(FakeGroup):
    """A fake group that notes in ``log`` what it sent, under ``name``."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> Any:
        self.log.append(self.name)
        return super().send(tensors, peer, tag)


@pytest.mark.rule("hosts.nccl-lane", "hosts.nccl-fallback")
def test_a_channel_on_a_lane_sends_its_signed_gloo_message_first_then_its_tensors_by_nccl() -> None:
    """The sending side's hook (``_plane._Outbox``): on a lane, the Gloo message (no tensor
    bytes in it) goes out before the NCCL sends, and the reader makes the message whole; a
    channel planned for a lane whose ends did not both agree sends its message through Gloo as
    before. Planted: the NCCL sends posted before the Gloo message (the order fails)."""
    log: list[str] = []
    gloo, lanes = OrderedGroup("gloo", log), OrderedGroup("nccl", log)
    message = [torch.arange(6, dtype=torch.float64).reshape(2, 3), torch.tensor([1, 2], dtype=torch.int8)]
    rest = (("skeleton", 0, 0), (0, 2))
    outbox = _LaneOutbox(Channel("out", 0, 1, 3), KEY)
    outbox.lane = fake_lane(lanes)
    outbox.connected(gloo)
    outbox.put(("out", message, rest, 0.5, 4))
    assert log == ["gloo", "nccl", "nccl"], log
    (payload,) = gloo.sent
    incoming = wire.Incoming("out", wire.signer(KEY))
    incoming.buffer(wire.ROOM)[: payload.numel()] = payload
    read = incoming.read()
    assert read is not None and read[1] == [], read  # no tensor's bytes in the Gloo message
    _, tensors, got_rest, stamp, number = fake_lane(lanes).received(read)
    bare = ("out", [message[0]], None, 0.5, 5)
    assert fake_lane(lanes).received(bare) is bare  # a bare tensor went whole over Gloo
    assert (got_rest, stamp, number) == (rest, 0.5, 4)
    assert all(torch.equal(a, b) for a, b in zip(tensors, message, strict=True)), tensors
    outbox.close()
    # No lane agreed: the message goes through Gloo whole, as on any channel.
    log.clear()
    plain = _LaneOutbox(Channel("out", 0, 1, 3), KEY)
    gloo = OrderedGroup("gloo", log)
    plain.connected(gloo)
    plain.put(("out", [message[0]], None, 0.5, 5))
    assert log == ["gloo"], log
    incoming = wire.Incoming("out", wire.signer(KEY))
    incoming.buffer(wire.ROOM)[: gloo.sent[0].numel()] = gloo.sent[0]
    read = incoming.read()
    assert read is not None and read[2] is None and torch.equal(read[1][0], message[0]), read
    plain.close()


class Pending:
    """An NCCL operation that never completes (its peer is gone)."""

    def is_completed(self) -> bool:
        return False

    def wait(self) -> bool:
        raise AssertionError("waited for an operation that never completed")


def test_a_wait_on_nccl_ends_once_the_plane_closed_for_its_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wait is bounded: an operation in flight when the plane closes gets CLOSE_GRACE
    to complete, then the wait raises (the control plane tells why the run stops). Planted:
    the closing flag not looked at (the wait never ends: the hang guard fails the test)."""
    monkeypatch.setattr(nccl, "CLOSE_GRACE", 0.05)
    lane = fake_lane(FakeGroup())
    lane._closing.set()
    with hang_guard(HANG_GUARD), pytest.raises(RuntimeError, match=r"^the data plane closed during an NCCL"):
        nccl.Completion(Pending(), lane).wait()
    nccl.Completion(Done(), lane).wait()  # one that completed returns, closed or not


def test_a_lane_refuses_a_tensor_the_data_plane_cannot_carry() -> None:
    """As the Gloo message does (``_plane_wire``): a sparse or quantized tensor, named."""
    lane = fake_lane(FakeGroup())
    sparse = torch.eye(2).to_sparse()
    with pytest.raises(TypeError, match=r"^a tensor of dtype torch\.float32 and layout torch\.sparse_coo "):
        lane.outgoing(("out", [sparse], None, 0.0, 1))
