"""``Subscription``: every message of a port from now on, for the host, in a bounded buffer."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, cast, final

from ._messages import cpu_copy
from ._numbers import non_negative
from ._port import M, _Port

_POLL = 0.5  # real seconds: the longest get() sleeps before it looks again (run.interrupt)


@final
class Subscription(Generic[M]):
    """The messages made visible on a port after ``run.subscribe(port)``, oldest first.

    Holds at most ``maxsize`` messages: when more arrive, the oldest are dropped and counted
    in :attr:`dropped`. Messages come out as CPU copies the host owns. See :ref:`run.subscribe`.
    """

    _port: _Port
    _cond: threading.Condition
    _buffer: deque[Any]
    _maxsize: int
    _dropped: int
    _closed: bool
    _ended: bool
    _on_close: Callable[[Subscription[Any]], None]
    _raise_error: Callable[[], None]
    _virtual: bool
    _lend: Callable[[], bool] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("mujou.Subscription has no public constructor; use run.subscribe(port)")

    @classmethod
    def _open(
        cls,
        port: _Port,
        maxsize: int,
        on_close: Callable[[Subscription[Any]], None],
        raise_error: Callable[[], None],
        virtual: bool,
        *,
        lend: Callable[[], bool] | None = None,
    ) -> Subscription[M]:
        """``lend``: runs a due update on the calling thread while ``get`` waits, and says
        whether it did (threads.host-runs-updates); None: ``get`` only waits."""
        self = cls.__new__(cls)
        self._raise_error = raise_error  # raises the run's error, if a hook failed
        self._virtual = virtual
        self._lend = lend
        self._port = port
        self._cond = threading.Condition()
        self._buffer = deque()
        self._maxsize = maxsize
        self._dropped = 0
        self._closed = False
        self._ended = False
        self._on_close = on_close
        port._add_watcher(self._receive)
        return self

    def _receive(self, message: object) -> None:
        with self._cond:
            if len(self._buffer) == self._maxsize:
                self._buffer.popleft()
                self._dropped += 1
            self._buffer.append(message)
            self._cond.notify()

    def _run_ended(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    @property
    def dropped(self) -> int:
        """How many messages were dropped because the buffer was full."""
        with self._cond:
            return self._dropped

    def drain(self) -> list[M]:
        """Every waiting message, oldest first, without waiting."""
        with self._cond:
            messages = list(self._buffer)
            self._buffer.clear()
        return [cast("M", cpu_copy(message)) for message in messages]

    def get(self, timeout: float | None = None) -> M:
        """The oldest waiting message; waits up to ``timeout`` real seconds for one, running
        due updates on this thread meanwhile (:ref:`threads.host-runs-updates`).

        Under the virtual timer nothing arrives while the host waits here, so with no message
        waiting ``get`` raises at once: advance the time with ``run.sleep`` (or wait with
        ``run.wait_for``) first, then ``drain`` or ``get``.

        Raises:
            queue.Empty: no message came within ``timeout``.
            HookError: a hook failed and no message is left.
            RuntimeError: the subscription is closed, the run ended with none left, or the
                run is under the virtual timer and none is waiting.
        """
        deadline = (
            None if timeout is None else time.monotonic() + non_negative("timeout", timeout, optional=True)
        )
        lend = self._lend
        taken: list[object] = []  # the message, copied outside the lock
        while not taken:
            with self._cond:
                if self._buffer:
                    taken.append(self._buffer.popleft())
                    break
                self._check_waiting()
                # In slices, so that a KeyboardInterrupt of the host is seen (run.interrupt).
                left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
                if left <= 0:
                    raise queue.Empty
                if lend is None:
                    self._cond.wait(left)
                    continue
            # No lock held: the update it runs may send to this subscription.
            if not lend():
                with self._cond:
                    if not self._buffer:
                        self._cond.wait(left)
        return cast("M", cpu_copy(taken[0]))

    def _check_waiting(self) -> None:
        """With the lock held and no message waiting: raise if none can come."""
        if self._closed:
            raise RuntimeError("the subscription is closed")
        self._raise_error()
        if self._ended:
            raise RuntimeError("the run has ended and no message is left")
        if self._virtual:
            raise RuntimeError(
                "Subscription.get(): no message is waiting, and under the virtual timer "
                "none arrives while the host waits here; advance the time with "
                "run.sleep() (or wait with run.wait_for()) first, then drain() or get()"
            )

    def close(self) -> None:
        """Stop receiving messages; the waiting ones are dropped."""
        self._port._remove_watcher(self._receive)
        with self._cond:
            self._closed = True
            self._buffer.clear()
            self._cond.notify_all()
        self._on_close(self)

    def __enter__(self) -> Subscription[M]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
