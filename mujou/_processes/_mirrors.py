"""Mirrors: another process's port shown on the host's port object while the host watches it.

``run.subscribe`` and ``run.wait_for`` watch a port's object on the host (proc.host-api). For
a port whose node runs in another process, that process forwards the port's messages as
events while one or more host calls watch it, and each is published on the host's object of
the port. At the end of the run the objects get back what they held before.

NOTE [ a mirror never goes back ]

The process adds its forwarder, then replies with the port's latest message. The reply comes
on the control connection, the forwarded messages on the events connection, read by another
thread: a message sent between the two reaches the host by the events, maybe before the
reply, which holds an older one. So the reply's message is the mirror's first only when no
event of the watch was published before it (under ``_publish_lock``, which orders the two);
every event's message is as new as the reply's or newer.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch

from .._errors import HookError, MujouInternalError, ProcessError
from .._port import Latest, _Port, bare_cpu
from ._group import Group


class Mirrors:
    """The ports of other processes mirrored onto the host's port objects, by watch key."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._mirrors: dict[int, _Port] = {}  # by watch key
        self._watching: dict[int, list[int]] = {}  # id(port) -> [watch key, users]
        self._lock = threading.Lock()  # watch and undo; held across the process's reply
        self._publish_lock = threading.Lock()  # a reply's first message, an event's publish
        self._published: set[int] = set()  # the watch keys an event was published for
        # The host's objects of ports mirrored, with what they held before: given back at the end.
        self._mirrored: dict[int, tuple[_Port, Latest | None]] = {}

    def watch(self, group: Group, port: _Port) -> Callable[[], None]:
        """Mirror ``port``, of a node in ``group``'s process, onto the host's object; returns
        the undo. One mirror serves every host call that watches the port at the same time."""
        with self._lock:
            watching = self._watching.get(id(port))
            if watching is not None:
                watching[1] += 1
            else:
                key = next(self._ids)
                watching = self._watching[id(port)] = [key, 1]
                self._mirrors[key] = port
                self._mirrored.setdefault(id(port), (port, port._latest))
                latest = group.call("watch", key, port.name)
                with self._publish_lock:  # NOTE [ a mirror never goes back ]
                    if latest is not None and key not in self._published:
                        message, stamp = latest
                        port._latest = (message, _version(message), None, stamp, 1, bare_cpu(message, None))

        def undo() -> None:
            with self._lock:
                watching[1] -= 1
                if watching[1] > 0:
                    return
                del self._watching[id(port)]
                with self._publish_lock:
                    self._mirrors.pop(watching[0], None)
                    self._published.discard(watching[0])
                with contextlib.suppress(ProcessError, HookError, MujouInternalError):
                    group.call("unwatch", watching[0], port.name)

        return undo

    def publish(self, key: int, message: Any, stamp: float) -> None:
        """A message of the port watched as ``key`` (an event of its process)."""
        with self._publish_lock:
            port = self._mirrors.get(key)
            if port is not None:
                self._published.add(key)
                port._publish(message, _version(message), None, stamp)

    def give_back(self) -> None:
        """The run ended: each mirrored port object holds what it held before."""
        for port, latest in self._mirrored.values():
            port._latest = latest


def _version(message: Any) -> int:
    """The version a mirrored message is published with (a nest's is 0, as for a send)."""
    return message._version if isinstance(message, torch.Tensor) else 0
