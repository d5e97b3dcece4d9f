"""Whether a recording's ports match a net's: what ``Recording.check_net`` reports.

See :ref:`record.read-check-net`. A node's outputs are compared with the recording's channels
by name (``"node.port"``), period, and, where the port declares them, kind, dtype and shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from .._net import Net
from .._node import Node
from .._ports import Output
from .._specs import TensorSpec


class RecordedPort(Protocol):
    """What the check reads of a recorded port (``mujou.RecordedPort``, which the reader makes:
    named by its shape here, so that this module does not import the reader that calls it)."""

    @property
    def name(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def port(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...] | None: ...
    @property
    def period(self) -> float | None: ...


def mismatches(recorded: Mapping[str, RecordedPort], net: Net, nodes: Iterable[Node] | None) -> list[str]:
    """One line per port of ``nodes`` that the recording lacks or records differently.

    Raises:
        TypeError: ``net`` is not a Net, or ``nodes`` holds something that is not one of its nodes.
    """
    if not isinstance(net, Net):
        raise TypeError(f"net must be a mujou.Net, got {type(net).__name__}: {net!r:.100}")
    named = {id(node): name for name, node in net.named_nodes()}
    chosen = list(net.nodes()) if nodes is None else list(nodes)
    problems: list[str] = []
    for node in chosen:
        if not isinstance(node, Node):
            raise TypeError(f"nodes must be nodes of the net, got {type(node).__name__}: {node!r:.100}")
        name = named.get(id(node))
        if name is None:
            raise TypeError(f"nodes must be nodes of the net; {node!r:.100} is not in it")
        outputs = {attr: port for attr, port in node._mujou.ports.items() if isinstance(port, Output)}
        for attr, port in outputs.items():
            problems += _port_problems(f"{name}.{attr}", node, port, recorded.get(f"{name}.{attr}"))
        problems += [
            f"{port.name!r} is recorded, but node {name!r} has no output {port.port!r}"
            for port in recorded.values()
            if port.node == name and port.port not in outputs
        ]
    return problems


def _port_problems(name: str, node: Node, port: Output[object], found: RecordedPort | None) -> list[str]:
    if found is None:
        return [f"{name!r} is not in the recording"]
    problems = []
    period = node.period
    if period != found.period:
        problems.append(f"{name!r}: the node's period is {period!r}, the recording's {found.period!r}")
    declared = port._declared
    if declared is None:
        return problems
    spec = declared.tree
    if not isinstance(spec, TensorSpec):
        if found.kind != "structured":
            problems.append(f"{name!r}: the port declares {declared.text}, the recording holds tensors")
        return problems
    if found.kind != "tensor":
        problems.append(f"{name!r}: the port declares tensors ({spec!r}), the recording holds nests")
        return problems
    dtype = None if spec.dtype is None else str(spec.dtype).removeprefix("torch.")
    if dtype is not None and found.dtype and dtype != found.dtype:
        problems.append(f"{name!r}: the port declares dtype {dtype}, the recording's is {found.dtype}")
    if spec.shape is not None and found.shape is not None and not _fits(spec.shape, found.shape):
        problems.append(
            f"{name!r}: the port declares shape {list(spec.shape)}, the recording's is {list(found.shape)}"
        )
    return problems


def _fits(declared: tuple[int | None, ...], shape: tuple[int, ...]) -> bool:
    return len(declared) == len(shape) and all(
        want is None or want == size for want, size in zip(declared, shape, strict=True)
    )
