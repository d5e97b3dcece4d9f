"""How a net prints: the tree of its nodes, as ``print(torch.nn.Module)`` prints its modules.

``str()`` of a net, a node container or a node is this multi-line text; ``repr()`` stays one
short line (see :ref:`net.print`). Each node shows when it updates (period and rate, or
trigger), where (device, worker pool or own thread), and each port with its declared type
and its connections.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from ._node import Node, is_initialized
from ._ports import Input, Output
from ._specs import SpecTree, TensorSpec, describe

if TYPE_CHECKING:
    from ._port import _Port

INDENT = "  "


class Branch(Protocol):
    """What printing reads of a net or node container (``_net.Branch``): its members."""

    def _members(self) -> Iterator[tuple[str, Node | Branch]]: ...


def branch_text(branch: Branch) -> str:
    """The tree of ``branch``: ``Name(`` then each member, indented, then ``)``."""
    return "\n".join(_branch_lines(type(branch).__name__, branch, ""))


def node_text(node: Node) -> str:
    """One node: its heading line, then a line for each port."""
    return "\n".join(_node_lines(node, ""))


def _branch_lines(heading: str, branch: Branch, indent: str) -> list[str]:
    members = list(branch._members())
    if not members:
        return [f"{indent}{heading}()"]
    lines = [f"{indent}{heading}("]
    inner = indent + INDENT
    for key, member in members:
        label = f"({key}): "
        if isinstance(member, Node):
            node_lines = _node_lines(member, inner)
            node_lines[0] = f"{inner}{label}{node_lines[0].lstrip()}"
            lines += node_lines
        else:
            lines += _branch_lines(f"{label}{type(member).__name__}", member, inner)
    lines.append(f"{indent})")
    return lines


def _node_lines(node: Node, indent: str) -> list[str]:
    cls = type(node).__name__
    if not is_initialized(node):
        return [f"{indent}{cls}(not initialized: no super().__init__())"]
    lines = [f"{indent}{cls}({', '.join(_settings(node))})"]
    for attr, port in node._mujou.ports.items():
        lines.append(f"{indent}{INDENT}{_port_line(attr, port)}")
    return lines


def _settings(node: Node) -> list[str]:
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
