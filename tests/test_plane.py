"""Unit tests of the data plane between hosts (mujou._hosts._plane, _plane_wire): a message's
bytes, its signature checked before anything is unpickled, and the latest-value sending of one
channel, without Gloo (a fake group whose sends complete when the test says)."""

from __future__ import annotations

import threading
from collections import namedtuple
from typing import Any

import pytest
import torch
from _support import HANG_GUARD, wait_until

import mujou
from mujou._hosts import _plane_wire as wire
from mujou._hosts._plane import Channel, _Outbox
from mujou._processes._wire import Crossing, Forwarders, joined

KEY = b"k" * 32
Pair = namedtuple("Pair", ["a", "b"])


def crossing_of(message: Any, stamp: float = 1.5, number: int = 7) -> Crossing:
    """``message`` as the process layer's ``split`` gives it to a channel."""
    if isinstance(message, torch.Tensor):
        return "out", [message], None, stamp, number
    a, b = message.a, message.b
    return "out", [a], ((Pair(0, b), (0,))), stamp, number


def received(incoming: wire.Incoming, payload: torch.Tensor, room: int) -> Crossing | None:
    """What ``incoming`` reads of ``payload`` received into a buffer of ``room`` bytes (what
    follows it there is not its own)."""
    buffer = incoming.buffer(max(room, payload.numel()))
    buffer.fill_(0xAB)
    buffer[: payload.numel()] = payload
    return incoming.read()


def encoded(message: Any, key: bytes = KEY, number: int = 7) -> torch.Tensor:
    """``message``'s bytes, as a channel's sender lays them out (a copy: the buffer is reused)."""
    outgoing = wire.Outgoing(wire.signer(key))
    outgoing.layout(crossing_of(message, number=number))
    return outgoing.encode(wire.ROOM).clone()


@pytest.mark.rule("hosts.data-plane")
def test_a_message_crosses_whole_with_its_stamp_number_and_nest() -> None:
    sign = wire.signer(KEY)
    cases: list[Any] = [
        torch.arange(32, dtype=torch.float64).reshape(4, 8),
        torch.arange(4, dtype=torch.float64),  # the same dtype, another shape
        torch.tensor(True),
        torch.zeros(0, 3, dtype=torch.int16),
        torch.randn(5, dtype=torch.complex64).conj(),
        torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),  # not contiguous
        Pair(torch.arange(3, dtype=torch.uint8), "text"),
    ]
    outgoing, incoming = wire.Outgoing(sign), wire.Incoming("out", sign)
    # Each case twice in a row (the second reuses the first's layout), then all once more.
    for number, message in enumerate([*(case for case in cases for _ in range(2)), *cases]):
        size = outgoing.layout(crossing_of(message, number=number))
        payload = outgoing.encode(wire.ROOM)
        assert payload.numel() == size
        crossing = received(incoming, payload, wire.ROOM)
        assert crossing is not None and (incoming.kind, incoming.room) == (wire.MESSAGE, wire.ROOM)
        _, tensors, rest, stamp, got = crossing
        assert (stamp, got) == (1.5, number)
        back, _ = joined(tensors, rest)
        if isinstance(message, torch.Tensor):
            assert back.dtype == message.dtype and torch.equal(back, message.resolve_conj())
        else:
            assert type(back) is Pair and back.b == "text" and torch.equal(back.a, message.a)
    grow = wire.control(wire.GROW, sign, 1 << 20)
    incoming.buffer(wire.ROOM)[: grow.numel()] = grow
    assert incoming.read() is None and (incoming.kind, incoming.room) == (wire.GROW, 1 << 20)
    assert wire.next_room(100, wire.ROOM) == wire.ROOM
    assert wire.next_room(70_000, 70_000) == 70_000 and wire.next_room(20_000, 70_000) == 70_000
    assert wire.next_room(10_000, 70_000) == 10_000 and wire.next_room(100, 70_000) == wire.ROOM


@pytest.mark.rule("hosts.data-plane")
def test_bytes_not_signed_by_the_run_are_refused_before_anything_is_unpickled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payload = encoded(Pair(torch.ones(2), "x"))
    unpickled: list[bytes] = []
    monkeypatch.setattr("mujou._hosts._plane_wire.pickle.loads", unpickled.append)
    theirs = wire.Incoming("out", wire.signer(b"s" * 32))  # another run's key
    with pytest.raises(ValueError, match=r"^a message on 'out' is not signed with the run's key"):
        received(theirs, payload, wire.ROOM)
    ours = wire.Incoming("out", wire.signer(KEY))
    tampered = payload.clone()
    tampered[40] ^= 1  # a byte of the header
    with pytest.raises(ValueError, match=r"is not signed with the run's key"):
        received(ours, tampered, wire.ROOM)
    with pytest.raises(ValueError, match=r"is shorter than its header"):
        received(ours, payload[:20], 20)
    assert unpickled == []
    received(ours, payload, wire.ROOM)
    assert len(unpickled) == 1  # the structure, once signed
    with pytest.raises(ValueError, match=r"is shorter than its tensors"):
        received(wire.Incoming("out", wire.signer(KEY)), payload[:-16], payload.numel() - 16)


class Work:
    """A fake Gloo send: it completes when the test says."""

    def __init__(self, payload: torch.Tensor) -> None:
        self.payload = payload.clone()  # the channel writes its buffer again after the send completed
        self.header = wire.Incoming("out", wire.signer(KEY))
        crossing = received(self.header, payload, payload.numel())
        self.number = None if crossing is None else crossing[4]
        self.done = threading.Event()

    def wait(self) -> None:
        assert self.done.wait(HANG_GUARD), "a send the test never completed"


class Group:
    """A fake Gloo group: each send is recorded, and completes when ``complete`` says."""

    def __init__(self) -> None:
        self.sends: list[Work] = []
        self.changed = threading.Condition()

    def send(self, tensors: list[torch.Tensor], rank: int, tag: int) -> Work:
        assert (rank, tag) == (1, 3)
        work = Work(tensors[0])
        with self.changed:
            self.sends.append(work)
            self.changed.notify_all()
        return work

    def wait_sends(self, count: int) -> list[Work]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.sends) >= count, HANG_GUARD), self.sends
            return list(self.sends)


def idle(outbox: _Outbox) -> bool:
    """Whether the channel has no send in flight (the next goes out from the sending thread)."""
    with outbox._condition:
        return not outbox._work and not outbox._sending


@pytest.mark.rule("hosts.data-plane")
def test_a_channel_sends_at_once_when_idle_and_only_the_latest_while_a_send_is_in_flight() -> None:
    outbox = _Outbox(Channel("out", writer=0, reader=1, tag=3), KEY)
    group = Group()
    sender = threading.Thread(target=outbox.run, daemon=True)
    sender.start()
    outbox.put(crossing_of(torch.zeros(2), number=1))  # not connected yet: it waits in the mailbox
    outbox.connected(group)
    (first,) = group.wait_sends(1)
    assert first.number == 1
    # The reader does not take it: the node's later sends never wait, and replace each other.
    for number in range(2, 50):
        outbox.put(crossing_of(torch.zeros(2), number=number))
    assert len(group.sends) == 1
    first.done.set()  # the reader took it: the newest goes, and only it
    _, second = group.wait_sends(2)
    assert second.number == 49
    second.done.set()
    # Idle again: a send goes out from the sending thread itself, before put returns.
    wait_until(lambda: idle(outbox), "the sender thread to see the send complete")
    outbox.put(crossing_of(torch.zeros(2), number=50))
    assert len(group.sends) == 3 and group.sends[2].number == 50
    # A larger message first announces the room it needs.
    group.sends[2].done.set()
    wait_until(lambda: idle(outbox), "the sender thread to see the send complete")
    outbox.put(crossing_of(torch.zeros(4096), number=51))
    grow, big = group.sends[3:5]
    assert grow.header.kind == wire.GROW and grow.header.room >= 4096 * 4
    assert big.header.kind == wire.MESSAGE and big.number == 51
    grow.done.set()
    big.done.set()
    outbox.close()  # the end: the reader is told
    bye = group.wait_sends(6)[5]
    assert bye.header.kind == wire.BYE
    bye.done.set()
    sender.join(HANG_GUARD)
    assert not sender.is_alive()


class Two(mujou.Node):
    """A node with two outputs, for the forwarders' watchers."""

    y = mujou.Output()
    z = mujou.Output()

    def on_update(self, dt: float) -> None:
        pass


@pytest.mark.rule("hosts.data-plane")
def test_an_output_read_only_on_other_hosts_is_not_copied_into_a_ring_under_the_real_time_timer() -> None:
    pipe: Any = object()  # a reader process's wake pipe (the ring sender only keeps it here)
    for virtual, watched in ((False, ["y"]), (True, ["y", "z"])):
        node = Two()
        forwarders = Forwarders({"y": node.y, "z": node.z}, virtual)
        # y is read by a process of this host too; z by other hosts only (their data plane).
        forwarders.install({"y": [pipe], "z": []})
        assert [name for name, port in (("y", node.y), ("z", node.z)) if port._watchers] == watched
        forwarders.remove()
        assert not node.y._watchers and not node.z._watchers


@pytest.mark.rule("hosts.data-plane")
def test_a_bare_tensor_of_the_last_layout_is_sent_and_read_again_whole() -> None:
    """The hot paths of both ends (``Outgoing.encode_again``, ``Incoming.read`` of the last
    layout): each message of a channel, read in turn by one reader, is the tensor sent."""
    base = torch.arange(12, dtype=torch.float32)
    complex_ = torch.arange(6, dtype=torch.float32) * (1 + 2j)
    messages = [
        base.reshape(3, 4),
        base.reshape(3, 4) * 2,  # the same layout, other values
        base.reshape(4, 3),  # the same size, another shape
        base.reshape(4, 3).to(torch.int32),  # the same size and shape, another dtype
        base.reshape(3, 4).t().to(torch.int32),  # the same again, not contiguous
        base.reshape(4, 3).to(torch.int32) + 5,
        complex_,
        complex_.conj(),  # the same layout, a conjugate view
        complex_.imag,
        complex_[1:2].imag,
        complex_[1:2].conj().imag,  # the same layout, a negative view (contiguous: one element)
        complex_[1:2].imag,
    ]
    outbox = _Outbox(Channel("out", writer=0, reader=1, tag=3), KEY)
    group = Group()
    outbox.connected(group)
    reader = wire.Incoming("out", wire.signer(KEY))
    for number, message in enumerate(messages):
        outbox.put(crossing_of(message, stamp=number / 4, number=number))
        (work,) = group.sends[number:]
        crossing = received(reader, work.payload, work.payload.numel())
        assert crossing is not None
        _, (tensor,), rest, stamp, got = crossing
        assert (rest, stamp, got) == (None, number / 4, number)
        expected = message.resolve_conj().resolve_neg()
        assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, number
        assert torch.equal(tensor, expected), number
        with outbox._condition:  # the send completed, as the sender thread sees it
            outbox._work = []
    # A message of the last layout whose signed header was changed is refused, as any other.
    outbox.put(crossing_of(complex_[1:2].imag, stamp=9.0, number=99))
    tampered = group.sends[-1].payload.clone()
    tampered[wire._STAMP_AT] ^= 1  # a byte of the stamp
    with pytest.raises(ValueError, match=r"^a message on 'out' is not signed with the run's key"):
        received(reader, tampered, tampered.numel())
    outbox.close()
