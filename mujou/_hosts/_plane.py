"""The data plane between hosts under the real-time timer: ``torch.distributed`` point to point
over Gloo (hosts.data-plane).

The run's host is rank 0 of a Gloo process group of its own; each group on another host is a
rank after it, in the order of ``processes=``. The group meets at a ``TCPStore`` on the run's
host (its address goes to each remote process in its ``Launch``, over the authenticated life
line). Each output read across hosts, for each reader's host, is a *channel*: a tag of its own
on the pair of ranks.

Latest value (proc.latest-value): a ``send`` on such an output only puts the message into the
channel's one-message mailbox, replacing one still there; the channel's sender thread takes
the newest and sends it. So a slow or stopped reader holds up that thread only, never the
node that sends, and a reader that reads again gets the newest message. The reader's side
has a receiver thread per channel, always waiting for the next message, which it publishes on
the input's stand-in (and wakes its triggered readers) as the process layer's receiver does.

A message is two Gloo sends: its length, then one byte tensor with a header and the tensors'
bytes. The header (the stamp, the sender's number, the nest's structure, each tensor's dtype
and shape) is pickled and signed with HMAC-SHA256 under a key made for the run, which only
the authenticated life lines carry; a receiver checks the signature before it unpickles the
header, so a stranger who reaches the Gloo ports can send bytes but never make a process run
code. Each tensor is rebuilt from the bytes against its dtype and shape.
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import hmac
import os
import pickle
import secrets
import socket
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._distributed_c10d import PrefixStore, TCPStore

from .._ports import Output
from .._processes._member import Member
from .._processes._wire import NO_HOLDER, Crossing, joined, split

ALIGN = 16  # bytes: each tensor starts at a multiple of this in a message (for .view(dtype))
JOIN_GRACE = 2.0  # real seconds the end of the run waits for each plane thread
_HEAD = struct.Struct("!I32s")  # the header's length, its HMAC-SHA256
_BYE = -1  # a length that says the sender closed the channel
OPERATION_TIMEOUT = datetime.timedelta(days=1)  # a receiver waits for a quiet output that long


@dataclass(frozen=True)
class Channel:
    """One output read on another host: its name, the writing and reading ranks, its tag."""

    output: str
    writer: int
    reader: int
    tag: int


@dataclass(frozen=True)
class Part:
    """What one process of the plane is given: where the group meets, its rank, its channels."""

    store_port: int
    prefix: str
    rank: int
    size: int
    channels: tuple[Channel, ...]
    key: bytes
    timeout: float

    def attach(self, member: Member, control: Any) -> None:
        """In a remote process: take part in the plane, from the control connection's ends."""
        with socket.socket(fileno=os.dup(control.fileno())) as duplicate:
            here, there = duplicate.getsockname()[0], duplicate.getpeername()[0]
        Plane(self, member, here=here, store_host=there, store=None).attach()


class Plane:
    """One process's part in the data plane: its channels' threads, started at go."""

    def __init__(self, part: Part, member: Member, *, here: str, store_host: str, store: Any) -> None:
        self.part = part
        self.member = member
        self._here = here
        self._store_host = store_host
        self._store = store
        self._group: Any = None
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._mailboxes: dict[int, _Mailbox] = {}
        self._watchers: list[tuple[Output[Any], Any]] = []

    def attach(self) -> None:
        self.member.on_go.append(self.start)
        self.member.on_close.append(self.close)

    def start(self) -> None:
        """Forward the outputs read on other hosts; connect and receive on helper threads."""
        part, member = self.part, self.member
        outputs = member.forwarders.outputs
        for channel in part.channels:
            if channel.writer == part.rank:
                mailbox = self._mailboxes[channel.tag] = _Mailbox()
                port = outputs[channel.output]
                watcher = _watcher(port, channel.output, mailbox)
                port._add_watcher(watcher)
                self._watchers.append((port, watcher))
        self._spawn(self._connect, "mujou-plane-connect")
        for channel in part.channels:
            if channel.writer == part.rank:
                self._spawn(self._send, f"mujou-plane-send-{channel.output}", channel)
            elif channel.reader == part.rank:
                self._spawn(self._receive, f"mujou-plane-receive-{channel.output}", channel)

    def close(self) -> None:
        """Send nothing more, say so on each channel, and let the threads end (bounded)."""
        if self._closing.is_set():
            return
        self._closing.set()
        for port, watcher in self._watchers:
            port._remove_watcher(watcher)
        self._watchers.clear()
        for mailbox in self._mailboxes.values():
            mailbox.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(JOIN_GRACE)

    # -- the threads -------------------------------------------------------------------------

    def _spawn(self, body: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=self._guarded, args=(body, *args), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guarded(self, body: Any, *args: Any) -> None:
        """A plane thread. Gloo's error when the other end's process is gone is expected: the
        control plane reports that death (hosts.lost), so the thread gives it the group's
        timeout to stop the run; an error the run outlives, or any other, stops the run
        (MujouInternalError), never a silent thread death."""
        try:
            body(*args)
        except BaseException as exc:
            engine = self.member.engine
            if self._closing.is_set() or engine.ended:
                return
            if isinstance(exc, RuntimeError) and self._closing.wait(self.part.timeout + 1.0):
                return
            if not engine.ended:
                engine.crashed(NO_HOLDER, exc, exits=False)

    def _connect(self) -> None:
        from torch import distributed

        part = self.part
        store = self._store
        if store is None:
            store = TCPStore(
                self._store_host,
                part.store_port,
                is_master=False,
                timeout=datetime.timedelta(seconds=part.timeout),
            )
        # Options are not in torch's stubs; they are the one way to give the group its device.
        options: Any = distributed.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._devices = [distributed.ProcessGroupGloo.create_device(hostname=self._here)]
        options._timeout = OPERATION_TIMEOUT
        self._group = distributed.ProcessGroupGloo(
            PrefixStore(part.prefix, store), part.rank, part.size, options
        )
        self._ready.set()

    def _wait_ready(self) -> bool:
        while not self._ready.wait(0.1):
            if self._closing.is_set():
                return False
        return True

    def _send(self, channel: Channel) -> None:
        mailbox = self._mailboxes[channel.tag]
        if not self._wait_ready():
            return
        group, key = self._group, self.part.key
        length = torch.zeros(1, dtype=torch.int64)
        while True:
            crossing = mailbox.take()
            if crossing is None:  # closed: say so to the reader
                length[0] = _BYE
                group.send([length], channel.reader, channel.tag).wait()
                return
            payload = encode(crossing, key)
            length[0] = payload.numel()
            group.send([length], channel.reader, channel.tag).wait()
            group.send([payload], channel.reader, channel.tag).wait()

    def _receive(self, channel: Channel) -> None:
        if not self._wait_ready():
            return
        group, key, member = self._group, self.part.key, self.member
        length = torch.zeros(1, dtype=torch.int64)
        while True:
            group.recv([length], channel.writer, channel.tag).wait()
            size = int(length[0])
            if size == _BYE:
                return
            payload = torch.empty(size, dtype=torch.uint8)
            group.recv([payload], channel.writer, channel.tag).wait()
            name, tensors, rest, stamp, number = decode(channel.output, payload, key)
            message, nest = joined(tensors, rest)
            if self._closing.is_set() or member.engine.ended:
                continue
            member.standins.publish(member.engine, name, message, nest, stamp=stamp, number=number)


class _Mailbox:
    """One message, the newest: a put replaces what the sender thread has not taken yet."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._crossing: Crossing | None = None
        self._closed = False

    def put(self, crossing: Crossing) -> None:
        with self._condition:
            self._crossing = crossing
            self._condition.notify()

    def take(self) -> Crossing | None:
        """The newest message, waiting for one; None once closed."""
        with self._condition:
            while self._crossing is None and not self._closed:
                self._condition.wait()
            if self._closed:
                return None
            crossing, self._crossing = self._crossing, None
            return crossing

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()


def _watcher(port: Output[Any], name: str, mailbox: _Mailbox) -> Any:
    def forward(message: Any) -> None:
        mailbox.put(split(port, name))

    return forward


# -- the message's bytes --------------------------------------------------------------------------


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def encode(crossing: Crossing, key: bytes) -> torch.Tensor:
    """One byte tensor: the signed header, then each tensor's bytes, aligned."""
    _, tensors, rest, stamp, number = crossing
    flat = [tensor.contiguous() for tensor in tensors]
    header = pickle.dumps(
        (stamp, number, rest, [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in flat]),
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    mac = hmac.new(key, header, hashlib.sha256).digest()
    start = _aligned(_HEAD.size + len(header))
    sizes = [_aligned(t.numel() * t.element_size()) for t in flat]
    payload = torch.empty(start + sum(sizes), dtype=torch.uint8)
    head = _HEAD.pack(len(header), mac) + header
    payload[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    offset = start
    for tensor, size in zip(flat, sizes, strict=True):
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            payload[offset : offset + nbytes] = tensor.reshape(-1).view(torch.uint8)
        offset += size
    return payload


def decode(name: str, payload: torch.Tensor, key: bytes) -> Crossing:
    """The message ``encode`` made; ValueError for a header not signed with ``key``."""
    if payload.numel() < _HEAD.size:
        raise ValueError(f"a message on {name!r} is shorter than its header")
    length, mac = _HEAD.unpack(ctypes.string_at(payload.data_ptr(), _HEAD.size))
    if _HEAD.size + length > payload.numel():
        raise ValueError(f"a message on {name!r} is shorter than its header")
    header = ctypes.string_at(payload.data_ptr() + _HEAD.size, length)
    if not hmac.compare_digest(mac, hmac.new(key, header, hashlib.sha256).digest()):
        raise ValueError(
            f"a message on {name!r} is not signed with the run's key: it was not sent by the run"
        )
    stamp, number, rest, layouts = pickle.loads(header)
    offset = _aligned(_HEAD.size + length)
    tensors = []
    for dtype_name, shape in layouts:
        dtype = getattr(torch, dtype_name)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a message on {name!r} names no dtype: {dtype_name!r}")
        count = 1
        for extent in shape:
            count *= extent
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if offset + nbytes > payload.numel():
            raise ValueError(f"a message on {name!r} is shorter than its tensors")
        tensors.append(payload[offset : offset + nbytes].view(dtype).reshape(shape))
        offset += _aligned(nbytes)
    return name, tensors, rest, stamp, number


# -- the run's host ------------------------------------------------------------------------------


def channels(
    hosts: Sequence[str], outgoing: Mapping[str, Mapping[str, Sequence[str]]], local: Sequence[str]
) -> tuple[Channel, ...]:
    """The channels of a run: each output read across hosts, for each reader's rank. ``hosts``:
    the remote groups in order (ranks 1...); the run's host is rank 0 (with ``local``, the groups
    in processes of its own machine, which may not exchange with remote ones)."""
    rank = {"": 0, **{name: i for i, name in enumerate(hosts, start=1)}}
    found: list[Channel] = []
    for writer, outputs in outgoing.items():
        for output, readers in sorted(outputs.items()):
            for reader in readers:
                if writer not in hosts and reader not in hosts:
                    continue  # within the run's host: the process layer's rings
                if writer in local or reader in local:
                    raise ValueError(
                        f"output {output!r} goes from process {writer!r} to process {reader!r}, one on "
                        "another host and one in a process of the run's own host: under the "
                        "real-time timer, a port that crosses hosts goes from or to the run's host's "
                        "own process or a group on another host; place the group on the run's host "
                        "in the host's process (no group), or run under the virtual timer"
                    )
                found.append(Channel(output, rank[writer], rank[reader], len(found)))
    return tuple(found)


class HostPlane:
    """The run's host's side: the store where the plane meets, rank 0's part, each remote's."""

    def __init__(self, member: Member, placement: Any, address: str, timeout: float) -> None:

        remote = list(placement.hosts)
        local = [name for name in placement.groups if name not in placement.hosts]
        self.channels = channels(remote, placement.outgoing, local)
        self.ranks = {name: i for i, name in enumerate(remote, start=1)}
        self.size = 1 + len(remote)
        self.prefix = secrets.token_hex(8)
        self.key = secrets.token_bytes(32)
        self.timeout = timeout
        here = _route_to(address)
        self.store = TCPStore(
            here, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout)
        )
        part = self.part(0)
        Plane(part, member, here=here, store_host=here, store=self.store).attach()

    def part(self, rank: int) -> Part:
        return Part(self.store.port, self.prefix, rank, self.size, self.channels, self.key, self.timeout)


def _route_to(address: str) -> str:
    """This machine's address on the route to ``address`` ("HOST:PORT"); nothing is sent."""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host.strip("[]"), int(port)))
        found: str = probe.getsockname()[0]
    return found
