"""Pickling the host's commands and the processes' replies and events, with tensors as bytes.

A CPU tensor pickled the default way goes through ``torch.save``'s machinery, about half a
millisecond each here: too slow for the messages that cross at every tag under the virtual
timer (proc.virtual). A plain CPU tensor is pickled here as its dtype, shape and bytes
instead, and rebuilt as a tensor that owns a copy of them; any other tensor (a subclass, one
that requires grad, on another device, a quantized one, whose scale and zero point bytes do
not carry, or one of a dtype not in ``_PLAIN``) keeps torch's own reduction, which rebuilds
all of it. The rebuild checks that the bytes fit the dtype and shape, so a malformed frame is
an exception, never a tensor over memory it does not own.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import io
import math
import pickle
import threading
from typing import Any

import torch

loads = pickle.loads
_Tensor, _strided = torch.Tensor, torch.strided
# The dtypes whose tensors are their bytes and nothing else (no quantizer, no packed bits the
# shape does not count), by name: a torch.dtype pickles as a global, which costs a module
# lookup to load.
_PLAIN = {
    str(dtype): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
_PLAIN_DTYPES = frozenset(_PLAIN.values())
_local = threading.local()  # each thread's pickler and its buffer, reused


def _rebuilt(dtype: str, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    """The tensor ``_Pickler`` took apart; ValueError for bytes that do not make one."""
    kind = _PLAIN.get(dtype)
    if kind is None or not all(type(size) is int and size >= 0 for size in shape):
        raise ValueError(f"malformed tensor in a frame: dtype {dtype!r}, shape {shape!r}")
    if len(data) != math.prod(shape) * kind.itemsize:
        raise ValueError(
            f"malformed tensor in a frame: {len(data)} bytes for shape {shape!r} of {dtype}, "
            f"expected {math.prod(shape) * kind.itemsize}"
        )
    if not data:
        return torch.empty(shape, dtype=kind)
    flat = torch.frombuffer(bytearray(data), dtype=kind)
    if len(shape) == 1:
        return flat
    # A view costs a tensor more; a scalar's (the tags' usual message) is cheapest by strides.
    return flat.as_strided((), ()) if not shape else flat.view(shape)


# ``_rebuilt`` pickled as an extension code instead of its module and name: a load then finds
# it in ``copyreg``'s cache, not through an import of this module (about 1 us a tensor). The
# code is of copyreg's range for private use; both ends register it as they import this module
# (one version of Mujou on each: hosts.refused), and where another took it, it pickles by name.
_EXTENSION = 0xF3
with contextlib.suppress(ValueError):
    copyreg.add_extension(__name__, _rebuilt.__name__, _EXTENSION)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is _Tensor
            and obj.dtype in _PLAIN_DTYPES  # a quantized dtype is not: its quantizer stays behind
            and obj.is_cpu
            and not obj.requires_grad
            and obj.layout is _strided
            and not obj.is_conj()
            and not obj.is_neg()
        ):
            tensor = obj.contiguous()
            data = ctypes.string_at(tensor.data_ptr(), tensor.nbytes)
            return _rebuilt, (str(tensor.dtype), tuple(tensor.shape), data)
        return NotImplemented


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, its plain CPU tensors as bytes."""
    try:
        pickler: _Pickler
        buffer: io.BytesIO
        pickler, buffer = _local.pickler
    except AttributeError:
        buffer = io.BytesIO()
        pickler = _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        _local.pickler = pickler, buffer
    try:
        pickler.dump(obj)
        return buffer.getvalue()
    finally:
        pickler.clear_memo()
        buffer.seek(0)
        buffer.truncate()
