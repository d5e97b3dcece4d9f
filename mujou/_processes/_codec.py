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
from typing import Any

import torch

loads = pickle.loads


def _rebuilt(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and obj.layout is torch.strided
            and not obj.requires_grad
            and not obj.is_conj()
            and not obj.is_neg()
        ):
            tensor = obj.contiguous()
            data = ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())
            return _rebuilt, (tensor.dtype, tuple(tensor.shape), data)
        return NotImplemented


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, its plain CPU tensors as bytes."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
