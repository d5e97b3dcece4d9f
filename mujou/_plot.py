"""A picture of a trace with matplotlib, the optional extra ``mujou[plot]`` (observe.trace-view).

Three panels, as on the page of ``_trace_view``: the timeline of each thread's hook calls with
the flows, each node's lateness distribution, each thread's busy share. matplotlib is imported
here only, when a picture is asked for: ``import mujou`` never imports it. The figure is drawn
with matplotlib's object API on its Agg canvas, so the program's pyplot state and backend are
left alone.
"""

from __future__ import annotations

import os
from typing import Any

from ._trace_data import TraceView, chosen_flows, quantile, timeline

INSTALL = "pip install mujou[plot]"


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas; ImportError saying how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            f"drawing a trace as a picture needs matplotlib, which is not installed: {INSTALL} "
            "(or write the page, which needs nothing: --html)"
        ) from exc
    return Figure, FigureCanvasAgg


def check() -> None:
    """ImportError naming ``mujou[plot]`` if matplotlib is not installed."""
    _matplotlib()


def plot(view: TraceView, out: str | os.PathLike[str]) -> None:
    """Draw ``view`` to ``out``; its suffix chooses the format (.png, .svg, .pdf)."""
    figure_type, canvas_type = _matplotlib()
    rows = len(view.tracks)
    figure = figure_type(figsize=(11, 3.2 + 0.32 * rows + 0.3 * len(view.nodes)), layout="constrained")
    canvas_type(figure)
    grid = figure.add_gridspec(
        2, 2, height_ratios=[max(1.6, 0.32 * rows + 0.6), 1.4 + 0.25 * len(view.nodes)]
    )
    _timeline(view, figure.add_subplot(grid[0, :]))
    _lateness(view, figure.add_subplot(grid[1, 0]))
    _busy(view, figure.add_subplot(grid[1, 1]))
    figure.suptitle(
        f"Mujou trace {view.name}: {view.span:.3f} s, {len(view.nodes)} nodes, {len(view.hooks)} hook calls, "
        f"{len(view.flows)} flows",
        fontsize=11,
    )
    figure.savefig(os.fspath(out), dpi=110)


def _timeline(view: TraceView, axes: Any) -> None:
    by_node: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for track, node, start, end, _ in timeline(view, 1600):
        by_node.setdefault((track, node), []).append((start, end - start))
    for (track, node), spans in by_node.items():
        axes.broken_barh(spans, (track - 0.38, 0.76), facecolors=view.color(node), linewidth=0)
    for start, a, end, b in chosen_flows(view):
        axes.plot([start, end], [a, b], color="black", alpha=0.6, linewidth=0.6)
    for node in view.nodes:
        axes.bar(0, 0, color=view.color(node), label=node)  # the legend's entries
    axes.set_yticks(range(len(view.tracks)), view.tracks, fontsize=8)
    axes.set_ylim(len(view.tracks) - 0.5, -0.5)
    axes.set_xlim(0, view.span or 1.0)
    axes.set_xlabel("real time (s)")
    axes.set_title("Hook calls on each thread (lines: a send to the update it woke)", fontsize=10)
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def _lateness(view: TraceView, axes: Any) -> None:
    nodes = [n for n in view.nodes if view.lateness(n)]
    data = [[v * 1e3 for v in view.lateness(n)] for n in nodes]
    if data:
        boxes = axes.boxplot(
            data,
            orientation="horizontal",
            whis=(0, 100),
            showfliers=False,
            patch_artist=True,
            medianprops={"color": "black"},
        )
        for box, node in zip(boxes["boxes"], nodes, strict=True):
            box.set_facecolor(view.color(node))
            box.set_alpha(0.7)
        labels = [
            f"{node}\np99 {quantile(sorted(late), 0.99):.2f} ms\nmax {max(late):.2f} ms"
            for node, late in zip(nodes, data, strict=True)
        ]
        axes.set_yticks(range(1, len(nodes) + 1), labels, fontsize=8)
        axes.set_ylim(len(nodes) + 0.5, 0.5)
    axes.set_xlabel("lateness of the updates (ms; box: p25-p75, whiskers: min-max)")
    axes.set_title("Lateness of each node", fontsize=10)
    if data:
        axes.set_xlim(left=0)


def _busy(view: TraceView, axes: Any) -> None:
    shares = [100 * s for s in view.busy()]
    axes.barh(range(len(view.tracks)), shares, color="#4c72b0")
    for i, share in enumerate(shares):
        axes.annotate(
            f"{share:.1f} %", (share, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )
    axes.set_yticks(range(len(view.tracks)), view.tracks, fontsize=8)
    axes.set_ylim(len(view.tracks) - 0.5, -0.5)
    axes.set_xlim(0, 110)
    axes.set_xlabel("busy share of the trace's span (%)")
    axes.set_title("Busy share of each thread", fontsize=10)
