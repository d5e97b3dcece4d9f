"""What the run's handle, its recording and its processes use of each other, as Protocols.

``Run`` holds the run's processes and its recording, the recording reads the run and watches
ports through the processes, and a process of the run checks the messages the host writes as
``Run`` does. Naming each other's classes would make their modules import each other in a loop
(type-only imports count: a type one module takes from another is a dependency too). They name
these Protocols instead, which the classes fit as they are (``Processes``, ``Group``,
``Session``, ``Run``); this module imports none of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

from ._port import PortNode, _Port
from ._stats import RunStats


class ProcessGroup(Protocol):
    """One process of a run, as the host's calls use it (``_processes._group.Group``)."""

    def call(self, command: str, *args: Any) -> Any:
        """Send ``command`` and wait for its reply."""
        ...


class RunProcesses(Protocol):
    """A run's processes, as the run's handle and its recording use them
    (``_processes._host.Processes``)."""

    @property
    def group_workers(self) -> dict[str, int]:
        """Each process's workers, by name."""
        ...

    def has_node(self, node: PortNode) -> bool: ...

    def group_of(self, node: PortNode) -> ProcessGroup | None:
        """The process of ``node``; None for the host's."""
        ...

    def watch(self, port: _Port) -> Callable[[], None]:
        """Mirror another process's ``port`` onto the host; returns the undo."""
        ...

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Run the virtual timer's tags up to ``until`` in every process."""
        ...

    def read(self, port: _Port) -> Any: ...

    def state_tree(self) -> dict[str, Any]: ...

    def stats(self) -> RunStats: ...


class RunView(Protocol):
    """What a recording reads of the run it records (``_run.Run``)."""

    @property
    def time(self) -> float: ...

    def _state_tree(self) -> dict[str, Any]: ...


class Snapshots(Protocol):
    """A recorder, as ``run.snapshot`` uses it (``_record._recorder.Recorder``)."""

    def snapshot(self, path: str | os.PathLike[str]) -> None: ...


class RunRecording(Protocol):
    """A run's recording, as the run's handle uses it (``_record._recorder.Session``)."""

    @property
    def takes_keyframes(self) -> bool: ...

    @property
    def recorder(self) -> Snapshots: ...

    def advance(
        self,
        run: RunView,
        advance: Callable[[float | None, Callable[[], bool] | None], bool],
        until: float | None,
        done: Callable[[], bool] | None,
    ) -> bool:
        """``advance(until, done)``, stopping at each keyframe's time to take it."""
        ...

    def lost_count(self) -> int: ...
