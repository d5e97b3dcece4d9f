"""Plain values: what the default state of a node keeps as it is.

A plain value is what ``torch.load(weights_only=True)`` reads back: see
:ref:`state.default-node-state`.
"""

from __future__ import annotations

import torch

from ._contents import ATOMS

# The scalars a state keeps, by exact type (an IntEnum or a numpy float is an int or float
# subclass that torch.load(weights_only=True) refuses): state.default-node-state. Of what a
# state file holds (ATOMS), the immutable ones a node's attributes are.
_SCALARS = ATOMS - {bytearray, torch.layout, torch.qscheme}


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
