"""The shared-memory ring that carries one output's messages to readers in other processes.

One writer (the process that owns the output) copies each message's tensor leaves into the
next of K preallocated slots of one shared-memory buffer; any number of readers, in any
process, take the newest complete slot and copy it out. Latest value, as everywhere in
Mujou: a reader that is slow misses messages, it never sees a half-written one.

The buffer is a ``torch.uint8`` tensor in shared memory (``share_memory_()``); it reaches
other processes inside an :class:`Announce`, pickled by multiprocessing's ForkingPickler
(``Connection.send`` uses it), for which ``torch.multiprocessing`` registers the reduction
that passes a file descriptor instead of the bytes. Under the default ``file_descriptor``
strategy on Linux the segment has no name in ``/dev/shm`` once made, and it is freed when
the last process drops its tensor.

Layout of the buffer (``int64`` words, then bytes)::

    word 0  started   the number of the write the writer began last (0: none)
    word 1  done      the number of the write the writer finished last (0: none)
    word 2  waiting   set by a reader that gave up waiting for a write begun, cleared by
                      the writer as it wakes the readers again (NOTE [ the wake before the copy ])
    words 3..7        padding: the counters have the first cache line to themselves
    words 8+2k, 9+2k  slot k's message number, and its stamp (a float64 in the word)
    ...               padding to a multiple of 64 bytes
    K slots           each holds every leaf back to back, each leaf 64-byte aligned

A *structured* ring (``Announce.structured``) is the same, but the last leaf of each slot is
the writer's caller's data about the message, not one of its tensors (the wire puts a nest's
structure there, so that the slot alone makes the whole message).

Write n (1, 2, 3, ...) goes to slot ``n % K``. A message of another layout (leaf count,
dtype or shape of a leaf) gets a new buffer: a new ring of the next generation, which the
writer's caller announces to every reader before it tells them about the write.

NOTE [ the ring's seqlock ]

Writer, write n::                        Reader::

    started = n                             d = done        (0: nothing yet)
    fence                                   fence
    copy the leaves into slot n % K         copy slot d % K out, its number, its stamp
    slot's number, stamp                    fence
    fence                                   s = started
    done = n                                if s >= d + K: retry, else return the copy

Why the copy the reader returns is exactly write d: write d finished before the reader read
``done == d`` (the writer's second fence orders the copy before the store of ``done``; the
reader's first fence orders its load of ``done`` before its copy), so the reader sees all of
write d's bytes or later ones. Later bytes in slot ``d % K`` can only come from write d + K,
d + 2K, ..., and the writer stored ``started >= d + K`` before its first fence, ahead of any
of those bytes; so if any load of the reader's copy saw one of them, the reader's load of
``started`` after its second fence sees ``started >= d + K`` (fence-to-fence ordering, the
same argument as C11's ``atomic_thread_fence`` pairing), and the reader retries. Writes
d + 1 .. d + K - 1 go to other slots and do not matter. The counters only grow (int64: no
wrap in practice), so a stale ``done`` only makes the reader's copy older, never wrong.

NOTE [ a reader that keeps being lapped ]

A retry starts from the newest ``done``, so the writer laps a reader only by finishing K
writes during one of its copies: a fast writer of large messages, or a reader descheduled
mid-copy. No way of copying returns a whole slot from a writer that keeps doing that (the
reader cannot hold the writer back: a send never waits for a reader, proc.latest-value), so
``latest`` gives up after ``_TRIES`` copies and returns None ("nothing whole now"). Nothing is
lost by it: the writer's caller sends a record after each write (the wire's records, of which
a full pipe keeps the newest), so the write that lapped the last copy is followed by a record
that makes the reader try again, and the record after the writer's last write finds a slot
the writer no longer touches (it gets there after that write finished; only another write
can make that copy fail, and that write sends a record of its own). The receiver's thread
thus never spins for ever on one output, and the newest message still gets through once the
writer leaves the reader the time of one copy.

The header words are read and written through memoryviews of the buffer: each access is
one aligned 8-byte load or store in C (a ``memcpy`` of 8 bytes), so a counter is never torn,
and each is a separate C call the compiler cannot move past the copies around it. The
leaves are copied by torch (``copy_``, ``clone``), which may use any instructions (vector or
non-temporal stores, ``rep movsb``) and, for large tensors, its intra-op threads; their join
orders those threads' accesses before the caller's next step, as torch's own results rely on;
or by memoryview copies, one ``memmove`` each, on the reader's plain path (NOTE [ the plain
path ]).

NOTE [ the plain path ]

Most messages are one dense CPU tensor. For those the ring is *plain* (``_Ring.plain``: one
leaf, not structured, a real dtype, not empty; complex and empty leaves go the general way,
which copies them the same way), and the writer takes a CPU tensor of exactly that dtype
and shape, strided and not nested (``_fits_plain``), with the fewest calls:
``RingWriter.write_plain``, which the wire's sender calls for a bare tensor and ``write``
takes first, checks those six properties and copies with one ``copy_`` into the slot's view
(any strides, a negative bit, a tensor that requires grad, detached). The reader copies each
leaf with a memoryview assignment into the spare tensors' bytes (``_copy_into``), and reads
the header through memoryviews: no torch call and no ctypes call on its path (a memoryview's
item or copy 0.05-0.1 us warm). The memoryviews are made over raw addresses
(``bytes_at``, CPython's ``PyMemoryView_FromMemory``) and do not keep the memory alive: the
ring keeps its buffer (``_Ring.announce``) and the reader its spare tensors while their views
are used. Measured in a warm loop, 256 B, at load 5-6: ``write`` 4.3-5.1 us before, 3.2-3.7
after; ``latest`` into a spare 2.4-2.9 either way. The gain is in the cold path of the
bench (a message a millisecond): the reader's step from the pipe's read to the copy out
went from 17-20 us to 9-12 (NOTE [ the hand-off between processes ] in ``_inbox``).

The writer copied a plain leaf with a ctypes ``memmove`` from the tensor's data pointer
before, which needed two more properties (``is_contiguous``, ``is_neg``) and ``data_ptr``:
0.7 us warm against ``copy_``'s 1.6, but run cold, as in the bench, each such C call costs
several times its warm time (after a millisecond's sleep and a walk over 8 MB: the eight
properties 8.1 us, a ctypes memmove of 256 B 8.7), and one ``copy_`` costs less than the
calls it replaces: the sender's stamp to its record written 33.0 -> 24.5 us (median of five
runs each, base and new alternated, 256 B, load 6-8.5; the ring's write alone 11.5 -> 7.8).

NOTE [ the wake before the copy ]

``write_plain`` tells the readers before it copies: it stores ``started``, calls ``wake``
(the sender's records, an ``os.write`` to each reader's process), then copies the slot and
stores ``done``. Waking a reader's thread takes longer than the copy (on a quiet 16-core
machine 34 us from the sender's write to the woken reader, against 10-14 us of the plain
write's checks and copy run cold, 20-28 at 64 KiB): the copy is done while the reader wakes,
not before the record that wakes it. The reader reads ``started`` first (``latest``): a
write begun and not done is waited for (``_settle``: a few looks, then yields of the CPU, so
that a writer on the same CPU can finish, for up to ``SETTLE``), and the reader then takes it
as the seqlock says. A write that does not finish by then (its writer stopped or descheduled
in the middle of a copy) leaves the reader with the newest complete slot: the reader sets
the header's ``waiting`` word, and the writer, which looks at it once done, clears it and
wakes the readers again (the records once more). That look is not fenced (a fence is a
C call on every write), so in the few nanoseconds where a reader's store and the writer's
look cross both can miss the other: ``RingReader.unsettled`` then tells the caller to look
again, and the inbox's thread looks every ``_RECHECK`` until that write is done. A writer
never waits for a reader (proc.latest-value), and no reader sees a slot half written: only
the record's place changed. ``write``'s other paths (a new layout: a new ring, a nest) still
send their records after the write, as an announcement must come before them; a reader that
meets one of those writes begun waits for it the same way, or gets its record later.

On x86-64 the reader needs no fence instruction: its loads are not reordered with one
another (TSO), and each of its three steps is a C call of its own, which the compiler cannot
move; so the reader does not fence there (``_READ_FENCED``: each fence was a ctypes call on the
reader's path, a few microseconds with cold caches). The writer's stores are kept in order by TSO too,
except non-temporal ones, which glibc's ``memcpy`` uses only above a threshold of at least
0x4040 bytes: so on x86-64 the writer of a ring whose slots are smaller than 0x4000 bytes
does not fence (``_Ring.fenced``), and a larger one does.

The fences make this hold on every CPU, whatever instructions torch's copies use. Neither
torch nor CPython offers one, so ``_fence`` is C11 ``atomic_thread_fence(memory_order_seq_cst)``
from libatomic (``mfence`` on x86-64, which orders every store, non-temporal ones included;
``dmb ish`` on aarch64), or ``OSMemoryBarrier`` on macOS. Without libatomic, x86 takes and
releases a private lock instead: a locked compare-and-swap, a full fence for ordinary loads
and stores (with TSO, all a seqlock needs). Non-temporal stores, which a large ``memcpy``
may use, are ordered by it on Intel; on AMD only by the ``sfence`` glibc puts after them,
which orders them before ``done`` but not after ``started``: the one gap left, on x86
machines without libatomic. A weakly ordered CPU (aarch64, POWER) without libatomic gets
no ring: a clear error when one is made, rather than rare torn messages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch

# Registers ForkingPickler's reductions of tensors: a shared one travels as a file descriptor.
import torch.multiprocessing

Layout = tuple[tuple[torch.dtype, tuple[int, ...]], ...]
"""Per tensor leaf of a message: its dtype and shape."""

_ALIGN = 64  # bytes: a cache line, and a multiple of every dtype's size (views need that)
_STARTED = 0  # header word indices (see the module docstring)
_DONE = 1
_WAITING = 2
_SLOT_WORDS = 8  # slot k's number is word 8 + 2k, its stamp word 9 + 2k
_SPINS_BEFORE_YIELD = 100  # reader retries before it yields the CPU between tries
_TRIES = 1000  # copies a reader tries before it gives up (NOTE [ a reader that keeps being lapped ])
# A reader that finds a write begun and not done (NOTE [ the wake before the copy ]): looks
# this many times, then yields the CPU between looks for up to SETTLE seconds. A plain write
# copies a slot in microseconds; a writer stopped in the middle (a signal, descheduled) is
# looked at again later by the reader's caller, so this bounds the wait, not the delivery.
_SETTLE_SPINS = 64
SETTLE = 0.0002  # s


def _align(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


# --- the fence -------------------------------------------------------------------------------

_SEQ_CST = 5  # C11's memory_order_seq_cst


def _fence_libraries() -> Iterator[tuple[str, str]]:
    """Where a full fence may be: (library, function), the likeliest first."""
    yield "libatomic.so.1", "atomic_thread_fence"  # GCC's runtime on Linux
    found = ctypes.util.find_library("atomic")  # runs ldconfig or the compiler: only if needed
    if found is not None:
        yield found, "atomic_thread_fence"
    if sys.platform == "darwin":  # pragma: no cover (no macOS in CI)
        yield "/usr/lib/libSystem.B.dylib", "OSMemoryBarrier"


def _find_fence() -> tuple[Callable[[], None], str | None]:
    """The full memory fence of this machine, and None; or a stand-in and why there is none."""
    for library, name in _fence_libraries():
        try:
            fence = getattr(ctypes.CDLL(library), name)
        except (OSError, AttributeError):
            continue
        if name == "OSMemoryBarrier":  # pragma: no cover (no macOS in CI)
            fence.argtypes, fence.restype = [], None
            return fence, None
        fence.argtypes, fence.restype = [ctypes.c_int], None
        return functools.partial(fence, _SEQ_CST), None  # partial: no Python frame per fence
    if platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}:
        # Taking an uncontended lock is a locked compare-and-swap (CPython's lock, glibc's
        # semaphore), which x86 orders like a full fence (see the module docstring for
        # non-temporal stores); the lock itself guards nothing.
        lock = threading.Lock()

        def locked_fence() -> None:
            lock.acquire()
            lock.release()

        return locked_fence, None
    return (lambda: None), (
        f"the shared-memory ring between processes needs a memory fence on this "
        f"{platform.machine()!r} CPU, from libatomic (C11 atomic_thread_fence), which was not "
        "found; install libatomic (e.g. the libatomic1 package)"
    )


# A full memory fence (NOTE [ the ring's seqlock ]); _NO_FENCE says why there is none.
_fence, _NO_FENCE = _find_fence()
# The reader's fences: none on x86-64, where loads are not reordered with other loads (TSO),
# so the reader's three steps (done, the copy, started) stay in order without a fence; each
# is a separate C call, which the compiler cannot move past the others. Elsewhere the fence
# (a flag, not a no-op function: no Python call on the reader's path where it does nothing).
_TSO = platform.machine().lower() in {"x86_64", "amd64"}
_READ_FENCED = not _TSO
# Slots smaller than this are copied with ordinary stores on x86-64 (glibc takes non-temporal
# stores only above its threshold, 0x4040 bytes at the least), so their writer needs no
# fence either: TSO keeps its stores in order. Larger slots keep the writer's fences.
_PLAIN_STORES_BELOW = 0x4000


# --- copies (module level, so a test can interleave a writer with them) --------------------


def _copy_in(slot_view: torch.Tensor, tensor: torch.Tensor) -> None:
    slot_view.copy_(tensor)


def _copy_out(slot_view: torch.Tensor) -> torch.Tensor:
    return slot_view.clone()


def _fits_plain(tensor: torch.Tensor, plain: Layout) -> bool:
    """Whether ``tensor`` is a message for the one leaf of a plain ring (``_Ring.plain``: its
    layout): a CPU tensor of exactly that dtype and shape, strided and not nested, which
    ``copy_`` copies into the slot's view as it is (NOTE [ the plain path ])."""
    ((dtype, shape),) = plain
    return (
        tensor.__class__ is _TENSOR
        and tensor.dtype is dtype
        and tensor.is_cpu
        and tensor.layout is _STRIDED
        and not tensor.is_nested  # before the shape: a nested tensor's shape raises
        and tensor.shape == shape
    )


def _settle(words: memoryview, started: int, patience: float) -> bool:
    """Wait until write ``started`` is done, up to ``patience`` seconds: whether it is
    (NOTE [ the wake before the copy ]). Spins a while, then yields the CPU between looks, so
    that a writer on the same CPU (a woken reader may take the writer's) can finish."""
    for _ in range(_SETTLE_SPINS):
        if words[_DONE] >= started:
            return True
    if patience > 0:
        deadline = time.monotonic() + patience
        while words[_DONE] < started:
            if time.monotonic() >= deadline:
                break
            _yield_cpu()
        else:
            return True
    # Given up: the writer is to wake the readers again once done (``_WAITING``); then one
    # more look, as it may have finished before it could see that (the fence orders this
    # store before the look; the writer's look is not fenced, so the caller looks later too).
    words[_WAITING] = 1
    _fence()
    return words[_DONE] >= started


_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))  # releases the GIL


def _copy_into(spare: Sequence[memoryview], leaves: Sequence[memoryview]) -> None:
    """Copy a slot's ``leaves`` (its bytes) to the bytes of the spare tensors."""
    if len(spare) == 1:  # a plain ring's: without zip (with strict=, 1.7k instructions)
        spare[0][:] = leaves[0]
        return
    for target, source in zip(spare, leaves, strict=True):
        target[:] = source  # a memmove, without a ctypes call (NOTE [ the plain path ])


def bytes_at(address: int, nbytes: int) -> memoryview:
    """A writable view of the ``nbytes`` bytes at ``address`` (of a tensor, or the ring's
    buffer): it does not keep them alive, so whoever makes it keeps their owner with it."""
    if nbytes == 0:
        return memoryview(bytearray())
    return cast(memoryview, _from_memory(address, nbytes, _PYBUF_WRITE))


_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_from_memory.restype = ctypes.py_object
_PYBUF_WRITE = 0x200
_TENSOR = torch.Tensor
_STRIDED = torch.strided


# --- the shared buffer -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Announce:
    """A ring of one output, as its readers get it: send it with ForkingPickler.

    ``Connection.send`` does; plain ``pickle`` would copy the buffer's bytes instead of
    sharing it, which :class:`RingReader` refuses. Under torch's ``file_descriptor``
    strategy the receiver fetches the descriptor from the sender's multiprocessing resource
    sharer as it unpickles, so the sending process must live until then; an announce that is
    sent and never received keeps a descriptor open in the sender until it exits.
    """

    layout: Layout
    generation: int  # 1 for the first ring of an output, +1 at each re-allocation
    slots: int
    buffer: torch.Tensor  # uint8, in shared memory: the header, then the slots
    structured: bool = False  # the last leaf is not a tensor of the message: the caller's data


class _Ring:
    """Views of one ring's buffer: its header words, and each slot's leaves."""

    def __init__(self, announce: Announce) -> None:
        if _NO_FENCE is not None:
            raise RuntimeError(_NO_FENCE)
        self.announce = announce
        self.slots = announce.slots
        buffer = announce.buffer
        header_words = _SLOT_WORDS + 2 * self.slots
        header_bytes = _align(8 * header_words)
        leaves: list[tuple[int, torch.dtype, tuple[int, ...]]] = []
        slot_bytes = 0
        for dtype, shape in announce.layout:
            leaves.append((slot_bytes, dtype, shape))
            slot_bytes += _align(math.prod(shape) * dtype.itemsize)
        if buffer.dtype != torch.uint8 or buffer.numel() != header_bytes + self.slots * slot_bytes:
            raise ValueError(
                f"announce's buffer does not fit its layout: {buffer.numel()} bytes of "
                f"{buffer.dtype}, expected {header_bytes + self.slots * slot_bytes} of torch.uint8"
            )
        # Whether the writer fences (on x86-64, only a slot that may be copied with
        # non-temporal stores needs it: NOTE [ the ring's seqlock ]).
        self.fenced = not _TSO or slot_bytes >= _PLAIN_STORES_BELOW
        # A plain ring: one leaf, the message itself, of a real dtype and not empty: the
        # writer copies a tensor of that dtype and shape with the fewest calls, and the reader
        # copies the slot's bytes into its spare tensors (NOTE [ the plain path ]).
        self.plain: Layout | None = None
        if len(leaves) == 1 and not announce.structured:
            _, dtype, shape = leaves[0]
            if not dtype.is_complex and math.prod(shape) > 0:
                self.plain = announce.layout
        address = buffer.data_ptr()
        # The views of the header and of the slots' bytes do not keep the buffer alive:
        # self.announce does. An item of a memoryview is one aligned 8-byte load or store.
        header = bytes_at(address, header_bytes)
        self.words = header.cast("q")
        self.floats = header.cast("d")
        self.views: list[list[torch.Tensor]] = []
        for slot in range(self.slots):
            base = header_bytes + slot * slot_bytes
            self.views.append(
                [
                    buffer[base + offset : base + offset + math.prod(shape) * dtype.itemsize]
                    .view(dtype)
                    .view(shape)
                    for offset, dtype, shape in leaves
                ]
            )
        # Per slot, each leaf's (address, bytes), and its bytes: what a reader copies into
        # its spare tensors.
        self.spans = [
            [
                (address + header_bytes + slot * slot_bytes + offset, math.prod(shape) * dtype.itemsize)
                for offset, dtype, shape in leaves
            ]
            for slot in range(self.slots)
        ]
        self.bytes = [[bytes_at(at, nbytes) for at, nbytes in spans] for spans in self.spans]


def _allocate(layout: Layout, slots: int, generation: int, structured: bool) -> _Ring:
    header_bytes = _align(8 * (_SLOT_WORDS + 2 * slots))
    slot_bytes = sum(_align(math.prod(shape) * dtype.itemsize) for dtype, shape in layout)
    buffer = torch.zeros(header_bytes + slots * slot_bytes, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return _Ring(Announce(layout, generation, slots, buffer, structured))


def _layout_of(tensors: Sequence[object]) -> Layout:
    layout = []
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"leaf {index} of the message is not a tensor: {tensor!r}")
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
            raise TypeError(
                f"leaf {index} of the message is a {tensor.layout} "
                f"{'quantized ' if tensor.is_quantized else ''}"
                f"{'nested ' if tensor.is_nested else ''}tensor; "
                "only dense (strided) tensors cross processes"
            )
        layout.append((tensor.dtype, tuple(tensor.shape)))
    return tuple(layout)


def _same_layout(tensors: Sequence[object], layout: Layout) -> bool:
    """Whether ``tensors`` fit ``layout``: the per-write check, without building a layout.

    A quantized tensor never fits: its dtype is none of a layout's (``_layout_of`` refuses it).
    """
    if len(tensors) != len(layout):
        return False
    for tensor, (dtype, shape) in zip(tensors, layout, strict=True):
        if not isinstance(tensor, torch.Tensor) or tensor.layout is not torch.strided or tensor.is_nested:
            return False
        if tensor.dtype is not dtype or tensor.shape != shape:
            return False
    return True


# --- the two ends ----------------------------------------------------------------------------


class RingWriter:
    """The writing end of one output's rings (one ring per layout, the newest in use).

    One thread writes at a time (the output's node): the writer is not thread-safe.
    """

    def __init__(self, slots: int = 4) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int):
            raise TypeError(f"slots must be an int >= 1, got {type(slots).__name__}: {slots!r}")
        if slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        self._slots = slots
        self._ring: _Ring | None = None
        self._generation = 0
        self._count = 0  # writes into the current ring
        self._number: int | None = None  # the last message number written
        self._closed = False

    def write_plain(
        self, tensor: torch.Tensor, stamp: float, number: int, wake: Callable[[], None] | None = None
    ) -> bool:
        """``write([tensor], stamp, number)`` where that is the plain path of the ring in use
        (NOTE [ the plain path ]): the sender's hot path, which ``write`` takes first; whether
        it wrote. False: nothing was done (no plain ring yet, another layout, a tensor that is
        not dense, a number that does not increase, the writer closed): ``write`` goes on.

        ``wake``: called once the write has begun and before its copy, to tell the readers
        (NOTE [ the wake before the copy ]); not called when nothing is written."""
        ring = self._ring
        if ring is None or self._closed:
            return False
        plain = ring.plain
        if plain is None or (self._number is not None and number <= self._number):
            return False
        if not _fits_plain(tensor, plain):
            return False
        n = self._count + 1
        slot = n % ring.slots
        words = ring.words
        words[_STARTED] = n
        fenced = ring.fenced
        if fenced:
            _fence()  # NOTE [ the ring's seqlock ]: started before the slot's bytes
        if wake is not None:
            wake()  # NOTE [ the wake before the copy ]: a reader that comes waits for done
        # detach(): as in write (a slot's view is not to join the message's graph).
        _copy_in(ring.views[slot][0], tensor.detach() if tensor.requires_grad else tensor)
        words[_SLOT_WORDS + 2 * slot] = number
        ring.floats[_SLOT_WORDS + 2 * slot + 1] = stamp
        if fenced:
            _fence()  # the slot's bytes before done
        words[_DONE] = n
        self._count = n
        self._number = number
        if wake is not None and words[_WAITING]:  # a reader gave up waiting for this write
            words[_WAITING] = 0
            wake()  # NOTE [ the wake before the copy ]: again, now that it is done
        return True

    def write(
        self, tensors: Sequence[torch.Tensor], stamp: float, number: int, *, structured: bool = False
    ) -> Announce | None:
        """Copy the tensor leaves of message ``number`` (stamped ``stamp``) into the next slot.

        The tensors may have any dtype, shape and strides (non-contiguous ones too), and
        there may be none. ``number`` must be greater than the last one written.
        ``structured``: the last tensor is the caller's data about the message (its readers
        see ``RingReader.structured``); a change of it, as of the layout, makes a new ring.

        Returns:
            An :class:`Announce` when the ring was (re)allocated for a new layout, the first
            write included: the caller sends it to every reader BEFORE it tells them about
            this write. Else None.

        Raises:
            TypeError: a leaf is not a dense tensor.
            ValueError: ``number`` does not increase.
            RuntimeError: the writer is closed.
        """
        if not structured and len(tensors) == 1 and self.write_plain(tensors[0], stamp, number):
            return None  # NOTE [ the plain path ]
        if self._closed:
            raise RuntimeError("the ring writer is closed")
        if self._number is not None and number <= self._number:
            raise ValueError(f"message numbers must increase: got {number!r} after {self._number!r}")
        ring = self._ring
        announce = None
        if (
            ring is None
            or ring.announce.structured is not structured
            or not _same_layout(tensors, ring.announce.layout)
        ):
            layout = _layout_of(tensors)  # raises on a leaf that is no dense tensor
            self._generation += 1
            ring = self._ring = _allocate(layout, self._slots, self._generation, structured)
            self._count = 0
            announce = ring.announce
        assert ring is not None
        n = self._count + 1
        slot = n % ring.slots
        words = ring.words
        words[_STARTED] = n
        fenced = ring.fenced
        if fenced:
            _fence()  # NOTE [ the ring's seqlock ]: started before the slot's bytes
        for view, tensor in zip(ring.views[slot], tensors, strict=True):
            # A slot's view is a dtype view of the buffer, which autograd does not track
            # back to it: copying a tensor that requires grad would put the view itself in
            # the message's graph. detach() costs less than a no_grad block (0.5 vs 2 us).
            _copy_in(view, tensor.detach() if tensor.requires_grad else tensor)
        words[_SLOT_WORDS + 2 * slot] = number
        ring.floats[_SLOT_WORDS + 2 * slot + 1] = stamp
        if fenced:
            _fence()  # the slot's bytes before done
        words[_DONE] = n
        self._count = n
        self._number = number
        return announce

    def close(self) -> None:
        """Drop this end's references to the ring (readers keep theirs until they close)."""
        self._closed = True
        self._ring = None


class RingReader:
    """A reading end of one output's ring, in any process (one thread at a time)."""

    def __init__(self, announce: Announce) -> None:
        self._ring: _Ring | None = self._open(announce)
        # Whether the last tensor of each slot of the ring read now is the writer's data about
        # the message (``RingWriter.write(structured=True)``): an attribute, read on the hot path.
        self.structured = announce.structured
        # Tensors made ahead (``prepare``) for the next copy out, and their addresses: the
        # copy is then a memmove per leaf, without a tensor made on the reader's path.
        self._spare: list[torch.Tensor] | None = None
        self._spare_bytes: list[memoryview] = []  # their bytes (alive while _spare holds them)
        # Whether the last ``latest`` found a write begun that did not finish while it waited
        # (NOTE [ the wake before the copy ]): its message is still to come.
        self.unsettled = False

    @staticmethod
    def _open(announce: Announce) -> _Ring:
        if not isinstance(announce, Announce):
            raise TypeError(f"expected an Announce, got {announce!r}")
        if not announce.buffer.is_shared():  # type: ignore[no-untyped-call]  # unannotated in torch
            raise ValueError(
                "the announce's buffer is not in shared memory: it was pickled with plain "
                "pickle, which copies it; send it with multiprocessing's ForkingPickler "
                "(Connection.send)"
            )
        return _Ring(announce)

    @property
    def generation(self) -> int:
        """The generation of the ring this reader reads."""
        if self._ring is None:
            raise RuntimeError("the ring reader is closed")
        return self._ring.announce.generation

    def reannounce(self, announce: Announce) -> None:
        """Read the ring of ``announce`` from now on: a newer generation of the same output's.

        Raises:
            ValueError: ``announce`` is not newer than the ring read now.
        """
        if announce.generation <= self.generation:
            raise ValueError(
                f"a re-announce must be of a newer generation than {self.generation}, "
                f"got generation {announce.generation!r}"
            )
        self._ring = self._open(announce)
        self.structured = announce.structured
        self._spare = None
        self._spare_bytes = []

    def prepare(self) -> bool:
        """Make the tensors of the next ``latest`` now (a thread about to wait calls it), if
        they are not made yet; whether it made them."""
        ring = self._ring
        if ring is None or self._spare is not None:
            return False
        spare = [torch.empty(shape, dtype=dtype) for dtype, shape in ring.announce.layout]
        self._spare_bytes = [bytes_at(tensor.data_ptr(), tensor.nbytes) for tensor in spare]
        self._spare = spare
        return True

    def latest(self, patience: float = SETTLE) -> tuple[int, float, list[torch.Tensor]] | None:
        """``(number, stamp, tensors)`` of the newest complete slot; None before any write,
        or when the writer lapped each of ``_TRIES`` copies (NOTE [ a reader that keeps being
        lapped ]: the writer's next record tries again).

        A write begun and not finished yet (its record may come before its copy, NOTE [ the
        wake before the copy ]) is waited for, up to ``patience`` seconds (0: not at all);
        if it did not finish by then, the newest complete slot is returned (or None) and
        ``unsettled`` is set: the caller looks again later.

        The tensors are fresh contiguous CPU copies the caller owns, shaped by the layout.
        Never a half-written slot: when the writer may have overwritten the slot during the
        copy, the reader copies again (NOTE [ the ring's seqlock ]).
        """
        ring = self._ring
        if ring is None:
            raise RuntimeError("the ring reader is closed")
        words = ring.words
        started = words[_STARTED]
        done = words[_DONE]
        if started > done:
            self.unsettled = not _settle(words, started, patience)
            done = words[_DONE]
        elif self.unsettled:
            self.unsettled = False
        slots = ring.slots
        spare = self._spare
        tries = 0
        while True:
            if done == 0:
                return None
            if _READ_FENCED:
                _fence()  # done before the slot's bytes
            slot = done % slots
            if spare is None:
                tensors = [_copy_out(view) for view in ring.views[slot]]
            else:
                _copy_into(self._spare_bytes, ring.bytes[slot])
                tensors = spare
            number = words[_SLOT_WORDS + 2 * slot]
            stamp = ring.floats[_SLOT_WORDS + 2 * slot + 1]
            if _READ_FENCED:
                _fence()  # the slot's bytes before started
            if words[_STARTED] < done + slots:
                if spare is not None:
                    self._spare = None  # handed out: the next copy makes its own
                    self._spare_bytes = []
                return number, stamp, tensors
            # The writer began write done + K (or later) on this slot: the copy may be torn.
            # Copy the newest slot again, at most _TRIES times (NOTE [ a reader that keeps
            # being lapped ]); past a few tries (the reader descheduled, the writer on a
            # faster core) yield the CPU so a spinning reader does not starve the writer it
            # waits for on a busy machine.
            tries += 1
            if tries >= _TRIES:
                return None
            if tries >= _SPINS_BEFORE_YIELD:
                time.sleep(0)
            done = words[_DONE]

    def close(self) -> None:
        """Drop this reader's references to the ring."""
        self._ring = None
