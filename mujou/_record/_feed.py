"""The feed: a run's records carried to the recorder process through shared memory.

The run's process appends records to a byte ring in a buffer both processes map (a ``memfd``,
or a temporary file, whose descriptor the recorder process inherits); the recorder process
(``_sink``) takes them in order. Appending a message is one header packed and one ``memmove``
of the tensor's bytes, under a lock (several threads of the run's process append), with no
system call and no other thread involved: what a recording costs the hook that sends.

This module imports the standard library only: the recorder process imports it without torch.

Layout of the buffer::

    bytes 0..7      head: the bytes appended so far (only the run's process writes it)
    bytes 64..71    tail: the bytes taken so far (only the recorder process writes it)
    bytes 72..79    the messages the recorder process has written (or kept), for recorder.messages
    bytes 128..     the ring of ``size`` bytes, a power of two

The run's process wakes the recorder process through a pipe (``kick``: a byte written) once
it appended records and a thread of it is about to wait, or when much is waiting
(NOTE [ waking the recorder ]); the recorder process sleeps on the pipe meanwhile.

A record is a header ``(payload bytes, kind, stamp, aux)`` (``HEADER``: 24 bytes) and its
payload, padded to 8 bytes; it never wraps around the ring's end: where it does not fit before
the end, a ``WRAP`` header (or, with under 24 bytes left, nothing) sends the reader back to the
start. A record larger than a quarter of the ring goes in fragments: the first has the kind
with ``MORE`` set, the next ones ``CONT`` (with ``MORE`` but for the last); only a writer that
may wait sends one (the fragments after the first need the reader to make room).

NOTE [ the feed's ordering ]
One writer at a time (the lock) and one reader: the writer writes a record, then stores head;
the reader loads head, then reads the records before it, then stores tail; the writer loads
tail before it overwrites bytes the reader took. x86 orders every one of these (stores after
stores, loads after loads, stores after loads; ``memmove``'s non-temporal stores of large
copies are followed by glibc's ``sfence``), so there the ctypes calls, which the compiler cannot
reorder, are enough. Elsewhere a full fence (C11 ``atomic_thread_fence`` from libatomic, as
``mujou/_processes/_ring.py`` finds it) goes before each store of head or tail and after each
load of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import platform
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

HEADER = struct.Struct("<IIdq")  # payload bytes, kind, stamp (timer seconds), aux
_HEAD = 0  # word indices
_TAIL = 8
_MESSAGES = 9
DATA = 128  # where the ring starts
_PAD = 7

# Kinds. A message's kind is its form (>= FIRST_FORM); its payload is the encoded message.
WRAP = 0
META = 1  # payload: pickle of (name, {key: value})
CHANNEL = 2  # pickle of (channel id, topic, schema name, schema data, metadata)
FORM = 3  # pickle of (form, channel id): a message of the form is a message of the channel
ATTACH = 4  # aux: time in ns; payload: a keyframe's bytes
DUMP = 5  # pickle of a path: a snapshot recorder writes what it keeps there
END = 6  # pickle of the mujou.end record (less messages): finish the file
CONT = 7  # the next fragment of the record begun before
FIRST_FORM = 16
MORE = 1 << 31  # another fragment follows


def _fence_of_machine() -> Callable[[], None] | None:
    """A full memory fence where the CPU needs one (NOTE [ the feed's ordering ]), else None."""
    if platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}:
        return None
    for library in ("libatomic.so.1", ctypes.util.find_library("atomic")):
        if library is None:
            continue
        try:
            fence = ctypes.CDLL(library).atomic_thread_fence
        except (OSError, AttributeError):
            continue
        fence.argtypes, fence.restype = [ctypes.c_int], None
        return lambda: fence(5)  # memory_order_seq_cst
    raise RuntimeError(
        f"recording needs a memory fence on this {platform.machine()!r} CPU, from libatomic "
        "(C11 atomic_thread_fence), which was not found; install libatomic (e.g. the libatomic1 package)"
    )


def _memcpy() -> Any:
    """libc's ``memcpy`` called with the GIL held, or None where there is none to load (then
    ``ctypes.memmove``). Called with ``c_void_p`` arguments whose value is set in place, it
    takes a third less time than ``ctypes.memmove``, which converts its arguments and releases
    and takes back the GIL: the most of what a hook pays for a message recorded."""
    try:
        copy = ctypes.PyDLL(None).memcpy
    except (OSError, TypeError, AttributeError):  # pragma: no cover (no Windows in CI)
        return None
    copy.restype = None
    return copy


def _shared_file(size: int) -> int:
    """A descriptor of ``size`` bytes of memory that a child process can map (inheritable)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("mujou-record")
    else:  # pragma: no cover (Linux has memfd)
        with tempfile.TemporaryFile() as file:  # removed from its folder at once where it can be
            fd = os.dup(file.fileno())
    os.ftruncate(fd, DATA + size)
    return fd


class _Mapped:
    """The buffer of a feed, mapped: its header words and its ring."""

    def __init__(self, fd: int, size: int) -> None:
        if size < 4096 or size & (size - 1):
            raise ValueError(f"a feed's size must be a power of two of at least 4096 bytes, got {size}")
        self.fd = fd
        self.size = size
        # Every page made and mapped now, not at its first write: a page's first write costs
        # a fault (a page of shared memory made and zeroed), which would fall on a hook.
        populate = getattr(mmap, "MAP_POPULATE", 0)
        self.map = mmap.mmap(fd, DATA + size, flags=mmap.MAP_SHARED | populate)
        self.view = memoryview(self.map)
        self.words = (ctypes.c_int64 * (DATA // 8)).from_buffer(self.map)
        self.base = ctypes.addressof(self.words)
        self.fence = _fence_of_machine()

    def close(self) -> None:
        del self.words
        self.view.release()
        self.map.close()
        os.close(self.fd)


# A message form as FeedWriter.message takes it: the pack of its header and prefix, its kind,
# prefix, payload bytes, record bytes (header and padding included) and data bytes.
MessageForm = tuple[Callable[..., None], int, bytes, int, int, int]


def message_form(kind: int, prefix: bytes, nbytes: int) -> MessageForm:
    """The form of messages of ``kind`` whose payload is ``prefix`` then ``nbytes`` of data:
    worked out once, so that appending one packs its header and prefix in one call."""
    length = len(prefix) + nbytes
    packer = struct.Struct(f"{HEADER.format}{len(prefix)}s")
    return packer.pack_into, kind, prefix, length, HEADER.size + ((length + _PAD) & ~_PAD), nbytes


def wake_pipe() -> tuple[int, int] | None:
    """The pipe through which the run's process wakes the recorder process (NOTE [ waking the
    recorder ]): its read end (the recorder process's, which waits on it with ``select``) and
    its write end, which never blocks; None where ``select`` cannot wait on a pipe (Windows):
    the recorder process then looks at the feed every few milliseconds instead."""
    if os.name == "nt":  # pragma: no cover (no Windows in CI)
        return None
    read, write = os.pipe()
    os.set_blocking(write, False)
    return read, write


class FeedWriter:
    """The run's process's end: appends records (any thread; one at a time, by a lock).

    ``waiting``: the messages appended and not yet written by the recorder process at most;
    a message past them finds no room (as one that does not fit).

    NOTE [ waking the recorder ]
    The recorder process sleeps on a pipe until :meth:`kick` writes a byte to it, which the
    run's process does once it appended records and a thread of it is about to wait (the
    recorder's ``idle`` callback, ``Session.copy_deferred``), or waits for the recorder process
    (room, a flush, the end); and, in the middle of the hooks, once a quarter of ``waiting``
    messages or an eighth of the ring were appended since the last kick, so that a run that is
    never idle does not fill the feed. It used to look at the feed by itself every 0.2 to 5 ms:
    under the real-time timer those wake-ups fell in the middle of the updates of a fleet's
    slot, and on a busy machine each could take the CPU from the worker that ran them (the
    recorded fleet's worker was preempted three times as often). Now it runs when the run's
    threads are about to wait. It still looks by itself every ``Config.wake_most`` seconds
    (``_sink``), which bounds the time a record appended without a kick waits.
    """

    def __init__(self, size: int, waiting: int) -> None:
        self._mapped = _Mapped(_shared_file(size), size)
        self.fd = self._mapped.fd
        pipe = wake_pipe()
        self.wake_fd = None if pipe is None else pipe[0]  # the recorder process's end
        self._wake = None if pipe is None else pipe[1]
        self._kicked = 0  # head at the last kick
        self._kicked_count = 0  # messages appended then
        self._kick_bytes = size // 8
        self._kick_count = max(1, waiting // 4)
        self.size = size
        self._mask = size - 1
        self._lock = threading.Lock()
        self._head = 0
        self._limit = size  # head may reach this without loading tail again
        self._fragment = size // 4
        self._waiting = waiting
        self._appended = 0  # messages appended
        self._counted = 0  # messages the recorder process had written when last looked at
        self._view = self._mapped.view
        self._address = self._mapped.base + DATA
        self._words = self._mapped.words
        self._fence = self._mapped.fence
        self._copy = _memcpy()
        self._to = ctypes.c_void_p()  # memcpy's arguments, set in place (under the lock)
        self._from = ctypes.c_void_p()

    @property
    def written(self) -> int:
        """The bytes appended so far: the reader has taken a record once :attr:`taken` passes it."""
        return self._head

    @property
    def taken(self) -> int:
        """The bytes the reader has taken so far."""
        mapped = self._mapped
        taken = int(mapped.words[_TAIL])
        if mapped.fence is not None:
            mapped.fence()
        return taken

    @property
    def messages(self) -> int:
        """The messages the recorder process has written so far."""
        return int(self._mapped.words[_MESSAGES])

    def _reserve(self, need: int) -> int | None:
        """Where a record of ``need`` bytes goes (its offset in the ring, a WRAP written before
        it where needed), or None without room; the caller holds the lock."""
        head = self._head
        offset = head & self._mask
        skip = self.size - offset if self.size - offset < need else 0
        if head + skip + need > self._limit:
            self._limit = self.taken + self.size
            if head + skip + need > self._limit:
                return None
        if skip:
            if skip >= HEADER.size:
                HEADER.pack_into(self._view, DATA + offset, 0, WRAP, 0.0, 0)
            self._head = head + skip
            offset = 0
        return offset

    def _publish(self) -> None:
        if self._fence is not None:
            self._fence()
        self._words[_HEAD] = self._head
        if (
            self._head - self._kicked >= self._kick_bytes
            or self._appended - self._kicked_count >= self._kick_count
        ):
            self._kick_locked()

    def kick(self) -> None:
        """Wake the recorder process if records were appended since the last kick (NOTE
        [ waking the recorder ]); a thread about to wait, or about to wait for the recorder
        process, calls it."""
        if self._head != self._kicked:
            with self._lock:
                if self._head != self._kicked:
                    self._kick_locked()

    def _kick_locked(self) -> None:
        """Wake the recorder process (the lock held, the head published)."""
        self._kicked, self._kicked_count = self._head, self._appended
        if self._wake is None:
            return
        with contextlib.suppress(OSError):  # full (the recorder process has kicks to read), or gone
            os.write(self._wake, b"\0")

    def message(self, form: MessageForm, address: int, stamp: float, microstep: int) -> bool:
        """Append a message of ``form`` (:func:`message_form`): the header and the prefix in one
        pack, then the data at ``address`` (a tensor's memory), one payload that the recorder
        process writes as it is.

        False, appending nothing, when the ring has no room for it now, or ``waiting`` messages
        wait. The payload must be at most :meth:`largest` (a larger one goes by :meth:`record`).
        The hooks' path: everything it needs is at hand, the rest is in :meth:`_reserve`.
        """
        pack, kind, prefix, length, need, nbytes = form
        lock = self._lock
        lock.acquire()
        try:
            if self._appended - self._counted >= self._waiting:
                self._counted = self.messages
                if self._appended - self._counted >= self._waiting:
                    return False
            head = self._head
            offset = head & self._mask
            if offset + need > self.size or head + need > self._limit:
                found = self._reserve(need)
                if found is None:
                    return False
                offset, head = found, self._head
            pack(self._view, DATA + offset, length, kind, stamp, microstep, prefix)
            copy = self._copy
            if copy is None:
                ctypes.memmove(self._address + offset + length - nbytes + 24, address, nbytes)
            else:
                self._to.value = self._address + offset + length - nbytes + 24  # HEADER.size
                self._from.value = address
                copy(self._to, self._from, nbytes)
            self._head = head = head + need
            self._appended += 1
            if self._fence is not None:
                self._fence()
            self._words[_HEAD] = head
            if (
                head - self._kicked >= self._kick_bytes
                or self._appended - self._kicked_count >= self._kick_count
            ):
                self._kick_locked()
        finally:
            lock.release()
        return True

    def largest(self) -> int:
        """The largest payload that goes in one record (a larger one goes in fragments)."""
        return self._fragment

    def record(
        self,
        kind: int,
        payload: bytes | memoryview,
        *,
        stamp: float = 0.0,
        aux: int = 0,
        wait: Callable[[], None] | None = None,
    ) -> bool:
        """Append a record of any size: in fragments where it is larger than :meth:`largest`.

        ``wait`` is called while the ring has no room (it waits a little, or raises to give
        up); without it a record that finds no room now (or a message past ``waiting``) is not
        appended: False. The lock is held throughout, so the fragments are not interleaved with
        other records.
        """
        view = memoryview(payload).cast("B")
        fragment = self._fragment
        is_message = kind >= FIRST_FORM
        with self._lock:
            if wait is None and is_message and self._appended - self._counted >= self._waiting:
                self._counted = self.messages
                if self._appended - self._counted >= self._waiting:
                    return False
            if wait is None and len(view) > fragment:
                # All the fragments must fit now: room for them, and for a wrap's waste
                pieces = -(-len(view) // fragment)
                self._limit = self.taken + self.size
                if (
                    self._head + len(view) + pieces * (HEADER.size + _PAD) + fragment + HEADER.size + _PAD
                    > self._limit
                ):
                    return False
            first = True
            while first or view:
                piece, view = view[:fragment], view[fragment:]
                code = kind if first else CONT
                if view:
                    code |= MORE
                need = HEADER.size + ((len(piece) + _PAD) & ~_PAD)
                offset = self._reserve(need)
                while offset is None:
                    if wait is None:
                        return False
                    wait()
                    offset = self._reserve(need)
                HEADER.pack_into(self._view, DATA + offset, len(piece), code, stamp, aux)
                start = DATA + offset + HEADER.size
                self._view[start : start + len(piece)] = piece
                self._head += need
                if not view and is_message:
                    self._appended += 1
                self._publish()
                first = False
        return True

    def close(self) -> None:
        """Unmap the buffer (the recorder process keeps its own mapping), close the pipe."""
        with self._lock:
            del self._words, self._view  # the mapping closes once nothing points into it
            self._mapped.close()
            for fd in (self.wake_fd, self._wake):
                if fd is not None:
                    os.close(fd)
            self.wake_fd = self._wake = None


class FeedReader:
    """The recorder process's end: takes the records in order (one thread)."""

    def __init__(self, fd: int, size: int) -> None:
        self._mapped = _Mapped(fd, size)
        self._tail = 0
        self._parts: list[bytes] = []  # the fragments of a record begun
        self._kind = 0
        self._stamp = 0.0
        self._aux = 0

    def ready(self) -> int:
        """The bytes appended and not yet taken."""
        mapped = self._mapped
        head = int(mapped.words[_HEAD])
        if mapped.fence is not None:
            mapped.fence()
        return head - self._tail

    def records(self) -> Iterator[tuple[int, float, int, memoryview]]:
        """``(kind, stamp, aux, payload)`` of each whole record appended so far, in order.

        A payload is a view of the ring, valid until the next record is taken: copy what must
        outlive it. The records taken are given back to the writer (tail) once the loop is
        done with the last of them (or when it stops early, up to the record it stopped at).
        """
        view, size = self._mapped.view, self._mapped.size
        mask, unpack = size - 1, HEADER.unpack_from
        tail = given = self._tail
        end = tail + self.ready()
        try:
            while tail < end:
                if tail - given > size >> 3:  # room for the writer as the batch goes
                    self._tail = given = tail
                    self.give_back()
                offset = tail & mask
                if size - offset < 24:  # HEADER.size: no room for a header before the end
                    tail += size - offset
                    continue
                nbytes, code, stamp, aux = unpack(view, DATA + offset)
                if code == WRAP:
                    tail += size - offset
                    continue
                start = DATA + offset + 24
                tail += 24 + ((nbytes + _PAD) & ~_PAD)
                self._tail = tail
                if code < MORE and code != CONT:
                    yield code, stamp, aux, view[start : start + nbytes]
                    continue
                whole = self._fragment(code, stamp, aux, view[start : start + nbytes])
                if whole is not None:
                    yield self._kind, self._stamp, self._aux, whole
        finally:
            self._tail = tail
            self.give_back()

    @property
    def size(self) -> int:
        return self._mapped.size

    def _fragment(self, code: int, stamp: float, aux: int, payload: memoryview) -> memoryview | None:
        """Collect a fragment; the whole record once its last fragment came."""
        if code & ~MORE != CONT:
            self._kind, self._stamp, self._aux = code & ~MORE, stamp, aux
            self._parts = []
        self._parts.append(bytes(payload))
        if code & MORE:
            return None
        whole = memoryview(b"".join(self._parts))
        self._parts = []
        return whole

    def give_back(self) -> None:
        """Let the writer reuse the bytes of the records taken."""
        mapped = self._mapped
        if mapped.fence is not None:
            mapped.fence()
        mapped.words[_TAIL] = self._tail

    def count(self, messages: int) -> None:
        """Publish the messages written so far (``recorder.messages`` in the run's process)."""
        self._mapped.words[_MESSAGES] = messages

    def close(self) -> None:
        self._mapped.close()
