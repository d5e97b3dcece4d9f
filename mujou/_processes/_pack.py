"""Copying a group's nodes into their process: pickled on the host, rebuilt in the child.

A node is sent as its class (by reference: the child imports it), its ``Node`` arguments, its
generator's state and its other attributes (proc.copied). Ports and Mujou's bookkeeping are not
sent: the child makes them anew, as ``Node.__init__`` does, and connects the ports itself.
Tensors are pickled by value, so the child's node shares no memory with the host's.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

import torch

from .._containers import NodeDict
from .._node import Node
from .._port import _Port
from .._trigger import Trigger


@dataclass(frozen=True)
class Packed:
    """A node as its process receives it."""

    name: str
    cls: str  # module:qualname, for the error when the child cannot import it
    data: bytes  # pickle of (class, attributes)
    period: float | None
    trigger: Trigger | None
    min_interval: float
    delay: float
    seed: int
    generator: torch.Tensor
    device: str
    dedicated: bool


def _attributes(node: Node) -> dict[str, Any]:
    return {
        key: value for key, value in vars(node).items() if key != "_mujou" and not isinstance(value, _Port)
    }


def pack(node: Node, process: str) -> Packed:
    """``node`` for process ``process``; TypeError naming the attribute that cannot be pickled."""
    cls = type(node)
    where = f"{cls.__module__}.{cls.__qualname__}"
    attributes = _attributes(node)
    try:
        data = pickle.dumps((cls, attributes), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(_unpicklable(node, process, where, attributes, exc)) from exc
    core = node._mujou
    return Packed(
        name=node.name,
        cls=where,
        data=data,
        period=node.period,
        trigger=core.trigger,
        min_interval=core.min_interval,
        delay=core.delay,
        seed=core.seed,
        generator=core.generator.get_state(),
        device=str(core.device),
        dedicated=core.dedicated,
    )


def _unpicklable(node: Node, process: str, where: str, attributes: dict[str, Any], exc: Exception) -> str:
    head = f"node {node.name!r} cannot be copied into process {process!r}"
    try:
        pickle.dumps(type(node))
    except Exception as error:
        return (
            f"{head}: its class {where} cannot be pickled ({type(error).__name__}: {error}); "
            "define the class at the top level of a module (or of the main script), where the "
            "new process can import it"
        )
    for key, value in attributes.items():
        try:
            pickle.dump(value, io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            return (
                f"{head}: its attribute {key!r} ({type(value).__name__}) cannot be pickled "
                f"({type(error).__name__}: {error}); make it in on_start instead of __init__, "
                "or keep it out of the node"
            )
    return f"{head}: pickling it raised {type(exc).__name__}: {exc}"


def unpack(packed: Packed) -> Node:
    """The node ``packed`` describes, with fresh ports and bookkeeping, in no net yet."""
    try:
        cls, attributes = pickle.loads(packed.data)
    except Exception as exc:
        raise TypeError(
            f"node {packed.name!r} cannot be rebuilt in its process: unpickling its class "
            f"{packed.cls} or its attributes raised {type(exc).__name__}: {exc}; define the class "
            "at the top level of a module (or of the main script) that the new process can import"
        ) from exc
    node: Node = cls.__new__(cls)
    Node.__init__(
        node,
        period=packed.period,
        trigger=packed.trigger,
        min_interval=packed.min_interval,
        delay=packed.delay,
        seed=packed.seed,
        device=packed.device,
        dedicated_thread=packed.dedicated,
    )
    node._mujou.generator.set_state(packed.generator)
    vars(node).update(attributes)
    return node


def place(nodes: list[Node], names: list[str]) -> NodeDict[Any]:
    """Register each node under its name's path (``"a.b"``: ``root["a"]["b"]``), so that
    ``node.name`` is the same as in the host's net."""
    root: NodeDict[Any] = NodeDict()
    for node, name in zip(nodes, names, strict=True):
        *parents, leaf = name.split(".")
        branch = root
        for part in parents:
            if part not in branch:
                branch[part] = NodeDict()
            branch = branch[part]
        branch[leaf] = node
    return root
