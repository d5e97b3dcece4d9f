"""Replay: a run with some of its nodes replaced by their recording (see :ref:`replay.replaced`).

NOTE [ a replaced node keeps its schedule ]
A replaced node stays in the net with its name, ports, period, trigger and inputs; only the
object whose hooks the engine calls changes (``Slot.actor``): a ``_Standin`` that sends the
recorded messages instead of running the node's hooks. Under the virtual timer a run is
deterministic, so the stand-in updates at exactly the tags the node did, and in each update it
sends the messages recorded at that tag (stamped, staged and committed as the node's own: the
readers cannot tell). A recorded message at a tag where the stand-in does not update means the
recording is not of this run (another net, seed or input): that is an error naming the port
and both tags, never a silent drift. The engine needs no scheduling of its own for replay.

Scheduling the stand-in by the recorded tags instead would let it run where its node would not
(its upstream changed), but a tag's microstep is the engine's count of the chain that led to it
and cannot be asked for; and an update of a triggered node at a tag it was not woken at would
break the tag rule for its readers. A node whose upstream changed is a run that the recording
does not describe: the check says so.

Under the real-time timer tags do not repeat: each update of the stand-in sends every
recorded message up to the replay's position in the recording (``Replay.position``), which
moves ``rate`` recording seconds per timer second and can be paused and moved (``seek``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import torch

from .._messages import map_tensors
from .._node import Node
from .._numbers import non_negative, positive
from .._ports import Input, Output
from .._state import META_KEY
from ._check import node_mismatches
from ._reader import RecordedMessage, Recording

if TYPE_CHECKING:
    from .._engine import Engine
    from .._engine._slot import Slot
    from .._handles import RunView
    from .._processes._placement import Placement


def tag_ns(time: float) -> int:
    """A timer time as the recording stores it: whole nanoseconds."""
    return round(time * 1e9)


def recorded_timer(recording: Recording) -> str:
    """The timer the recording was made under: "virtual", "real", or "" when it does not say."""
    return recording.metadata.get("timer", "")


@final
class Replay:
    """Nodes of a net replaced by their recording, for one run at a time.

    Pass it to ``mujou.run(net, replay=...)``. The replaced nodes' hooks do not run; each of
    their updates sends what the node sent at that time in the recorded run. Under the virtual
    timer the other nodes then do exactly what they did there, bit for bit. See
    :ref:`replay.replaced` and :ref:`replay.identical`.

    Args:
        recording: The :class:`mujou.Recording` to replay.
        nodes: The nodes to replace, by name in the net (``"camera"``, ``"arm.joint"``) or as
            the node objects.
        start: Start from the recording's keyframe at or before this time (its state tree)
            instead of from the beginning (:ref:`replay.start`).
        rate: Recording seconds per timer second under the real-time timer
            (:ref:`replay.real-time`); ``1.0`` under the virtual timer.
        writes: Make the recorded host's writes (``inputs=`` and ``run.write``) at their
            recorded tags, so that the host's calls need not make them again
            (:ref:`replay.writes`; virtual timer). ``nodes`` may then be empty.

    Raises:
        TypeError, ValueError: an argument is not allowed.
    """

    def __init__(
        self,
        recording: Recording,
        *,
        nodes: Iterable[str | Node],
        start: float | None = None,
        rate: float = 1.0,
        writes: bool = False,
    ) -> None:
        if not isinstance(recording, Recording):
            raise TypeError(
                f"recording must be a mujou.Recording, got {type(recording).__name__}: {recording!r}"
            )
        if isinstance(nodes, str | Node) or not isinstance(nodes, Iterable):
            raise TypeError(
                f"nodes must be a list of node names or nodes, got {type(nodes).__name__}: {nodes!r}"
            )
        names: list[str] = []
        for node in nodes:
            if isinstance(node, Node):
                if not node.name:
                    raise ValueError(f"nodes: {node!r} is in no net; replace the nodes of the net you run")
                name = node.name
            elif isinstance(node, str):
                name = node
            else:
                raise TypeError(
                    f"nodes must hold node names (str) or nodes, got {type(node).__name__}: {node!r}"
                )
            if name in names:
                raise ValueError(f"nodes names {name!r} twice")
            names.append(name)
        if not isinstance(writes, bool):
            raise TypeError(f"writes must be a bool, got {type(writes).__name__}: {writes!r}")
        if not names and not writes:
            raise ValueError("nodes must name at least one node to replace (or writes=True)")
        if writes and start is not None:
            raise ValueError(
                "Replay(writes=True) makes the host's writes from the recording's beginning; "
                "it does not start at a keyframe (start=)"
            )
        self.recording = recording
        self.nodes: tuple[str, ...] = tuple(names)
        self.start = None if start is None else non_negative("start", start, optional=True)
        self.rate = positive("rate", rate, unit="")
        self.writes = writes
        self._inputs: dict[str, Input[Any]] = {}  # writes=True: the inputs the replay writes
        self._first: set[str] = set()  # those whose first message went as inputs=
        self._lock = threading.Lock()  # the position, from the host and the stand-ins
        self._engine: Engine | None = None
        self._anchor_run = 0.0  # the timer time at which the position was last set
        self._anchor_position = 0.0  # the position then
        self._paused = False
        self._seeks = 0  # counts seeks: a stand-in reopens its messages when it changed
        self._seek_to = 0.0  # the time of the last seek: they reopen there

    def __repr__(self) -> str:
        start = "" if self.start is None else f", start={self.start!r}"
        rate = "" if self.rate == 1.0 else f", rate={self.rate!r}"
        writes = ", writes=True" if self.writes else ""
        return f"Replay({self.recording!r}, nodes={list(self.nodes)!r}{start}{rate}{writes})"

    # -- mujou.run's side ------------------------------------------------------------------

    def _recorded_seed(self) -> int | None:
        """The recorded run's seed (its ``mujou`` record's ``run_seed``), or None where the
        file does not say (a recording of a Mujou without run seeds)."""
        text = self.recording.metadata.get("run_seed", "")
        return int(text) if text.isdigit() else None

    def _state(self, state: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The state tree the run starts from: the keyframe of ``start``, or ``state``."""
        if self.writes and state is not None:
            raise ValueError(
                "Replay(writes=True) makes the host's writes from the recording's beginning: "
                "run it without state="
            )
        if self.start is None:
            return state
        if state is not None:
            raise ValueError(
                "give the replay's first state either as Replay(start=) (a keyframe of the "
                "recording) or as mujou.run(state=), not both"
            )
        return self.recording.state_at(self.start)

    def _check(self, nodes: Sequence[Node], virtual: bool, placement: Placement | None) -> None:
        """Refuse, before any node starts, a replay that does not fit the net and the run."""
        by_name = {node.name: node for node in nodes}
        unknown = [name for name in self.nodes if name not in by_name]
        if unknown:
            raise ValueError(
                f"Replay nodes {', '.join(map(repr, unknown))} are not nodes of the net; its nodes: "
                + ", ".join(map(repr, by_name))
            )
        if virtual and self.rate != 1.0:
            raise ValueError(
                f"Replay rate={self.rate!r} is for the real-time timer; under the virtual timer the "
                "replay follows the recorded tags, as fast as the machine allows (rate=1.0)"
            )
        if virtual and recorded_timer(self.recording) == "real":
            raise ValueError(
                "the recording was made under the real-time timer, whose tags do not repeat: "
                "replay it under the real-time timer (mujou.RealTimeTimer())"
            )
        if placement is not None:
            away = [name for name in self.nodes if by_name[name] not in placement.host]
            if away:
                raise ValueError(
                    f"Replay nodes {', '.join(map(repr, away))} are placed in a child process "
                    "(processes=); a replaced node runs in the host's process: leave it out of "
                    "processes="
                )
        if self.writes:
            self._check_writes(nodes, virtual, placement)
        problems: list[str] = []
        for name in self.nodes:  # record.read-check-net's check, of the replaced nodes
            problems += node_mismatches(self.recording, by_name[name], name, period=False)
        if problems:
            raise ValueError("the recording does not fit the net: " + "; ".join(problems))

    def _check_writes(self, nodes: Sequence[Node], virtual: bool, placement: Placement | None) -> None:
        """writes=True: the inputs it writes; refused under the real-time timer and with
        processes (replay.writes)."""
        if not virtual:
            raise ValueError(
                "Replay(writes=True) makes the host's writes at their recorded tags, which only the "
                "virtual timer repeats: run the replay under mujou.VirtualTimer()"
            )
        if placement is not None:
            raise ValueError(
                "Replay(writes=True) makes the host's writes in the host's process only: run the "
                "replay without processes="
            )
        self._inputs = self._written(nodes)

    def _written(self, nodes: Sequence[Node]) -> dict[str, Input[Any]]:
        """The inputs writes=True writes: recorded, without a source (a replaced node's too:
        the writes wake it at its recorded tags)."""
        recorded = self.recording.ports
        return {
            port.name: port
            for node in nodes
            for port in node._mujou.ports.values()
            if isinstance(port, Input)
            and port.source is None
            and port.name in recorded
            and recorded[port.name].direction == "input"
        }

    def _inputs_at_start(
        self, nodes: Sequence[Node], inputs: Mapping[Input[Any], Any] | None
    ) -> Mapping[Input[Any], Any] | None:
        """``mujou.run``'s ``inputs=`` with writes=True: the first recorded message of each
        input it writes at the run's first tag (0, 0), which the recorded run's ``inputs=`` (or
        a write before any instant) gave; given ``inputs=`` on such an input is refused."""
        if not self.writes:
            return inputs
        written = self._written(nodes)
        first: dict[Input[Any], Any] = {}
        for message in self.recording.messages(ports=list(written), end=0.0) if written else ():
            port = written[message.port]
            if message.microstep == 0 and port not in first:
                first[port] = message.value
        given = dict(inputs) if isinstance(inputs, Mapping) else {}
        both = [port.name for port in first if port in given]
        if both:
            raise ValueError(
                f"inputs= gives {', '.join(map(repr, both))}, whose first message the replay writes "
                "(Replay(writes=True)); leave them out of inputs="
            )
        self._first = {port.name for port in first}
        return inputs if not first else {**given, **first}

    def _host_writes(self, engine: Engine, write: Callable[[Input[Any], Any], None]) -> HostWrites | None:
        """What makes the recorded host's writes in ``engine``'s run (writes=True) with
        ``write`` (``run.write``), or None; the first ones went as ``inputs=``."""
        if not self.writes:
            return None
        messages = self.recording.messages(ports=list(self._inputs)) if self._inputs else iter(())
        return HostWrites(engine, write, self._inputs, _after_first(messages, self._first))

    def _install(self, engine: Engine, state: Mapping[str, Any] | None) -> None:
        """Put the stand-ins in place of the replaced nodes' hooks, for ``engine``'s run."""
        origin = 0.0
        if state is not None:
            meta = state.get(META_KEY)
            time = meta.get("time") if isinstance(meta, Mapping) else None
            origin = float(time) if isinstance(time, int | float) else 0.0
        with self._lock:
            if self._engine is not None and not self._engine.ended:
                raise RuntimeError(
                    "this Replay is in a run that has not ended; stop that run first, or make another"
                )
            self._engine = engine
            self._anchor_run = self._anchor_position = origin
            self._paused = False
            self._seeks = 0
        channels = self.recording.ports  # an output the run sent nothing on has none
        queues = {name: deque[Queued]() for name in self.nodes}
        ports = {
            name: queues[node]
            for name, port in channels.items()
            if port.direction == "output" and (node := name.rpartition(".")[0]) in queues
        }  # a replaced node's inputs the host wrote are not sent (record.writes)
        feed = _Feed(self.recording, ports, None if state is None else origin)
        for slot in engine.slots:
            if slot.name in queues:
                slot.actor = _Standin(
                    self,
                    engine,
                    slot,
                    feed=feed,
                    queue=queues[slot.name],
                    origin=origin,
                    resumed=state is not None,
                )

    # -- the host's controls (real-time timer) -----------------------------------------------

    def _real_time_engine(self, what: str) -> Engine:
        engine = self._engine
        if engine is None or engine.ended:
            raise RuntimeError(f"Replay.{what}: the replay is in no running run; pass it to mujou.run first")
        if engine.virtual:
            raise RuntimeError(
                f"Replay.{what} is for the real-time timer; under the virtual timer the replay "
                "follows the recorded tags (start a replay at a keyframe with Replay(start=))"
            )
        return engine

    def _position_at(self, now: float) -> float:
        """The position at timer time ``now``, with the lock held."""
        if self._paused:
            return self._anchor_position
        return self._anchor_position + (now - self._anchor_run) * self.rate

    @property
    def position(self) -> float:
        """The time of the recording the replay has reached (see :ref:`replay.real-time`)."""
        engine = self._engine
        with self._lock:
            if engine is None:
                return self._anchor_position
            now = engine.end_time if engine.ended else engine.clock.now()
            return self._position_at(now)

    def pause(self) -> None:
        """Hold the position: the replaced nodes send nothing until :meth:`resume`.

        Real-time timer only; see :ref:`replay.real-time`.
        """
        engine = self._real_time_engine("pause()")
        with self._lock:
            if not self._paused:
                self._anchor_position = self._position_at(engine.clock.now())
                self._paused = True

    def resume(self) -> None:
        """Move the position on again from where :meth:`pause` held it."""
        engine = self._real_time_engine("resume()")
        with self._lock:
            if self._paused:
                self._anchor_run = engine.clock.now()
                self._paused = False

    def seek(self, time: float) -> None:
        """Move the position to ``time`` of the recording, forward or back.

        The replaced nodes then send the messages recorded after ``time``, as the position
        reaches them; a pause stays. Real-time timer only; see :ref:`replay.real-time`.
        """
        position = non_negative("time", time)
        engine = self._real_time_engine("seek()")
        with self._lock:
            self._anchor_run = engine.clock.now()
            self._anchor_position = self._seek_to = position
            self._seeks += 1

    def _real_position(self, now: float) -> tuple[float, int, float]:
        """The position at ``now``, the number of seeks so far and the last seek's time (a
        stand-in's update)."""
        with self._lock:
            return self._position_at(now), self._seeks, self._seek_to


class _Feed:
    """The recorded messages of a run's replaced nodes, read once, in tag order, into a queue
    per node as their updates need them.

    One reader for all of them: the recording's messages of several ports come out of one
    merge, cheaper than one per node. The stand-ins read it from their own threads, under its
    lock; each then takes from its own queue (deque appends and pops are atomic).
    """

    def __init__(self, recording: Recording, ports: Mapping[str, deque[Queued]], after: float | None) -> None:
        self._recording = recording
        self._queues = ports  # port name -> its node's queue
        self._lock = threading.Lock()
        self._messages: Iterator[RecordedMessage] = iter(())
        self._read = -1  # every message up to this time (ns) is in its queue
        self.seeks = 0  # the replay's seeks this feed has followed
        self.open(after)

    def open(self, after: float | None) -> None:
        """Read from the first message after recording time ``after`` (None: the first of all)."""
        for queue in self._queues.values():
            queue.clear()
        self._read = -1
        if not self._queues:
            self._messages = iter(())
            return
        messages = self._recording.messages(ports=list(self._queues), start=after)
        if after is not None:
            limit = self._read = tag_ns(after)
            messages = (message for message in messages if tag_ns(message.time) > limit)
        self._messages = iter(messages)

    def read_to(self, ns: int) -> None:
        """Put every message up to recording time ``ns`` in its node's queue."""
        if self._read > ns:
            return
        with self._lock:
            self._read_to(ns)

    def _read_to(self, ns: int) -> None:
        queues, messages = self._queues, self._messages
        while self._read <= ns:
            message = next(messages, None)
            if message is None:
                self._read = _END
                return
            self._read = at = tag_ns(message.time)
            queues[message.port].append((at, message.microstep, message))

    def take(self, queue: deque[Queued], ns: int, seeks: int, seek_to: float) -> list[RecordedMessage]:
        """Real-time timer: the messages of ``queue`` up to recording time ``ns``, taken out,
        after reopening at the replay's last seek if this feed has not followed it yet."""
        with self._lock:  # a reopen empties every queue: no stand-in takes meanwhile
            if seeks != self.seeks:
                self.seeks = seeks
                self.open(seek_to)
            self._read_to(ns)
            taken = []
            while queue and queue[0][0] <= ns:
                taken.append(queue.popleft()[2])
            return taken


Queued = tuple[int, int, RecordedMessage]  # a message's time (ns), microstep, and itself
_END = 2**63  # past every time of a recording


class _Standin:
    """What runs in place of a replaced node's hooks (NOTE [ a replaced node keeps its schedule ])."""

    def __init__(
        self,
        replay: Replay,
        engine: Engine,
        slot: Slot,
        *,
        feed: _Feed,
        queue: deque[Queued],
        origin: float,
        resumed: bool,
    ) -> None:
        self._replay = replay
        self._engine = engine
        self._slot = slot
        self._virtual = engine.virtual
        outputs = [port for port in slot.core.ports.values() if isinstance(port, Output)]
        self._outputs: dict[str, Output[Any]] = {port.name: port for port in outputs}
        self._device = slot.core.device
        self._origin = origin
        self._resumed = resumed
        self._feed = feed
        self._queue = queue  # the feed puts this node's messages here

    def _send(self, message: RecordedMessage) -> None:
        port = self._outputs[message.port]
        value = message.value
        if self._device.type != "cpu":
            value = _to_device(value, self._device)
        port.send(value, copy=False)  # the recording's tensor: nothing changes it

    # -- the hooks -------------------------------------------------------------------------

    def on_start(self) -> None:
        """Sends what the node sent in its ``on_start`` (the messages of the run's first tag)."""
        if self._resumed:
            return  # the state tree's messages replace these (state.resume)
        if self._virtual:
            self._send_tag(tag_ns(self._origin), 0)
        else:
            self._send_to(self._origin)

    def on_update(self, dt: float) -> None:
        """Sends what the node sent at this update's tag (or, real time, up to the position)."""
        if self._virtual:
            self._send_tag(tag_ns(self._slot.last), self._engine.microstep)
        else:
            self._send_to(self._slot.last)

    def on_stop(self) -> None:
        """Under the virtual timer, refuses a recorded message of a time the run passed unsent."""
        if not self._virtual:
            return
        now = tag_ns(self._engine.clock.now())
        self._feed.read_to(now - 1)
        for ns, microstep, message in self._queue:
            if ns < now:
                raise self._mismatch(ns, microstep, message, None)

    def state_dict(self) -> dict[str, Any]:
        """A replaced node's state is the recording's: its entry is empty (replay.state)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The node's saved state is not loaded: its hooks do not run (replay.state)."""

    # -- sending ---------------------------------------------------------------------------

    def _send_tag(self, ns: int, microstep: int) -> None:
        """Send the messages recorded at tag (``ns``, ``microstep``); refuse earlier ones."""
        self._feed.read_to(ns)
        queue = self._queue  # only this stand-in takes from it
        while queue:
            at, step, message = queue[0]
            if at > ns or (at == ns and step > microstep):
                break
            if at < ns or step < microstep:
                raise self._mismatch(at, step, message, (ns, microstep))
            queue.popleft()
            self._send(message)

    def _send_to(self, now: float) -> None:
        """Real-time timer: send every message recorded up to the position at ``now``."""
        position, seeks, seek_to = self._replay._real_position(now)
        # After a seek, from the seek's time, whatever the position has reached since.
        for message in self._feed.take(self._queue, tag_ns(position), seeks, seek_to):
            self._send(message)

    def _mismatch(
        self, ns: int, microstep: int, message: RecordedMessage, at: tuple[int, int] | None
    ) -> ValueError:
        where = f"tag ({ns / 1e9!r}, {microstep})"
        if at is None:
            now = self._engine.clock.now()
            when = f"the run passed that time (it stopped at {now!r}) without an update of the node there"
        else:
            when = f"the node did not update there (its next update ran at tag ({at[0] / 1e9!r}, {at[1]}))"
        return ValueError(
            f"replay of node {self._slot.name!r}: the recording has a message on {message.port!r} at "
            f"{where}, but {when}: the recording is not of this run (another net, seed, input "
            "or start)"
        )


class HostWrites:
    """The recorded host's writes of a replay (``Replay(writes=True)``), made at their tags.

    ``Run._advance`` hands the run's advance to :meth:`advance`, which stops the run at each
    write's time, runs that time's instants up to the write's microstep, and writes it with
    ``run.write``: where the recorded run's host did (record.writes: a write follows the tag of
    its microstep, and the host sees whole instants only). A write whose tag the run does not
    reach in the same way means the recording is not of this run: an error naming both tags.
    """

    def __init__(
        self,
        engine: Engine,
        write: Callable[[Input[Any], Any], None],
        inputs: Mapping[str, Input[Any]],
        messages: Iterator[RecordedMessage],
    ) -> None:
        self._engine = engine
        self._write = write
        self._inputs = inputs
        self._messages = messages
        self._next = next(messages, None)

    def advance(
        self,
        run: RunView,
        advance: Callable[[float | None, Callable[[], bool] | None], bool],
        until: float | None,
        done: Callable[[], bool] | None,
    ) -> bool:
        """``advance(until, done)``, making each recorded write on the way at its tag."""
        engine = self._engine
        while True:
            message = self._next
            if message is None or (until is not None and tag_ns(message.time) > tag_ns(until)):
                return advance(until, done)
            at = tag_ns(message.time)
            if at > tag_ns(run.time):
                if advance(message.time, done):
                    return True
                if engine.ended or tag_ns(run.time) < at:
                    return False
            # The instants of this time up to the write's microstep (as the host's sleep(0)).
            if at == tag_ns(run.time) and engine.microstep < message.microstep and advance(run.time, done):
                return True
            if at != tag_ns(run.time) or engine.microstep != message.microstep:
                raise ValueError(
                    f"replay of the host's writes: the recording writes {message.port!r} after tag "
                    f"({message.time!r}, {message.microstep}), but the run is at tag "
                    f"({run.time!r}, {engine.microstep}) there: the recording is not of this run "
                    "(another net, seed, input or host call)"
                )
            self._write(self._inputs[message.port], message.value)
            self._next = next(self._messages, None)


def _after_first(messages: Iterable[RecordedMessage], first: set[str]) -> Iterator[RecordedMessage]:
    """``messages`` less the first one at tag (0, 0) of each port of ``first`` (given as inputs=)."""
    left = set(first)
    for message in messages:
        if message.port in left and message.microstep == 0 and tag_ns(message.time) == 0:
            left.discard(message.port)
            continue
        yield message


def _to_device(value: Any, device: torch.device) -> Any:
    """A recorded message on the node's device, as the node sent it."""
    return map_tensors(value, lambda tensor: tensor.to(device))
