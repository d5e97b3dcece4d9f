"""What the host reads of a run's counters: ``run.stats()`` and the progress line, as snapshots.

A worker may update a node's counters while they are read here (no lock: the counters are
plain numbers, each read once); the recent latenesses are copied in one call before sorting.
See observe.stats.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._stats import LATENESS_WINDOW, NodeStats, RunStats, percentile

if TYPE_CHECKING:
    from ._lifecycle import Engine


def run_stats(engine: Engine) -> RunStats:
    """The run's counters now (frozen once the run has ended)."""
    nodes = {}
    for slot in engine.slots:
        updates = slot.updates
        recent = sorted(slot.lateness[: min(updates, LATENESS_WINDOW)].tolist())
        nodes[slot.name] = NodeStats(
            updates=updates,
            skipped=slot.skipped,
            busy=slot.busy_seconds,
            dt_min=slot.dt_min if updates else 0.0,
            dt_mean=(slot.last - slot.dt_from) / updates if updates else 0.0,
            dt_max=slot.dt_max,
            lateness_p50=percentile(recent, 0.50),
            lateness_p99=percentile(recent, 0.99),
            lateness_max=slot.lateness_max,
            coalesced={port._attr: port._coalesced for port in slot.inputs},
        )
    elapsed = (engine.end_real if engine.ended else time.perf_counter()) - engine.real_start
    busy = tuple(
        min(1.0, seconds / elapsed) if engine.real_start and elapsed > 0 else 0.0
        for seconds in engine.worker_busy
    )
    return RunStats(time=engine.time(), workers=engine.workers, nodes=nodes, worker_busy=busy)


def progress_sample(engine: Engine) -> tuple[float, int, float]:
    """(timer time, updates so far, worst lateness), for the progress line."""
    slots = engine.slots
    return engine.time(), sum(slot.updates for slot in slots), max(slot.lateness_max for slot in slots)
