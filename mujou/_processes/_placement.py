"""``processes=``: which process each node of a net runs in, checked before anything starts.

See the "Processes" page of the spec (proc.placement, proc.arguments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._net import Branch
from .._node import Node
from .._port import PortNode
from .._ports import Output

HOST = ""  # the host's process, in the placement's maps


@dataclass
class Placement:
    """The processes of a run: each group's nodes, the host's, and the ports that cross."""

    groups: dict[str, list[Node]]  # by name, each in the net's order
    host: list[Node]
    where: dict[int, str]  # id(node) -> its process's name (HOST for the host's)
    # Per process: its outputs read in other processes, with the readers' processes, and
    # the outputs of other processes its inputs read, with those inputs (all by name).
    outgoing: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    incoming: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # Per process: the outputs of other processes whose messages wake a triggered node there.
    waking: dict[str, set[str]] = field(default_factory=dict)
    # The groups placed on other hosts, by name: their ``mujou.OnHost`` (mujou._hosts).
    hosts: dict[str, Any] = field(default_factory=dict)

    def process_of(self, node: PortNode) -> str:
        return self.where[id(node)]

    def nodes_of(self, process: str) -> list[Node]:
        return self.host if process == HOST else self.groups[process]


def check_processes(nodes: Sequence[Node], processes: object) -> Placement:
    """The placement ``processes=`` gives ``nodes`` (the net's), or a clear error (proc.arguments)."""
    if not isinstance(processes, Mapping):
        raise TypeError(
            "processes must be a dict from a process name to its nodes (a node, a net, a "
            "NodeList or NodeDict, or a list or tuple of those), "
            f"got {type(processes).__name__}: {processes!r}"
        )
    members = {id(node): node for node in nodes}
    order = {id(node): i for i, node in enumerate(nodes)}
    where: dict[int, str] = {}
    groups: dict[str, list[Node]] = {}
    hosts: dict[str, Any] = {}
    for name, given in processes.items():
        group = given
        if not isinstance(name, str):
            raise TypeError(f"a process name must be a str, got {type(name).__name__}: {name!r}")
        if not name:
            raise ValueError("a process name must not be empty: name each process, such as 'vision'")
        if hasattr(group, "_mujou_remote"):  # a group placed on another host (mujou.OnHost)
            hosts[name] = given
            group = given.group
        found = _group_nodes(name, group)
        if not found:
            raise ValueError(f"process {name!r} has no node: give it at least one node of the net")
        for node in found:
            if id(node) not in members:
                raise ValueError(
                    f"process {name!r} holds node {_named(node)}, which is not in the net given to mujou.run"
                )
            other = where.get(id(node))
            if other is not None and other != name:
                raise ValueError(
                    f"node {node.name!r} is in processes {other!r} and {name!r}; a node runs in one process"
                )
            where[id(node)] = name
        groups[name] = sorted({id(node): node for node in found}.values(), key=lambda n: order[id(n)])
    host = [node for node in nodes if id(node) not in where]
    for node in host:
        where[id(node)] = HOST
    placement = Placement(groups, host, where, hosts=hosts)
    _cross_ports(placement, nodes)
    return placement


def _group_nodes(name: str, group: object) -> list[Node]:
    items = list(group) if isinstance(group, list | tuple) else [group]
    found: list[Node] = []
    for item in items:
        if isinstance(item, Node):
            found.append(item)
        elif isinstance(item, Branch):
            found.extend(item.nodes())
        else:
            raise TypeError(
                f"processes[{name!r}] holds {item!r}, a {type(item).__name__}; a group is a node, "
                "a Net, a NodeList or a NodeDict, or a list or tuple of those"
            )
    return found


def _named(node: Node) -> str:
    return repr(node.name) if node.name else f"{type(node).__name__} (in no net)"


def _cross_ports(placement: Placement, nodes: Sequence[Node]) -> None:
    """Fill in the outputs whose readers are in other processes, on both sides."""
    names = [HOST, *placement.groups]
    placement.outgoing = {name: {} for name in names}
    placement.incoming = {name: {} for name in names}
    placement.waking = {name: set() for name in names}
    for node in nodes:
        here = placement.process_of(node)
        for port in node._mujou.ports.values():
            if not isinstance(port, Output):
                continue
            for reader in port._readers:
                there = placement.process_of(reader.node)
                if there == here:
                    continue
                readers = placement.outgoing[here].setdefault(port.name, [])
                if there not in readers:
                    readers.append(there)
                placement.incoming[there].setdefault(port.name, []).append(reader.name)
                trigger = reader.node.trigger
                if trigger is not None and reader._attr in trigger.inputs:
                    placement.waking[there].add(port.name)
