"""A nest's structure in its ring's slot (``_wire.packed_rest``): what goes in comes out, and
the room grows by powers of two, so a structure whose size changes a little keeps its ring."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import select
import threading
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

import pytest
import torch
from _support import HANG_GUARD

from mujou._processes import _ring
from mujou._processes._inbox import Inbox
from mujou._processes._ring import Announce, RingWriter
from mujou._processes._wire import (
    _NONBLOCKING,
    Forwarders,
    Pipe,
    Standins,
    _framed,
    _sharer,
    packed_rest,
    unpacked_rest,
)

RESTS = [
    None,
    ({"a": 0, "b": "words"}, (0,)),
    ((0, 1.5, None, [0, "x" * 1000]), (0, 3)),  # more than the least room
]


@pytest.mark.parametrize("rest", RESTS, ids=["none", "small", "large"])
def test_a_rest_comes_back_equal(rest: object) -> None:
    leaf = packed_rest(rest, 0)  # type: ignore[arg-type]  # any picklable value
    assert unpacked_rest(leaf.clone()) == rest


def test_the_room_grows_by_powers_of_two_and_never_shrinks() -> None:
    small = packed_rest(({"w": "x"}, (0,)), 0)
    assert small.numel() == 256  # the least room
    assert packed_rest(({"w": "x" * 10}, (0,)), small.numel()).numel() == 256  # fits: the same leaf size
    large = packed_rest(({"w": "x" * 300}, (0,)), small.numel())
    assert large.numel() == 512
    assert packed_rest(({"w": "x"}, (0,)), large.numel()).numel() == 512  # keeps its room
    assert unpacked_rest(large) == ({"w": "x" * 300}, (0,))


# --- the wake pipe's writing end -----------------------------------------------------------------


def _record(name: str) -> bytes:
    return _framed(pickle.dumps((name,), protocol=pickle.HIGHEST_PROTOCOL))


def _fill(pipe: Pipe) -> int:
    """Write filler records straight into the pipe until it is full (nothing owed, no
    flusher): how many went."""
    sent = 0
    while True:
        try:
            os.write(pipe.connection.fileno(), _record(f"filler{sent}"))
        except BlockingIOError:
            return sent
        sent += 1


def _announce_of(leaves: int) -> Announce:
    announce = RingWriter().write([torch.zeros(i + 1) for i in range(leaves)], 0.0, 1)  # shapes unlike
    assert announce is not None
    return announce


@pytest.fixture
def ends() -> Iterator[tuple[Connection, Pipe]]:
    reader, writer = multiprocessing.Pipe(duplex=False)
    pipe = Pipe(writer)
    yield reader, pipe
    pipe.close()
    reader.close()


@pytest.mark.skipif(not _NONBLOCKING, reason="no write that cannot block here")
def test_a_frame_over_pipe_buf_to_a_full_pipe_keeps_no_sender_waiting(ends: tuple[Connection, Pipe]) -> None:
    """Review S4: the announcement of a nest of many tensors (a frame over PIPE_BUF) to a
    reader that stopped reading, its pipe with room for less than the frame: neither its
    send nor another output's send waits, and once the reader reads, every frame comes whole
    and in order (planted: the frame written waiting with the pipe's lock held, as before:
    the sends never return, and the bounded join fails)."""
    reader, pipe = ends
    announce = _announce_of(600)
    frame = len(ForkingPickler.dumps(("announce", "big", announce)))
    assert frame > select.PIPE_BUF
    fillers = _fill(pipe)
    got: list[tuple[object, ...]] = []
    while not pipe._room.poll(0):  # some room, less than the frame
        got.append(pickle.loads(reader.recv_bytes()))

    def send_both() -> None:
        pipe.send("big", _record("big"), announce)
        pipe.send("x", _record("x"), None)

    sender = threading.Thread(target=send_both, daemon=True)
    sender.start()
    sender.join(HANG_GUARD / 2)
    assert not sender.is_alive(), "a send waited for a reader that does not read"
    while not got or got[-1] != ("x",):
        assert reader.poll(HANG_GUARD), f"the flusher did not write what was owed: {got[-3:]}"
        got.append(pickle.loads(reader.recv_bytes()))
    names = [record[1] if record[0] == "announce" else record[0] for record in got]
    assert names == [*(f"filler{i}" for i in range(fillers)), "big", "big", "x"]
    assert got[fillers][0] == "announce" and got[fillers + 1] == ("big",)


@pytest.mark.skipif(not _NONBLOCKING, reason="no flusher here")
def test_an_error_in_the_flusher_reaches_on_crash(
    ends: tuple[Connection, Pipe], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 #10: an exception of Mujou's own in the pipe's flusher thread is handed to
    ``on_crash`` (the member stops the run with it), not lost with the thread (planted: no
    handler in _flush: on_crash is never called)."""
    reader, pipe = ends
    crashed: list[BaseException] = []
    done = threading.Event()

    def on_crash(exc: BaseException) -> None:
        crashed.append(exc)
        done.set()

    pipe.on_crash = on_crash
    _fill(pipe)
    pipe.send("y", _record("y"), None)  # owed: the flusher starts

    def broken() -> None:
        raise RuntimeError("planted in the test")

    monkeypatch.setattr(pipe, "_write_owed", broken)
    while reader.poll(0):  # room: the flusher writes, and fails
        reader.recv_bytes()
    assert done.wait(HANG_GUARD), "on_crash was not called"
    assert isinstance(crashed[0], RuntimeError) and pipe.broken


@pytest.mark.skipif(not _NONBLOCKING, reason="announcements are sent waiting here")
def test_closing_takes_back_the_descriptors_no_reader_fetched(ends: tuple[Connection, Pipe]) -> None:
    """Issue 23 #11: an announcement written but never read (its reader died) hands a
    descriptor to the resource sharer; ``close`` takes it back (planted: _take_back does
    nothing: the key stays registered and its descriptor open)."""
    _, pipe = ends
    announce = _announce_of(1)
    pipe.send("y", _record("y"), announce)
    handed = list(pipe._handed)
    assert len(handed) == 1 and handed[0][1] in _sharer._cache
    pipe.close()
    assert handed[0][1] not in _sharer._cache
    pipe.close()  # idempotent


# --- the receiver --------------------------------------------------------------------------------


class _Engine:
    """What a receiver uses of its engine: whether the run ended, and the crash path."""

    def __init__(self) -> None:
        self.ended = False
        self.workers = 0  # no worker waits on the pipes: the receiver's thread takes them
        self.crashes: list[BaseException] = []

    def crashed(self, holder: int, exc: BaseException, *, exits: bool) -> None:
        self.crashes.append(exc)


def test_an_announcement_whose_sender_took_its_descriptor_back_ends_the_receiver_quietly() -> None:
    """The sender's process ended its part of the run (its pipe closed, taking back the ring's
    descriptor no reader fetched) while the reader's process still ran: the reader's receiver
    reads the announcement, cannot fetch the descriptor, and ends at the pipe's end, with no
    internal error (seen in the start-stop benchmark: each process of a run stops at once).
    Planted: today's receiver, which stopped the run with MujouInternalError (EOFError)."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    pipe = Pipe(writer)
    pipe.send("y", _record("y"), _announce_of(1))
    pipe.close()  # takes the descriptor back, closes the writing end
    engine = _Engine()
    receiver = Inbox(cast(Any, engine), Standins(["y"]), [reader])
    receiver.start()
    receiver._thread.join(HANG_GUARD)  # it ends by itself, at the pipe's end
    assert not receiver._thread.is_alive()
    assert engine.crashes == []
    assert reader.closed


@pytest.fixture
def forwarding() -> Iterator[tuple[Standins, Forwarders, Pipe, int]]:
    """Output ``y`` forwarded under the real-time timer to one reader's wake pipe: the stand-ins
    that publish on it, its forwarders (to install), the pipe, and the reading end's descriptor."""
    standins = Standins(["y"])
    forwarders = Forwarders({"y": standins.ports["y"]}, virtual=False)
    reading, writing = multiprocessing.Pipe(duplex=False)
    pipe = Pipe(writing)
    try:
        yield standins, forwarders, pipe, reading.fileno()
    finally:
        forwarders.remove()
        pipe.close()
        reading.close()


def _in_the_pipe(fd: int) -> bool:
    """Whether the pipe read at ``fd`` holds anything now."""
    return bool(select.select([fd], [], [], 0)[0])


def _drain(fd: int) -> None:
    while _in_the_pipe(fd):
        os.read(fd, 1 << 16)


def test_the_senders_record_of_a_plain_write_goes_before_its_copy(
    monkeypatch: pytest.MonkeyPatch, forwarding: tuple[Standins, Forwarders, Pipe, int]
) -> None:
    """NOTE [ the wake before the copy ] in _ring: a message that fits the plain ring in use
    is in its reader's pipe (the record) before the slot is copied; a first message, which
    makes the ring, is announced after its write (planted: the record after the copy, as
    before: the pipe was empty during the copy)."""
    standins, forwarders, pipe, fd = forwarding
    forwarders.install({"y": [pipe]})
    in_the_pipe: list[bool] = []
    copy_in = _ring._copy_in

    def copy(view: torch.Tensor, tensor: torch.Tensor) -> None:
        in_the_pipe.append(_in_the_pipe(fd))
        copy_in(view, tensor)

    monkeypatch.setattr(_ring, "_copy_in", copy)
    standins.publish(None, "y", torch.full((4,), 1.0), None, stamp=1.0, number=1)
    assert in_the_pipe == [False]  # the ring's first write: announced, then recorded, after it
    _drain(fd)
    standins.publish(None, "y", torch.full((4,), 2.0), None, stamp=2.0, number=2)
    assert in_the_pipe == [False, True]


def test_a_send_hands_its_core_over_once_the_message_is_whole(
    monkeypatch: pytest.MonkeyPatch, forwarding: tuple[Standins, Forwarders, Pipe, int]
) -> None:
    """NOTE [ the core handed to the reader ] in _handover: a send under the real-time timer
    yields its core once, after its record is in the pipe and the slot's copy is done, on the
    plain path and on the ring's first write alike (planted: the hand-over in the wake, before
    the copy, which was slower than none; or none on the first write)."""
    standins, forwarders, pipe, fd = forwarding
    copies: list[int] = []  # the slot copies so far, at each copy
    handed: list[tuple[int, bool]] = []  # at each hand-over: the copies so far, a record in the pipe
    copy_in = _ring._copy_in

    def copy(view: torch.Tensor, tensor: torch.Tensor) -> None:
        copy_in(view, tensor)
        copies.append(len(copies) + 1)

    def hand_over() -> None:
        handed.append((len(copies), _in_the_pipe(fd)))

    monkeypatch.setattr(_ring, "_copy_in", copy)
    monkeypatch.setattr(forwarders, "_handover", hand_over)  # before install: each sender binds it
    forwarders.install({"y": [pipe]})
    standins.publish(None, "y", torch.full((4,), 1.0), None, stamp=1.0, number=1)
    assert handed == [(1, True)]  # the ring's first write, announced and recorded
    _drain(fd)
    standins.publish(None, "y", torch.full((4,), 2.0), None, stamp=2.0, number=2)
    assert handed == [(1, True), (2, True)]  # the plain path


def test_a_fresh_publish_frees_the_message_it_replaced_only_once_dropped() -> None:
    """A ring's copy that replaces a stand-in's message keeps the message it replaced alive
    until ``drop_replaced`` (a thread about to wait), so that freeing it is not on the way to
    the update; then it is freed (planted: ``drop_replaced`` that keeps it: still alive)."""
    standins = Standins(["y"])
    first = torch.zeros(4)
    standins.publish(None, "y", first, None, stamp=1.0, number=1, fresh=True)
    gone = weakref.ref(first)
    del first
    standins.publish(None, "y", torch.ones(4), None, stamp=2.0, number=2, fresh=True)
    assert gone() is not None  # replaced, kept
    standins.drop_replaced()
    assert gone() is None


def test_a_rings_copy_is_published_as_any_fresh_message() -> None:
    """``publish_copy`` (the inbox's hot path: a bare CPU tensor copied out of a ring) leaves
    on the stand-in what ``publish(fresh=True)`` does: the same numbers across skipped and
    repeated sender numbers and a restart, version 0, the bare-CPU fact, the watchers called,
    the replaced message kept until dropped (planted: a step of 1 for every message: the
    numbers after a skip differ)."""
    general, hot = Standins(["y"]), Standins(["y"])
    seen: dict[str, list[torch.Tensor]] = {"general": [], "hot": []}
    general.ports["y"]._watchers = (seen["general"].append,)
    hot.ports["y"]._watchers = (seen["hot"].append,)
    for step, number in enumerate([1, 2, 5, 5, 4, 9, 1]):
        if step == 6:
            general.restart_numbers()
            hot.restart_numbers()
        message = torch.full((3,), float(step))
        general.publish(None, "y", message, None, stamp=float(step), number=number, fresh=True)
        port = hot.publish_copy(hot.ports["y"], "y", message, float(step), number)
        assert port is hot.ports["y"]
        assert hot.ports["y"]._latest == general.ports["y"]._latest
        assert hot._replaced == general._replaced
    assert seen["hot"] == seen["general"]
    latest = hot.ports["y"]._latest
    assert latest is not None and latest[4] == 13
