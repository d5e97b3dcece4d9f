"""What ``Run.stats()`` returns: frozen snapshots of a run's counters.

See :ref:`observe.stats` and :ref:`observe.stats-values`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
class HostStats:
    """One host of a run with groups on other hosts: its nodes, and their lateness taken on
    that host's clock (hosts.stats).

    Attributes:
        address: The ``"HOST:PORT"`` of the host's agent; ``""`` for the run's host.
        clock_offset: The host's monotonic clock minus the run's host's, in seconds, as
            measured at the start (``0.0`` for the run's host), which its timer corrects for.
        nodes: The names of the nodes that run there, in registration order.
        lateness_p50: The largest ``lateness_p50`` of those nodes.
        lateness_p99: The largest ``lateness_p99`` of those nodes.
        lateness_max: The largest ``lateness_max`` of those nodes.
        nccl_messages: The messages its processes received by NCCL, device to device
            (hosts.nccl-lane), so far in the run: each counted once its NCCL sends completed.
    """

    address: str
    clock_offset: float
    nodes: tuple[str, ...]
    lateness_p50: float
    lateness_p99: float
    lateness_max: float
    nccl_messages: int = 0


@dataclass(frozen=True, repr=False)
class RunStats:
    """A run's counters.

    ``print(stats)`` shows them as a table, a row per node and per worker; ``repr`` is one
    short line. See :ref:`observe.stats-print`.

    Attributes:
        time: The run's timer time when the stats were taken.
        workers: The number of worker threads.
        nodes: Each node's :class:`NodeStats`, by node name, in registration order.
        worker_busy: For each worker, the fraction of real time since the timer started that
            it spent in hooks.
        lost: The messages a recording of the run dropped (``record=``, real-time timer: its
            writer fell behind; see :ref:`record.lost`); 0 when nothing is recorded.
        hosts: In a run with groups on other hosts, each host's :class:`HostStats`, by its
            agent's address, the run's host first (as ``""``); empty in any other run.
    """

    time: float
    workers: int
    nodes: Mapping[str, NodeStats]
    worker_busy: tuple[float, ...]
    lost: int = 0
    hosts: Mapping[str, HostStats] = field(default_factory=dict)

    def __repr__(self) -> str:
        """``<RunStats t=10.000 s: 3 nodes, 2 workers>``."""
        return f"<RunStats {self._heading()}>"

    def _heading(self) -> str:
        nodes, workers = _count(len(self.nodes), "node"), _count(self.workers, "worker")
        lost = f", {_count(self.lost, 'message')} lost by the recording" if self.lost else ""
        return f"t={self.time:.3f} s: {nodes}, {workers}{lost}"

    def __str__(self) -> str:
        """The table: a row per node (updates, skipped, lateness, busy, coalesced), per worker."""
        rows: list[tuple[str, ...]] = [NODE_COLUMNS]
        for name, node in self.nodes.items():
            coalesced = str(sum(node.coalesced.values())) if node.coalesced else "-"
            rows.append(
                (
                    name,
                    str(node.updates),
                    str(node.skipped),
                    duration(node.lateness_p50),
                    duration(node.lateness_p99),
                    duration(node.lateness_max),
                    duration(node.busy),
                    coalesced,
                )
            )
        lines = [f"RunStats at {self._heading()}", *_table(rows)]
        if self.worker_busy:
            lines += [
                "",
                *_table(
                    [WORKER_COLUMNS, *((str(i), f"{busy:.0%}") for i, busy in enumerate(self.worker_busy))]
                ),
            ]
        else:
            lines += ["", "no workers: every node has a thread of its own"]
        return "\n".join(lines)


NODE_COLUMNS = ("node", "updates", "skipped", "late p50", "late p99", "late max", "busy", "coalesced")
WORKER_COLUMNS = ("worker", "busy")


def duration(seconds: float) -> str:
    """Seconds in the unit that shows them plainly: ``0``, ``12.3 µs``, ``1.20 ms``, ``0.532 s``."""
    if seconds == 0:
        return "0"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def host_stats(
    nodes: Mapping[str, NodeStats],
    where: Mapping[str, str],
    offsets: Mapping[str, float],
    nccl: Mapping[str, int] | None = None,
) -> dict[str, HostStats]:
    """Each host's figures: ``where`` gives each node's host (an agent's address, ``""`` for
    the run's), ``offsets`` each remote host's clock offset, ``nccl`` the messages each host
    received by NCCL."""
    nccl = nccl or {}
    names: dict[str, list[str]] = {"": []}
    for name in nodes:
        names.setdefault(where.get(name, ""), []).append(name)
    return {
        address: HostStats(
            address=address,
            clock_offset=offsets.get(address, 0.0),
            nodes=tuple(own),
            lateness_p50=max((nodes[n].lateness_p50 for n in own), default=0.0),
            lateness_p99=max((nodes[n].lateness_p99 for n in own), default=0.0),
            lateness_max=max((nodes[n].lateness_max for n in own), default=0.0),
            nccl_messages=nccl.get(address, 0),
        )
        for address, own in names.items()
    }


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows aligned in columns: the first column to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def percentile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` percentile of sorted values (nearest rank), 0.0 for none."""
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]
