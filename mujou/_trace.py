"""Recording a run as a Chrome/Perfetto trace: one slice per hook on its thread's track.

The format is the Chrome trace event format's JSON object form
(``{"traceEvents": [...]}``), which Perfetto UI and ``chrome://tracing`` load.
See :ref:`observe.trace`.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MAX_EVENTS = 2_000_000  # about 400 MB of JSON at most: past it, slices are counted, not kept


class TraceRecorder:
    """Collects hook slices while the run runs; writes them as a trace file when it ends."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.origin = time.perf_counter()
        # (thread name, node, hook, began, ended, (t, dt, lateness) or None); list.append is
        # atomic, so hooks on any thread record without a lock.
        self._slices: list[tuple[str, str, str, float, float, tuple[float, float, float] | None]] = []
        self.dropped = 0

    def record(
        self, node: str, hook: str, began: float, ended: float, update: tuple[float, float, float] | None
    ) -> None:
        """Record one hook call that ran on the calling thread from ``began`` to ``ended``."""
        if len(self._slices) >= MAX_EVENTS:
            self.dropped += 1
            return
        self._slices.append((threading.current_thread().name, node, hook, began, ended, update))

    def events(self) -> list[dict[str, Any]]:
        """The trace events: thread names, then one complete event per hook call."""
        tids: dict[str, int] = {}
        slices = []
        for thread, node, hook, began, ended, update in self._slices:
            tid = tids.setdefault(thread, len(tids) + 1)
            event: dict[str, Any] = {
                "name": node,
                "cat": hook,
                "ph": "X",
                "ts": round((began - self.origin) * 1e6, 3),
                "dur": round((ended - began) * 1e6, 3),
                "pid": 1,
                "tid": tid,
            }
            if update is not None:
                t, dt, lateness = update
                event["args"] = {"t": t, "dt": dt, "lateness": lateness}
            slices.append(event)
        names: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "mujou run"}}
        ]
        names += [
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": thread}}
            for thread, tid in tids.items()
        ]
        return names + slices

    def write(self) -> None:
        """Write the trace file atomically (a complete file, or none)."""
        document = {
            "traceEvents": self.events(),
            "displayTimeUnit": "ms",
            "otherData": {"producer": "mujou", "dropped_slices": self.dropped},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(document, file)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
