"""What ``Run.stats()`` returns: frozen snapshots of a run's counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeStats:
    """One node's counters in a run. See :ref:`run.stats`.

    Attributes:
        updates: The updates that have started.
        skipped: The slots skipped because an update started more than a period late.
        max_lateness: The largest lateness (start minus due time) of an update, in timer seconds.
        busy: Real seconds spent in the node's hooks.
    """

    updates: int
    skipped: int
    max_lateness: float
    busy: float


@dataclass(frozen=True)
class RunStats:
    """A run's counters. See :ref:`run.stats`.

    Attributes:
        time: The run's timer time when the stats were taken.
        workers: The number of worker threads.
        nodes: Each node's :class:`NodeStats`, by node name, in registration order.
    """

    time: float
    workers: int
    nodes: Mapping[str, NodeStats]
