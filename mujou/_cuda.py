"""Carrying out the routing plan on CUDA: stream pools, streams made current, waits, copies.

Nothing here runs for a net without CUDA nodes: a CPU node outside ``Plan.touches_cuda``
never reaches ``torch.cuda`` (cuda.cpu-node-no-cuda).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ._messages import cpu_tensor_copy
from ._routing import STREAMS_PER_DEVICE, Plan, StreamId

_pool_lock = threading.Lock()
_pools: dict[int, list[torch.cuda.Stream]] = {}  # the process's pools: 32 streams per device
NODE_PRIORITY = -1  # high: a pool of its own, apart from the host's default-priority streams
_MAKE_ATTEMPTS = 8 * STREAMS_PER_DEVICE  # torch hands its streams out in turn: enough to see all


def pool_stream(stream_id: StreamId) -> torch.cuda.Stream:
    """The stream ``stream_id`` of its device's pool (cuda.stream-pool).

    The pool is made whole on the device's first use: 32 distinct streams, so two pool
    indices never share a stream, whatever other code takes streams meanwhile. torch has 32
    streams of each priority per device and hands them out in turn; the pool takes the
    high-priority ones, so the streams the host makes with ``torch.cuda.Stream()`` (default
    priority) are never a node's.
    """
    with _pool_lock:
        pool = _pools.get(stream_id.device)
        if pool is None:
            pool, seen = [], set()
            for _ in range(_MAKE_ATTEMPTS):
                # torch.cuda.Stream.__new__ carries no annotations.
                made = torch.cuda.Stream(device=stream_id.device, priority=NODE_PRIORITY)  # type: ignore[no-untyped-call]
                if made.cuda_stream not in seen:
                    seen.add(made.cuda_stream)
                    pool.append(made)
                if len(pool) == STREAMS_PER_DEVICE:
                    break
            _pools[stream_id.device] = pool
        return pool[stream_id.pool_index % len(pool)]


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

    def make_current(self, *, keep: bool) -> Callable[[], None] | None:
        """Before a hook: the copy streams, then the node's device and stream (cuda.stream-current).

        Not undone after a hook on Mujou's threads: the next hook there sets its own. With
        ``keep`` (the host's thread), returns what puts the thread's device and streams back.
        A node without a stream of its own (a CPU node with copy streams) keeps the
        thread's current device: ``torch.cuda.set_stream`` would change it.
        """
        device = torch.cuda.current_device()
        touched = {stream.device for stream in self.copy_streams.values()}
        if self.stream is not None:
            touched.add(self.stream.device)
        before = [torch.cuda.current_stream(each) for each in touched] if keep else []
        for stream in self.copy_streams.values():
            torch.cuda.set_stream(stream)
        if self.stream is not None:
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self.stream)
        else:
            torch.cuda.set_device(device)
        if not keep:
            return None

        def restore() -> None:
            for stream in before:
                torch.cuda.set_stream(stream)
            torch.cuda.set_device(device)

        return restore

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


def host_to_node(message: torch.Tensor, device: torch.device, copy: bool = True) -> torch.Tensor:
    """The host's snapshot of ``message`` for a node on ``device`` (cuda.write-on-device).

    A tensor already on the node's CUDA device stays there, copied on the host's current
    stream of that device, which is waited for; anything else goes through host memory. With
    ``copy=False`` (run.write-no-copy), a tensor already on ``device`` is the message itself
    (detached), once the host's current stream of a CUDA device has done its work.
    """
    if not copy and message.device == device:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return message.detach() if message.requires_grad else message
    if device.type != "cuda":
        return cpu_tensor_copy(message)
    message = message.detach()
    if message.device != device:
        message = message.to("cpu")
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream()
        copied = message.to(device, copy=True)
        stream.synchronize()
    return copied
