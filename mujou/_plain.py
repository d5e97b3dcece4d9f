"""Plain values: what the default state of a node keeps as it is, and copying them to a device.

A plain value is what ``torch.load(weights_only=True)`` reads back: see
:ref:`state.default-node-state`.
"""

from __future__ import annotations

from typing import Any

import torch

# The scalars a state keeps, by exact type (an IntEnum or a numpy float is an int or float
# subclass that torch.load(weights_only=True) refuses): state.default-node-state.
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device})


def is_plain(value: object) -> bool:
    """Whether ``value`` is a plain value the default state keeps as it is.

    ``None``, a bool, int, float, complex, str, bytes, ``torch.dtype`` or ``torch.device``, a
    tensor, or a list, tuple or dict (with scalar keys) of plain values: what
    ``torch.load(weights_only=True)`` reads back. A container that holds itself is not.
    """
    return _plain(value, set())


def _plain(value: object, open_containers: set[int]) -> bool:
    kind = type(value)
    if kind in _SCALARS or isinstance(value, torch.Tensor):
        return True
    if kind is not list and kind is not tuple and kind is not dict:
        return False
    if id(value) in open_containers:
        return False  # it holds itself: no file can hold it
    open_containers.add(id(value))
    try:
        if isinstance(value, dict):
            return all(type(key) in _SCALARS and _plain(item, open_containers) for key, item in value.items())
        assert isinstance(value, list | tuple)
        return all(_plain(item, open_containers) for item in value)
    finally:
        open_containers.discard(id(value))


def on_device(value: Any, device: torch.device) -> Any:
    """A copy of plain ``value`` with each tensor a copy on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if type(value) is dict:
        return {key: on_device(item, device) for key, item in value.items()}
    if type(value) is list:
        return [on_device(item, device) for item in value]
    if type(value) is tuple:
        return tuple(on_device(item, device) for item in value)
    return value
