"""Nodes for conformance/test_process_control.py that run in processes of their own.

The processes of a run import their nodes' classes by name, so these live at the top level
of a module on ``sys.path``. What a test observes of a process goes through files under the
test's ``tmp_path``, whose paths the nodes hold: they outlive the process.
"""

from __future__ import annotations

import multiprocessing.util
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mujou import Input, Node


def _refuse_outside(host: int) -> Any:
    """Rebuilds an ``Unloadable`` in process ``host`` only; elsewhere its unpickling raises."""
    if os.getpid() != host:
        raise ValueError("an Unloadable cannot be rebuilt outside the host's process")
    return Unloadable()


@dataclass
class Unloadable:
    """A message (a dataclass) that pickles in the host's process, and cannot be unpickled
    in any other."""

    value: int = 0

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _refuse_outside, (os.getpid(),)


def _mark_exit_outside(host: int, path: str) -> ExitMarker:
    """Rebuilds an ``ExitMarker``: outside process ``host``, ``path`` is written when this
    process exits normally (multiprocessing's exit finalizers; not when it is killed)."""
    if os.getpid() != host:
        multiprocessing.util.Finalize(None, Path(path).write_text, args=("exited",), exitpriority=0)
    return ExitMarker(path)


class ExitMarker:
    """An attribute that makes the process it is rebuilt in write a file at its normal exit."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[int, str]]:
        return _mark_exit_outside, (os.getpid(), self.path)


class Logged(Node):
    """Periodic; appends one line to the file ``path`` for each update ("update") and for its
    ``on_stop`` ("stop"). At its update number ``act_at`` it does ``act``: "kill" (SIGKILL of
    its own process), "sigstop" (SIGSTOP of its own process), "vanish" (see ``_vanish``),
    "raise" (a ValueError),
    "block" (waits for the file ``path + '.go'``, at most 30 s, after writing
    ``path + '.entered'``; then writes ``path + '.finished'``) or nothing ("")."""

    x: Input[Any] = Input(optional=True)  # for run.write

    def __init__(self, path: str, act: str = "", act_at: int = 0, dedicated_thread: bool = False) -> None:
        super().__init__(period=0.1, seed=0, dedicated_thread=dedicated_thread)
        self.path = path
        self.act = act
        self.act_at = act_at
        self.updates = 0

    def _log(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(line + "\n")

    def on_update(self, dt: float) -> None:
        self.updates += 1
        self._log("update")
        if self.updates != self.act_at:
            return
        if self.act == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.act == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.act == "vanish":
            threading.Thread(target=self._vanish, daemon=True).start()
        elif self.act == "raise":
            raise ValueError(f"update {self.updates} raised")
        elif self.act == "block":
            Path(self.path + ".entered").touch()
            go = Path(self.path + ".go")
            for _ in range(30_000):
                if go.exists():
                    break
                time.sleep(0.001)
            Path(self.path + ".finished").touch()

    def on_stop(self) -> None:
        self._log("stop")

    def _vanish(self) -> None:
        """A moment after this update (its tag answered): fork a process that holds this
        one's connections open (its pid in ``path + '.holder'``, it exits within a minute),
        then SIGKILL this one: its death shows by no end of file, only by its exit."""
        time.sleep(0.3)
        holder = os.fork()
        if holder == 0:
            time.sleep(60.0)
            os._exit(0)
        Path(self.path + ".holder").write_text(str(holder))
        os.kill(os.getpid(), signal.SIGKILL)


def log_of(path: Path) -> list[str]:
    """The lines a ``Logged`` node wrote (none if it never wrote)."""
    return path.read_text(encoding="utf-8").split() if path.exists() else []


class LockedState(Logged):
    """A ``Logged`` whose state_dict holds a lock: a state that cannot be pickled."""

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "lock": threading.Lock()}


class Gate(Node):
    """Periodic, in the host's process: at its update number ``at`` it sets ``entered`` and
    waits for ``release`` (at most ``hold`` real seconds), holding the host's part of that tag."""

    def __init__(self, at: int, hold: float = 5.0) -> None:
        super().__init__(period=0.1, seed=0)
        self.at = at
        self.hold = hold
        self.updates = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.stopped = False

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if self.updates == self.at:
            self.entered.set()
            self.release.wait(self.hold)

    def on_stop(self) -> None:
        self.stopped = True


class ExitsNormally(Logged):
    """A ``Logged`` whose process writes ``path + '.exited'`` if it exits by itself."""

    def __init__(self, path: str, dedicated_thread: bool = False) -> None:
        super().__init__(path, dedicated_thread=dedicated_thread)
        self.exit_marker = ExitMarker(path + ".exited")


class Carrier(Node):
    """Holds ``payload`` as an attribute: an ``Unloadable`` makes a node no process can rebuild."""

    def __init__(self, payload: object) -> None:
        super().__init__(period=0.1, seed=0)
        self.payload = payload
