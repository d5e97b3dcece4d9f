"""Recording a run as a Chrome/Perfetto trace: one slice per hook on its thread's track.

The format is the Chrome trace event format's JSON object form
(``{"traceEvents": [...]}``), which Perfetto UI and ``chrome://tracing`` load.
See :ref:`observe.trace`.

The temporary file beside the target is created when the recorder is (at the run's start), so
a path that cannot be written is refused then (:ref:`observe.trace-start`). The slices are
streamed to it while the run runs, so memory
stays bounded however long it runs: each recording thread keeps up to :data:`CHUNK` slices of
its own (no lock on the hook path), then hands them to a writer thread, which encodes and
writes them. At most :data:`MAX_PENDING` chunks wait for the writer: a thread that has one
more waits until the writer has taken one (a run faster than the file waits for it, and its
trace stays complete). When the run ends, the rest is written, the file is completed (the
tracks' names and the counts) and renamed to the target, so the target holds a complete trace
or nothing. Slices are dropped (and counted) only once the file could not be written: that
error is raised when the run ends.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol, TextIO

from ._files import Temporary, reworded

CHUNK = 1024  # slices a recording thread keeps before it hands them to the writer
MAX_PENDING = 64  # chunks waiting for the writer at most (with CHUNK, about 20 MB)

Update = tuple[float, float, float, list[tuple[str, float]] | None]
"""An update's t, dt and lateness, and the sends that woke it (observe.trace-flows): per send,
its thread's name and a time in its slice; None for none."""

# (node, hook, began, ended, the update or None)
Slice = tuple[str, str, float, float, Update | None]

FLOW = {"name": "wake", "cat": "flow"}
"""The name and category of every flow event (observe.trace-flows)."""


class Recorder(Protocol):
    """What the engine needs of a trace: a slice per hook call, and the end of the run."""

    def record(self, node: str, hook: str, began: float, ended: float, update: Update | None) -> None: ...

    def write(self) -> None: ...


class _Track:
    """One recording thread's slices not yet handed to the writer, and its track's id."""

    __slots__ = ("slices", "tid")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.slices: list[Slice] = []  # appended to by its thread only


class TraceRecorder:
    """Streams hook slices to a temporary file while the run runs; completes it when it ends.

    Raises:
        OSError: the temporary file cannot be created beside ``path``; the message names
            ``trace=`` and the path.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._where = f"trace={os.fspath(path)!r}"
        self.origin = time.perf_counter()
        self.dropped = 0  # slices counted, not written (under _lock)
        self._local = threading.local()  # .track: the calling thread's _Track
        self._lock = threading.Lock()
        self._handed = threading.Condition(self._lock)  # the writer waits here for chunks
        self._room = threading.Condition(self._lock)  # recording threads wait here for room
        self._tids: dict[str, int] = {}  # each track's id, by thread name
        # The other processes of the run (proc.trace): pid -> its name, and its tracks' ids.
        self._processes: dict[int, tuple[str, dict[str, int]]] = {}
        self._tracks: list[_Track] = []
        self._pending: deque[tuple[int, int, list[Slice]]] = deque()  # (pid, tid, slices) to write
        self._closing = False
        self._writer: threading.Thread | None = None
        # The writer's (or, at the end, write()'s) alone:
        self._written = 0  # events in the file
        self._flow = 0  # the last flow's id
        self._error: Exception | None = None  # the file could not be written
        self._file, self._temporary = self._create()

    def _create(self) -> tuple[TextIO, Temporary]:
        """Create the temporary file and open the array of events (observe.trace-start)."""
        try:
            if not os.path.lexists(self.path.parent):  # (a file there is refused as a parent)
                self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = Temporary(self.path)
        except OSError as exc:
            raise reworded(exc, f"{self._where} cannot be written") from exc
        file = os.fdopen(temporary.handle, "w", encoding="utf-8", buffering=1 << 16)
        try:
            file.write('{"traceEvents": [')
        except BaseException:
            file.close()
            temporary.discard()
            raise
        return file, temporary

    def discard(self) -> None:
        """Remove the temporary file and write nothing: the run was refused before any hook ran."""
        with self._lock:
            self._closing = True
        self._file.close()
        self._temporary.discard()

    def record(self, node: str, hook: str, began: float, ended: float, update: Update | None) -> None:
        """Record one hook call that ran on the calling thread from ``began`` to ``ended``."""
        try:
            track: _Track = self._local.track
        except AttributeError:
            track = self._register()
        slices = track.slices
        slices.append((node, hook, began, ended, update))
        if len(slices) >= CHUNK:
            self._hand_over(track)

    def _register(self) -> _Track:
        name = threading.current_thread().name
        with self._lock:
            track = _Track(self._tids.setdefault(name, len(self._tids) + 1))
            self._tracks.append(track)
        self._local.track = track
        return track

    def _hand_over(self, track: _Track) -> None:
        """Give the writer the calling thread's slices, once it has room for them."""
        slices = track.slices
        track.slices = []
        with self._lock:
            while len(self._pending) >= MAX_PENDING and self._error is None and not self._closing:
                self._room.wait()
            if self._closing or self._error is not None:
                self.dropped += len(slices)
                return
            self._queue(1, track.tid, slices)

    def record_remote(self, pid: int, process: str, thread: str, slices: list[Slice]) -> None:
        """Record ``slices`` that thread ``thread`` of another process of the run recorded,
        on the same clock (``time.perf_counter`` is the machine's monotonic clock)."""
        with self._lock:
            _, tids = self._processes.setdefault(pid, (process, {}))
            tid = tids.setdefault(thread, len(tids) + 1)
            while len(self._pending) >= MAX_PENDING and self._error is None and not self._closing:
                self._room.wait()
            if self._closing or self._error is not None:
                self.dropped += len(slices)
                return
            self._queue(pid, tid, slices)

    def _queue(self, pid: int, tid: int, slices: list[Slice]) -> None:
        """With the lock held: give the writer ``slices``, starting it the first time."""
        self._pending.append((pid, tid, slices))
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_pending, name="mujou-trace", daemon=True)
            self._writer.start()
        else:
            self._handed.notify()

    def _write_pending(self) -> None:
        """Write the chunks handed over, as they come, until write() has closed the recorder."""
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._handed.wait()
                if not self._pending:
                    return
                pid, tid, slices = self._pending.popleft()
                self._room.notify()
            self._write_chunk(pid, tid, slices)

    def _write_chunk(self, pid: int, tid: int, slices: list[Slice]) -> None:
        if self._error is None:
            try:
                self._append(self._events(pid, tid, slices))
                return
            except Exception as exc:  # raised by write(), at the run's end
                with self._lock:
                    self._error = exc
                    self._room.notify_all()
        with self._lock:
            self.dropped += len(slices)

    def _events(self, pid: int, tid: int, slices: list[Slice]) -> list[dict[str, Any]]:
        """One complete event per hook call, and a flow (a start and an end event) per send
        that woke it (observe.trace-flows)."""
        origin = self.origin
        events: list[dict[str, Any]] = []
        for node, hook, began, ended, update in slices:
            event: dict[str, Any] = {
                "name": node,
                "cat": hook,
                "ph": "X",
                "ts": round((began - origin) * 1e6, 3),
                "dur": round((ended - began) * 1e6, 3),
                "pid": pid,
                "tid": tid,
            }
            flows = None
            if update is not None:
                t, dt, lateness, flows = update
                event["args"] = {"t": t, "dt": dt, "lateness": lateness}
            events.append(event)
            if flows:
                end = round((began + (ended - began) / 2 - origin) * 1e6, 3)  # inside the slice
                for thread, at in flows:
                    self._flow += 1
                    start = {"ph": "s", "id": self._flow, "ts": round((at - origin) * 1e6, 3)}
                    events.append({**FLOW, **start, "pid": pid, "tid": self._tid(pid, thread)})
                    events.append(
                        {**FLOW, "ph": "f", "bp": "e", "id": self._flow, "ts": end, "pid": pid, "tid": tid}
                    )
        return events

    def _tid(self, pid: int, thread: str) -> int:
        """The track id of thread ``thread`` of process ``pid`` (1: this one)."""
        with self._lock:
            tids = self._tids if pid == 1 else self._processes[pid][1]
            return tids.setdefault(thread, len(tids) + 1)

    def _append(self, events: list[dict[str, Any]]) -> None:
        """Append ``events`` to the array of the temporary file."""
        if events:
            text = json.dumps(events)[1:-1]
            self._file.write(text if self._written == 0 else ", " + text)
            self._written += len(events)

    def write(self) -> None:
        """Complete the trace file and put it at the path (a complete file, or none).

        Called once, when the run has ended and no hook runs any more.
        """
        with self._lock:
            self._closing = True
            for track in self._tracks:  # what the threads kept: at most CHUNK each
                if track.slices:
                    self._pending.append((1, track.tid, track.slices))
                    track.slices = []
            writer = self._writer
            self._handed.notify()
        if writer is not None:
            writer.join()
        else:
            self._write_pending()  # nothing was handed over while the run ran: write it here
        try:
            self._complete()
        except BaseException as exc:
            self._file.close()
            self._temporary.discard()
            if isinstance(exc, OSError):
                raise reworded(exc, f"{self._where} could not be written") from exc
            raise

    def _complete(self) -> None:
        """Raise the error that stopped the writing, or end the file and rename it to the path."""
        if self._error is not None:
            raise self._error
        names: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "mujou run"}}
        ]
        names += [
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": thread}}
            for thread, tid in self._tids.items()
        ]
        for pid, (process, tids) in self._processes.items():
            names.append(
                {
                    "name": "process_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": 0,
                    "args": {"name": process},
                }
            )
            names += [
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}}
                for thread, tid in tids.items()
            ]
        self._append(names)
        other = {"producer": "mujou", "dropped_slices": self.dropped}
        self._file.write(f'], "displayTimeUnit": "ms", "otherData": {json.dumps(other)}}}')
        self._file.close()
        self._temporary.commit()
