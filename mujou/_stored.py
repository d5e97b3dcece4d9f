"""A port's message in the state tree, in what ``torch.load(weights_only=True)`` reads back.

A bare tensor is stored as itself; a nest as its leaves (CPU tensors and scalars) and its
structure, in plain values: ``"*"`` for a leaf, ``{"dict": keys, "order": keys, "items": [...]}``
(``"dict"``: the keys in optree's sorted order, as the items and leaves are; ``"order"``: the
dict's own), ``{"list": [...]}``, ``{"tuple": [...]}``, and for a NamedTuple or a dataclass
``{"namedtuple" | "dataclass": [module, qualname], "fields": names, "items": [...]}``.
A restore rebuilds a class only from a module already imported (never importing one, never
calling anything but a NamedTuple's ``_make``), so a tree runs no code. See
:ref:`state.port-messages`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import optree
import torch

from ._messages import SCALARS, is_message_class, rebuild_dataclass, register_dataclass, tree_flatten
from ._state import cpu_copy

_Kind = optree.PyTreeKind
LEAF = "*"


def encode(message: Any, stamp: float) -> dict[str, Any]:
    """The tree entry of a port's latest message: CPU copies, plain values."""
    if isinstance(message, torch.Tensor):
        return {"stamp": stamp, "tensor": cpu_copy(message)}
    leaves, spec = tree_flatten(message)
    return {"stamp": stamp, "leaves": cpu_copy(leaves), "structure": _structure(spec)}


def _structure(spec: optree.PyTreeSpec) -> Any:
    if spec.is_leaf():
        return LEAF
    items = [_structure(child) for child in spec.children()]
    kind = spec.kind
    if kind == _Kind.DICT:  # children in sorted key order (optree's), and the dict's own order
        one = optree.treespec_one_level(spec)
        assert one is not None  # a dict is one level
        order = list(optree.tree_unflatten(one, [0] * one.num_leaves))
        return {"dict": list(spec.entries()), "order": order, "items": items}
    if kind in (_Kind.LIST, _Kind.TUPLE):
        return {"list" if kind == _Kind.LIST else "tuple": items}
    cls = spec.type
    assert cls is not None
    tag = "namedtuple" if kind == _Kind.NAMEDTUPLE else "dataclass"
    return {tag: [cls.__module__, cls.__qualname__], "fields": _fields_of(cls), "items": items}


class MalformedError(ValueError):
    """A tree entry that is not a stored message."""


def decode(entry: object, near: type) -> tuple[Any, float]:
    """The message and stamp of a tree entry (CPU tensors); MalformedError saying what is wrong.

    ``near`` is the class of the port's node: a message class saved from a script's
    ``__main__`` is looked up in that class's module too (and the other way round).
    """
    if not isinstance(entry, dict) or set(entry) not in (
        {"stamp", "tensor"},
        {"stamp", "leaves", "structure"},
    ):
        raise MalformedError("is not a message entry of run.state_dict()")
    stamp = entry["stamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        raise MalformedError(f"has the stamp {stamp!r}, not a number of seconds")
    if "tensor" in entry:
        if not isinstance(entry["tensor"], torch.Tensor):
            raise MalformedError(f"holds a {type(entry['tensor']).__name__}, not a tensor")
        return entry["tensor"], float(stamp)
    leaves = entry["leaves"]
    if not isinstance(leaves, list):
        raise MalformedError("has leaves that are not a list")
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor) and type(leaf) not in SCALARS:
            raise MalformedError(f"has the leaf {type(leaf).__name__}, not a tensor or a scalar")
    rest = iter(leaves)
    message = _build(entry["structure"], rest, near)
    if next(rest, rest) is not rest:
        raise MalformedError("has more leaves than its structure")
    return message, float(stamp)


def _build(structure: object, leaves: Any, near: type) -> Any:
    if structure == LEAF:
        leaf = next(leaves, leaves)
        if leaf is leaves:
            raise MalformedError("has fewer leaves than its structure")
        return leaf
    if not isinstance(structure, dict) or not isinstance(structure.get("items", []), list):
        raise MalformedError(f"has the structure {structure!r}")
    if set(structure) == {"dict", "order", "items"} and isinstance(structure["dict"], list):
        keys, order, items = structure["dict"], structure["order"], structure["items"]
        if (
            len(keys) != len(items)
            or not all(isinstance(key, str) for key in keys)
            or not isinstance(order, list)
            or sorted(order) != sorted(keys)
        ):
            raise MalformedError("has a dict whose keys do not fit its items")
        built = {key: _build(item, leaves, near) for key, item in zip(keys, items, strict=True)}
        return {key: built[key] for key in order}
    if set(structure) == {"list"} and isinstance(structure["list"], list):
        return [_build(item, leaves, near) for item in structure["list"]]
    if set(structure) == {"tuple"} and isinstance(structure["tuple"], list):
        return tuple(_build(item, leaves, near) for item in structure["tuple"])
    for tag in ("namedtuple", "dataclass"):
        if set(structure) == {tag, "fields", "items"}:
            cls = _find_class(structure[tag], tag, structure["fields"], near)
            parts = [_build(item, leaves, near) for item in structure["items"]]
            if len(parts) != len(structure["fields"]):
                raise MalformedError(f"has a {cls.__qualname__} whose fields do not fit its items")
            if tag == "dataclass":
                register_dataclass(cls)
                return rebuild_dataclass((cls, tuple(structure["fields"])), parts)
            return cls._make(parts)  # type: ignore[attr-defined]  # a NamedTuple class, checked
    raise MalformedError(f"has the structure {structure!r}")


def _find_class(where: object, tag: str, fields: object, near: type) -> type:
    """The message class a tree names, from the modules already imported (never importing)."""
    if not (isinstance(where, list) and len(where) == 2 and all(isinstance(part, str) for part in where)):
        raise MalformedError(f"names the class {where!r}, not [module, qualname]")
    module, qualname = where
    places = [module, near.__module__, "__main__"] if module == "__main__" else [module, "__main__"]
    for place in places:
        found: object = sys.modules.get(place)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if is_message_class(found) and _fields_of(found) == fields:
            kind_ok = dataclasses.is_dataclass(found) == (tag == "dataclass")
            if kind_ok:
                return found  # type: ignore[return-value]  # a class, checked
    raise MalformedError(
        f"holds a {module}.{qualname} ({tag} with fields {fields!r}), which no imported module "
        "has; import the module that defines it before mujou.run (a class defined inside a "
        "function cannot be restored)"
    )


def _fields_of(cls: Any) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [field.name for field in dataclasses.fields(cls)]
    return list(cls._fields)
