"""The ports that cross processes, in one process: stand-ins and forwarders.

An input whose source is in another process reads a *stand-in*: an output of no node, named
as the source, whose latest message this process sets when one arrives (proc.latest-value).
The process's outputs that have readers elsewhere get a watcher that forwards each message:

- under the real-time timer, into the output's ring of shared-memory slots (a nest's
  structure too, pickled into a leaf of its own), then a small record on the wake pipe of
  each reader's process (proc.transport, proc.wake); there an idle worker, or a thread of
  Mujou's while none is idle, takes the newest slot, publishes it on the stand-in and wakes
  the triggered readers at once (``_inbox``);
- under the virtual timer, into an outbox the host collects at the end of each tag and hands
  to the readers' processes before the next tag is chosen (proc.virtual).

A stand-in's message numbers (``Latest[4]``, what ``Input.fresh`` compares) count the
sender's messages, skipped ones included, so ``coalesced`` counts them as in one process.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import pickle
import select
import struct
import threading
from collections.abc import Callable, Sequence
from multiprocessing import resource_sharer
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, cast

import torch

from .._messages import Nest, flatten, rebuild
from .._ports import Output
from ._handover import Handover
from ._ring import Announce, RingWriter

if TYPE_CHECKING:
    from .._engine import Engine

# A message that crosses: (output name, message's tensors, the rest of a nest or None, stamp,
# the sender's number). The rest of a nest: the nest with 0 for each tensor, and the tensors'
# positions among its leaves.
Rest = tuple[Any, tuple[int, ...]] | None
Crossing = tuple[str, list[torch.Tensor], Rest, float, int]

_FRAME = struct.Struct("!i")  # multiprocessing.Connection's frame: the length, then the bytes
_LENGTH = struct.Struct("<q")  # the length of a nest's rest, first in its leaf of the slot
_REST_ROOM = 256  # bytes: the least room a ring's slot keeps for a nest's rest
NO_HOLDER = -1  # the engine's holder of a thread that holds no node (Engine.crashed)
_FLUSH_LOOK_MS = 100  # how often a pipe's flusher looks whether it still owes anything
# Records that do not wait for a full pipe: where a pipe's end can be made non-blocking.
_NONBLOCKING = os.name == "posix" and hasattr(select, "PIPE_BUF")
_PIPE_BUF = getattr(select, "PIPE_BUF", 512)  # bytes a pipe writes all or nothing (POSIX's least: 512)


def make_standin(name: str) -> Output[Any]:
    """The output a process's inputs read for a source in another process."""
    standin: Output[Any] = Output()
    standin._attr = name  # no node: its name is the source's whole name
    return standin


def split(port: Output[Any], name: str) -> Crossing:
    """The latest message of ``port`` (named ``name``) as it crosses: its tensors (on the
    CPU) and the rest."""
    latest = port._latest
    assert latest is not None
    message, _, nest, stamp, number, _ = latest
    if nest is None:  # a bare tensor, the hot path: no call where it is on the CPU already
        return name, [message if message.is_cpu else message.cpu()], None, stamp, number
    positions = tuple(i for i, leaf in enumerate(nest.leaves) if isinstance(leaf, torch.Tensor))
    tensors = [nest.leaves[i].cpu() for i in positions]
    holes = [0 if isinstance(leaf, torch.Tensor) else leaf for leaf in nest.leaves]
    return name, tensors, (rebuild(nest.spec, holes), positions), stamp, number


def packed_rest(rest: Rest, room: int) -> torch.Tensor:
    """The rest of a nest as the last leaf of its ring's slot: its pickle's length (8 bytes),
    the pickle, and zeros up to ``room`` bytes, or the next power of two that holds it (a
    larger leaf re-allocates the ring: a slower send, as for a new layout)."""
    data = pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL)
    need = _LENGTH.size + len(data)
    if need > room:
        room = max(_REST_ROOM, 1 << (need - 1).bit_length())
    buffer = bytearray(room)
    _LENGTH.pack_into(buffer, 0, len(data))
    buffer[_LENGTH.size : need] = data
    return torch.frombuffer(buffer, dtype=torch.uint8)


def unpacked_rest(leaf: torch.Tensor) -> Rest:
    """The rest ``packed_rest`` put in ``leaf`` (a contiguous CPU copy of the slot's)."""
    raw = ctypes.string_at(leaf.data_ptr(), leaf.numel())
    (length,) = _LENGTH.unpack_from(raw, 0)
    rest: Rest = pickle.loads(raw[_LENGTH.size : _LENGTH.size + length])
    return rest


def joined(tensors: Sequence[torch.Tensor], rest: Rest) -> tuple[Any, Nest | None]:
    """The message ``split`` took apart, and what its nest is (None for a bare tensor)."""
    if rest is None:
        return tensors[0], None
    skeleton, positions = rest
    leaves, spec = flatten(skeleton)
    for tensor, i in zip(tensors, positions, strict=True):
        leaves[i] = tensor
    return rebuild(spec, leaves), Nest(spec, leaves)


class Standins:
    """This process's stand-ins, by the source's name, and publishing onto them."""

    def __init__(self, names: Sequence[str]) -> None:
        self.ports = {name: make_standin(name) for name in names}
        self._sent: dict[str, int] = {}  # the sender's number of the latest message, by name
        # The latest a fresh publish replaced, kept until ``drop_replaced`` (a thread about to
        # wait): freeing its tensor cost about 1.7k instructions on the way to the update.
        self._replaced: Any = None

    def publish(
        self,
        engine: Engine | None,
        name: str,
        message: Any,
        nest: Nest | None,
        *,
        stamp: float,
        number: int,
        fresh: bool = False,
    ) -> Output[Any]:
        """Make ``message`` the latest of stand-in ``name``; wake its triggered readers (with
        ``engine``; else the caller does, ``_inbox``). ``fresh``: a message no one changed
        since it was made (a ring's copy), whose version is 0; the message it replaces is freed
        later (``drop_replaced``). Returns the stand-in."""
        port = self.ports[name]
        before = self._sent.get(name)
        self._sent[name] = number
        step = 1 if before is None or number <= before else number - before
        latest = port._latest
        version = 0 if fresh or nest is not None else message._version
        number = step if latest is None else latest[4] + step
        port._latest = (message, version, nest, stamp, number, nest is None and message.is_cpu)
        if fresh:
            self._replaced = latest
        for watcher in port._watchers:
            watcher(message)
        if engine is not None and port._wakes:
            engine.arrived(port)
        return port

    def publish_copy(
        self, port: Output[Any], name: str, message: torch.Tensor, stamp: float, number: int
    ) -> Output[Any]:
        """``publish`` for a bare tensor a ring's reader copied out (``_inbox``, its hot path):
        ``port`` is stand-in ``name``; the tensor is fresh and on the CPU, its version 0 (no
        torch call for either); the caller wakes the triggered readers."""
        sent = self._sent
        before = sent.get(name)
        sent[name] = number
        step = 1 if before is None or number <= before else number - before
        latest = self._replaced = port._latest
        port._latest = (message, 0, None, stamp, step if latest is None else latest[4] + step, True)
        for watcher in port._watchers:
            watcher(message)
        return port

    def drop_replaced(self) -> None:
        """Free the message the last fresh publish replaced (unless another replaced it)."""
        self._replaced = None

    def restart_numbers(self) -> None:
        """A restore or a start: the next message from each sender counts one."""
        self._sent.clear()


class Forwarders:
    """Watchers on this process's outputs that have readers in other processes."""

    def __init__(self, outputs: dict[str, Output[Any]], virtual: bool) -> None:
        self.outputs = outputs
        self.virtual = virtual
        self.outbox: list[Crossing] = []  # virtual timer: this tag's crossings
        self._watchers: list[tuple[Output[Any], Callable[[Any], None]]] = []
        self._rings: dict[str, RingWriter] = {}
        self._pipes: dict[str, list[Pipe]] = {}
        self._handover = Handover()  # the sender's core, to the reader it woke

    def install(self, pipes: dict[str, list[Pipe]]) -> None:
        """Forward from now on: ``pipes`` gives the pipes of each output's reader processes.
        Under the real-time timer an output with none (read on other hosts only, which the
        data plane between hosts forwards: ``mujou._hosts._plane``) gets no ring: a copy of
        each of its messages into a ring that no process reads cost its sends tens of µs."""
        self._pipes = pipes
        for name, port in self.outputs.items():
            if not (self.virtual or pipes[name]):
                continue
            watcher = self._collector(port, name) if self.virtual else self._sender(port, name)
            port._add_watcher(watcher)
            self._watchers.append((port, watcher))

    def remove(self) -> None:
        """Forward nothing more: the watchers go, and the rings (idempotent)."""
        for port, watcher in self._watchers:
            port._remove_watcher(watcher)
        self._watchers.clear()
        for ring in self._rings.values():
            ring.close()
        self._rings.clear()
        self.outbox.clear()

    def _collector(self, port: Output[Any], name: str) -> Callable[[Any], None]:
        outbox = self.outbox

        def collect(message: Any) -> None:
            outbox.append(split(port, name))

        return collect

    def _sender(self, port: Output[Any], name: str) -> Callable[[Any], None]:
        ring = self._rings[name] = RingWriter()
        pipes = self._pipes[name]
        # The record only says "look at the ring": a later one, or one still in the pipe,
        # finds the same newest slot, which holds a nest's structure too.
        record = _framed(pickle.dumps((name,), protocol=pickle.HIGHEST_PROTOCOL))
        room = 0  # the room for a nest's rest in the slots of the ring written now

        def wake_all() -> None:
            for pipe in pipes:
                pipe.send(name, record, None)

        # One reader process (the common case): its pipe's send itself, without a frame of ours.
        wake = functools.partial(Pipe.send, pipes[0], name, record, None) if len(pipes) == 1 else wake_all
        handover = self._handover

        def send(message: Any) -> None:
            nonlocal room
            latest = port._latest
            assert latest is not None
            tensor = latest[0]
            if latest[2] is None and ring.write_plain(tensor, latest[3], latest[4], wake):
                # The hot path: a bare tensor that fits the plain ring in use; its records went
                # before its copy (NOTE [ the wake before the copy ] in _ring), and the message
                # is whole now: the core to a reader they woke (NOTE [ the core handed to the
                # reader ] in _handover).
                handover()
                return
            if latest[2] is None and tensor.is_cpu:  # a bare CPU tensor: split's first case, inline
                announce = ring.write([tensor], latest[3], latest[4])
            else:
                _, tensors, rest, stamp, number = split(port, name)
                if rest is not None:
                    leaf = packed_rest(rest, room)
                    room = leaf.numel()
                    tensors.append(leaf)
                announce = ring.write(tensors, stamp, number, structured=rest is not None)
            for pipe in pipes:  # each pickles its own announcement: a reader fetches it once
                pipe.send(name, record, announce)
            handover()

        return send


class Pipe:
    """One end that writes to another process's wake pipe, shared by this process's senders.

    A reader's process that stops reading (stopped by a signal, stuck) fills its pipe; a
    sender then must not wait for it (proc.latest-value). So no write here blocks. What
    finds the pipe full is owed, by output, and written as soon as there is room (by the next
    send through the pipe, or by a thread that waits for room while anything is owed), unless
    a newer one of its output replaces it: the announcements of new rings, then the records,
    each of which makes the reader take the newest slot of its ring. A frame over
    ``PIPE_BUF`` bytes (an announcement of a nest of about a hundred tensors), which a write
    may cut, is written as far as the pipe takes it; its rest goes first once there is room.

    An announcement is pickled once the pipe has room for it: its pickle hands a duplicate of
    the ring's descriptor to this process's resource sharer, for the reader's process to
    fetch once. The pipe keeps the keys of those it handed out, and ``close`` (the run ended,
    or the reader's process is gone) takes back the ones never fetched, which would
    otherwise hold a descriptor and the ring's memory until this process ends.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self.broken = False  # the reader's process ended, or the pipe was closed: write no more
        # Called with an exception in the flusher thread (Mujou's own error): set by the
        # member that uses the pipe, to stop the run (the engine's crashed path).
        self.on_crash: Callable[[BaseException], None] | None = None
        self._announces: dict[str, Announce] = {}  # by output: a new ring a full pipe left out
        self._owed: dict[str, bytes] = {}  # by output: the frame of a record a full pipe left out
        self._partial: memoryview | None = None  # the rest of a frame a write cut: next to go
        self._handed: list[_Key] = []  # resource sharer keys of the announcements written
        self._flusher: threading.Thread | None = None  # writes what is owed once there is room
        self._fd = connection.fileno() if _NONBLOCKING else -1
        if self._fd >= 0:
            os.set_blocking(self._fd, False)
            self._room = select.poll()
            self._room.register(self._fd, select.POLLOUT)

    def send(self, name: str, record: bytes, announce: Announce | None) -> None:
        """Write output ``name``'s ``record`` (framed: ``_framed``), after the announcement of
        its new ring, if any."""
        lock = self._lock
        lock.acquire()  # not ``with``: about 900 instructions fewer on the sender's hot path
        try:
            if self.broken:
                return
            try:
                if self._fd < 0:  # no write that cannot block here: each waits
                    if announce is not None:
                        self.connection.send_bytes(self._announcement(name, announce))
                    self.connection.send_bytes(record[_FRAME.size :])
                    return
                if (
                    announce is None
                    and not (self._announces or self._owed or self._partial is not None)  # _owes()
                    and len(record) <= _PIPE_BUF
                ):
                    try:  # nothing owed before it: the record goes at once (the hot path)
                        os.write(self._fd, record)  # at most PIPE_BUF bytes: all or nothing
                        return
                    except BlockingIOError:
                        pass  # the pipe is full: owed, as below
                if announce is not None:
                    self._announces[name] = announce  # replaces an older one still owed
                self._owed[name] = record  # replaces an older one
                self._write_owed()
                if self._owes() and self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush, name="mujou-ports-out", daemon=True)
                    self._flusher.start()
            except OSError:  # the reader's process ended: the host stops the run for it
                self._break()
        finally:
            lock.release()

    def close(self) -> None:
        """Write nothing more; take back the descriptors no reader fetched; close the end.

        Idempotent. The flusher, if any, ends at its next look."""
        with self._lock:
            self._break()
            self.connection.close()

    def _break(self) -> None:
        """With the lock held: write nothing more, and drop what was owed."""
        self.broken = True
        self._announces.clear()
        self._owed.clear()
        self._partial = None
        _take_back(self._handed)
        self._handed.clear()

    def _owes(self) -> bool:
        return bool(self._announces or self._owed or self._partial is not None)

    def _flush(self) -> None:
        """While something is owed: write it as soon as the pipe has room, then end. So a
        reader's process that reads again gets the latest messages without waiting for
        another send. An error of Mujou's own here stops the run (``on_crash``)."""
        try:
            room = select.poll()  # its own: one poll object is not for two threads at once
            room.register(self._fd, select.POLLOUT)
            while True:
                ready = room.poll(_FLUSH_LOOK_MS)  # also when the reader's end closed: the write fails
                with self._lock:
                    if self.broken or not self._owes():
                        self._flusher = None
                        return
                    if ready:
                        try:
                            self._write_owed()
                        except OSError:  # the reader's process ended
                            self._break()
        except BaseException as exc:
            with self._lock:
                self._flusher = None
                self._break()
            if self.on_crash is not None:
                self.on_crash(exc)

    def _write_owed(self) -> None:
        """Write what is owed while the pipe has room: the rest of a cut frame, the
        announcements, then the records."""
        if self._partial is not None and not self._write_rest():
            return
        for name, announce in list(self._announces.items()):
            if not self._room.poll(0):
                return
            del self._announces[name]
            self._partial = memoryview(_framed(self._announcement(name, announce)))
            if not self._write_rest():
                return
        for name, frame in list(self._owed.items()):
            if len(frame) > select.PIPE_BUF:  # a name of thousands of characters: may be cut
                del self._owed[name]
                self._partial = memoryview(frame)
                if not self._write_rest():
                    return
                continue
            try:
                os.write(self._fd, frame)  # at most PIPE_BUF bytes: all or nothing
            except BlockingIOError:
                return
            del self._owed[name]

    def _write_rest(self) -> bool:
        """Write as much of the cut frame as the pipe takes: whether all of it went."""
        rest = self._partial
        assert rest is not None
        while rest:
            try:
                rest = rest[os.write(self._fd, rest) :]
            except BlockingIOError:
                self._partial = rest
                return False
        self._partial = None
        return True

    def _announcement(self, name: str, announce: Announce) -> bytes:
        """The record of output ``name``'s new ring, pickled as a ring must be (``Announce``),
        the descriptors it hands out kept for ``close``."""
        self._handed = [key for key in self._handed if key[1] in _sharer._cache]  # drop fetched ones
        buffer = io.BytesIO()
        _AnnouncePickler(buffer, self._handed).dump(("announce", name, announce))
        return buffer.getvalue()


_Key = tuple[Any, int]  # a resource sharer's key of a descriptor: (its address, a number)


class _AnnouncePickler(ForkingPickler):
    """ForkingPickler (a shared tensor goes as a descriptor), noting each descriptor it hands
    to this process's resource sharer (under torch's ``file_descriptor`` strategy)."""

    def __init__(self, file: io.BytesIO, handed: list[_Key]) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._handed_out = handed

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is resource_sharer.DupFd:
            self._handed_out.append(cast(Any, obj)._id)
        return NotImplemented


_sharer = cast(Any, resource_sharer)._resource_sharer  # no public call takes a registration back


def _take_back(keys: Sequence[_Key]) -> None:
    """Close the descriptors of ``keys`` that no reader fetched from the resource sharer."""
    for _, key in keys:
        with _sharer._lock:
            entry = _sharer._cache.pop(key, None)
        if entry is not None:
            entry[1]()  # its close: the duplicate of the ring's descriptor


def _framed(data: bytes) -> bytes:
    """``data`` framed as ``Connection.send_bytes`` frames it: its length, then the bytes."""
    return _FRAME.pack(len(data)) + data
