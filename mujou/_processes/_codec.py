"""Pickling the host's commands and the processes' replies and events, with tensors as bytes.

A CPU tensor pickled the default way goes through ``torch.save``'s machinery, about half a
millisecond each here: too slow for the messages that cross at every tag under the virtual
timer (proc.virtual). A plain CPU tensor is pickled here as its dtype, shape and bytes
instead, and rebuilt as a tensor that owns a copy of them; any other tensor (a subclass, one
that requires grad, on another device) keeps torch's own reduction.
"""

from __future__ import annotations

import ctypes
import io
import pickle
import threading
from typing import Any

import torch

loads = pickle.loads
_Tensor, _strided = torch.Tensor, torch.strided
# By name: a torch.dtype pickles as a global, which costs a module lookup to load.
_DTYPES = {str(dtype): dtype for dtype in vars(torch).values() if isinstance(dtype, torch.dtype)}
_local = threading.local()  # each thread's pickler and its buffer, reused


def _rebuilt(dtype: str, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=_DTYPES[dtype])
    flat = torch.frombuffer(bytearray(data), dtype=_DTYPES[dtype])
    return flat if len(shape) == 1 else flat.view(shape)  # a view costs a tensor more


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is _Tensor
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
