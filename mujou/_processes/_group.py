"""The host's handle on one process of a run: its commands, its events, its end.

One owner per connection (NOTE [ the control protocol ]): a reader thread reads every frame
the process sends, on both of its connections, and a writer thread writes every command. The
host's threads only hand a command to the writer and wait, with the engine's poll, on the
``Reply`` the reader completes. So an interrupt of the host (a Ctrl-C, ``interrupt_main()``)
is seen within a poll and never cuts a frame, no lock spans two calls, and a reply whose
waiter was interrupted is dropped by the reader (replies go by number).

The reader watches the process's exit too (NOTE [ a death ]): a death (SIGKILL, ``os._exit``),
or a process stopped and then killed, fails every reply still awaited with the same
``ProcessError`` (proc.died), also when no end of file ever comes. A failure another process
describes becomes the host's exception here (proc.hook-error).

NOTE [ a death ]
A process's sentinel and its connections tell its end only once every copy of their ends is
closed: a process that a node forked holds them open after its parent died. So the reader
also looks at the exit status whenever nothing came for a poll.

NOTE [ the tags connection ]
Under the virtual timer each tag is a command to every process and its reply (proc.virtual).
Through the reader and the writer that is four wake-ups of sleeping threads a tag, on top of the
process's own, each tens of microseconds on a busy machine: more than a small tag takes. So a
group of a virtual run has a second connection, ``tags``, which only the lockstep's thread
(``_lockstep``, never the host's own thread: no interrupt can cut a frame there) writes and
reads: the tag's command goes out at once, and its reply is read where it is awaited, polled for
a while first, as the process polls for the command. The process reads both connections; the
reply says how many events it sent before it, and ``tag_reply`` waits until the reader handled
that many, so the order of NOTE [ the control protocol ] holds on both. A death is still the
reader's to find: ``tag_reply`` raises the error the reader fails the replies with.

NOTE [ the control protocol ]
A command is one frame: its number (8 bytes), its name and a NUL, then its arguments pickled,
so that a process that cannot unpickle the arguments still replies to the command by number,
with an error naming it. A reply is ``(number, status, payload, warnings, events)``:
``events`` counts the events the process had sent before the reply, and the reader handles
those before it completes the reply, so that a reply is never seen before the events sent
ahead of it (the messages of the ports the host watches, an ``ended``).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import pickle
import queue
import struct
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from .._engine._lifecycle import HOST_POLL_REAL, HOST_POLL_VIRTUAL
from .._errors import HookError, MujouInternalError, ProcessError
from .._node import Node
from . import _codec as codec
from . import _frames as frames
from ._main_script import GUARD_EXIT, guard_reason
from ._member import Failure
from ._spin import SPIN, Poller

EXIT_GRACE = 10.0  # real seconds a process is given for each step of its end, then killed
NUMBER = struct.Struct("!Q")  # a command frame's number (NOTE [ the control protocol ])


class ExitedError(ProcessError):
    """The reply to a command the process took no more: it was asked to exit (the run ended)."""


class Reply:
    """The reply to one command, completed once by the group's reader (a small future)."""

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` real seconds; whether the reply came."""
        return self._done.wait(timeout)

    def result(self) -> Any:
        """The reply's payload, or its error raised (once done)."""
        if self._error is not None:
            raise self._error
        return self._value


class Group:
    """The host's handle on one process of the run."""

    def __init__(
        self,
        name: str,
        nodes: Sequence[Node],
        *,
        process: multiprocessing.process.BaseProcess,
        control: Connection,
        events: Connection,
        on_event: Callable[[Group, tuple[Any, ...]], None],
        on_warning: Callable[[type[Warning], str], None],
        virtual: bool = False,
        tags: Connection | None = None,
    ) -> None:
        """The reader and the writer start at once; ``built`` is the process's first reply
        (its nodes rebuilt, or why not). ``on_event`` gets the process's events on the reader,
        and ``("died",)``, ``("crashed", exc)`` (a bug in this thread) and, on the thread of a
        host call that found the process dead, ``("lost", error)``. ``tags``: the lockstep's
        connection, under the virtual timer (NOTE [ the tags connection ])."""
        self.name = name
        self.node_names = tuple(node.name for node in nodes)
        self.process = process
        self._control = control
        self._events = events
        self._on_event = on_event
        self._on_warning = on_warning
        self.poll = HOST_POLL_VIRTUAL if virtual else HOST_POLL_REAL
        self._lock = threading.Lock()  # the fields below; never held across a wait or a call
        self._taken_changed = threading.Condition(self._lock)
        self._taken = 0  # the events the reader handled (NOTE [ the tags connection ])
        self.tags = tags
        self._tag_number = 0
        self._tag_poller = Poller([tags]) if tags is not None and Poller.available() else None
        # The tags' frames, read and written on the descriptor (``_frames``).
        self._read_tag = frames.reader(tags) if tags is not None else None
        self._write_tag = frames.writer(tags) if tags is not None else None
        self._numbers = 1  # the next command's number (0: the first reply, ``built``)
        # The process's next due time where a span of tags ended whole, and the number of the next
        # command then: while no command went since, the next span need not ask it (proc.exchange).
        self.known_due: tuple[int, float] | None = None
        self.built = Reply()
        self._pending: dict[int, Reply] = {0: self.built}
        self._ending: BaseException | None = None  # why no command is taken any more
        self._exiting = False  # asked to exit (or to be killed): its end is no death
        self._stop: Reply | None = None  # the reply to ``stop``, sent once
        self._stop_lock = threading.Lock()
        self.nodes_stopped = False  # its engine ended: its started nodes had on_stop
        self.dead = False  # it ended before it was asked to
        self.exitcode: int | None = None  # kept once its handle is closed (end)
        self.ended = threading.Event()  # it ended, and the reader handled all it sent
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._reader = threading.Thread(
            target=self._guarded, args=(self._read,), name=f"mujou-process-{name}"
        )
        self._writer = threading.Thread(target=self._guarded, args=(self._write,), name=f"mujou-send-{name}")
        self._reader.daemon = self._writer.daemon = True
        self._reader.start()
        self._writer.start()

    # -- commands --------------------------------------------------------------------------

    def request(self, command: str, *args: Any) -> Reply:
        """Send ``command``; its reply, to wait for (already failed if the process ended).

        Raises only when the arguments cannot be pickled (nothing is sent then).
        """
        data = codec.dumps(args)
        reply = Reply()
        with self._lock:
            ending = self._ending
            if ending is None:
                number = self._numbers
                self._numbers += 1
                self._pending[number] = reply
                # Under the lock, so that the writer gets the commands in their numbers' order;
                # put() is one call that cannot be cut: the writer writes the frame whole.
                self._outbox.put(b"".join((NUMBER.pack(number), command.encode(), b"\0", data)))
        if ending is not None:
            reply.fail(ending)
        return reply

    @property
    def commands(self) -> int:
        """How many commands went through the control connection (``known_due``)."""
        return self._numbers

    def wait(self, reply: Reply) -> Any:
        """Wait for ``reply`` (its payload, or its error raised), looking every poll: an
        interrupt of the host is seen within one and leaves the protocol whole. A host
        call's wait: the run settles its end before a ProcessError is raised (proc.died)."""
        while not reply.wait(self.poll):
            pass
        try:
            return reply.result()
        except ExitedError:
            raise
        except ProcessError as error:
            self._on_event(self, ("lost", error))
            raise

    def call(self, command: str, *args: Any) -> Any:
        """Send ``command`` and wait for its reply (a host call)."""
        return self.wait(self.request(command, *args))

    # -- the tags connection (NOTE [ the tags connection ]) -----------------------------------

    def send_tag(self, command: str, *args: Any) -> None:
        """Write ``command`` on the tags connection (the lockstep's thread only). A process that
        ended is found by ``tag_reply``."""
        assert self._write_tag is not None
        self._tag_number += 1
        frame = b"".join((NUMBER.pack(self._tag_number), command.encode(), b"\0", codec.dumps(args)))
        with contextlib.suppress(OSError):
            self._write_tag(frame)

    def tag_reply(self) -> Any:
        """The reply to the last ``send_tag``, its error raised, once the reader handled the
        events sent before it; the process's error if it ended (a ProcessError settles the
        run's end first, as ``wait``'s does). Every wait looks every poll."""
        tags, read = self.tags, self._read_tag
        assert tags is not None and read is not None
        poller = self._tag_poller
        ready = poller is not None and bool(poller.wait(SPIN))
        data: bytes | None = None
        while data is None:
            try:
                if ready or (bool(poller.block(self.poll)) if poller is not None else tags.poll(self.poll)):
                    data = read()
                    break
            except (EOFError, OSError):  # the process ended: the reader says how
                ready = False
                while not self.ended.wait(self.poll):
                    pass
            if self.ended.is_set():
                with self._lock:
                    error = self._ending
                assert error is not None
                if isinstance(error, ProcessError) and not isinstance(error, ExitedError):
                    self._on_event(self, ("lost", error))
                raise error
        _, status, payload, warned, sent = codec.loads(data)
        if self._taken < sent:  # the reader has not handled them all (a count that only grows)
            with self._taken_changed:
                while self._taken < sent and not self.ended.is_set():
                    self._taken_changed.wait(self.poll)
        for category, message in warned:
            self._on_warning(category, f"{message} (in process {self.name!r})")
        if status == "error":
            raise rebuild_failure(payload, self.name)
        return payload

    def stop_reply(self) -> Reply:
        """The reply to ``stop`` (sent the first time only)."""
        with self._stop_lock:
            if self._stop is None:
                self._stop = self.request("stop")
            return self._stop

    # -- the end ---------------------------------------------------------------------------

    def ask_to_exit(self) -> None:
        """Ask the process to exit (its end is no death from now on); once."""
        with self._lock:
            if self._exiting:
                return
            self._exiting = True
        self.request("exit")
        with self._lock:
            if self._ending is None:
                self._ending = self.error("exited as the run ended", ExitedError)

    def end(self, deadline: float) -> None:
        """Wait for the process to end until ``deadline`` (``time.monotonic()``), kill it then;
        then its threads end and its connections close. Safe from two threads, and again."""
        with self._lock:
            self._exiting = True
        if not self.ended.wait(max(0.0, deadline - time.monotonic())):
            self.kill()
            self.ended.wait(EXIT_GRACE)  # the reader reaps it
        if self._running():  # the reader crashed: nobody reaped it
            self.kill()
            self.process.join(EXIT_GRACE)
        self._outbox.put(None)
        for thread in (self._reader, self._writer):
            if thread is not threading.current_thread():
                thread.join(EXIT_GRACE)  # the process has ended: each ends at once
        with self._lock:
            if not self._reader.is_alive() and not self._writer.is_alive():
                self._control.close()
                self._events.close()
                if self.tags is not None:
                    self.tags.close()
                if self.exitcode is None and self.process.exitcode is not None:
                    self.exitcode = self.process.exitcode
                    self.process.close()  # its handle's descriptors (a sentinel, a pipe)

    def kill(self) -> None:
        """SIGKILL the process (its reader reaps it, then fails what is pending)."""
        with self._lock:
            self._exiting = True
        if self._running():
            self.process.kill()

    def _running(self) -> bool:
        """Whether the process has not ended (been reaped); False once its handle is closed."""
        with self._lock:
            return self.exitcode is None and self.process.exitcode is None

    def error(self, reason: str | None = None, kind: type[ProcessError] = ProcessError) -> ProcessError:
        """The error of this process's end (its exit code, whether its nodes had on_stop)."""
        code = self.exitcode
        if code is None:
            try:
                code = self.process.exitcode
            except ValueError:  # its handle was closed meanwhile, with the code kept first
                code = self.exitcode
        if reason is None:  # a process on another host names it (mujou._hosts)
            reason = getattr(self.process, "end_reason", None)
        if code == GUARD_EXIT and reason is None:
            reason = guard_reason()
        return kind(self.name, code, self.node_names, self.nodes_stopped, reason)

    # -- the threads -----------------------------------------------------------------------

    def _guarded(self, body: Callable[[], None]) -> None:
        """Run a thread's body; a bug in it fails every awaited reply and stops the run
        (MujouInternalError), instead of a silent thread death."""
        try:
            body()
        except BaseException as exc:
            thread = threading.current_thread().name
            error = MujouInternalError(
                f"internal error in Mujou ({type(exc).__name__} on thread {thread}); "
                "the run stopped: please report it with the traceback of the cause"
            )
            error.__cause__ = exc
            self._finish(error)
            self._on_event(self, ("crashed", exc))

    def _write(self) -> None:
        """The writer: every command's frame, whole, in order, until ``end``."""
        outbox, control = self._outbox, self._control
        while True:
            data = outbox.get()
            if data is None:
                return
            try:
                control.send_bytes(data)
            except OSError:  # the process ended: the reader sees it by its sentinel
                return

    def _read(self) -> None:
        """The reader: every reply and event, until the process ends; then what is left."""
        control, events, sentinel = self._control, self._events, self.process.sentinel
        open_: list[Any] = [control, events, sentinel]
        while control in open_ and sentinel in open_:
            ready_now = wait(open_, self.poll)
            if not ready_now and self.process.exitcode is not None:  # NOTE [ a death ]
                break
            for ready in ready_now:
                if ready is sentinel:
                    open_.remove(sentinel)
                    continue
                connection = cast(Connection, ready)
                try:
                    if not connection.poll(0):  # a reply read the events ahead of it
                        continue
                    data = connection.recv_bytes()
                except (EOFError, OSError):
                    open_.remove(ready)
                    continue
                if ready is events:
                    self._event(data)
                else:
                    self._reply(data)
        # The process ended, or closed its control connection to end: reap it (killed if it
        # lingers), then handle what it sent before its end.
        self.process.join(EXIT_GRACE)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(EXIT_GRACE)
        for connection in (events, control):
            while True:
                try:
                    if not connection.poll(0):
                        break
                    data = connection.recv_bytes()
                except (EOFError, OSError):
                    break
                if connection is events:
                    self._event(data)
                else:
                    self._reply(data)
        with self._lock:
            died = not self._exiting
        error = self.error()
        self.dead = died
        self._finish(error if died else self.error("exited as the run ended", ExitedError))
        if died:
            self._on_event(self, ("died",))

    def _finish(self, error: BaseException) -> None:
        """No command is taken from now on: fail every awaited reply with ``error``."""
        with self._lock:
            if self._ending is None:
                self._ending = error
            pending, self._pending = self._pending, {}
        for reply in pending.values():
            reply.fail(error)
        self.ended.set()
        with self._taken_changed:
            self._taken_changed.notify_all()  # a tag_reply waiting for events: it ended

    def _event(self, data: bytes) -> None:
        """Handle one event (the reader's thread), then count it."""
        event = codec.loads(data)
        if event[0] == "ended":
            self.nodes_stopped = True
        self._on_event(self, event)
        with self._taken_changed:
            self._taken += 1
            self._taken_changed.notify_all()

    def _reply(self, data: bytes) -> None:
        """Complete the reply in ``data`` after the events sent before it."""
        number, status, payload, warned, sent = codec.loads(data)
        events = self._events
        while self._taken < sent:  # sent before the reply: already on their way
            try:
                event = events.recv_bytes()
            except (EOFError, OSError):
                break
            self._event(event)
        for category, message in warned:
            self._on_warning(category, f"{message} (in process {self.name!r})")
        with self._lock:
            reply = self._pending.pop(number, None)
        if reply is not None:  # None: its waiter was interrupted, or gave up
            if status == "error":
                reply.fail(rebuild_failure(payload, self.name))
            else:
                reply.set(payload)


def rebuild_failure(failure: Failure, process: str) -> BaseException:
    """The host's exception for a failure another process described (proc.hook-error)."""
    if failure[0] == "hook":
        _, node, hook, at, pickled, type_name, text, trace = failure
        cause = _unpickled(pickled)
        if cause is None:
            cause = RuntimeError(f"{type_name}: {text}")
        error = HookError(node, hook, at, cause)
        error.args = (text,)
        error.__cause__ = cause
        error.add_note(f"The traceback of the hook, in process {process!r}:\n{trace.rstrip()}")
        return error
    _, type_name, text, pickled, trace = failure
    cause = _unpickled(pickled)
    if isinstance(cause, BaseException):
        if trace:
            cause.add_note(f"The traceback, in process {process!r}:\n{trace.rstrip()}")
        return cause
    return MujouInternalError(f"process {process!r} failed with {type_name}: {text}\n{trace}")


def _unpickled(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:
        return None
