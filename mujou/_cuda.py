"""Carrying out the routing plan on CUDA: stream pools, streams made current, waits, copies.

Nothing here runs for a net without CUDA nodes: a CPU node outside ``Plan.touches_cuda``
never reaches ``torch.cuda`` (cuda.cpu-node-no-cuda).
"""

from __future__ import annotations

import threading

import torch

from ._routing import Plan, StreamId

_pool_lock = threading.Lock()
_pool: dict[StreamId, torch.cuda.Stream] = {}  # the process's pools: 32 streams per device


def pool_stream(stream_id: StreamId) -> torch.cuda.Stream:
    """The stream ``stream_id`` of its device's pool, made on first use."""
    with _pool_lock:
        stream = _pool.get(stream_id)
        if stream is None:
            # torch.cuda.Stream.__new__ carries no annotations.
            made = torch.cuda.Stream(device=stream_id.device)  # type: ignore[no-untyped-call]
            stream = _pool[stream_id] = made
        return stream


class NodeStreams:
    """The streams of one node: its own (CUDA nodes) and its copy streams, by source device."""

    __slots__ = ("copy_streams", "device", "stream")

    def __init__(self, device: torch.device, plan: Plan, name: str) -> None:
        self.device = device
        own = plan.streams.get(name)
        self.stream = None if own is None else pool_stream(own)
        self.copy_streams = {
            source: pool_stream(stream_id)
            for (reader, source), stream_id in plan.copy_streams.items()
            if reader == name
        }

    def make_current(self) -> None:
        """Before a hook: the copy streams, then the node's device and stream (cuda.stream-current).

        Not undone after the hook: the next hook on this thread sets its own (see the
        "Threads and devices" page).
        """
        for stream in self.copy_streams.values():
            torch.cuda.set_stream(stream)
        if self.stream is not None:
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self.stream)

    def wait(self) -> None:
        """Wait for the work queued on the node's own stream, and only that (cuda.wait-after-update)."""
        if self.stream is not None:
            self.stream.synchronize()

    def copy_in(self, message: torch.Tensor) -> torch.Tensor:
        """A message of another CUDA device, copied to this node's device on its copy stream."""
        assert message.device.index is not None
        stream = self.copy_streams.get(message.device.index)
        if stream is None:  # not planned (a host-written tensor): the current stream copies it
            return message.to(self.device)
        with torch.cuda.stream(stream):
            copied = message.to(self.device)
        stream.synchronize()
        return copied


def host_to_node(message: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The host's snapshot of ``message`` for a node on ``device`` (cuda.write-on-device).

    A tensor already on the node's CUDA device stays there, copied on the host's current
    stream of that device, which is waited for; anything else goes through host memory.
    """
    message = message.detach()
    if device.type != "cuda":
        return message.to("cpu", copy=True)
    if message.device != device:
        message = message.to("cpu")
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream()
        copied = message.to(device, copy=True)
        stream.synchronize()
    return copied
