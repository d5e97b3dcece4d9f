"""One state tree and one set of stats for a run with processes, from each process's (proc.state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._node import Node
from .._ports import Input, Output
from .._state import META_KEY
from .._stats import RunStats, host_stats
from .._tree import _lookup
from ._placement import HOST, Placement


def merge_trees(
    nodes: Sequence[Node], placement: Placement, trees: Mapping[str, Mapping[str, Any]], now: float
) -> dict[str, Any]:
    """The one tree of the run, from each process's: as one process would give it (proc.state)."""
    tree: dict[str, Any] = {}
    saved_nodes: dict[str, Any] = {}
    ports: dict[str, Any] = {}
    fresh: dict[str, Any] = {}
    for node in nodes:
        own = trees[placement.process_of(node)]
        meta = own[META_KEY]
        *parents, leaf = node.name.split(".")
        branch = tree
        for part in parents:
            branch = branch.setdefault(part, {})
        branch[leaf] = _lookup(own, node.name)
        saved_nodes[node.name] = meta["nodes"][node.name]
        for port in node._mujou.ports.values():
            if isinstance(port, Output) or (isinstance(port, Input) and port.source is None):
                ports[port.name] = meta["ports"][port.name]
        for port in node._mujou.ports.values():
            if isinstance(port, Input):
                fresh[port.name] = meta["fresh"][port.name]
    host_meta = trees[HOST][META_KEY]
    tree[META_KEY] = {
        "version": host_meta["version"],
        "time": now,
        "nodes": saved_nodes,
        "ports": ports,
        "fresh": fresh,
    }
    return tree


def merge_stats(
    nodes: Sequence[Node],
    placement: Placement,
    stats: Mapping[str, RunStats],
    now: float,
    remote: Mapping[str, tuple[str, float]] | None = None,
    *,
    nccl: Mapping[str, int] | None = None,
) -> RunStats:
    """The run's stats from each process's: every node, every worker (the host's first);
    with ``remote`` (each group on another host's address and clock offset), each host's, and
    with ``nccl`` the messages each process (by name) received by NCCL."""
    order = [HOST, *placement.groups]
    merged = {node.name: stats[placement.process_of(node)].nodes[node.name] for node in nodes}
    hosts = {}
    if remote:
        where = {node.name: remote.get(placement.process_of(node), ("", 0.0))[0] for node in nodes}
        by_host: dict[str, int] = {}
        for process, count in (nccl or {}).items():
            address = remote.get(process, ("", 0.0))[0]
            by_host[address] = by_host.get(address, 0) + count
        hosts = host_stats(merged, where, dict(remote.values()), by_host)
    return RunStats(
        time=now,
        workers=sum(stats[name].workers for name in order),
        nodes=merged,
        worker_busy=tuple(busy for name in order for busy in stats[name].worker_busy),
        hosts=hosts,
    )
