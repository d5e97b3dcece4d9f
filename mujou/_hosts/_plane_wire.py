"""The bytes of one message of the data plane between hosts (hosts.data-plane): one byte tensor
that one Gloo send carries.

A message is its signature, its header, then its tensors' bytes, each at a multiple of
``ALIGN`` bytes from the start:

- the signature: keyed BLAKE2b of the header under the run's key (32 bytes: BLAKE2's own
  MAC, about half the cost of HMAC-SHA256 in Python);
- the header: ``_FIXED`` (the header's length, the kind, the room of the next message, the
  stamp, the sender's number, the count of tensors, the length of a nest's structure), then
  each tensor's dtype (an index into ``DTYPES``) and shape, then the nest's structure, pickled
  (none for a bare tensor).

A receiver checks the signature before it reads anything else of the header, and unpickles a
nest's structure only then: bytes that were not sent by the run are refused (``ValueError``)
without a look at them. The tensors' bytes are not signed: they are only ever bytes of a
tensor, checked against the signed dtypes and shapes.

The kinds: a message (``MESSAGE``), the announcement of more room for the next message
(``GROW``, no tensor), and the end of the channel (``BYE``). Each says how many bytes the
receiver's next receive is to take (``room``).

NOTE [ the hot path of a channel ]
Most channels carry a bare tensor of one dtype and shape, message after message. For such a
message the sender writes only the stamp, the number, the signature and the tensor's bytes
(``Outgoing.encode_again``), and the receiver compares the signed header, but its stamp and
number, with the last one's and reads only those two (``Incoming.read``); the signature is
checked on every message all the same. Measured (2026-12-03, load 4-6 on 2 cores, min of 15
warm loops): the sender's path from the watcher to Gloo's send 7.1 to 5.2-5.6 µs at 256 B,
the read 1.2-2.5 to 0.9-1.9 µs. In the hand-off itself (``bench/mujou_hosts.py``, send to
read p50, base and new alternated, 3 s each, load 3.5-6.6), the gain was below the noise: at
256 B base 184-240 µs, new 179-265 µs, the bare Gloo reference 116-118 µs; at 64 KiB base
198-283 µs, new 159-260 µs, the reference 120-142 µs. The live split
at 256 B (load 2-5, p50 per step): stamp to the watcher 7 µs; the watcher to Gloo's send
24 µs; Gloo's send call 56-69 µs (the reference pays it too); read 10-13 µs; join and
publish 10-11 µs; publish to the node's update 22-28 µs, the engine's path
(``_engine._lend.Lender.received``: the arrival, ``take_for_host``, the batch runner,
``host_done``), over half of what the receiving side adds to the reference, and most of it
beyond this module. Since cut (2026-12-04): the receiving thread claims the update in one step
(NOTE [ the receiver claims its update ] in ``_engine._batches``) and reads its torch settings
after each update instead of at each arrival: from ``Lender.received`` to the hook's first
line 39.5k instructions a message before, 27.2k after the claim (callgrind); from Gloo's recv
returning to the hook 129 lines of Python now (59 fewer from the claim, 9 from the settings),
against 77 on the sending side from ``Output.send`` to Gloo's send. Live split at 256 B after
the claim (load 4-5): sent to the recv returning 127-193 µs (the reference's whole hand-off
100-130 µs), read 9-11 µs, join and publish 10-12 µs, then to the hook's read 33-39 µs: what
is left is mostly before the recv returns, and the batch runner's per-update path (47 of the
129 lines). ``bench/run.py --quick --repeats 3
--only cross-host-256B,cross-host-64KiB --systems mujou,floor``, base and new alternated
twice (load 2.7-4.6): at 256 B base 1.64x and 2.39x, new 1.61x and 1.85x; at 64 KiB base
1.60x and 1.45x, new 1.32x and 1.40x: on this machine the spread between runs is larger than
the change. Since (2026-12-04): the receiver makes each tensor's view in the next receive's
buffer with two torch calls (the buffer as the dtype, ``as_strided``) instead of three (a
slice, ``view``, ``reshape``): ``Incoming.buffer`` of a bare 256 B tensor, timeit min,
base and new alternated twice in the same minute (load 3.0-3.3): 6.3 µs to 4.6-4.8 µs.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import math
import pickle
import struct
from typing import Any

import torch

from .._processes._wire import Crossing, Rest

ALIGN = 16  # bytes: each tensor starts at a multiple of this in a message (for .view(dtype))
ROOM = 4096  # bytes: the room of a channel's first receive, and the least room of any
SHRINK = 4  # a message this many times smaller than the room makes the next room its size
MESSAGE, GROW, BYE = 0, 1, 2
_MAC = 32  # bytes of the signature
# The header's length (from its start, after the signature), its kind, the next message's room,
# the stamp, the sender's number, the count of tensors, the length of the pickled structure.
_FIXED = struct.Struct("<IB3xQdqII")
_TENSOR = struct.Struct("<BB")  # a tensor's dtype (index into DTYPES) and its number of dimensions
_EXTENT = struct.Struct("<q")
_STAMP = struct.Struct("<dq")  # the stamp and the sender's number, in the fixed header
_STAMP_AT = _MAC + 16  # where they are in a message: after the header's length, kind and room
_STAMP_END = _STAMP_AT + _STAMP.size
_LENGTH = struct.Struct("<I")  # the header's length, first in it
# The dtypes a tensor may have, by index (the same torch on every host: hosts.refused).
DTYPES: tuple[torch.dtype, ...] = tuple(
    dtype
    for name in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex32",
        "complex64",
        "complex128",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    )
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
)
_INDEX = {dtype: i for i, dtype in enumerate(DTYPES)}
_memmove = ctypes.memmove
_Shape = tuple[torch.dtype, tuple[int, ...], int, int, tuple[int, ...]]  # Incoming's, of a tensor


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def signer(key: bytes) -> Any:
    """The MAC of ``key`` (keyed BLAKE2b), to be copied for each message (cheaper than a new one)."""
    return hashlib.blake2b(key=key, digest_size=_MAC)


class Outgoing:
    """One channel's messages laid out to be sent: ``layout`` a message (its size in bytes),
    then ``encode`` it into a buffer that messages of the same tensors' dtypes and shapes and
    the same length of structure share: only the header's stamp, number, room and structure,
    the signature and the tensors' bytes are written again. The buffer is written again only
    once the send of the last message completed (``_plane._Outbox`` sends one at a time)."""

    __slots__ = (
        "_bare",
        "_copies",
        "_count",
        "_end",
        "_header",
        "_key",
        "_layout_end",
        "_memory",
        "_number",
        "_rest",
        "_sign",
        "_stamp",
        "_tensors",
        "buffer",
        "size",
    )

    def __init__(self, sign: Any) -> None:
        self._sign = sign
        self._key: tuple[Any, ...] | None = None  # the tensors' dtypes, layouts and shapes, the rest's length
        self._bare: tuple[torch.dtype, torch.Size] | None = None  # the last message's, if a bare tensor
        self._tensors: list[torch.Tensor] = []
        self._rest = b""
        self._stamp = 0.0
        self._number = 0
        self._count = 0
        self._layout_end = 0  # where the header's structure begins
        self._end = 0  # where the header ends
        self._copies: list[tuple[int, int]] = []  # each tensor's address and length in bytes
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self._memory = memoryview(b"")
        self._header = self._memory  # the signed bytes: the header, its structure included
        self.size = 0

    def layout(self, crossing: Crossing) -> int:
        """Take ``crossing`` as the next message: its size in bytes."""
        _, tensors, rest, self._stamp, self._number = crossing
        if rest is None and len(tensors) == 1:  # a bare tensor, the hot path: no new list
            tensor = _plain(tensors[0])
            if tensor is not tensors[0]:
                tensors = [tensor]
            self._rest = b""
            key: tuple[Any, ...] = (tensor.dtype, tensor.layout, tensor.shape, 0)
        else:
            tensors = [_plain(tensor) for tensor in tensors]
            self._rest = b"" if rest is None else pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL)
            key = (*((t.dtype, t.layout, t.shape) for t in tensors), len(self._rest))
        self._tensors = tensors
        if key != self._key:
            self._lay_out(tensors, key)
        return self.size

    def encode_again(self, tensor: torch.Tensor, stamp: float, number: int) -> torch.Tensor | None:
        """The hot path of ``layout`` and ``encode``: ``tensor``, a bare CPU tensor, as the
        next message, if the last message was a bare tensor of its dtype and shape, already
        encoded: then only the stamp, the number, the signature and the tensor's bytes are
        written, and the room stays the last one's (``next_room`` gives it again for a message
        of the same size). None otherwise, with nothing written: ``layout`` and ``encode`` then."""
        bare = self._bare
        if (
            bare is None
            or tensor.dtype is not bare[0]
            or tensor.shape != bare[1]
            or not tensor.is_contiguous()
            or tensor.is_neg()
            or tensor.is_conj()
        ):
            return None
        memory = self._memory
        _STAMP.pack_into(memory, _STAMP_AT, stamp, number)
        mac = self._sign.copy()
        mac.update(self._header)
        memory[:_MAC] = mac.digest()
        address, nbytes = self._copies[0]
        if nbytes:
            _memmove(address, tensor.data_ptr(), nbytes)
        return self.buffer

    def _lay_out(self, flat: list[torch.Tensor], key: tuple[Any, ...]) -> None:
        """A new layout: the tensors' dtypes and shapes in the header, a buffer of its size."""
        self._bare = None
        parts = []
        for tensor in flat:
            index = _INDEX.get(tensor.dtype)
            if index is None or tensor.layout != torch.strided or tensor.is_quantized:
                raise TypeError(
                    f"a tensor of dtype {tensor.dtype} and layout {tensor.layout} cannot cross hosts: "
                    "the data plane takes dense tensors of the dtypes "
                    + ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
                )
            parts.append(_TENSOR.pack(index, tensor.dim()))
            parts.extend(_EXTENT.pack(extent) for extent in tensor.shape)
        layout = b"".join(parts)
        self._layout_end = _MAC + _FIXED.size + len(layout)
        self._end = self._layout_end + len(self._rest)
        offsets = []
        offset = aligned(self._end)
        for tensor in flat:
            nbytes = tensor.numel() * tensor.element_size()
            offsets.append((offset, nbytes))
            offset += aligned(nbytes)
        self.size = offset
        self.buffer, self._memory = _buffer(offset)
        base = self.buffer.data_ptr()
        self._copies = [(base + offset, nbytes) for offset, nbytes in offsets]
        self._count = len(flat)
        self._memory[_MAC + _FIXED.size : self._layout_end] = layout
        self._header = self._memory[_MAC : self._end]
        self._key = key

    def encode(self, room: int) -> torch.Tensor:
        """The message ``layout`` took, announcing ``room`` bytes for the next one: the
        buffer, which the next ``encode`` writes again."""
        memory, rest, end = self._memory, self._rest, self._end
        _FIXED.pack_into(
            memory, _MAC, end - _MAC, MESSAGE, room, self._stamp, self._number, self._count, len(rest)
        )
        if rest:
            memory[self._layout_end : end] = rest
        mac = self._sign.copy()
        mac.update(self._header)
        memory[:_MAC] = mac.digest()
        tensors = self._tensors
        for tensor, (address, nbytes) in zip(tensors, self._copies, strict=True):
            if nbytes:
                _memmove(address, tensor.data_ptr(), nbytes)
        bare = len(tensors) == 1 and not rest
        self._bare = (tensors[0].dtype, tensors[0].shape) if bare else None
        self._tensors = []  # the message's tensors are not kept past their send
        return self.buffer


def _buffer(size: int) -> tuple[torch.Tensor, memoryview]:
    """A byte tensor of ``size`` bytes, and a memoryview of its memory (read and written
    without a torch call: a call costs more than the bytes of a header)."""
    tensor = torch.empty(size, dtype=torch.uint8)
    if not size:
        return tensor, memoryview(bytearray())
    return tensor, memoryview((ctypes.c_ubyte * size).from_address(tensor.data_ptr())).cast("B")


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as bytes in memory order (a conjugate or negative view resolved): itself
    where it is already."""
    if tensor.is_contiguous() and not (tensor.is_conj() or tensor.is_neg()):
        return tensor
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    return tensor.contiguous()


def control(kind: int, sign: Any, room: int) -> torch.Tensor:
    """A message of no tensor: ``GROW`` (the next receive takes ``room`` bytes) or ``BYE``."""
    header = _FIXED.pack(_FIXED.size, kind, room, 0.0, 0, 0, 0)
    payload = torch.empty(aligned(_MAC + len(header)), dtype=torch.uint8)
    _signed_into(payload.data_ptr(), sign, header)
    return payload


def _signed_into(address: int, sign: Any, header: bytes) -> None:
    mac = sign.copy()
    mac.update(header)
    signed = mac.digest() + header
    ctypes.memmove(address, signed, len(signed))


def next_room(size: int, room: int) -> int:
    """The room to give the message after one of ``size`` bytes that went into ``room``: as
    much again, unless this one was much smaller (the buffers stay near the messages' size)."""
    return room if size * SHRINK >= room else max(ROOM, size)


class Incoming:
    """One channel's receiving side: the buffer of the next receive (``buffer``), and what a
    message received into it is (``read``).

    The buffer is made before the receive is posted, with views of the tensors a message of
    the last one's layout would carry in it: such a message is read without a torch call (a
    call costs more than the bytes of a header). Each message gets a buffer of its own, as
    readers keep its tensors."""

    __slots__ = (
        "_again",
        "_buffer",
        "_layout",
        "_memory",
        "_name",
        "_shapes",
        "_sign",
        "_views",
        "kind",
        "room",
    )

    def __init__(self, name: str, sign: Any) -> None:
        self._name = name
        self._sign = sign
        self._layout = b""  # the last message's header after the fixed part, but its structure
        self._shapes: list[_Shape] = []  # each tensor's dtype, shape, offset, bytes and strides
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._memory = memoryview(b"")
        self._views: list[torch.Tensor] | None = None
        # The last message's signed header but its stamp and number, if it carried no
        # structure: its end, its bytes before the stamp, its bytes after the number.
        self._again: tuple[int, bytes, bytes] | None = None
        self.kind = MESSAGE
        self.room = ROOM

    def buffer(self, room: int) -> torch.Tensor:
        """A buffer of ``room`` bytes for the next receive."""
        self._buffer, self._memory = _buffer(room)
        shapes = self._shapes
        fits = bool(shapes) and shapes[-1][2] + shapes[-1][3] <= room
        self._views = self._viewed(shapes) if fits else None
        return self._buffer

    def _viewed(self, shapes: list[_Shape]) -> list[torch.Tensor]:
        """The views of the tensors of ``shapes`` in the buffer: two torch calls each, the
        buffer's bytes as the dtype, then the tensor's place in them (a slice, a ``view`` and a
        ``reshape`` took twice as long: a message's receive posted sooner)."""
        whole, size = self._buffer, len(self._memory)
        if size % ALIGN:  # each dtype's size divides ALIGN
            whole = whole[: size - size % ALIGN]
        return [
            whole.view(dtype).as_strided(shape, strides, offset // dtype.itemsize)
            for dtype, shape, offset, _, strides in shapes
        ]

    def read(self) -> Crossing | None:
        """Check the signature of the received message's header (``ValueError`` naming the
        output if it is not the run's), then read it: its kind and next room (``kind``,
        ``room``) and, for a message, what it carries; None for any other kind."""
        name, memory = self._name, self._memory
        again, views = self._again, self._views
        # The hot path: the last message's length, kind and room (as the length alone is read
        # before the signature below), then the signature, then the rest of its layout.
        if again is not None and views is not None and memory[_MAC:_STAMP_AT] == again[1]:
            end = again[0]
            mac = self._sign.copy()
            mac.update(memory[_MAC:end])
            if not hmac.compare_digest(mac.digest(), memory[:_MAC]):
                raise ValueError(
                    f"a message on {name!r} is not signed with the run's key: it was not sent by the run"
                )
            if memory[_STAMP_END:end] == again[2]:
                stamp, number = _STAMP.unpack_from(memory, _STAMP_AT)
                return name, views, None, stamp, number
        total = len(memory)
        if total < _MAC + _FIXED.size:
            raise ValueError(f"a message on {name!r} is shorter than its header")
        (length,) = _LENGTH.unpack_from(memory, _MAC)
        if length < _FIXED.size or _MAC + length > total:
            raise ValueError(f"a message on {name!r} is shorter than its header")
        end = _MAC + length
        mac = self._sign.copy()
        mac.update(memory[_MAC:end])
        if not hmac.compare_digest(mac.digest(), memory[:_MAC]):
            raise ValueError(
                f"a message on {name!r} is not signed with the run's key: it was not sent by the run"
            )
        _, self.kind, self.room, stamp, number, count, rest_length = _FIXED.unpack_from(memory, _MAC)
        self._again = None
        if self.kind != MESSAGE:
            return None
        # The layout read with its own length: a change in the structure's length moves the tensors.
        layout_end = end - rest_length
        layout = _LENGTH.pack(length) + memory[_MAC + _FIXED.size : layout_end]
        if layout != self._layout or self._views is None:
            self._read_layout(layout, count, aligned(end))
        tensors = self._views
        assert tensors is not None
        if not rest_length:
            self._again = (end, bytes(memory[_MAC:_STAMP_AT]), bytes(memory[_STAMP_END:end]))
        rest: Rest = pickle.loads(memory[layout_end:end]) if rest_length else None
        return name, tensors, rest, stamp, number

    def _read_layout(self, layout: bytes, count: int, offset: int) -> None:
        """A message of another layout than the last: its tensors' dtypes, shapes and places,
        and their views (``ValueError`` if the buffer is too short for them)."""
        shapes = []
        at = _LENGTH.size
        for _ in range(count):
            index, dims = _TENSOR.unpack_from(layout, at)
            at += _TENSOR.size
            shape = struct.unpack_from(f"<{dims}q", layout, at)
            at += dims * _EXTENT.size
            dtype = DTYPES[index]
            nbytes = math.prod(shape) * dtype.itemsize
            if offset + nbytes > len(self._memory):
                raise ValueError(f"a message on {self._name!r} is shorter than its tensors")
            shapes.append((dtype, shape, offset, nbytes, _strides(shape)))
            offset += aligned(nbytes)
        self._shapes, self._layout = shapes, layout
        self._views = self._viewed(shapes)


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``, in elements."""
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))
