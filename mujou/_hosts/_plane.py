"""The data plane between hosts under the real-time timer: ``torch.distributed`` point to point
over Gloo (hosts.data-plane).

The run's host is rank 0 of a Gloo process group of its own; each group on another host is a
rank after it, in the order of ``processes=``. The group meets at a ``TCPStore`` on the run's
host (its address goes to each remote process in its ``Launch``, over the authenticated life
line). Each output read across hosts, for each reader's host, is a *channel*: a tag of its own
on the pair of ranks.

Latest value (proc.latest-value): a ``send`` on such an output never waits for the reader
(NOTE [ a send without a thread hop ]): a slow or stopped reader holds up the channel's sender
thread only, never the node that sends, and a reader that reads again gets the newest message.
The reader's side has a receiver thread per channel, which publishes each message on the
input's stand-in as the process layer's receiver does, then runs the update it made due itself
(hosts.receiver-runs-updates, ``_engine._lend.Lender.received``): a worker woken for it cost a
wake-up of another thread, and on a busy machine a wait for a core.

A message is one Gloo send of one byte tensor (``_plane_wire``): a header signed with
keyed BLAKE2b under a key made for the run, which only the authenticated life lines carry, then
the tensors' bytes. A receiver checks the signature before it reads anything else of the
header (or unpickles a nest's structure in it), so a stranger who reaches the Gloo ports can
send bytes but never make a process run code. Each tensor is a view of the received bytes.

The receiver posts its next receive (Gloo sends a message to a receive that waits for it, and
only then) as soon as it published a message, into a buffer of the room that message announced;
a message larger than that goes after a *grow* message that announces more room.

NOTE [ a send without a thread hop ]
A send on an output read on another host calls Gloo's send in the sending thread when the
channel has no send in flight (the last one completed: Gloo wrote it to the receive the reader
had posted); Gloo writes it without waiting. Otherwise the message goes into the channel's
one-message mailbox, which the channel's sender thread empties once the send in flight
completed. So there is at most one send in flight per channel, a slow reader holds up the
sender thread only, and a reader that reads again gets the newest message. The sender thread
also waits for each send to complete, so that the next one goes out from the sending thread
again: Gloo tells a send's end only to a wait. Checked on torch 2.13: a send's
``is_completed()`` stays false until ``wait()`` returned, even long after the reader took
it; ``get_future()`` is not implemented; a ``wait`` with a timeout that expires closes the
pair. Waiting in the next send instead (no thread; unsafe, as a slow reader would then stall
the node) made no difference to the hand-off's p50 that the noise of this machine let show.
Counted (2026-12-04, 256 B, ``bench/mujou_hosts.py``'s hand-off, 3 s, /proc's context
switches and CPU time of each thread, load 3.3-4.1): the sender thread here wakes 2.1 times
a message (the put's notify, then the send's completion in its wait) for 39.5 µs of CPU;
the node's thread 1.0 times, 183 µs (its update, the encoding and Gloo's send call); the
sending side's Gloo loop 1.0, 54 µs; on the reader's host Gloo's loop 1.3, 47 µs, and the
receiver thread 1.1, 161 µs. So the second wake-up is about 7 % of the CPU of a message,
and of the hand-off's path it is off it but for the core it takes. Gloo gives no way to
learn a send's end but a wait that blocks (and a timed one that expires closes the pair),
so one send in flight a channel with a buffer written again needs a thread that blocks on
each send: two wake-ups of it a message, as long as a message finds it idle.

NOTE [ where the reader's thread is woken ]
Gloo reads the socket on a thread of its own (``gloo_tcp_loop``), which the sender's write
wakes on the sender's CPU; that thread then wakes the receiver thread, which the kernel puts
on the CPU it ran on last if that CPU is idle. On the 2-core virtual machine of
bench/RESULTS.md a thread woken on an idle CPU runs about 30 µs later (the hypervisor wakes
that CPU), one woken on the waker's CPU about 6-10 µs later. Bare Gloo's sender blocks in
its ``wait()`` right after its write, so its reader's thread keeps to the one busy CPU: 80-87 %
of its wake-ups land there (``python -m bench.wake_placement mujou_hosts gloo_handoff 256``,
2026-12-05). Mujou's sending thread goes on with its update after the send, still runnable on
that CPU when the reader's thread is woken, so 76-83 % of the receiver thread's wake-ups went
to the other, idle CPU (p50 36 µs from the wake-up to running). Put to the test with a 100 µs
sleep after each send (not kept): 68 % on the waker's CPU, and the hand-off's p50 152, 151
and 168 µs without the sleep against 132, 131 and 136 µs with it, alternated. A node's send
does not block its worker for the reader's sake (other nodes wait for that worker), so that
part of the gap to bare Gloo stays on such a machine; on the 16-core one, where waking an idle
core is cheap, the hand-off was 1.11x bare Gloo (bench/RESULTS.md, 2026-12-04).
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch._C._distributed_c10d import PrefixStore, TCPStore

from .._engine._lend import fresh_settings
from .._ports import Output
from .._processes._member import Member
from .._processes._wire import NO_HOLDER, Crossing, joined, split
from .._routing import Route
from . import _nccl as nccl
from ._plane_wire import BYE, GROW, ROOM, Incoming, Outgoing, control, next_room, signer

JOIN_GRACE = 2.0  # real seconds the end of the run waits for each plane thread
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
    lanes: tuple[nccl.Lane, ...] = ()  # the channels that go by NCCL where both ends can (_nccl)

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
        self._outboxes: list[_Outbox] = []
        self._watchers: list[tuple[Output[Any], Any]] = []
        self._lanes: dict[int, nccl.NcclLane] = {}  # the channels that go by NCCL, by tag

    def attach(self) -> None:
        self.member.on_go.append(self.start)
        self.member.on_close.append(self.close)

    def start(self) -> None:
        """Forward the outputs read on other hosts; connect and receive on helper threads."""
        part, member = self.part, self.member
        outputs = member.forwarders.outputs
        lanes = {lane.tag for lane in part.lanes}
        for channel in part.channels:
            if channel.writer == part.rank:
                port = outputs[channel.output]
                if channel.tag in lanes and nccl.able():  # it may go by NCCL (_nccl)
                    outbox: _Outbox = _LaneOutbox(channel, part.key)
                    watcher = nccl.watcher(port, channel.output, outbox.put)
                    if port._route is Route.HOST and not port._readers:
                        # NOTE [ the NCCL lane and CUDA streams ]: its messages stay on its
                        # device (as for a CUDA reader in its process); with a CPU reader there,
                        # the plan gave no copy stream: they go through host memory.
                        port._route = Route.DEVICE
                else:
                    outbox = _Outbox(channel, part.key)
                    watcher = _watcher(port, channel.output, outbox)
                self._outboxes.append(outbox)
                port._add_watcher(watcher)
                self._watchers.append((port, watcher))
        self._spawn(self._connect, "mujou-plane-connect")
        for outbox in self._outboxes:
            self._spawn(outbox.run, f"mujou-plane-send-{outbox.channel.output}")
        for channel in part.channels:
            if channel.reader == part.rank:
                self._spawn(self._receive, f"mujou-plane-receive-{channel.output}", channel)

    def close(self) -> None:
        """Send nothing more, say so on each channel, and let the threads end (bounded)."""
        if self._closing.is_set():
            return
        self._closing.set()
        for port, watcher in self._watchers:
            port._remove_watcher(watcher)
        self._watchers.clear()
        for outbox in self._outboxes:
            outbox.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(JOIN_GRACE)
        for lane in list(self._lanes.values()):  # the connecting thread closes any it makes after
            lane.close()

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
        if part.lanes and not self._open_lanes(store):
            return
        self._ready.set()
        for outbox in self._outboxes:
            if isinstance(outbox, _LaneOutbox):
                outbox.lane = self._lanes.get(outbox.channel.tag)
            outbox.connected(self._group)

    def _open_lanes(self, store: Any) -> bool:
        """Agree on this process's NCCL lanes with their other ends and make their groups, in
        the order of the channels' tags (NOTE [ one NCCL communicator per channel ]). False,
        with the run stopped, if one cannot be made."""
        part = self.part
        channels = {channel.tag: channel for channel in part.channels}
        lanes_store = nccl.lane_store(store, part.prefix)
        for lane in nccl.agreed(part.lanes, channels, part.rank, lanes_store):
            channel = channels[lane.tag]
            reader = channel.reader if channel.writer == part.rank else None
            try:
                made = nccl.NcclLane(lane, reader=reader, store=lanes_store, closing=self._closing)
            except Exception as exc:
                error = RuntimeError(
                    f"output {channel.output!r} cannot cross by NCCL from rank {channel.writer} "
                    f"(cuda:{lane.writer_device}) to rank {channel.reader} (cuda:{lane.reader_device}): "
                    f"NCCL could not start on rank {part.rank}: {exc}"
                )
                self.member.engine.failed(NO_HOLDER, error)
                return False
            self._lanes[lane.tag] = made
            if self._closing.is_set():  # closed while it was made: close() may not have seen it
                made.close()
                return False
        return True

    def _wait_ready(self) -> bool:
        while not self._ready.wait(0.1):
            if self._closing.is_set():
                return False
        return True

    def _receive(self, channel: Channel) -> None:
        """Receive the channel's messages: publish each and run the update it makes due, then
        post the next receive (a message sent before that waits for it in the sender's Gloo;
        posting first would delay the publish by the call, tens of microseconds)."""
        if not self._wait_ready():
            return
        group, member = self._group, self.member
        engine, lender = member.engine, member.engine.lender
        name, writer, tag = channel.output, channel.writer, channel.tag
        standin, publish = member.standins.ports[name], member.standins.publish
        incoming = Incoming(name, signer(self.part.key))
        work = group.recv([incoming.buffer(ROOM)], writer, tag)
        fresh = fresh_settings()  # this thread's torch settings, read again after each update it runs
        read = incoming.read
        if (lane := self._lanes.get(tag)) is not None:  # then its CUDA tensors by NCCL (_nccl)
            read = lane.reading(read)
        while True:
            work.wait()
            crossing = read()
            if incoming.kind == BYE:
                return
            if crossing is not None and not (self._closing.is_set() or engine.ended):
                _, tensors, rest, stamp, number = crossing
                message, nest = (tensors[0], None) if rest is None else joined(tensors, rest)
                publish(None, name, message, nest, stamp=stamp, number=number)
                if standin._wakes:
                    if lender is None:
                        engine.arrived(standin)
                    else:  # the update it makes due, on this thread (hosts.receiver-runs-updates)
                        lender.received(standin, fresh)
                        fresh = fresh_settings()
            work = group.recv([incoming.buffer(incoming.room)], writer, tag)


class _Outbox:
    """The sending side of one channel (NOTE [ a send without a thread hop ]): a send goes
    out at once from the sending thread when none is in flight, else into a one-message
    mailbox that the channel's sender thread empties; that thread also waits for each send to
    complete, so that the next may go out at once."""

    def __init__(self, channel: Channel, key: bytes) -> None:
        self.channel = channel
        self._sign = signer(key)
        self._outgoing = Outgoing(self._sign)
        self._condition = threading.Condition()
        self._group: Any = None  # the plane's Gloo group, once connected
        self._pending: Crossing | None = None  # the mailbox
        self._work: list[Any] = []  # the sends in flight, until the sender thread saw them complete
        self._sending = False  # a thread is sending now
        self._error: BaseException | None = None  # a direct send's, for the sender thread to raise
        self._closed = False
        self._room = ROOM  # the room of the receive the reader has posted for the next message

    def connected(self, group: Any) -> None:
        with self._condition:
            self._group = group
            self._condition.notify()

    def put(self, crossing: Crossing) -> None:
        """Send ``crossing`` now if nothing is in flight, else leave it in the mailbox
        (replacing one still there). Never waits for the reader."""
        with self._condition:
            if self._closed:
                return
            if self._group is None or self._sending or self._work or self._pending is not None:
                self._pending = crossing
                self._condition.notify()
                return
            self._sending = True
        work: list[Any] = []
        try:
            work = self._send(crossing)
        except BaseException as exc:  # the sender thread raises it, not the node that sends
            with self._condition:
                self._error = exc
        finally:
            with self._condition:
                self._sending = False
                self._work = work
                self._condition.notify()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify()

    def run(self) -> None:
        """The sender thread: wait for each send in flight, send what the mailbox holds once
        none is; once closed, say so to the reader."""
        while (step := self._next()) is not None:
            work, crossing = step
            if crossing is None:
                for each in work:
                    each.wait()  # a reader that does not read holds up this thread only
                with self._condition:
                    self._work = []
                continue
            try:
                work = self._send(crossing)
            finally:
                with self._condition:
                    self._sending = False
                    self._work = work
        if self._group is not None:
            self._group.send([control(BYE, self._sign, ROOM)], self.channel.reader, self.channel.tag).wait()

    def _next(self) -> tuple[list[Any], Crossing | None] | None:
        """The sender thread's next step, once there is one: the sends in flight to wait for,
        or the mailbox's message to send (the thread is then the one sending); None once
        closed with nothing in flight. Raises a direct send's error."""
        with self._condition:
            while True:
                if self._error is not None:
                    raise self._error
                if not self._sending:
                    if self._work:
                        return self._work, None
                    if self._closed:
                        return None
                    if self._pending is not None and self._group is not None:
                        crossing, self._pending = self._pending, None
                        self._sending = True
                        return [], crossing
                self._condition.wait()

    def _send(self, crossing: Crossing) -> list[Any]:
        """Send ``crossing`` (after more room, if it needs it); the sends' works, which hold
        their tensors until they completed."""
        group, reader, tag = self._group, self.channel.reader, self.channel.tag
        outgoing = self._outgoing
        _, tensors, rest, stamp, number = crossing
        if rest is None and len(tensors) == 1:  # a bare tensor: the hot path, if of the last layout
            again = outgoing.encode_again(tensors[0], stamp, number)
            if again is not None:
                return [group.send([again], reader, tag)]
        size = outgoing.layout(crossing)
        works = []
        if size > self._room:
            self._room = max(ROOM, size)
            works.append(group.send([control(GROW, self._sign, self._room)], reader, tag))
        self._room = next_room(size, self._room)
        works.append(group.send([outgoing.encode(self._room)], reader, tag))
        return works


class _LaneOutbox(_Outbox):
    """The sending side of a channel planned for an NCCL lane (``_nccl``): its messages keep
    their CUDA tensors (``_nccl.watcher``); once connected, on the lane its ends agreed, each
    goes as its Gloo message, then its CUDA tensors by NCCL (the reader posts its receives once
    it checked that message); with no lane, through host memory as on any channel."""

    def __init__(self, channel: Channel, key: bytes) -> None:
        super().__init__(channel, key)
        self.lane: nccl.NcclLane | None = None  # set before it is connected, if agreed

    def _send(self, crossing: Crossing) -> list[Any]:
        lane = self.lane
        if lane is None:
            return super()._send(nccl.on_host(crossing))
        gloo, on_device = lane.outgoing(crossing)
        works = super()._send(gloo)
        works.extend(lane.send(on_device))
        return works


def _watcher(port: Output[Any], name: str, outbox: _Outbox) -> Any:
    def forward(message: Any) -> None:
        outbox.put(split(port, name))

    return forward


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
        self.lanes = nccl.plan_lanes(self.channels, *nccl.devices_of(placement, {"": 0, **self.ranks}))
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
        return Part(
            self.store.port, self.prefix, rank, self.size, self.channels, self.key, self.timeout, self.lanes
        )

    def nccl_received(self) -> dict[str, int]:
        """The messages each process (by name, the run's host's ``""``) received by NCCL so far
        (hosts.stats); empty if no channel may go by NCCL."""
        if not self.lanes:
            return {}
        return nccl.counts(nccl.lane_store(self.store, self.prefix), {"": 0, **self.ranks})


def _route_to(address: str) -> str:
    """This machine's address on the route to ``address`` ("HOST:PORT"); nothing is sent."""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host.strip("[]"), int(port)))
        found: str = probe.getsockname()[0]
    return found
