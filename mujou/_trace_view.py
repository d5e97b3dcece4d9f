"""Looking at a trace offline: ``mujou.plot_trace`` and ``python -m mujou trace``, and the
self-contained page.

The trace is read by ``mujou._trace_data``; ``html`` draws it as one page with inline SVG drawn
here, which needs no dependency and no network; ``mujou._plot`` draws the same with matplotlib
(observe.trace-view).
"""

from __future__ import annotations

import html as _html
import math
import os
import sys
from pathlib import Path
from typing import Any

from ._trace_data import TraceView, chosen_flows, load, milliseconds, quantile, summary, timeline

VIEWS = {".html": "page", ".htm": "page", ".png": "picture", ".svg": "picture", ".pdf": "picture"}
"""The suffixes ``plot_trace`` writes, and what it writes for each."""


def plot_trace(trace: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Draw the trace file ``trace`` (written by ``mujou.run(net, trace=...)``) to ``out``, to
    look at the run offline: a timeline of each thread's hook calls with the flows from a send to
    the update it woke, each node's lateness distribution and each thread's busy share.

    ``out``'s suffix chooses: ``.html`` (or ``.htm``) writes a self-contained page (inline SVG,
    no script, nothing fetched) that needs no other package; ``.png``, ``.svg`` or ``.pdf`` a
    picture drawn with matplotlib (``pip install mujou[plot]``). See :ref:`observe.trace-view`.

    Raises:
        TypeError: ``trace`` or ``out`` is not a path.
        ValueError: ``out`` has another suffix, or ``trace`` is not a trace.
        ImportError: a picture was asked for and matplotlib is not installed.
        OSError: ``trace`` cannot be read or ``out`` written.
    """
    for name, value in (("trace", trace), ("out", out)):
        if not isinstance(value, str | os.PathLike):
            raise TypeError(f"{name} must be a file path, got {type(value).__name__}: {value!r}")
    suffix = Path(out).suffix.lower()
    kind = VIEWS.get(suffix)
    if kind is None:
        raise ValueError(
            f"out must end in {', '.join(VIEWS)} (a page, or a picture with matplotlib), "
            f"got {os.fspath(out)!r}"
        )
    if kind == "picture":
        from . import _plot

        _plot.check()  # before the trace is read: say at once what to install
        _plot.plot(load(trace), out)
    else:
        Path(out).write_text(html(load(trace)), encoding="utf-8")


def add_trace_command(commands: Any) -> None:
    """``python -m mujou trace FILE [--html OUT] [--plot OUT]`` (observe.trace-view)."""
    command = commands.add_parser(
        "trace",
        help="look at a run's trace offline: a summary, a page, a picture",
        description=(
            "Print a summary of the trace FILE that mujou.run(net, trace=FILE) wrote: each node's "
            "updates and lateness, each thread's busy share. --html writes a self-contained page "
            "(no network, nothing to install) and --plot a picture (needs matplotlib: "
            "pip install mujou[plot]), each with a timeline of the hook calls on each thread and "
            "the flows from a send to the update it woke, each node's lateness distribution and "
            "each thread's busy share."
        ),
    )
    command.add_argument("file", metavar="FILE", help="the trace, a JSON file")
    command.add_argument("--html", metavar="OUT", help="write a self-contained page to OUT (.html)")
    command.add_argument(
        "--plot", metavar="OUT", help="write a picture to OUT (.png, .svg or .pdf; matplotlib)"
    )


def trace_command(args: Any) -> int:
    """Run ``python -m mujou trace``; the exit status (1: the trace or an output failed)."""
    try:
        for option, out, kinds in (("--html", args.html, ("page",)), ("--plot", args.plot, ("picture",))):
            if out is not None and VIEWS.get(Path(out).suffix.lower()) not in kinds:
                allowed = ", ".join(s for s, k in VIEWS.items() if k in kinds)
                raise ValueError(f"{option} must name a file ending in {allowed}, got {out!r}")
        from . import _plot  # matplotlib is imported by _plot.check only

        if args.plot is not None:
            _plot.check()
        view = load(args.file)
        print(summary(view))
        if args.html is not None:
            Path(args.html).write_text(html(view), encoding="utf-8")
            print(f"wrote {args.html}")
        if args.plot is not None:
            _plot.plot(view, args.plot)
            print(f"wrote {args.plot}")
    except (OSError, ValueError, ImportError) as exc:
        print(f"python -m mujou trace: error: {exc}", file=sys.stderr)
        return 1
    return 0


# -- the page ------------------------------------------------------------------------------

WIDTH = 960  # the timeline's width in pixels
LABEL = 190  # the width of the labels left of it
ROW = 22  # a track's height
STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; }
td:first-child, th:first-child { text-align: left; } th { border-bottom: 1px solid #999; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
"""


def html(view: TraceView) -> str:
    """A self-contained page (inline SVG and CSS, no script, nothing fetched) of ``view``."""
    e = _html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Mujou trace: {e(view.name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Mujou trace: {e(view.name)}</h1>",
        f"<p>{view.span:.3f} s of real time, {len(view.nodes)} node(s) on {len(view.tracks)} thread(s), "
        f"{len(view.hooks)} hook call(s), {len(view.flows)} flow(s) from a send to the update it woke.</p>",
        "<h2>Timeline: each thread's hook calls</h2>",
        _legend(view),
        _timeline_svg(view),
        "<h2>Lateness of each node's updates</h2>",
        _lateness_table(view),
        "<h2>Busy share of each thread</h2>",
        _busy_svg(view),
        "</body></html>",
    ]
    return "\n".join(parts)


def _legend(view: TraceView) -> str:
    items = "".join(
        f'<span style="margin-right:16px"><span class="swatch" style="background:{view.color(n)}"></span>'
        f"{_html.escape(n)}</span>"
        for n in view.nodes
    )
    return f"<p>{items}</p>"


def _seconds_ticks(span: float) -> list[float]:
    """About six round ticks from 0 to ``span`` seconds."""
    if span <= 0:
        return [0.0]
    raw = span / 6
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    return [i * step for i in range(int(span / step) + 1)]


def _timeline_svg(view: TraceView) -> str:
    e = _html.escape
    scale = WIDTH / view.span if view.span > 0 else 0.0
    height = ROW * len(view.tracks) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL + WIDTH + 10}" height="{height}">']
    for i, label in enumerate(view.tracks):
        y = i * ROW
        out.append(f'<rect x="{LABEL}" y="{y + 2}" width="{WIDTH}" height="{ROW - 4}" fill="#f3f3f3"/>')
        out.append(f'<text x="{LABEL - 6}" y="{y + ROW / 2 + 4}" text-anchor="end">{e(label)}</text>')
    for track, node, start, end, calls in timeline(view, WIDTH):
        x = LABEL + start * scale
        w = max(0.6, (end - start) * scale)
        what = f"{node}: {calls} hook calls" if calls > 1 else f"{node}: {(end - start) * 1e3:.3f} ms"
        out.append(
            f'<rect x="{x:.2f}" y="{track * ROW + 2}" width="{w:.2f}" height="{ROW - 4}" '
            f'fill="{view.color(node)}"><title>{e(what)} at {start:.4f} s</title></rect>'
        )
    for start, a, end, b in chosen_flows(view):
        out.append(
            f'<line x1="{LABEL + start * scale:.2f}" y1="{a * ROW + ROW / 2}" x2="{LABEL + end * scale:.2f}" '
            f'y2="{b * ROW + ROW / 2}" stroke="#000" stroke-opacity="0.35" stroke-width="0.7"/>'
        )
    axis = ROW * len(view.tracks) + 4
    for tick in _seconds_ticks(view.span):
        x = LABEL + tick * scale
        out.append(f'<line x1="{x:.2f}" y1="{axis}" x2="{x:.2f}" y2="{axis + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.2f}" y="{axis + 18}" text-anchor="middle">{tick:g} s</text>')
    out.append("</svg>")
    if view.flows:
        shown = len(chosen_flows(view))
        out.append(
            f"<p>Grey lines: flows from a send to the update it woke ({shown} of {len(view.flows)}).</p>"
        )
    return "\n".join(out)


LOW = 1e-6  # the histograms' lowest lateness, in seconds: lower ones count in the first bar


def _histogram(values: list[float], high: float, bins: int = 40, width: int = 320, height: int = 24) -> str:
    """A small inline histogram of ``values`` on a log scale from ``LOW`` to ``high`` seconds."""
    counts = [0] * bins
    span = math.log(high / LOW) if high > LOW else 1.0
    for v in values:
        counts[min(bins - 1, max(0, int(math.log(max(v, LOW) / LOW) / span * bins)))] += 1
    most = max(counts) or 1
    bars = "".join(
        f'<rect x="{i * width / bins:.1f}" y="{height - c / most * height:.1f}" '
        f'width="{width / bins - 0.5:.1f}" height="{c / most * height:.1f}" fill="#555"/>'
        for i, c in enumerate(counts)
        if c
    )
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{bars}</svg>'


def _lateness_table(view: TraceView) -> str:
    e = _html.escape
    high = max([LOW * 10, *(v for n in view.nodes for v in view.lateness(n))])
    rows = [
        "<table><tr><th>node</th><th>updates</th><th>p50</th><th>p99</th><th>max</th>"
        f"<th>distribution, log scale from 0.001 ms to {high * 1e3:.3f} ms</th></tr>"
    ]
    for node in view.nodes:
        late = view.lateness(node)
        rows.append(
            f'<tr><td><span class="swatch" style="background:{view.color(node)}"></span>{e(node)}</td>'
            f"<td>{len(view.updates(node))}</td><td>{milliseconds(quantile(late, 0.5))}</td>"
            f"<td>{milliseconds(quantile(late, 0.99))}</td>"
            f"<td>{milliseconds(late[-1] if late else math.nan)}</td>"
            f"<td>{_histogram(late, high) if late else ''}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _busy_svg(view: TraceView) -> str:
    e = _html.escape
    width = 400
    height = ROW * len(view.tracks)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL + width + 60}" height="{height}">']
    for i, (track, share) in enumerate(zip(view.tracks, view.busy(), strict=True)):
        y = i * ROW
        out.append(f'<text x="{LABEL - 6}" y="{y + ROW / 2 + 4}" text-anchor="end">{e(track)}</text>')
        out.append(f'<rect x="{LABEL}" y="{y + 3}" width="{width}" height="{ROW - 6}" fill="#eee"/>')
        out.append(
            f'<rect x="{LABEL}" y="{y + 3}" width="{min(1.0, share) * width:.1f}" '
            f'height="{ROW - 6}" fill="#4c72b0"/>'
        )
        out.append(f'<text x="{LABEL + width + 6}" y="{y + ROW / 2 + 4}">{share:.1%}</text>')
    out.append("</svg>")
    return "\n".join(out)
