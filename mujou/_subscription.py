"""``Subscription``: every message of a port from now on, for the host, in a bounded buffer."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import final

import torch

from ._ports import _Port


@final
class Subscription:
    """The messages made visible on a port after ``run.subscribe(port)``, oldest first.

    Holds at most ``maxsize`` messages: when more arrive, the oldest are dropped and counted
    in :attr:`dropped`. Messages come out as CPU copies the host owns. See :ref:`run.subscribe`.
    """

    _port: _Port
    _cond: threading.Condition
    _buffer: deque[torch.Tensor]
    _maxsize: int
    _dropped: int
    _closed: bool
    _ended: bool
    _on_close: Callable[[Subscription], None]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("mujou.Subscription has no public constructor; use run.subscribe(port)")

    @classmethod
    def _open(cls, port: _Port, maxsize: int, on_close: Callable[[Subscription], None]) -> Subscription:
        self = cls.__new__(cls)
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

    def _receive(self, message: torch.Tensor) -> None:
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

    def drain(self) -> list[torch.Tensor]:
        """Every waiting message, oldest first, without waiting."""
        with self._cond:
            messages = list(self._buffer)
            self._buffer.clear()
        return [message.to("cpu", copy=True) for message in messages]

    def get(self, timeout: float | None = None) -> torch.Tensor:
        """The oldest waiting message; waits up to ``timeout`` real seconds for one.

        Under the virtual timer nothing arrives while the host waits here: use :meth:`drain`
        after ``run.sleep``.

        Raises:
            queue.Empty: no message came within ``timeout``.
            RuntimeError: the subscription is closed, or the run ended with none left.
        """
        with self._cond:
            while not self._buffer:
                if self._closed:
                    raise RuntimeError("the subscription is closed")
                if self._ended:
                    raise RuntimeError("the run has ended and no message is left")
                if not self._cond.wait(timeout):
                    raise queue.Empty
            message = self._buffer.popleft()
        return message.to("cpu", copy=True)

    def close(self) -> None:
        """Stop receiving messages; the waiting ones are dropped."""
        self._port._remove_watcher(self._receive)
        with self._cond:
            self._closed = True
            self._buffer.clear()
            self._cond.notify_all()
        self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
