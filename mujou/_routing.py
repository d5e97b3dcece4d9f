"""Where each port's messages travel and which CUDA stream each node and copy uses.

A pure function of the net's devices and connections, so it is tested on machines without
a GPU; ``_cuda.py`` carries it out. See the CUDA rules of the "Threads and devices" page:
:ref:`cuda.send-stays-on-device`, :ref:`cuda.host-memory-route`, :ref:`cuda.stream-pool`,
:ref:`cuda.copy-stream` and :ref:`cuda.cpu-node-no-cuda`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

STREAMS_PER_DEVICE = 32  # the pool of each device; past it, nodes share streams (cuda.stream-pool)


class Route(enum.Enum):
    """How an output's messages travel."""

    DEVICE = "device"  # kept on the sender's CUDA device: a CUDA node reads the port
    HOST = "host"  # through host memory: only CPU nodes (or only the host) read it


@dataclass(frozen=True, order=True)
class StreamId:
    """One stream of a device's pool: ``pool_index`` in ``range(STREAMS_PER_DEVICE)``."""

    device: int
    pool_index: int


@dataclass(frozen=True)
class OutputSpec:
    """An output port: its name, its node, and the nodes that read it (in registration order)."""

    name: str
    node: str
    readers: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """The routing of a net.

    Attributes:
        routes: Each output's route, by port name.
        streams: Each CUDA node's own stream, by node name.
        copy_streams: The stream a node copies messages from another CUDA device on, by
            (node name, that device's index).
        touches_cuda: The nodes whose hooks Mujou makes a CUDA stream current for; a CPU
            node outside it never touches CUDA.
    """

    routes: Mapping[str, Route]
    streams: Mapping[str, StreamId]
    copy_streams: Mapping[tuple[str, int], StreamId]
    touches_cuda: frozenset[str]

    def stream_users(self, device: int) -> dict[StreamId, list[str]]:
        """Who uses each stream of ``device``: node names, and "node<-copy" for copy streams."""
        users: dict[StreamId, list[str]] = {}
        for name, stream in self.streams.items():
            if stream.device == device:
                users.setdefault(stream, []).append(name)
        for (name, _), stream in self.copy_streams.items():
            if stream.device == device:
                users.setdefault(stream, []).append(f"{name}<-copy")
        return users


def plan_routes(devices: Mapping[str, torch.device], outputs: Sequence[OutputSpec]) -> Plan:
    """Plan a net whose nodes (in registration order) have ``devices`` and ports ``outputs``."""
    routes: dict[str, Route] = {}
    copy_needs: list[tuple[str, int]] = []  # (reader, source device), in first-need order
    for output in outputs:
        sender = devices[output.node]
        cuda_reader = any(devices[reader].type == "cuda" for reader in output.readers)
        if sender.type == "cuda" and cuda_reader:
            routes[output.name] = Route.DEVICE
            for reader in output.readers:
                if devices[reader] != sender and (reader, _index(sender)) not in copy_needs:
                    copy_needs.append((reader, _index(sender)))
        else:
            routes[output.name] = Route.HOST
    used: dict[int, int] = {}  # streams handed out so far, per device

    def take(device: int) -> StreamId:
        count = used.get(device, 0)
        used[device] = count + 1
        return StreamId(device, count % STREAMS_PER_DEVICE)

    streams = {name: take(_index(device)) for name, device in devices.items() if device.type == "cuda"}
    order = {name: position for position, name in enumerate(devices)}
    copy_needs.sort(key=lambda need: (order[need[0]], need[1]))
    copy_streams = {need: take(need[1]) for need in copy_needs}
    touches = frozenset(streams) | frozenset(reader for reader, _ in copy_streams)
    return Plan(routes, streams, copy_streams, touches)


def _index(device: torch.device) -> int:
    assert device.index is not None, "CUDA devices are pinned to an index when a node is made"
    return device.index
