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
from collections.abc import Callable
from typing import Any

import torch

loads = pickle.loads
_Tensor, _strided, _frombuffer = torch.Tensor, torch.strided, torch.frombuffer
_string_at = ctypes.string_at
_SIZES = 64  # sizes of tensors in bytes whose ctypes array type is kept (``_bytes_of``)
_arrays: dict[int, Any] = {}  # such types, by size
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
_NAMES = {dtype: name for name, dtype in _PLAIN.items()}
_local = threading.local()  # each thread's pickler and its buffer, reused


def _rebuilt(dtype: str, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    """The tensor ``_reduced`` took apart; ValueError for bytes that do not make one."""
    kind = _PLAIN.get(dtype)
    if kind is None:
        raise ValueError(f"malformed tensor in a frame: dtype {dtype!r}, shape {shape!r}")
    if shape == ():  # a scalar, the tags' usual message: 1-d, then 0-d in place, not by a view
        if len(data) != kind.itemsize:
            raise ValueError(
                f"malformed tensor in a frame: {len(data)} bytes for shape () of {dtype}, "
                f"expected {kind.itemsize}"
            )
        return _frombuffer(bytearray(data), dtype=kind).squeeze_()
    if not all(type(size) is int and size >= 0 for size in shape):
        raise ValueError(f"malformed tensor in a frame: dtype {dtype!r}, shape {shape!r}")
    if len(data) != math.prod(shape) * kind.itemsize:
        raise ValueError(
            f"malformed tensor in a frame: {len(data)} bytes for shape {shape!r} of {dtype}, "
            f"expected {math.prod(shape) * kind.itemsize}"
        )
    if not data:
        return torch.empty(shape, dtype=kind)
    flat = _frombuffer(bytearray(data), dtype=kind)
    return flat if len(shape) == 1 else flat.view(shape)


# ``_rebuilt`` pickled as an extension code instead of its module and name: a load then finds
# it in ``copyreg``'s cache, not through an import of this module (about 1 us a tensor). The
# code is of copyreg's range for private use; both ends register it as they import this module
# (one version of Mujou on each: hosts.refused), and where another took it, it pickles by name.
_EXTENSION = 0xF3
with contextlib.suppress(ValueError):
    copyreg.add_extension(__name__, _rebuilt.__name__, _EXTENSION)


def _bytes_of(tensor: torch.Tensor) -> bytes:
    """A contiguous CPU tensor's bytes: through a ctypes array type of their size, cached for
    ``_SIZES`` sizes (a third of ``ctypes.string_at``'s cost), else by ``string_at``."""
    size = tensor.nbytes
    array = _arrays.get(size)
    if array is None:
        if len(_arrays) >= _SIZES or not size:
            return _string_at(tensor.data_ptr(), size)
        array = _arrays[size] = ctypes.c_char * size
    return array.from_address(tensor.data_ptr()).raw


def _reduced(obj: torch.Tensor) -> Any:
    """A tensor's reduction (the picklers' table, ``_TABLE``): a plain CPU tensor as its dtype,
    shape and bytes, any other as torch reduces it."""
    if (
        obj.dtype in _NAMES  # a quantized dtype is not: its quantizer stays behind
        and obj.is_cpu
        and not obj.requires_grad
        and obj.layout is _strided
        and not (obj._is_view() and (obj.is_conj() or obj.is_neg()))  # only a view has either bit
    ):
        tensor = obj.contiguous()
        return _rebuilt, (_NAMES[tensor.dtype], tuple(tensor.shape), _bytes_of(tensor))
    reduce: Callable[[int], Any] = obj.__reduce_ex__
    return reduce(pickle.HIGHEST_PROTOCOL)


class _Table(dict[type, Any]):
    """``copyreg``'s reductions as they are at each lookup, and ``_reduced`` for an exact
    torch.Tensor (a subclass keeps torch's own reduction)."""

    def __missing__(self, kind: type) -> Any:
        return copyreg.dispatch_table[kind]


# Each pickler's reductions: a table, not ``reducer_override``, which the pickler calls for
# every object it has no code of its own for (the ``_rebuilt`` it returns too); the table is
# looked up for the objects it has no code for but a reduction (the tensor, once).
_TABLE = _Table({_Tensor: _reduced})


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, its plain CPU tensors as bytes."""
    try:
        pickler: pickle.Pickler
        buffer: io.BytesIO
        pickler, buffer = _local.pickler
    except AttributeError:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = _TABLE
        _local.pickler = pickler, buffer
    try:
        pickler.dump(obj)
        return buffer.getvalue()
    finally:
        pickler.clear_memo()
        buffer.seek(0)
        buffer.truncate()
