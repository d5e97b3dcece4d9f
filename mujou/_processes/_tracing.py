"""The trace of a process of the run: its hook slices go to the host's trace (proc.trace).

Each recording thread keeps its slices and hands them to the host in chunks, on the events
connection; the host's recorder writes them under this process's pid. When the run ends here,
the rest goes too, before this process replies that its nodes stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._trace import CHUNK, Slice, Update


class TraceForwarder:
    """A ``Recorder`` that forwards the slices to the host's trace."""

    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        self._send = send
        self._local = threading.local()  # .slices: the calling thread's list
        self._lock = threading.Lock()
        self._tracks: list[tuple[str, list[list[Slice]]]] = []  # (thread, [its current list])

    def record(self, node: str, hook: str, began: float, ended: float, update: Update | None) -> None:
        try:
            box: list[list[Slice]] = self._local.box
        except AttributeError:
            box = self._local.box = [[]]
            with self._lock:
                self._tracks.append((threading.current_thread().name, box))
        slices = box[0]
        slices.append((node, hook, began, ended, update))
        if len(slices) >= CHUNK:
            box[0] = []
            self._send(("trace", threading.current_thread().name, slices))

    def write(self) -> None:
        """The run ended here: send what the threads kept (no hook runs any more)."""
        with self._lock:
            tracks = list(self._tracks)
        for thread, box in tracks:
            if box[0]:
                slices, box[0] = box[0], []
                self._send(("trace", thread, slices))
