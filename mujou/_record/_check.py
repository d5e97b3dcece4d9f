"""Whether a recording's ports match a net's: what ``Recording.check_net`` and a replay's check report.

See :ref:`record.read-check-net` and :ref:`replay.mismatch`: one check for both. A node's
outputs are compared with the recording's channels by name (``"node.port"``), period, and,
where the port declares them, kind, dtype and shape; an output the recorded net had, and which
the recording was asked to record, that sent nothing has no channel and is no mismatch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Protocol

from .._net import Net
from .._node import Node
from .._ports import Input, Output
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
    @property
    def direction(self) -> str: ...


class Recorded(Protocol):
    """What the check reads of a recording (``mujou.Recording``)."""

    @property
    def ports(self) -> Mapping[str, RecordedPort]: ...
    @property
    def metadata(self) -> Mapping[str, str]: ...
    @property
    def net(self) -> Mapping[str, object]: ...


def recorded_outputs(recording: Recorded) -> set[str]:
    """The outputs the recorded net had, by name: a recording has no channel for an output
    on which the run sent nothing, and the net's structure (its ``mujou.net`` record) tells
    those from outputs the net did not have."""
    nodes = recording.net.get("nodes")
    found: set[str] = set()
    for node in nodes if isinstance(nodes, list) else ():
        ports = node.get("ports") if isinstance(node, Mapping) else None
        for port in ports if isinstance(ports, list) else ():
            if isinstance(port, Mapping) and port.get("kind") == "output":
                found.add(f"{node.get('name')}.{port.get('name')}")
    return found


def recorded_choice(recording: Recorded) -> set[str] | None:
    """The ports the recording was asked to record (its ``mujou`` record's ``outputs``),
    whether or not they sent; None where the file does not say."""
    text = recording.metadata.get("outputs", "")
    try:
        names = json.loads(text) if text else None
    except ValueError:
        return None
    return {name for name in names if isinstance(name, str)} if isinstance(names, list) else None


def mismatches(recording: Recorded, net: Net, nodes: Iterable[Node] | None) -> list[str]:
    """One line per port of ``nodes`` (None: every node of ``net``) that the recording lacks
    or records differently.

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
        problems += node_mismatches(recording, node, name)
    return problems


def node_mismatches(recording: Recorded, node: Node, name: str, *, period: bool = True) -> list[str]:
    """One line per port of ``node``, named ``name`` in the net, that the recording lacks or
    records differently, and per port recorded for it that it does not have; without
    ``period``, the node's period is not compared (a replay finds another period at its tags:
    replay.tag-mismatch)."""
    recorded = recording.ports
    known = recorded_outputs(recording)
    chosen = recorded_choice(recording)
    ports = node._mujou.ports
    outputs = {attr: port for attr, port in ports.items() if isinstance(port, Output)}
    written = {attr for attr, port in ports.items() if isinstance(port, Input) and port.source is None}
    problems: list[str] = []
    for attr, port in outputs.items():
        full = f"{name}.{attr}"
        found = recorded.get(full)
        if found is None and full in known:
            if chosen is not None and full not in chosen:
                problems.append(
                    f"{full!r} was left out of the recording (Recorder(outputs=)); record every output"
                )
            continue  # recorded, but it sent nothing: no channel
        problems += _port_problems(full, node, port, found, period)
    for held in recorded.values():
        if held.node != name or held.port in outputs:
            continue
        if held.direction == "input" and held.port in written:
            continue  # the host's writes of an input without a source (record.writes)
        problems.append(f"{held.name!r} is recorded, but node {name!r} has no output {held.port!r}")
    return problems


def _port_problems(
    name: str, node: Node, port: Output[object], found: RecordedPort | None, period: bool
) -> list[str]:
    if found is None:
        return [f"{name!r} is not in the recording"]
    problems = []
    if period and node.period != found.period:
        problems.append(f"{name!r}: the node's period is {node.period!r}, the recording's {found.period!r}")
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
