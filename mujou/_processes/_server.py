"""How a run's processes start: from Mujou's own fork server, or with ``spawn`` (proc.start-method).

A process started with ``spawn`` is a new interpreter that imports torch and Mujou afresh:
seconds per process. On Linux, Mujou instead starts one fork server, a new interpreter that
imports torch and Mujou once, on the first run with processes; each process of a run is then
a fork of that server, started in milliseconds with both already imported. Nothing else of
the host's memory is inherited: each process is prepared as ``spawn`` prepares one (the
host's ``sys.path``, working directory and main script, imported anew as ``__mp_main__``),
and ``_child.main`` takes the host's environment, standard output and error of the moment
(``HostStreams``).

The server is Mujou's own, not ``multiprocessing``'s global one: ``set_forkserver_preload``
is process-wide, so preloading torch there would override the preload list of a program that
uses the forkserver itself (or be ignored where its server already runs: Python 3.14 starts
it for any ``multiprocessing.Process`` on Linux). Its preload leaves out ``__main__``, which
the global one names (inert up to 3.13, where CPython passes the server no main path): each
process imports the main script anew, as with ``spawn``. The server lives until the host's
process ends.

Elsewhere (macOS, where forking a process that loaded system frameworks is unsafe; Windows,
which has no fork) the processes start with ``spawn``. So does a host whose server would
import another torch or Mujou than its own (the host imported one from a path added to
``sys.path`` at run time, which the server, a new interpreter, does not have): the first
process from the server reports the files it imported, and a mismatch stops the server.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.context import get_spawning_popen
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ._main_script import main_file

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

PRELOAD = ["torch", "mujou"]
"""What the server imports once, for every process it starts."""

PROBE_NAME = "mujou-probe"  # the first process from a new server, which reports its imports

PROBE_TIMEOUT = 60.0  # real seconds the first process from a new server has to report (a busy machine)


class _Choice:
    """How this host's processes start: chosen once, by the first run with processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one choice at a time
        self.context: SpawnContext | ForkServerContext | None = None
        self.server: _Server | None = None  # the fork server, when it is the choice

    def choose(self) -> SpawnContext | ForkServerContext:
        with self._lock:
            if self.context is None:
                self.context = self._choose()
            return self.context

    def _choose(self) -> SpawnContext | ForkServerContext:
        if sys.platform != "linux":
            return multiprocessing.get_context("spawn")
        self.server = _Server()
        context = _ServerContext()
        try:
            kept = _probe(context) == imported_files()
        except BaseException:  # an interrupt while the server starts: none is left
            kept = False
            raise
        finally:
            if not kept:
                self.server.stop()
                self.server = None
        return context if kept else multiprocessing.get_context("spawn")


CHOICE = _Choice()


def start_context() -> SpawnContext | ForkServerContext:
    """The context that starts the run's processes: that of Mujou's fork server, started
    here the first time (about one import of torch), or ``spawn``'s."""
    return CHOICE.choose()


def method() -> str:
    """``"forkserver"`` or ``"spawn"``: how the processes start (choosing it if need be)."""
    return start_context().get_start_method()


def imported_files() -> tuple[str | None, str | None]:
    """The files this process's torch and Mujou were imported from (Mujou's: the package of
    this module, found from its own file rather than by importing the package here)."""
    return torch.__file__, os.path.join(os.path.dirname(os.path.dirname(__file__)), "__init__.py")


class HostStreams:
    """The host's standard output and error as they are when a process starts, for it to write
    there: a fork of the server has the server's, those the host had when the server started
    (before a redirection, or a test's capture). In the process, a ``Streams``."""

    def __reduce__(self) -> tuple[Any, ...]:
        popen = get_spawning_popen()
        if getattr(popen, "method", None) != "forkserver":  # spawned: it has the host's
            return (Streams, ())
        return (Streams, tuple(_dup_for_child(fd) for fd in (1, 2)))


def _dup_for_child(fd: int) -> Any:
    """The host's ``fd`` for the process being started, None where it is not open."""
    try:
        os.fstat(fd)
    except OSError:
        return None
    return reduction.DupFd(fd)


class Streams:
    """``HostStreams`` in the process: the host's descriptors 1 and 2, if it needs them."""

    def __init__(self, *duplicates: Any) -> None:
        self._duplicates = duplicates

    def take(self) -> None:
        """Make this process's descriptors 1 and 2 the host's."""
        for target, duplicate in zip((1, 2), self._duplicates, strict=False):
            if duplicate is not None:
                fd = duplicate.detach()
                if fd != target:
                    os.dup2(fd, target)
                    os.close(fd)


def _report(connection: Connection) -> None:
    """The probe's target: the files the server's preload imported (or this process imported)."""
    connection.send(imported_files())
    connection.close()


def _probe(context: ForkServerContext) -> tuple[str | None, str | None] | None:
    """Start one process from the server; the files of its torch and Mujou, None if it failed."""
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(target=_report, args=(sending,), name=PROBE_NAME, daemon=True)
    try:
        process.start()
        sending.close()
        if not receiving.poll(PROBE_TIMEOUT):
            return None
        reported: tuple[str | None, str | None] = receiving.recv()
        return reported
    except (OSError, EOFError):
        return None
    finally:
        receiving.close()
        if process.pid is not None:
            process.join(PROBE_TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()


if sys.platform == "linux":
    from multiprocessing import context as _context
    from multiprocessing import forkserver, popen_forkserver, spawn, util

    class _Server(forkserver.ForkServer):
        """A fork server of Mujou's own, which imported ``PRELOAD`` (and not ``__main__``)."""

        # CPython's, not in typeshed's stub.
        _forkserver_pid: int | None
        _stop: Callable[[], None]

        def __init__(self) -> None:
            super().__init__()
            self.set_forkserver_preload(PRELOAD)

        @property
        def pid(self) -> int | None:
            """The server's process id, None before it started and once it stopped."""
            return self._forkserver_pid

        def stop(self) -> None:
            """End the server (one that would start the wrong code is not kept)."""
            self._stop()

    class _Popen(popen_forkserver.Popen):
        """``forkserver``'s Popen, asking Mujou's server rather than ``multiprocessing``'s.

        ``_launch`` is CPython's (the same from 3.11 to 3.14) but for the server it asks.
        """

        _fds: list[int]  # CPython's: the descriptors the child inherits, not in typeshed's stub

        def _launch(self, process_obj: Any) -> None:
            server = CHOICE.server
            assert server is not None
            prep_data = _without_main(spawn.get_preparation_data(process_obj._name), process_obj._name)
            buf = io.BytesIO()
            _context.set_spawning_popen(self)
            try:
                reduction.dump(prep_data, buf)
                reduction.dump(process_obj, buf)
            finally:
                _context.set_spawning_popen(None)
            self.sentinel, w = server.connect_to_new_process(self._fds)
            # The child's sentinel of its parent: a duplicate of the data pipe's write end.
            parent_w = os.dup(w)
            self.finalizer = util.Finalize(self, _close, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)

    def _without_main(prep_data: dict[str, Any], name: str) -> dict[str, Any]:
        """What a process is prepared with, less the import of the main script for the probe
        (which needs none of it) and where the main program has no file to import (standard
        input): there ``spawn`` would ask the process to run a file that does not exist."""
        if name == PROBE_NAME or ("init_main_from_path" in prep_data and main_file() is None):
            prep_data.pop("init_main_from_path", None)
            prep_data.pop("init_main_from_name", None)
        return prep_data

    def _close(*fds: int) -> None:
        for fd in fds:
            os.close(fd)

    class _Process(_context.ForkServerProcess):
        """A process started from Mujou's server."""

        # Its own multiprocessing defaults to spawn, as when it was spawned.
        _start_method = "spawn"

        @staticmethod
        def _Popen(process_obj: Any) -> _Popen:  # noqa: N802 (multiprocessing's name)
            return _Popen(process_obj)

    class _ServerContext(_context.ForkServerContext):
        """The context whose ``Process`` starts from Mujou's server."""

        Process: ClassVar[type[_context.ForkServerProcess]] = _Process
