"""The comparison of two state trees: the first difference, named by its path (mujou.testing).

Trees are compared bit for bit, as the virtual timer promises them (sched.virtual-deterministic):
tensors by dtype, shape, device and the bits of each element; plain values by type and value.
A difference is described without printing a tensor: its first differing index, the two values
there and how many elements differ. See testing.compare.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping

import torch

_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60

# Unsigned would print oddly but is never printed: these views only say which bits differ.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def state_difference(first: object, second: object) -> str | None:
    """The first difference between two state trees, in words; None when they are equal.

    Walks both trees in the first one's order; names the difference by its path, written as
    Python indexes the tree (``["smoother"]["mean"]``). See :ref:`testing.compare`.
    """
    return _difference(first, second, "")


def assert_states_equal(first: object, second: object) -> None:
    """Raise ``AssertionError`` naming the first difference of two state trees, if any.

    For tests: ``assert_states_equal(run_a.state_dict(), run_b.state_dict())``. See
    :ref:`testing.compare`.
    """
    difference = state_difference(first, second)
    if difference is not None:
        raise AssertionError(f"the state trees differ at {difference}")


def _where(path: str) -> str:
    return path or "the root"


def _difference(a: object, b: object, path: str) -> str | None:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _tensor_difference(a, b, path)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return _mapping_difference(a, b, path)
    if type(a) is not type(b):
        return f"{_where(path)}: a {type(a).__name__} in the first tree, a {type(b).__name__} in the second"
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        if len(a) != len(b):
            return f"{_where(path)}: {len(a)} items in the first tree, {len(b)} in the second"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _difference(x, y, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if not _same_value(a, b):
        return f"{_where(path)}: {_SHORT.repr(a)} in the first tree, {_SHORT.repr(b)} in the second"
    return None


def _mapping_difference(a: Mapping[object, object], b: Mapping[object, object], path: str) -> str | None:
    for key in a:
        if key not in b:
            return f"{_where(path)}: the key {key!r} is only in the first tree"
    for key in b:
        if key not in a:
            return f"{_where(path)}: the key {key!r} is only in the second tree"
    for key in a:
        found = _difference(a[key], b[key], f"{path}[{key!r}]")
        if found is not None:
            return found
    return None


def _same_value(a: object, b: object) -> bool:
    """Plain values: floats bit for bit (NaN is NaN, -0.0 is not 0.0), the rest by ``==``."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        )
    if isinstance(a, complex) and isinstance(b, complex):
        return _same_value(a.real, b.real) and _same_value(a.imag, b.imag)
    try:
        return bool(a == b)
    except Exception:  # an == that cannot say (not a plain value): compare identities
        return a is b


def _tensor_difference(a: torch.Tensor, b: torch.Tensor, path: str) -> str | None:
    where = _where(path)
    for what in ("dtype", "shape", "device", "layout"):
        x, y = getattr(a, what), getattr(b, what)
        if x != y:
            shown = (tuple(x), tuple(y)) if what == "shape" else (x, y)
            return f"{where}: {what} {shown[0]} in the first tree, {shown[1]} in the second"
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_quantized:
        a, b = a.int_repr(), b.int_repr()
    differs = _bits(a) != _bits(b)
    if a.is_complex():
        differs = differs.any(dim=-1)
    count = int(differs.sum())
    if count == 0:
        return None
    index = tuple(int(i) for i in differs.nonzero()[0])
    x, y = a[index].item(), b[index].item()
    hint = ""
    if path.endswith("['generator']"):
        hint = (
            "; this is a generator's state: the node drew a different number of times, or "
            "its generator was seeded differently (see threads.derived-seed)"
        )
    return (
        f"{where}: element {index}: {x!r} in the first tree, {y!r} in the second "
        f"({count} of {differs.numel()} elements differ){hint}"
    )


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor whose elements are equal exactly where ``tensor``'s have the same bits."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor.resolve_conj())
    if tensor.is_floating_point():
        return tensor.contiguous().view(_BITS[tensor.element_size()])
    return tensor
