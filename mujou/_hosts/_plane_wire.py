"""The bytes of one message of the data plane between hosts (hosts.data-plane): one byte tensor
that one Gloo send carries.

A message is its signature, its header, then its tensors' bytes, each at a multiple of
``ALIGN`` bytes from the start:

- the signature: HMAC-SHA256 of the header under the run's key (32 bytes);
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
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import pickle
import struct
from typing import Any

import torch

from .._processes._wire import Crossing, Rest

ALIGN = 16  # bytes: each tensor starts at a multiple of this in a message (for .view(dtype))
ROOM = 4096  # bytes: the room of a channel's first receive, and the least room of any
SHRINK = 4  # a message this many times smaller than the room makes the next room its size
MESSAGE, GROW, BYE = 0, 1, 2
_MAC = 32  # bytes of HMAC-SHA256
# The header's length (from its start, after the signature), its kind, the next message's room,
# the stamp, the sender's number, the count of tensors, the length of the pickled structure.
_FIXED = struct.Struct("<IB3xQdqII")
_TENSOR = struct.Struct("<BB")  # a tensor's dtype (index into DTYPES) and its number of dimensions
_EXTENT = struct.Struct("<q")
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


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def signer(key: bytes) -> Any:
    """The HMAC of ``key``, to be copied for each message (cheaper than a new one)."""
    return hmac.new(key, digestmod=hashlib.sha256)


class Outgoing:
    """A message laid out to be sent: its size in bytes, then its bytes (``encode``)."""

    __slots__ = ("_layout", "_number", "_rest", "_stamp", "_tensors", "size")

    def __init__(self, crossing: Crossing) -> None:
        _, tensors, rest, stamp, number = crossing
        flat = [_plain(tensor) for tensor in tensors]
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
        self._layout = b"".join(parts)
        self._rest = b"" if rest is None else pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL)
        self._stamp = stamp
        self._number = number
        self._tensors = flat
        head = _MAC + _FIXED.size + len(self._layout) + len(self._rest)
        self.size = aligned(head) + sum(aligned(t.numel() * t.element_size()) for t in flat)

    def encode(self, sign: Any, room: int) -> torch.Tensor:
        """The message's bytes, announcing ``room`` bytes for the next one."""
        header = (
            _FIXED.pack(
                _FIXED.size + len(self._layout) + len(self._rest),
                MESSAGE,
                room,
                self._stamp,
                self._number,
                len(self._tensors),
                len(self._rest),
            )
            + self._layout
            + self._rest
        )
        payload = torch.empty(self.size, dtype=torch.uint8)
        base = payload.data_ptr()
        _signed_into(base, sign, header)
        offset = aligned(_MAC + len(header))
        for tensor in self._tensors:
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes:
                ctypes.memmove(base + offset, tensor.data_ptr(), nbytes)
            offset += aligned(nbytes)
        return payload


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as bytes in memory order (a conjugate or negative view resolved)."""
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
    """A received message's signed header: its kind, the next room, and what it carries."""

    __slots__ = ("_layouts", "_start", "kind", "number", "rest", "room", "stamp")

    def __init__(self, name: str, payload: torch.Tensor, sign: Any) -> None:
        """Check the signature of ``payload``'s header (``ValueError`` naming output ``name``
        if it is not the run's), then read the header."""
        total = payload.numel()
        base = payload.data_ptr()
        if total < _MAC + _FIXED.size:
            raise ValueError(f"a message on {name!r} is shorter than its header")
        (length,) = struct.unpack_from("<I", ctypes.string_at(base + _MAC, 4))
        if length < _FIXED.size or _MAC + length > total:
            raise ValueError(f"a message on {name!r} is shorter than its header")
        header = ctypes.string_at(base + _MAC, length)
        mac = sign.copy()
        mac.update(header)
        if not hmac.compare_digest(mac.digest(), ctypes.string_at(base, _MAC)):
            raise ValueError(
                f"a message on {name!r} is not signed with the run's key: it was not sent by the run"
            )
        _, self.kind, self.room, self.stamp, self.number, count, rest_length = _FIXED.unpack_from(header)
        at = _FIXED.size
        layouts = []
        for _ in range(count):
            index, dims = _TENSOR.unpack_from(header, at)
            at += _TENSOR.size
            shape = struct.unpack_from(f"<{dims}q", header, at)
            at += dims * _EXTENT.size
            layouts.append((DTYPES[index], shape))
        self._layouts = layouts
        self.rest: Rest = pickle.loads(header[at : at + rest_length]) if rest_length else None
        self._start = aligned(_MAC + length)

    def tensors(self, name: str, payload: torch.Tensor) -> list[torch.Tensor]:
        """The message's tensors: views of ``payload``; ``ValueError`` if it is too short."""
        offset, total = self._start, payload.numel()
        found = []
        for dtype, shape in self._layouts:
            count = 1
            for extent in shape:
                count *= extent
            nbytes = count * dtype.itemsize
            if offset + nbytes > total:
                raise ValueError(f"a message on {name!r} is shorter than its tensors")
            found.append(payload[offset : offset + nbytes].view(dtype).reshape(shape))
            offset += aligned(nbytes)
        return found

    def crossing(self, name: str, payload: torch.Tensor) -> Crossing:
        return name, self.tensors(name, payload), self.rest, self.stamp, self.number
