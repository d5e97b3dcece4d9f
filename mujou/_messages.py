"""Messages: a tensor, or a nest of tensors and plain scalars, taken apart and rebuilt by optree.

A nest is made of ``dict`` (``str`` keys), ``list``, ``tuple``, ``NamedTuple`` and dataclass
instances; its leaves are tensors and the scalars ``bool``, ``int``, ``float``, ``str`` and
``None``. See :ref:`ports.message`.

NOTE [ messages and optree ]
Nests are flattened and rebuilt with optree (``tree_flatten``/``tree_unflatten``), in the
namespace ``"mujou"``: dataclasses are registered there the first time one is met, so
registering them changes nothing for torch.export, torch.compile or any other optree user.
A rebuilt dataclass is made as ``copy.copy`` makes one, without calling ``__init__``: its
fields (``dataclasses.fields``) are set on a new object. Every rebuild makes new containers,
so a message never shares a container with the sender or with the host.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, cast

import optree
import torch

from ._contents import type_name

NAMESPACE = "mujou"
SCALARS = (bool, int, float, str, type(None))
KINDS = (
    "a tensor, or a nest (dict with str keys, list, tuple, NamedTuple, dataclass) of tensors "
    "and bool, int, float, str or None"
)

_Tensor = torch.Tensor
_Kind = optree.PyTreeKind
_ALLOWED = frozenset({_Kind.LEAF, _Kind.DICT, _Kind.LIST, _Kind.TUPLE, _Kind.NAMEDTUPLE})
_dataclass_fields: dict[type, tuple[str, ...]] = {}  # the registered dataclasses' fields
_register_lock = threading.Lock()
_checked_specs: dict[optree.PyTreeSpec, str] = {}  # structures seen: "" when allowed, else why not
_MAX_CHECKED = 4096  # forget them all past this many (a net with ever-new structures)


def tree_flatten(tree: object) -> tuple[list[Any], optree.PyTreeSpec]:
    """optree's flatten of a message, None a leaf, in Mujou's namespace."""
    leaves: list[Any]
    leaves, spec = optree.tree_flatten(cast(Any, tree), none_is_leaf=True, namespace=NAMESPACE)
    return leaves, spec


def register_dataclass(cls: type) -> None:
    """Make dataclass ``cls`` a node of Mujou's nests (once; safe from any thread)."""
    with _register_lock:
        if cls in _dataclass_fields:
            return
        names = tuple(field.name for field in dataclasses.fields(cls))

        def flatten(obj: Any) -> tuple[list[Any], tuple[type, tuple[str, ...]], tuple[str, ...]]:
            return [getattr(obj, name) for name in names], (cls, names), names

        def unflatten(meta: Hashable | None, children: Iterable[Any]) -> Any:
            return rebuild_dataclass(cast("tuple[type, tuple[str, ...]]", meta), children)

        optree.register_pytree_node(cls, flatten, unflatten, namespace=NAMESPACE)
        _dataclass_fields[cls] = names


def rebuild_dataclass(meta: tuple[type, tuple[str, ...]], children: Any) -> Any:
    """A dataclass of class ``meta[0]`` with fields ``meta[1]`` set to ``children``, as copy.copy does."""
    cls, names = meta
    obj: Any = object.__new__(cls)
    for name, value in zip(names, children, strict=True):
        object.__setattr__(obj, name, value)
    return obj


def is_message_class(cls: object) -> bool:
    """Whether ``cls`` is a NamedTuple class or a dataclass (the classes a nest may hold)."""
    return isinstance(cls, type) and (optree.is_namedtuple_class(cls) or dataclasses.is_dataclass(cls))


def flatten(value: object) -> tuple[list[Any], optree.PyTreeSpec]:
    """The leaves and structure of a nest; TypeError naming what is not allowed, and where."""
    while True:
        leaves, spec = tree_flatten(value)
        met_dataclass = False
        for leaf in leaves:
            if isinstance(leaf, _Tensor) or type(leaf) in SCALARS:
                continue
            if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
                register_dataclass(type(leaf))
                met_dataclass = True
                continue
            raise TypeError(f"{_what(leaf)} at {_path_of(value, leaf)}")
        if met_dataclass:
            continue  # flattened again, through the dataclasses' fields
        problem = _checked_specs.get(spec)
        if problem is None:
            problem = _structure_problem(spec, "")
            if len(_checked_specs) >= _MAX_CHECKED:
                _checked_specs.clear()
            _checked_specs[spec] = problem
        if problem:
            raise TypeError(problem)
        if spec.is_leaf():
            raise TypeError(
                f"{_what(value)}: a message is not a bare scalar; send a tensor (torch.tensor(x))"
            )
        return leaves, spec


def _structure_problem(spec: optree.PyTreeSpec, path: str) -> str:
    kind = spec.kind
    if kind not in _ALLOWED and not (kind == _Kind.CUSTOM and spec.type in _dataclass_fields):
        name = getattr(spec.type, "__qualname__", str(spec.type))
        where = path or "the top"
        allowed = "containers are dict, list, tuple, NamedTuple, dataclass"
        return f"{with_article(name)} container at {where} ({allowed})"
    if kind == _Kind.DICT:
        for key in spec.entries():
            if not isinstance(key, str):
                return f"the dict key {key!r} at {path or 'the top'} (dict keys are str)"
    fields = spec.type._fields if kind == _Kind.NAMEDTUPLE else None  # type: ignore[union-attr]  # a NamedTuple class
    for entry, child in zip(spec.entries(), spec.children(), strict=True):
        if fields is not None:
            step = f".{fields[entry]}"
        elif kind == _Kind.CUSTOM:
            step = f".{entry}"
        else:
            step = f"[{entry!r}]"
        problem = _structure_problem(child, path + step)
        if problem:
            return problem
    return ""


def _what(value: object) -> str:
    return with_article(type_name(type(value)))


def with_article(name: str) -> str:
    """``name`` with its article: "an int", "a str"."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _path_of(tree: object, leaf: object) -> str:
    """Where ``leaf`` is in ``tree``, as ``['key'][0]`` (for error messages)."""
    accessors, leaves, _ = optree.tree_flatten_with_accessor(
        cast(Any, tree), none_is_leaf=True, namespace=NAMESPACE
    )
    for accessor, found in zip(accessors, leaves, strict=True):
        if found is leaf:
            return accessor.codify("") or "the top"
    return "the top"


class Nest:
    """A published nest as it was sent: its structure, its leaves, its tensors' version counters.

    A reader checks the message against it (ports.message-leaf-by-leaf): a tensor changed in
    place, or a container changed (an item replaced, added or removed), reads as changed.
    """

    __slots__ = ("leaves", "spec", "tensors")

    def __init__(self, spec: optree.PyTreeSpec, leaves: list[Any]) -> None:
        self.spec = spec
        self.leaves = leaves
        self.tensors = tuple((leaf, leaf._version) for leaf in leaves if isinstance(leaf, _Tensor))

    def unchanged(self, message: Any) -> bool:
        """Whether ``message`` (the nest this describes) is as it was sent."""
        for tensor, version in self.tensors:
            if tensor._version != version:
                return False
        leaves, spec = tree_flatten(message)
        if spec != self.spec:
            return False
        return all(now is sent for now, sent in zip(leaves, self.leaves, strict=True))


def rebuild(spec: optree.PyTreeSpec, leaves: list[Any]) -> Any:
    """The nest of structure ``spec`` with ``leaves``: new containers throughout."""
    return optree.tree_unflatten(spec, leaves)


def map_tensors(message: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``message`` with ``fn`` applied to each tensor (new containers; scalars kept)."""
    if isinstance(message, _Tensor):
        return fn(message)
    leaves, spec = tree_flatten(message)
    return optree.tree_unflatten(spec, [fn(leaf) if isinstance(leaf, _Tensor) else leaf for leaf in leaves])


def cpu_copy(message: Any) -> Any:
    """A copy of ``message`` the host owns: its tensors copied to the CPU, new containers."""
    if isinstance(message, _Tensor):
        return cpu_tensor_copy(message)
    return map_tensors(message, cpu_tensor_copy)


def cpu_tensor_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy of ``tensor``: clone, the same copy for a CPU tensor as
    ``.to("cpu", copy=True)``, takes half the time."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    return tensor.clone() if tensor.is_cpu else tensor.to("cpu", copy=True)
