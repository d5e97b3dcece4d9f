"""What ``Run.stats()`` returns: frozen snapshots of a run's counters.

See :ref:`observe.stats` and :ref:`observe.stats-values`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LATENESS_WINDOW = 1024  # the updates the lateness percentiles look back over


@dataclass(frozen=True)
class NodeStats:
    """One node's counters in a run.

    Attributes:
        updates: The updates that have started.
        skipped: The slots skipped because an update started more than a period late.
        busy: Real seconds spent in the node's hooks.
        dt_min: The smallest ``dt`` of an update, in timer seconds (0.0 before the first).
        dt_mean: The mean ``dt``.
        dt_max: The largest ``dt``.
        lateness_p50: The median lateness (start minus due time) of the last 1024 updates.
        lateness_p99: Their 99th percentile.
        lateness_max: The largest lateness of any update.
        coalesced: For each input, by attribute name, the messages that arrived in this run
            and that no update of the node saw fresh: a later one replaced each before the
            node's next update started (trigger.coalesce).
    """

    updates: int
    skipped: int
    busy: float
    dt_min: float
    dt_mean: float
    dt_max: float
    lateness_p50: float
    lateness_p99: float
    lateness_max: float
    coalesced: Mapping[str, int]


@dataclass(frozen=True)
class RunStats:
    """A run's counters.

    Attributes:
        time: The run's timer time when the stats were taken.
        workers: The number of worker threads.
        nodes: Each node's :class:`NodeStats`, by node name, in registration order.
        worker_busy: For each worker, the fraction of real time since the timer started that
            it spent in hooks.
        lost: The messages a recording of the run dropped (``record=``, real-time timer: its
            writer fell behind; see :ref:`record.lost`); 0 when nothing is recorded.
    """

    time: float
    workers: int
    nodes: Mapping[str, NodeStats]
    worker_busy: tuple[float, ...]
    lost: int = 0


def percentile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` percentile of sorted values (nearest rank), 0.0 for none."""
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]
