"""Typed ports: what a port declares its messages to be, checked at send, write and connect.

A declaration is a *spec*: :class:`TensorSpec` (a tensor, with a dtype and a shape that may
leave dimensions free), a scalar type (``bool``, ``int``, ``float``, ``str``) or ``None``, a
dict, list or tuple of specs, or a NamedTuple class or dataclass, whose fields are declared by
their annotations. See :ref:`ports.typed`.

A spec is compiled once, when the port is declared, into the structure messages are
flattened up to (an optree ``PyTreeSpec``, so the check of a message's containers is one
call) and the checks of the leaves there.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any, Final, cast, final

import optree
import torch

from ._messages import NAMESPACE, is_message_class, rebuild_dataclass, register_dataclass, with_article

_Tensor = torch.Tensor
_SCALAR_TYPES = (bool, int, float, str)
_SPEC_TEXT = re.compile(r"(, NoneIsLeaf)?(, namespace='[^']*')?\)$")  # what follows a PyTreeSpec's structure


@final
class TensorSpec:
    """What a tensor of a port's messages must be: a dtype and a shape, each optional.

    Args:
        dtype: The tensor's dtype, or None for any.
        shape: The tensor's shape, a sequence of sizes where ``None`` leaves a dimension
            free, or None for any shape (any number of dimensions).

    Attributes:
        dtype: The dtype, or None.
        shape: The shape as a tuple (``None`` for each free dimension), or None.

    Raises:
        TypeError: ``dtype`` is not a torch.dtype, or ``shape`` not a sequence of sizes.
        ValueError: a size is negative (``-1`` included: a free dimension is ``None``).

    See :ref:`ports.typed`.
    """

    __slots__ = ("dtype", "shape")

    dtype: torch.dtype | None
    shape: tuple[int | None, ...] | None

    def __init__(self, dtype: torch.dtype | None = None, shape: Sequence[int | None] | None = None) -> None:
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {type(dtype).__name__}: {dtype!r}")
        given: object = shape
        if shape is not None:
            if not isinstance(given, Sequence) or isinstance(given, str):
                raise TypeError(
                    f"shape must be a sequence of sizes (int, or None for a free dimension) or None, "
                    f"got {type(given).__name__}: {given!r}"
                )
            for size in given:
                if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
                    raise TypeError(
                        "shape sizes must be ints >= 0, or None for a free dimension, "
                        f"got {size!r} in {shape!r}"
                    )
                if size is not None and size < 0:
                    raise ValueError(
                        f"shape sizes must be ints >= 0, or None for a free dimension, got {size!r} in "
                        f"{shape!r}" + (" (write None, not -1, for a free dimension)" if size == -1 else "")
                    )
            shape = tuple(shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a TensorSpec cannot be changed")

    def matches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` has this dtype and shape."""
        if self.dtype is not None and tensor.dtype != self.dtype:
            return False
        shape = self.shape
        if shape is None:
            return True
        sizes = tensor.shape
        if len(sizes) != len(shape):
            return False
        return all(want is None or want == size for want, size in zip(shape, sizes, strict=True))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorSpec) and (self.dtype, self.shape) == (other.dtype, other.shape)

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape))

    def __repr__(self) -> str:
        return f"TensorSpec(dtype={self.dtype}, shape={self.shape})"


class _Any:
    """A field whose annotation declares nothing Mujou checks: any message part."""

    def __repr__(self) -> str:
        return "any"


ANY: Final = _Any()

# A compiled spec, as a tree: a leaf check (TensorSpec, a scalar type, None or ANY), or a
# container: ("dict", keys, children), ("list", children), ("tuple", children) or
# ("class", cls, field names, children).
SpecTree = Any


@final
class _Leaf:
    """A leaf check in a skeleton, so that optree stops there (whatever the check is)."""

    __slots__ = ("check",)

    def __init__(self, check: object) -> None:
        self.check = check


class Declared:
    """A port's compiled declaration: the tree, the structure to flatten up to, the leaf checks."""

    __slots__ = ("checks", "paths", "prefix", "text", "tree")

    def __init__(self, tree: SpecTree) -> None:
        self.tree = tree
        self.text = describe(tree)
        skeleton = _skeleton(tree)
        accessors, leaves, prefix = optree.tree_flatten_with_accessor(
            skeleton,
            is_leaf=lambda value: isinstance(value, _Leaf),
            none_is_leaf=True,
            namespace=NAMESPACE,
        )
        self.prefix = prefix
        self.checks = [leaf.check for leaf in leaves]
        self.paths = [accessor.codify("") for accessor in accessors]  # as ['a'].b[0]

    def problem(self, message: object) -> str:
        """Why ``message`` does not match, as "expects X, got Y"; "" when it does."""
        parts: list[Any]
        if self.prefix.is_leaf():
            parts = [message]
        else:
            try:
                parts = self.prefix.flatten_up_to(cast(Any, message))
            except ValueError:  # optree's message shows the tensors' values: never shown
                where = _structure_difference(self.tree, message) or "its structure differs"
                return f"expects {self.text}, got {describe_value(message)} ({where})"
        for check, part, path in zip(self.checks, parts, self.paths, strict=True):
            if not _leaf_matches(check, part):
                where = f" at {path}" if path else ""
                return f"expects{where} {describe(check)}, got {describe_value(part)}"
        return ""


def declare(dtype: object, shape: object, spec: object) -> Declared | None:
    """A port's declaration from its ``dtype``, ``shape`` and ``spec`` arguments (None: untyped)."""
    if spec is not None:
        if dtype is not None or shape is not None:
            raise TypeError("give either spec=, or dtype= and shape=, not both")
        return Declared(compile_spec(spec, "spec"))
    if dtype is None and shape is None:
        return None
    return Declared(TensorSpec(dtype, shape))  # type: ignore[arg-type]  # TensorSpec checks them


def compile_spec(spec: object, where: str) -> SpecTree:
    """The tree of ``spec``; TypeError naming ``where`` it is not a spec."""
    if isinstance(spec, TensorSpec) or spec is None or spec is ANY:
        return spec
    if spec is _Tensor:
        return TensorSpec()
    if spec in _SCALAR_TYPES:
        return spec
    if is_message_class(spec):
        return _compile_class(spec)  # type: ignore[arg-type]  # a class, just checked
    if isinstance(spec, dict) and type(spec) is dict:
        mapping = cast("dict[object, object]", spec)
        for key in mapping:
            if not isinstance(key, str):
                raise TypeError(f"{where} has the dict key {key!r}; dict keys are str")
        return ("dict", tuple(mapping), tuple(compile_spec(v, f"{where}[{k!r}]") for k, v in mapping.items()))
    if isinstance(spec, list | tuple) and type(spec) in (list, tuple):
        items = cast("list[object] | tuple[object, ...]", spec)
        return (type(spec).__name__, tuple(compile_spec(v, f"{where}[{i}]") for i, v in enumerate(items)))
    raise TypeError(
        f"{where} must be a TensorSpec, torch.Tensor, bool, int, float, str, None, a dict, list "
        f"or tuple of those, or a NamedTuple class or dataclass; got {type(spec).__name__}: {spec!r}"
    )


def _compile_class(cls: type) -> SpecTree:
    if dataclasses.is_dataclass(cls):
        register_dataclass(cls)
        names = tuple(field.name for field in dataclasses.fields(cls))
    else:
        names = tuple(cls._fields)  # type: ignore[attr-defined]  # a NamedTuple class
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # an annotation that does not resolve declares nothing
        hints = {}
    return ("class", cls, names, tuple(_field_spec(hints.get(name, Any)) for name in names))


def _field_spec(annotation: object) -> SpecTree:
    """What a field's annotation declares: TensorSpec from Annotated, scalars, classes; else ANY."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        for extra in extras:
            if isinstance(extra, TensorSpec):
                return extra
        annotation = base
    if isinstance(annotation, type) and issubclass(annotation, _Tensor):
        return TensorSpec()
    if annotation in _SCALAR_TYPES:
        return annotation
    if annotation is None or annotation is type(None):
        return None
    if is_message_class(annotation):
        return _compile_class(annotation)  # type: ignore[arg-type]  # a class, just checked
    return ANY


def _skeleton(tree: SpecTree) -> Any:
    """A nest shaped as ``tree`` whose leaves are the checks: optree flattens it to the prefix."""
    if isinstance(tree, tuple):
        kind = tree[0]
        if kind == "dict":
            return {key: _skeleton(child) for key, child in zip(tree[1], tree[2], strict=True)}
        if kind == "list":
            return [_skeleton(child) for child in tree[1]]
        if kind == "tuple":
            return tuple(_skeleton(child) for child in tree[1])
        cls, names, children = tree[1], tree[2], tree[3]
        parts = [_skeleton(child) for child in children]
        if dataclasses.is_dataclass(cls):
            return rebuild_dataclass((cast(type, cls), names), parts)
        return cls._make(parts)
    return _Leaf(tree)


def _leaf_matches(check: object, value: object) -> bool:
    if check is ANY:
        return True
    if isinstance(check, TensorSpec):
        return isinstance(value, _Tensor) and check.matches(value)
    if check is None:
        return value is None
    return type(value) is check


def describe(tree: SpecTree, leaf: Callable[[object], str] = repr) -> str:
    """A declaration as a person reads it, e.g. ``{'pose': TensorSpec(...), 'ok': bool}``;
    ``leaf`` writes each ``TensorSpec`` and ``ANY`` in it (``repr`` by default)."""
    if isinstance(tree, TensorSpec) or tree is ANY:
        return leaf(tree)
    if tree is None:
        return "None"
    if isinstance(tree, type):
        return tree.__name__
    kind = tree[0]
    if kind == "dict":
        return (
            "{"
            + ", ".join(f"{k!r}: {describe(c, leaf)}" for k, c in zip(tree[1], tree[2], strict=True))
            + "}"
        )
    if kind == "list":
        return "[" + ", ".join(describe(c, leaf) for c in tree[1]) + "]"
    if kind == "tuple":
        items = [describe(c, leaf) for c in tree[1]]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    fields = ", ".join(f"{n}={describe(c, leaf)}" for n, c in zip(tree[2], tree[3], strict=True))
    return f"{tree[1].__name__}({fields})"


def describe_value(value: object) -> str:
    """A received message (or part) as a person reads it: a tensor by its dtype and shape."""
    if isinstance(value, _Tensor):
        return f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    if value is None or type(value) in _SCALAR_TYPES:
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, dict | list | tuple) or dataclasses.is_dataclass(value):
        text = str(optree.tree_structure(value, none_is_leaf=True, namespace=NAMESPACE))  # type: ignore[arg-type]  # any object is a pytree to optree
        return _SPEC_TEXT.sub("", text.removeprefix("PyTreeSpec("))  # the structure alone
    return f"a {type(value).__qualname__}"


def _structure_difference(tree: SpecTree, value: object, path: str = "") -> str:
    """Where ``value``'s containers first differ from ``tree``'s, without showing any value; "" if nowhere.

    For a message that optree cannot flatten up to the declared structure; see
    :ref:`ports.typed-errors`.
    """
    where = f"at {path}" if path else "at the top"
    if not isinstance(tree, tuple):
        return ""  # a leaf check: the leaves are compared one by one afterwards
    kind = tree[0]
    if kind == "class":
        cls = tree[1]
        if type(value) is not cls:
            hint = f": make it with {cls.__name__}(...)" if isinstance(value, tuple | dict) else ""
            return f"{where}: expects {with_article(cls.__name__)}, got {_kind_of_value(value)}{hint}"
        pairs = [(f"{path}.{n}", c, getattr(value, n)) for n, c in zip(tree[2], tree[3], strict=True)]
    elif kind == "dict":
        if type(value) is not dict:
            return f"{where}: expects a dict, got {_kind_of_value(value)}"
        mapping = cast("dict[object, object]", value)
        if set(mapping) != set(tree[1]):
            got = sorted(_key_text(key) for key in mapping)
            return f"{where}: expects the dict keys {sorted(map(repr, tree[1]))}, got {got}"
        pairs = [(f"{path}[{k!r}]", c, mapping[k]) for k, c in zip(tree[1], tree[2], strict=True)]
    else:
        items = cast("list[object] | tuple[object, ...]", value)
        if type(value) is not (list if kind == "list" else tuple):
            return f"{where}: expects a {kind} of {len(tree[1])}, got {_kind_of_value(value)}"
        if len(items) != len(tree[1]):
            return f"{where}: expects a {kind} of {len(tree[1])}, got {_kind_of_value(value)}"
        pairs = [(f"{path}[{i}]", c, v) for i, (c, v) in enumerate(zip(tree[1], items, strict=True))]
    for sub, child, part in pairs:
        found = _structure_difference(child, part, sub)
        if found:
            return found
    return ""


def _kind_of_value(value: object) -> str:
    """What a message part is, by its type alone: never its value (a tensor's may be large)."""
    if isinstance(value, _Tensor):
        return "a tensor"
    if value is None:
        return "None"
    if type(value) in (list, tuple):
        items = cast("list[object] | tuple[object, ...]", value)
        return f"a {type(value).__name__} of {len(items)}"
    return with_article(type(value).__qualname__)


def _key_text(key: object) -> str:
    return repr(key) if type(key) in _SCALAR_TYPES or key is None else _kind_of_value(key)


def _kind_of_spec(tree: SpecTree) -> str:
    """What a declaration is, in a few words: "a tensor", "a Pose", "a dict", "a tuple of 2"."""
    if isinstance(tree, TensorSpec):
        return "a tensor"
    if tree is None or tree is ANY:
        return describe(tree)
    if isinstance(tree, type):
        return with_article(tree.__name__)
    kind = tree[0]
    if kind == "class":
        return with_article(tree[1].__name__)
    if kind == "dict":
        return "a dict"
    return f"a {kind} of {len(tree[1])}"


def clash(a: SpecTree, b: SpecTree, path: str = "") -> str:
    """Why no message can match both declarations, naming where and what differs; "" when some can.

    Names the one field, dtype or dimension, never the whole declarations again (the caller
    shows them once): see :ref:`net.typed-connect`.
    """
    if a is ANY or b is ANY:
        return ""
    where = f" at {path}" if path else ""
    if isinstance(a, TensorSpec) and isinstance(b, TensorSpec):
        if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
            return f"{where} dtype {a.dtype} vs {b.dtype}"
        if a.shape is not None and b.shape is not None:
            if len(a.shape) != len(b.shape):
                return f"{where} shape {a.shape} vs {b.shape}: {len(a.shape)} vs {len(b.shape)} dimensions"
            for dim, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)):
                if x is not None and y is not None and x != y:
                    return f"{where} shape {a.shape} vs {b.shape}: dimension {dim} is {x} vs {y}"
        return ""
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]:
        kind = a[0]
        if kind == "dict" and set(a[1]) != set(b[1]):
            return f"{where} dict keys {sorted(a[1])} vs {sorted(b[1])}"
        if kind == "class" and a[1] is not b[1]:
            return f"{where} {a[1].__qualname__} vs {b[1].__qualname__}"
        if kind == "dict":
            b_of = dict(zip(b[1], b[2], strict=True))
            pairs = [(f"{path}[{k!r}]", c, b_of[k]) for k, c in zip(a[1], a[2], strict=True)]
        elif kind == "class":
            pairs = [(f"{path}.{n}", c, d) for n, c, d in zip(a[2], a[3], b[3], strict=True)]
        else:
            if len(a[1]) != len(b[1]):
                return f"{where} {kind} of {len(a[1])} vs {len(b[1])} items"
            pairs = [(f"{path}[{i}]", c, d) for i, (c, d) in enumerate(zip(a[1], b[1], strict=True))]
        for sub, c, d in pairs:
            found = clash(c, d, sub)
            if found:
                return found
        return ""
    if a == b and not isinstance(a, tuple):
        return ""
    return f"{where} {_kind_of_spec(a)} vs {_kind_of_spec(b)}"
