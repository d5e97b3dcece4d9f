"""The NCCL lane of the data plane between hosts: CUDA tensors from device to device
(hosts.nccl-lane, hosts.nccl-fallback, hosts.nccl-streams).

A channel of the data plane (``_plane.Channel``: one output read on another host, for one
reader's host) goes by NCCL when the output's node is on a CUDA device and every node that reads
the output on the reader's host is on a CUDA device (``plan_lanes``, decided on the run's host,
where the whole net is), and both ends' processes can run NCCL (``able``: torch built with
NCCL, a CUDA device), which each end says in the plane's store before either uses the channel
(``agreed``). Any other channel, and one whose ends do not both say so, goes through host memory
as before.

On an NCCL channel, a message is still one signed Gloo message (``_plane_wire``): its header
carries the message's CPU tensors as before, and, in the signed structure, each CUDA tensor's
place in the message, dtype and shape (``outgoing``). The sender posts one NCCL send per CUDA
tensor after the Gloo message; the reader checks the Gloo message's signature first, as for
any message, then allocates each CUDA tensor on its reader's device from the checked dtype
and shape and posts the NCCL receive into it (``NcclLane.received``). The tensors go as bytes
(``uint8`` views), so every dtype of ``_plane_wire.DTYPES`` crosses, whatever NCCL's own
datatypes are.

NOTE [ one NCCL communicator per channel ]
NCCL's send and receive carry no tag: on one communicator, the n-th receive from a rank takes
the n-th send to it. The data plane's channels between two ranks each have their threads (a
sender thread per channel and the node threads that send directly, a receiver thread per
channel), so on one communicator shared by two channels a receive of one channel could take a
send of the other. Each channel therefore has an NCCL process group of its own, of its two
ends only (rank 0 the writer, rank 1 the reader), made from the plane's store under a prefix of
its own: on it, only the channel's sender posts sends (one at a time, ``_plane._Outbox``) and only
its receiver thread posts receives, so the n-th receive takes the n-th send. One ordered stream
of sends per pair of ranks would save communicators (each costs GPU memory and a proxy thread
of NCCL's), but would need one thread per pair to order the sends of all its channels, and a
receiver that posts its receives in that order, whatever channel's header came first over Gloo:
a hop between threads on every message, and a head-of-line wait between channels, which the
data plane is built to avoid. A group is made by its two ends only (``ProcessGroupNCCL`` on a
``PrefixStore``, not ``dist.new_group``, which every rank of a default group would have to
call), eagerly (``eager_connect_single_device``), when the plane connects at the start of the
real-time run: each process makes its channels' groups in the order of the channels' tags, so
two processes never wait for each other's groups in opposite orders.

NOTE [ the NCCL lane and CUDA streams ]
``ProcessGroupNCCL`` runs each send and receive on an internal stream of its own, after it
made that stream wait for the caller's current stream (of the tensor's device); its ``Work``
tells the end by ``is_completed()`` (a query of an event, no wait) and keeps the tensor from
the caching allocator until then. The sender's tensor is whole before any NCCL stream reads it:
an output whose message crosses by NCCL keeps its CUDA tensors on the node's device
(``Route.DEVICE``, as for a CUDA reader in its own process: cuda.send-stays-on-device), so
``send`` copied it on the node's stream and waited for that stream before the watcher saw it.
The lane posts its sends and receives with a stream of its own current (``NcclLane.stream``),
so NCCL's stream waits for nothing the node queued after it sent, nor for a node's stream
that the receiver thread left current after it ran an update (hosts.receiver-runs-updates);
a copy that makes a tensor contiguous goes on that stream too, before the send. The reader
publishes a message only once every receive of it is complete (``is_completed()``): its
tensors' bytes are then in device memory, which any stream reads, so a reader's kernels see
the whole message on its own stream, and ``Input.read`` records that stream on the tensor
(as for a message of its own process) so its memory is not reused before they are done.

Faults: every wait on NCCL here is a poll of ``is_completed()`` that also ends once the plane
has been closed for ``CLOSE_GRACE``: the control plane bounds a lost host (hosts.lost), and the
plane's close then aborts the channel's group, which ends any NCCL operation still posted.
The groups' own timeout is that of the Gloo group's operations (a day): NCCL's watchdog would
otherwise take a process down after its timeout while a reader merely does not read. One
fault is not Mujou's to bound: an NCCL operation in flight when the other end dies may fail
with NCCL's remote error, and
PyTorch's watchdog then, by default (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``), ends the process
that posted it rather than raising in it. Most of the time no operation is in flight (the
receiver waits for the next header on Gloo), so the control plane's hosts.lost holds; a program
that must survive such a death on the run's host sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``
there (abort the communicator only: the wait here then raises, as Gloo's does). Mujou sets no
such variable (settings.process-wide-untouched).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._distributed_c10d import PrefixStore

from .._processes._wire import Crossing, Rest
from ._plane_wire import DTYPES

POLL = 50e-6  # real seconds between two looks at an NCCL operation's end (a transfer takes ms)
# Real seconds an NCCL operation still in flight when the plane closes gets to complete, so that
# the channel ends as a Gloo channel does (its sender says goodbye once its sends completed);
# past it the operation's peer is taken for gone (the control plane reports why: hosts.lost).
CLOSE_GRACE = 1.0
OPERATION_TIMEOUT = datetime.timedelta(days=1)  # as the Gloo group's: never while the run runs
_INDEX = {dtype: i for i, dtype in enumerate(DTYPES)}
# The lane's part of a message's signed structure: each CUDA tensor's place among the message's
# tensors, its dtype (index into DTYPES) and its shape; then the nest's own rest.
Placed = tuple[tuple[tuple[int, int, tuple[int, ...]], ...], Rest]


@dataclass(frozen=True)
class Lane:
    """A channel that goes by NCCL where both ends can: its tag, and the CUDA device index of
    its writer's node and of its first reader's node on the reader's host."""

    tag: int
    writer_device: int
    reader_device: int


def plan_lanes(
    channels: Sequence[Any],
    writers: Mapping[str, torch.device],
    readers: Mapping[tuple[str, int], Sequence[torch.device]],
) -> tuple[Lane, ...]:
    """The channels that go by NCCL where both ends can (hosts.nccl-lane): those whose output's
    node (``writers``, by output) is on a CUDA device and whose readers on the reader's rank
    (``readers``, by output and rank, in registration order) are all on CUDA devices. The
    receive goes to the first reader's device. Pure: tested without a GPU."""
    found = []
    for channel in channels:
        writer = writers.get(channel.output)
        devices = readers.get((channel.output, channel.reader), ())
        if writer is None or writer.type != "cuda" or not devices:
            continue
        if any(device.type != "cuda" for device in devices):
            continue
        found.append(Lane(channel.tag, _index(writer), _index(devices[0])))
    return tuple(found)


def devices_of(
    placement: Any, ranks: Mapping[str, int]
) -> tuple[dict[str, torch.device], dict[tuple[str, int], list[torch.device]]]:
    """``plan_lanes``'s ``writers`` and ``readers`` from a placement (``ranks``: each process's
    rank in the plane, the run's host's ``""`` included)."""
    writers: dict[str, torch.device] = {}
    readers: dict[tuple[str, int], list[torch.device]] = {}
    for process, rank in ranks.items():
        nodes = placement.nodes_of(process)
        ports = {port.name: node for node in nodes for port in node._mujou.ports.values()}
        for output in placement.outgoing.get(process, {}):
            writers[output] = ports[output].device
        for output, inputs in placement.incoming.get(process, {}).items():
            readers[(output, rank)] = [ports[name].device for name in inputs]
    return writers, readers


def able() -> bool:
    """Whether this process can run the NCCL lane: torch built with NCCL, and a CUDA device."""
    from torch import distributed

    return bool(distributed.is_available() and distributed.is_nccl_available() and torch.cuda.is_available())


def chosen(
    lanes: Sequence[Lane], channels: Mapping[int, Any], rank: int, ables: Mapping[int, bool]
) -> tuple[Lane, ...]:
    """The lanes of ``rank``'s channels whose both ends said they can run NCCL (``ables``, by
    rank); the others go through host memory (hosts.nccl-fallback). Pure."""
    found = []
    for lane in lanes:
        channel = channels[lane.tag]
        if rank not in (channel.writer, channel.reader):
            continue
        if ables.get(channel.writer, False) and ables.get(channel.reader, False):
            found.append(lane)
    return tuple(found)


def agreed(lanes: Sequence[Lane], channels: Mapping[int, Any], rank: int, store: Any) -> tuple[Lane, ...]:
    """Say in the plane's ``store`` whether this process can run NCCL, read what the other
    ends of its lanes said (each ``get`` bounded by the store's timeout), and return the lanes
    that go by NCCL."""
    mine = [lane for lane in lanes if rank in (channels[lane.tag].writer, channels[lane.tag].reader)]
    if not mine:
        return ()
    here = able()
    store.set(f"nccl-able/{rank}", b"1" if here else b"0")
    ables = {rank: here}
    for lane in mine:
        channel = channels[lane.tag]
        other = channel.reader if channel.writer == rank else channel.writer
        if other not in ables:
            ables[other] = bytes(store.get(f"nccl-able/{other}")) == b"1"
    return chosen(mine, channels, rank, ables)


def lane_store(store: Any, prefix: str) -> Any:
    """The part of the plane's store (under its run's ``prefix``) where the lanes meet."""
    return PrefixStore(f"{prefix}/nccl/", store)


def count_key(rank: int) -> str:
    """The store's key of the count of messages sent to ``rank`` by NCCL (hosts.stats)."""
    return f"nccl-sent/{rank}"


def counts(store: Any, ranks: Mapping[str, int]) -> dict[str, int]:
    """The messages sent to each process (by name) by NCCL so far, from the plane's store."""
    return {process: int(store.add(count_key(rank), 0)) for process, rank in ranks.items()}


def kept(port: Any, name: str) -> Crossing:
    """The latest message of ``port`` (named ``name``) as it crosses on a lane: as
    ``_wire.split`` takes it, but its tensors on the node's CUDA device stay there."""
    from .._messages import rebuild

    latest = port._latest
    assert latest is not None
    message, _, nest, stamp, number, _ = latest
    device = port.node.device
    if nest is None:
        return name, [message if message.device == device else message.cpu()], None, stamp, number
    positions = tuple(i for i, leaf in enumerate(nest.leaves) if isinstance(leaf, torch.Tensor))
    tensors = [_kept(nest.leaves[i], device) for i in positions]
    holes = [0 if isinstance(leaf, torch.Tensor) else leaf for leaf in nest.leaves]
    return name, tensors, (rebuild(nest.spec, holes), positions), stamp, number


def watcher(port: Any, name: str, put: Callable[[Crossing], None]) -> Callable[[Any], None]:
    """The watcher that forwards each message of ``port`` (named ``name``) to a lane's
    channel (``put``), its CUDA tensors kept on the node's device (``kept``)."""

    def forward(message: Any) -> None:
        put(kept(port, name))

    return forward


def _kept(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor if tensor.device == device else tensor.cpu()


def on_host(crossing: Crossing) -> Crossing:
    """``crossing`` with its CUDA tensors copied to host memory: a ``kept`` message on a
    channel that goes through host memory after all (hosts.nccl-fallback)."""
    name, tensors, rest, stamp, number = crossing
    if all(tensor.is_cpu for tensor in tensors):
        return crossing
    return name, [tensor.cpu() for tensor in tensors], rest, stamp, number


class NcclLane:
    """One end of one channel's NCCL lane: its group of two, its stream, its sends or receives.

    .. note::
        ``send`` may be called from the sending node's thread and from the channel's sender
        thread, never at once (one thread sends at a time: ``_plane._Outbox``); ``received`` only
        from the channel's receiver thread. See NOTE [ one NCCL communicator per channel ].
    """

    def __init__(self, lane: Lane, *, reader: int | None, store: Any, closing: threading.Event) -> None:
        """This process's end of ``lane``: the writer's, with the reader's rank (``reader``:
        the sends are counted under its key), or the reader's (None)."""
        from torch import distributed

        self.lane = lane
        writer = reader is not None
        self.device = torch.device("cuda", lane.writer_device if writer else lane.reader_device)
        self._closing = closing
        self._store = store
        self._key = "" if reader is None else count_key(reader)  # the writer's: its count's in the store
        self.sent_count = 0  # the writer's: the messages whose NCCL sends completed, counted
        process_group: Any = getattr(distributed, "ProcessGroupNCCL")  # noqa: B009  # absent without NCCL
        options = process_group.Options()
        options._timeout = OPERATION_TIMEOUT
        with torch.cuda.device(self.device):
            # torch.cuda.Stream.__new__ carries no annotations.
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            self.group: Any = process_group(
                PrefixStore(f"group/{lane.tag}/", store), 0 if writer else 1, 2, options
            )
            self.group.eager_connect_single_device(self.device)  # fails here, at the start, if it cannot

    # -- the sender's end --------------------------------------------------------------------

    def outgoing(self, crossing: Crossing) -> tuple[Crossing, list[torch.Tensor]]:
        """The Gloo message of ``crossing`` (its CPU tensors, and the places, dtypes and shapes
        of its CUDA tensors in its signed structure), and the CUDA tensors that go by NCCL."""
        name, tensors, rest, stamp, number = crossing
        host: list[torch.Tensor] = []
        device: list[torch.Tensor] = []
        placed = []
        for place, tensor in enumerate(tensors):
            if tensor.device == self.device:
                index = _INDEX.get(tensor.dtype)
                if index is None or tensor.layout != torch.strided or tensor.is_quantized:
                    raise TypeError(
                        f"a tensor of dtype {tensor.dtype} and layout {tensor.layout} cannot cross "
                        "hosts: the data plane takes "
                        "dense tensors of the dtypes "
                        + ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
                    )
                placed.append((place, index, tuple(tensor.shape)))
                device.append(tensor)
            else:
                host.append(tensor if tensor.is_cpu else tensor.cpu())
        structure: Placed = (tuple(placed), rest)
        return (name, host, (structure, ()), stamp, number), device

    def send(self, tensors: Sequence[torch.Tensor]) -> list[Completion]:
        """Post an NCCL send of each of ``tensors``' bytes to the reader; what to wait for
        (the sender thread, which counts the message once its last send completed)."""
        works = []
        with torch.cuda.stream(self.stream):
            for tensor in tensors:
                if tensor.numel():
                    works.append(Completion(self.group.send([_bytes(tensor)], 1, 0), self))
        if works:
            works[-1].counts = True
        return works

    def _count(self) -> None:
        """A message's NCCL sends completed: count it in the plane's store, which
        ``run.stats()`` reads on the run's host (hosts.stats): a round trip to the store, on
        the sender thread, off the hand-off's path."""
        self._store.add(self._key, 1)
        self.sent_count += 1

    # -- the reader's end --------------------------------------------------------------------

    def reading(self, read: Callable[[], Crossing | None]) -> Callable[[], Crossing | None]:
        """``read`` (``_plane_wire.Incoming.read``: the checked Gloo message), then the
        message made whole by ``received``."""
        received = self.received

        def read_whole() -> Crossing | None:
            crossing = read()
            return None if crossing is None else received(crossing)

        return read_whole

    def received(self, crossing: Crossing) -> Crossing:
        """The message whose checked Gloo message is ``crossing``: its CUDA tensors received by
        NCCL onto this end's device (allocated from the signed dtypes and shapes), once they
        are complete. A bare tensor carries no placed tensors (it went whole over Gloo)."""
        name, host, rest, stamp, number = crossing
        if rest is None:
            return crossing
        structure: Placed = rest[0]
        placed, inner = structure
        made: list[tuple[int, torch.Tensor]] = []
        works = []
        with torch.cuda.stream(self.stream):
            for place, index, shape in placed:
                dtype = DTYPES[index]
                tensor = torch.empty(shape, dtype=dtype, device=self.device)
                if tensor.numel():
                    works.append(Completion(self.group.recv([_bytes(tensor)], 0, 0), self))
                made.append((place, tensor))
        for work in works:
            work.wait()
        tensors = list(host)
        for place, tensor in made:
            tensors.insert(place, tensor)
        return name, tensors, inner, stamp, number

    def close(self) -> None:
        """End the group: any operation still posted ends (the plane's threads are gone or
        leaving: their polls see the plane closing)."""
        with contextlib.suppress(RuntimeError):  # already aborted by NCCL's own error handling
            self.group.abort()


class Completion:
    """One NCCL operation to wait for: a poll of its end that also ends when the plane closes."""

    __slots__ = ("_lane", "_work", "counts")

    def __init__(self, work: Any, lane: NcclLane) -> None:
        self._work = work
        self._lane = lane
        self.counts = False  # the last send of a message: count the message once it completed

    def wait(self) -> None:
        """Return once the operation completed (raise its error, if it failed); raise
        ``RuntimeError`` if it did not within ``CLOSE_GRACE`` of the plane's close."""
        work, closing = self._work, self._lane._closing
        deadline = None
        while not work.is_completed():
            if closing.is_set():
                now = time.monotonic()
                if deadline is None:
                    deadline = now + CLOSE_GRACE
                elif now > deadline:
                    raise RuntimeError("the data plane closed during an NCCL transfer")
            time.sleep(POLL)
        with torch.cuda.stream(self._lane.stream):
            work.wait()  # raises its error; else gives the tensors back to the allocator
        if self.counts:
            self._lane._count()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes, as a flat ``uint8`` view (contiguous first, on the current stream)."""
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _index(device: torch.device) -> int:
    assert device.index is not None, "CUDA devices are pinned to an index when a node is made"
    return device.index
