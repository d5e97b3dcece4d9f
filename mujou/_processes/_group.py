"""The host's handle on one process of a run: its commands, its events, its end.

Commands go one at a time on the control connection, each waited for; a thread reads the
process's events (its end, the messages of ports the host watches) and notices when the
process dies (proc.died). A failure another process describes becomes the host's exception
here (proc.hook-error).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import pickle
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from .._errors import HookError, MujouInternalError, ProcessError
from .._node import Node
from . import _codec as codec
from ._member import Failure
from ._spin import SPIN, poller

EXIT_GRACE = 10.0  # real seconds a process is given to exit after the run stopped


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
    ) -> None:
        self.name = name
        self.node_names = tuple(node.name for node in nodes)
        self.process = process
        self._control = control
        self._poller = poller(control, virtual)  # the replies of the virtual timer's tags
        self._events = events
        self._on_event = on_event
        self._on_warning = on_warning
        self._lock = threading.Lock()  # one command at a time
        self._sent = 0  # the number of the last command: its reply carries it
        self._taken = 0  # events handled so far
        self._taken_changed = threading.Condition()
        self.dead = False
        self._death: ProcessError | None = None
        self._death_lock = threading.Lock()
        self.closed = False
        self._reader = threading.Thread(target=self._read_events, name=f"mujou-process-{name}", daemon=True)

    def start_reading(self) -> None:
        self._reader.start()

    def send(self, command: str, *args: Any) -> None:
        """Send a command; ``receive`` waits for its reply (so that several groups work at once)."""
        self._lock.acquire()
        self._sent += 1
        try:
            data = codec.dumps((self._sent, command, *args))
            self._control.send_bytes(data)
        except OSError:
            self._lock.release()
            raise self.died() from None
        except BaseException:
            self._lock.release()
            raise

    def receive(self) -> Any:
        """The reply to the last command sent. A reply to an earlier one, whose wait was
        interrupted (a KeyboardInterrupt of the host), is skipped."""
        try:
            while True:
                try:
                    if self._poller is not None:
                        self._poller.wait(SPIN)
                    number, status, payload, warned = codec.loads(self._control.recv_bytes())
                except (EOFError, OSError):
                    raise self.died() from None
                if number == self._sent:
                    break
        finally:
            self._lock.release()
        for category, message in warned:
            self._on_warning(category, f"{message} (in process {self.name!r})")
        if status == "error":
            raise rebuild_failure(payload, self.name)
        return payload

    def call(self, command: str, *args: Any) -> Any:
        self.send(command, *args)
        return self.receive()

    def died(self) -> ProcessError:
        """The error of this process's unexpected end, with its exit code: the same error for
        every thread that finds it dead (one of them reaps the process; the others wait)."""
        with self._death_lock:
            if self._death is None:
                self.dead = True
                self.process.join(EXIT_GRACE)
                self._death = ProcessError(self.name, self.process.exitcode, self.node_names)
            return self._death

    def wait_events(self, count: int) -> None:
        """Wait until the event thread has handled the first ``count`` events."""
        with self._taken_changed:
            while self._taken < count and not self.dead:
                self._taken_changed.wait(0.1)

    def _read_events(self) -> None:
        while True:
            try:
                event = codec.loads(self._events.recv_bytes())
            except (EOFError, OSError):
                if not self.closed:
                    self._on_event(self, ("died",))
                return
            self._on_event(self, event)
            with self._taken_changed:
                self._taken += 1
                self._taken_changed.notify_all()

    def close(self) -> None:
        """Ask the process to exit and wait for it (kill it after a grace period)."""
        self.closed = True
        if not self.dead:
            with contextlib.suppress(ProcessError, HookError, MujouInternalError):
                self.call("exit")
        self.process.join(EXIT_GRACE)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        if self._reader.is_alive():
            self._reader.join(EXIT_GRACE)  # its last events (the trace's last slices) handled
        self._control.close()
        self._events.close()


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
