"""The live progress line: run time, updates per second and the worst lateness, on stderr.

See :ref:`observe.progress`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

INTERVAL = 1.0  # real seconds between two progress lines


class Progress:
    """Prints a progress line about every ``INTERVAL`` real seconds until :meth:`finish`."""

    def __init__(self, sample: Callable[[], tuple[float, int, float]], stream: TextIO | None = None) -> None:
        self._sample = sample  # () -> (timer time, updates so far, worst lateness)
        self._stream = sys.stderr if stream is None else stream
        self._terminal = self._stream.isatty()
        self._done = threading.Event()
        self._began = time.perf_counter()
        self._last = (self._began, 0)
        self._thread = threading.Thread(target=self._main, name="mujou-progress", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while not self._done.wait(INTERVAL):
            self._print(final=False)

    def _print(self, *, final: bool) -> None:
        timer_time, updates, worst = self._sample()
        now = time.perf_counter()
        since, before = (self._began, 0) if final else self._last
        rate = (updates - before) / max(now - since, 1e-9)
        self._last = (now, updates)
        line = f"mujou t={timer_time:.2f} s  {rate:,.0f} updates/s  worst lateness {worst * 1e3:.1f} ms" + (
            "  (ended)" if final else ""
        )
        if self._terminal:
            self._stream.write("\r" + line + ("\n" if final else ""))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def finish(self) -> None:
        """Stop printing, and print the last line: the whole run's rate."""
        self._done.set()
        self._thread.join()
        self._print(final=True)
