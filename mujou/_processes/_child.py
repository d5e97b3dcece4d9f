"""The main function of a process of a run: rebuild the group's nodes, then obey the host.

The host sends commands on the control connection (NOTE [ the control protocol ] in
``_group``), and this process answers each in turn, by number, from the table ``COMMANDS``; a
command it cannot read, or whose reply cannot be pickled, gets an error naming it, and the
process goes on. It sends events (its end, messages of ports the host watches) on the events
connection, from any thread. When the control connection closes (the host ended, or died),
the process stops its nodes and exits (proc.cleanup).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, cast

import torch

from .._engine import Engine, HookThread
from .._errors import MujouInternalError
from .._messages import cpu_copy  # keeps a nest's NamedTuples and dataclasses
from .._port import _Port
from .._ports import Input, Output, link
from .._timer import RealTimeTimer, Timer, VirtualTimer
from . import _codec as codec
from . import _frames as frames
from ._exchange import Span
from ._group import NUMBER as _NUMBER
from ._member import Member, describe
from ._pack import Packed, place, unpack
from ._server import Streams
from ._spin import SPIN, poller
from ._tracing import TraceForwarder
from ._wire import Pipe


@dataclass(frozen=True)
class Setup:
    """What a process of the run is given when it is spawned."""

    name: str
    nodes: list[Packed]
    links: list[tuple[str, str]]  # (output, input) within the group, by name
    incoming: dict[str, list[str]]  # source output elsewhere -> this group's inputs reading it
    outgoing: dict[str, list[str]]  # this group's outputs read elsewhere -> readers' processes
    workers: int
    virtual: bool
    scale: float
    torch_threads: int
    default_dtype: torch.dtype
    deterministic: bool
    trace: bool  # send the hooks' slices to the host's trace (proc.trace)
    attach: Callable[[Member], None] | None = None  # called on the Member once built (mujou._hosts)


class Events:
    """The events connection, written from any thread of this process."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self.sent = 0  # events sent so far: a reply says how many the host must have taken

    def send(self, event: tuple[Any, ...]) -> None:
        """Send ``event``; one that cannot be pickled becomes a warning for the host."""
        try:
            data = codec.dumps(event)
        except Exception as exc:
            data = codec.dumps(("unsent", event[0], f"{type(exc).__name__}: {exc}"))
        with self._lock:
            self.sent += 1
            with contextlib.suppress(OSError):  # the host is gone: the control connection ends us
                self._connection.send_bytes(data)


def main(
    setup: Setup,
    control: Connection,
    events_connection: Connection,
    wake_out: dict[str, Connection],
    wake_in: list[Connection],
    *,
    environ: dict[str, str],
    streams: Streams,
    tags: Connection | None = None,
) -> None:
    """The process's life: build, then serve the host's commands until it says exit.

    Under the virtual timer a worker's thread serves them, as worker 0 while it waits for the
    engine (NOTE [ a lent worker ] in ``_engine._threads``). ``environ`` and ``streams``
    are the host's environment, standard output and error when the run started: a process
    forked from Mujou's server has the server's (proc.start-method). ``tags``: the virtual
    timer's second command connection (NOTE [ the tags connection ] in ``_group``).
    """
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    streams.take()
    # The host's Ctrl-C reaches every process of the terminal's group: the host alone
    # handles it (run.interrupt), by stopping the run, which stops this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(setup.torch_threads)
    torch.set_default_dtype(setup.default_dtype)
    if torch.are_deterministic_algorithms_enabled() != setup.deterministic:
        # Only when it changes: the call imports torch._inductor's config, seconds.
        torch.use_deterministic_algorithms(setup.deterministic)
    if not _lends(setup):
        _serve(setup, control, events_connection, wake_out, wake_in, tags=tags)
        return
    thread = HookThread(
        target=_serve,
        args=(setup, control, events_connection, wake_out, wake_in),
        kwargs={"tags": tags},
        name="mujou-worker-0",
    )
    thread.start()
    thread.join()


def _serve(
    setup: Setup,
    control: Connection,
    events_connection: Connection,
    wake_out: dict[str, Connection],
    wake_in: list[Connection],
    *,
    tags: Connection | None,
) -> None:
    """Build the group's nodes, then obey the host until it says exit (or is gone): its
    commands on ``control``, and the lockstep's on ``tags`` (if any), each replied on its own."""
    events = Events(events_connection)
    try:
        member = _build(setup, TraceForwarder(events.send) if setup.trace else None)
    except BaseException as exc:
        control.send_bytes(codec.dumps((0, "error", describe(exc), [], events.sent)))
        return
    if setup.attach is not None:
        setup.attach(member)
    control.send_bytes(codec.dumps((0, "ok", None, [], events.sent)))
    pipes = {name: Pipe(connection) for name, connection in wake_out.items()}
    by_output = {  # a reader on another host has no pipe (mujou._hosts)
        output: [pipes[p] for p in readers if p in pipes] for output, readers in setup.outgoing.items()
    }
    member.when_ended(lambda: events.send(("ended", member.failure())))
    watches: dict[int, Callable[[Any], None]] = {}
    commands = _Commands(member, events, watches, by_output, wake_in)

    hooks = member.engine.hooks

    def message(payload: Any) -> bytes:  # a message of a span's tag (proc.exchange), as a reply
        warned = _warnings(member) if hooks._warnings else []  # most tags warn none: no call
        return _reply(0, "exchange", "ok", payload, warned=warned, events=events.sent)

    span = commands.spans = Span(member, message)
    sources = [control] if tags is None else [control, tags]
    # The next tag's command comes soon; while a span of tags runs, only its messages are read
    # (proc.exchange): a command the host sends once the span ended waits for its last one.
    polling = poller(sources, setup.virtual)
    spanning = poller([tags], setup.virtual) if tags is not None else None
    # The tags' frames, read and written on the descriptor (``_frames``).
    read_tag = frames.reader(tags) if tags is not None else control.recv_bytes
    write_tag = frames.writer(tags) if tags is not None else control.send_bytes
    try:
        while True:
            listening, looking = ([tags], spanning) if span.active and tags in sources else (sources, polling)
            found: Sequence[object]  # connections, cast below
            if looking is None:
                found = wait(listening)
            elif looking is spanning:  # the tags connection alone: any descriptor ready is its
                found = listening if looking.wait(SPIN) or looking.block(None) else []
            else:  # without making a selector each command as ``wait`` does
                ready = looking.wait(SPIN) or looking.block(None)
                found = [c for c in listening if c.fileno() in ready]
            for source in found:
                connection = cast(Connection, source)
                try:
                    frame = read_tag() if connection is tags else connection.recv_bytes()
                except (EOFError, OSError):
                    if connection is control:  # the host is gone
                        member.stop()
                        return
                    sources.remove(connection)  # the host closed the lockstep's connection
                    polling, span.active = poller(sources, setup.virtual), False
                    continue
                send = write_tag if connection is tags else connection.send_bytes
                if connection is tags and frame.startswith(_EXCHANGE, _NUMBER.size):
                    _send(send, _exchanged(span, frame, events))  # no reply: its answer
                    continue
                number, command, status, payload = _obey(commands, frame)
                if not (command == "span" and status == "ok" and span.quiet):  # else its due is known
                    send(
                        _reply(number, command, status, payload, warned=_warnings(member), events=events.sent)
                    )
                if command == "exit":
                    return
                if command == "span" and span.active:  # the first tag's message goes at once
                    _send(send, _exchanged(span, None, events))
    finally:
        member.engine.error_reported = True  # the host reports it (proc.hook-error)
        if not member.engine.ended:  # a lent worker 0 stops here: no other thread can
            member.stop()
        member.disconnect_standins()


_EXCHANGE = b"exchange\0"  # the name of the host's message of a span's tag (proc.exchange)


def _exchanged(span: Span, frame: bytes | None, events: Events) -> bytes | None:
    """The host's message of a span's tag in ``frame`` taken (None: the span's start), and the
    next tag run if there is one: the frame to send the host, if any. An error (a bug, a
    message that cannot be read) ends the span and goes to the host as the message's."""
    try:
        if frame is None:
            return span.next()
        if not span.active:  # the host's end of a span this process ended already (an error)
            return None
        crossings, ask, host_due = codec.loads(memoryview(frame)[_NUMBER.size + len(_EXCHANGE) :])
        return span.take(crossings, ask, host_due)
    except BaseException as exc:
        span.active = False
        warned = _warnings(span.member)
        return _reply(0, "exchange", "error", describe(exc), warned=warned, events=events.sent)


def _send(send: Callable[[bytes], None], frame: bytes | None) -> None:
    if frame is not None:
        send(frame)


def _obey(commands: _Commands, frame: bytes) -> tuple[int, str, str, Any]:
    """Run the command in ``frame``: its number, its name, "ok" or "error", and the result."""
    (number,) = _NUMBER.unpack_from(frame)
    end = frame.index(b"\0", _NUMBER.size)
    command = frame[_NUMBER.size : end].decode(errors="replace")
    try:
        run = COMMANDS.get(command)
        if run is None:
            raise MujouInternalError(f"unknown command {command!r}; the commands: {', '.join(COMMANDS)}")
        try:
            args = codec.loads(memoryview(frame)[end + 1 :])
        except Exception as exc:
            raise TypeError(
                f"the arguments of the command {command!r} cannot be unpickled in this process: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return number, command, "ok", run(commands, *args)
    except BaseException as exc:
        return number, command, "error", describe(exc)


def _reply(number: int, command: str, status: str, payload: Any, *, warned: list[Any], events: int) -> bytes:
    """The reply's frame; a payload that cannot be pickled is replied as an error naming it."""
    try:
        return codec.dumps((number, status, payload, warned, events))
    except Exception as exc:
        error = TypeError(
            f"the reply to the command {command!r} cannot be pickled to be sent to the host: "
            f"{type(exc).__name__}: {exc}"
        )
        failure = describe(error)
        try:
            return codec.dumps((number, "error", failure, warned, events))
        except Exception:  # a warning's category that cannot be pickled: the warnings are lost
            return codec.dumps((number, "error", failure, [], events))


def _lends(setup: Setup) -> bool:
    """Whether the thread that takes the host's commands is worker 0 too: under the virtual
    timer, where the process has workers (NOTE [ a lent worker ])."""
    return setup.virtual and setup.workers > 0


def _warnings(member: Member) -> list[tuple[type[Warning], str]]:
    """The warnings the hooks caused here since the last reply: the host issues them on its
    thread, at its next call (rules.warnings-on-host)."""
    found: list[tuple[type[Warning], str]] = []
    pending = member.engine.hooks._warnings
    while pending:
        found.append(pending.popleft())
    return found


def _build(setup: Setup, trace: TraceForwarder | None) -> Member:
    nodes = [unpack(packed) for packed in setup.nodes]
    place(nodes, [packed.name for packed in setup.nodes])
    ports = {port.name: port for node in nodes for port in node._mujou.ports.values()}
    for output_name, input_name in setup.links:
        output, input = ports[output_name], ports[input_name]
        assert isinstance(output, Output) and isinstance(input, Input)
        link(output, input)
    timer: Timer = VirtualTimer() if setup.virtual else RealTimeTimer(scale=setup.scale)
    engine = Engine(nodes, setup.workers, timer, trace, lent=_lends(setup))
    engine.claim()
    member = Member(engine, nodes, setup.incoming, list(setup.outgoing))
    member.connect_standins()
    return member


class _Commands:
    """What the host's commands do here (``COMMANDS``, by name; sent by ``_group.Group``)."""

    def __init__(
        self,
        member: Member,
        events: Events,
        watches: dict[int, Callable[[Any], None]],
        pipes: dict[str, list[Pipe]],
        inbound: list[Connection],
    ) -> None:
        self.member = member
        self.events = events
        self.watches = watches
        self.pipes = pipes
        self.inbound = inbound
        self.spans: Span  # set by _serve

    def start(self, states: list[Any] | None) -> list[tuple[str, str]]:
        """on_start, then load_state_dict of ``states``: the loads' errors (node, text)."""
        errors = self.member.start(states)
        return [(name, f"{type(exc).__name__}: {exc}") for name, exc in errors]

    def restore_schedule(self, meta: dict[str, Any], standins: dict[str, Any]) -> None:
        self.member.restore_standins(standins)
        self.member.engine.restore_schedule(meta)

    def crossings(self) -> Any:
        return self.member.crossings()

    def apply(self, crossings: Any, wake: bool) -> float:
        self.member.apply(crossings, wake=wake)
        return self.member.next_due()

    def go(self, origin: float | None) -> None:
        self.member.go(origin, self.pipes, self.inbound)

    def next_due(self) -> float:
        return self.member.next_due()

    def begin_advance(self) -> None:
        self.member.begin_advance()

    def span(self, until: float | None, host_due: float, ask: int, waking: Any, known: Any = None) -> float:
        """A span of tags begins (proc.exchange): this process's next due time (not sent where
        the host knew it, ``Span.quiet``)."""
        return self.spans.begin(until, host_due, ask, waking, known)

    def instant(self, due: float, crossings: Any = ()) -> Any:
        if crossings:  # the last tag's messages from the others that wake nothing here
            self.member.apply(crossings)
        return self.member.instant(due)

    def set_time(self, time: float) -> None:
        self.member.set_time(time)

    def read(self, name: str) -> Any:
        return self.member.read(name)

    def write(self, name: str, value: Any) -> None:
        self.member.write(name, value)

    def watch(self, key: int, name: str) -> Any:
        """Send the host every message of port ``name`` from now on; its latest now."""
        source = self._source(name)
        events = self.events

        def forward(message: Any) -> None:
            latest = source._latest
            stamp = 0.0 if latest is None else latest[3]
            events.send(("message", key, cpu_copy(message), stamp))

        self.watches[key] = forward
        source._add_watcher(forward)
        return self.member.latest(name)

    def _source(self, name: str) -> _Port:
        """The port whose messages port ``name`` reads: its source, for an input that has one."""
        port = self.member.ports[name]
        if isinstance(port, Input) and port._source is not None:
            return port._source
        return port

    def unwatch(self, key: int, name: str) -> None:
        source = self._source(name)
        watcher = self.watches.pop(key, None)
        if watcher is not None:
            source._remove_watcher(watcher)

    def state(self) -> Any:
        return self.member.engine.state_tree()

    def stats(self) -> Any:
        return self.member.stats()

    def final(self) -> Any:
        """What the host keeps of this process once the run has ended (run.state-after-error):
        the state tree (or the error taking it raised), the stats, each port's latest message."""
        try:
            tree: Any = self.member.engine.state_tree()
        except Exception as exc:
            tree = describe(exc)
        latest = {name: self.member.read(name) for name in self.member.ports}
        return tree, self.member.stats(), latest

    def stop(self) -> Any:
        self.member.stop()
        return self.member.failure()

    def exit(self) -> None:
        """Nothing here: the loop ends after replying (``_serve``)."""


COMMANDS: dict[str, Callable[..., Any]] = {
    "start": _Commands.start,
    "restore_schedule": _Commands.restore_schedule,
    "crossings": _Commands.crossings,
    "apply": _Commands.apply,
    "go": _Commands.go,
    "next_due": _Commands.next_due,
    "begin_advance": _Commands.begin_advance,
    "span": _Commands.span,
    "instant": _Commands.instant,
    "set_time": _Commands.set_time,
    "read": _Commands.read,
    "write": _Commands.write,
    "watch": _Commands.watch,
    "unwatch": _Commands.unwatch,
    "state": _Commands.state,
    "stats": _Commands.stats,
    "final": _Commands.final,
    "stop": _Commands.stop,
    "exit": _Commands.exit,
}
"""The commands a process takes from the host, by name: nothing else can be called."""
