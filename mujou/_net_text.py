"""How a net prints: the tree of its nodes, as ``print(torch.nn.Module)`` prints its modules.

``str()`` of a net, a node container or a node is this multi-line text; ``repr()`` stays one
short line (see :ref:`net.print`). Each node shows when it updates (period and rate, or
trigger), where (device, worker pool or own thread), and each port with its declared type
and its connections.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, cast

from ._ports import Input, Output
from ._specs import SpecTree, TensorSpec, describe

if TYPE_CHECKING:
    import torch

    from ._port import _Port
    from ._trigger import Trigger

INDENT = "  "


class PrintedCore(Protocol):
    """What printing reads of a node's bookkeeping (``_node.NodeCore``): when and where it
    updates, and its ports."""

    @property
    def period(self) -> float: ...
    @property
    def trigger(self) -> Trigger | None: ...
    @property
    def min_interval(self) -> float: ...
    @property
    def delay(self) -> float: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def dedicated(self) -> bool: ...
    @property
    def ports(self) -> Mapping[str, _Port]: ...


class Printed(Protocol):
    """What printing reads of a node (``_node.Node``, which this module is below): its
    bookkeeping, which a node whose ``__init__`` did not call ``super().__init__()`` lacks."""

    @property
    def _mujou(self) -> PrintedCore: ...


class Branch(Protocol):
    """What printing reads of a net or node container (``_net.Branch``): its members."""

    def _members(self) -> Iterator[tuple[str, Printed | Branch]]: ...


def branch_text(branch: Branch, node_class: type[Printed]) -> str:
    """The tree of ``branch``: ``Name(`` then each member, indented, then ``)``; its members
    that are instances of ``node_class`` (``Node``) are its nodes, the others branches."""
    return "\n".join(_branch_lines(type(branch).__name__, branch, node_class, ""))


def node_text(node: Printed) -> str:
    """One node: its heading line, then a line for each port."""
    return "\n".join(_node_lines(node, ""))


def _branch_lines(heading: str, branch: Branch, node_class: type[Printed], indent: str) -> list[str]:
    members = list(branch._members())
    if not members:
        return [f"{indent}{heading}()"]
    lines = [f"{indent}{heading}("]
    inner = indent + INDENT
    for key, member in members:
        label = f"({key}): "
        if isinstance(member, node_class):
            node_lines = _node_lines(member, inner)
            node_lines[0] = f"{inner}{label}{node_lines[0].lstrip()}"
            lines += node_lines
        else:  # not a node, so a branch: a branch's members are nodes and branches (_net)
            sub = cast("Branch", member)
            lines += _branch_lines(f"{label}{type(member).__name__}", sub, node_class, inner)
    lines.append(f"{indent})")
    return lines


def _node_lines(node: Printed, indent: str) -> list[str]:
    cls = type(node).__name__
    if "_mujou" not in vars(node):  # _node.is_initialized
        return [f"{indent}{cls}(not initialized: no super().__init__())"]
    lines = [f"{indent}{cls}({', '.join(_settings(node))})"]
    for attr, port in node._mujou.ports.items():
        lines.append(f"{indent}{INDENT}{_port_line(attr, port)}")
    return lines


def _settings(node: Printed) -> list[str]:
    """When and where the node updates: period and rate, or trigger; device; thread."""
    core = node._mujou
    parts: list[str] = []
    if core.period != math.inf:
        parts.append(f"period={_seconds(core.period)} ({1.0 / core.period:.4g} Hz)")
    if core.trigger is not None:
        parts.append(f"trigger={core.trigger!r}")
    if core.min_interval:
        parts.append(f"min_interval={_seconds(core.min_interval)}")
    if core.delay:
        parts.append(f"delay={_seconds(core.delay)}")
    parts.append(str(core.device))
    parts.append("own thread" if core.dedicated else "worker pool")
    return parts


def _port_line(attr: str, port: _Port) -> str:
    kind = "in " if isinstance(port, Input) else "out"
    declared = port._declared
    text = f"{kind} {attr}: {type(port).__name__}"
    if declared is not None:
        text += f"[{brief(declared.tree)}]"
    if isinstance(port, Input):
        if port._optional:
            text += " (optional)"
        source = port._source
        text += f" <- {source.name}" if source is not None else " <- host"
    elif isinstance(port, Output) and port._readers:
        text += " -> " + ", ".join(reader.name for reader in port._readers)
    return text


def _seconds(value: float) -> str:
    """Seconds in the unit that shows them plainly: ``2 s``, ``33.33 ms``, ``500 µs``."""
    if value >= 1.0:
        return f"{value:.4g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.4g} ms"
    return f"{value * 1e6:.4g} µs"


def brief(tree: SpecTree) -> str:
    """A declaration in a few characters: ``float32[?, 3]``, ``Pose(position=float32[3], ok=bool)``."""
    return describe(tree, _brief_leaf)


def _brief_leaf(leaf: object) -> str:
    if not isinstance(leaf, TensorSpec):
        return "any"  # ANY, the only other leaf describe hands over
    dtype = "tensor" if leaf.dtype is None else str(leaf.dtype).removeprefix("torch.")
    if leaf.shape is None:
        return dtype
    return f"{dtype}[{', '.join('?' if size is None else str(size) for size in leaf.shape)}]"
