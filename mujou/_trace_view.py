"""Looking at a trace offline: what it holds, as a summary, a self-contained page or a picture.

``load`` reads a trace that ``mujou.run(net, trace=...)`` wrote (observe.trace) into a
``TraceView``: the hook slices on their tracks, the flows (observe.trace-flows), and per node and
per track what the pictures show: a timeline of the updates on each thread, the distribution of
each node's lateness, and each thread's busy share. ``summary`` is text; ``html`` is one page
with inline SVG drawn here, which needs no dependency and no network; ``mujou._plot`` draws the
same with matplotlib (observe.trace-view).
"""

from __future__ import annotations

import html as _html
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
"""A node's color: the node's place among the trace's nodes, modulo this (matplotlib's tab10)."""

MAX_FLOWS = 2000  # flows drawn on a timeline at most (evenly chosen); a summary counts them all


@dataclass(frozen=True)
class Hook:
    """One hook call: its node and hook, when it ran (seconds from the trace's first slice),
    its track, and its lateness (timer seconds) if it is an update."""

    node: str
    hook: str
    start: float
    duration: float
    track: int
    lateness: float | None


@dataclass
class TraceView:
    """A trace as the pictures see it."""

    name: str  # the file's name
    tracks: list[str]  # each track's label: its thread (and process, where there are several)
    hooks: list[Hook]
    flows: list[tuple[float, int, float, int]]  # (start, its track, end, its track), in seconds
    span: float  # seconds from the first slice's start to the last one's end
    nodes: list[str] = field(default_factory=list)  # in the order of their first hook call

    def color(self, node: str) -> str:
        return PALETTE[self.nodes.index(node) % len(PALETTE)]

    def updates(self, node: str) -> list[Hook]:
        return [h for h in self.hooks if h.node == node and h.hook == "on_update"]

    def lateness(self, node: str) -> list[float]:
        """The lateness of each update of ``node``, in timer seconds, sorted."""
        return sorted(h.lateness for h in self.updates(node) if h.lateness is not None)

    def busy(self) -> list[float]:
        """Each track's busy share: the time in hooks over the trace's span."""
        spent = [0.0] * len(self.tracks)
        for h in self.hooks:
            spent[h.track] += h.duration
        return [s / self.span if self.span > 0 else 0.0 for s in spent]


def load(path: str | os.PathLike[str]) -> TraceView:
    """Read the trace at ``path``.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a trace in the Chrome trace event format's JSON object form.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{os.fspath(path)!r} is not a trace: not JSON ({exc})") from None
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        raise ValueError(
            f"{os.fspath(path)!r} is not a trace: a trace is a JSON object with a list 'traceEvents', "
            "as mujou.run(net, trace=...) writes"
        )
    try:
        return _view(Path(path).name, events)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{os.fspath(path)!r} is not a trace Mujou can read: an event lacks {exc}") from None


def _view(name: str, events: list[Any]) -> TraceView:
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    slices = []
    starts: dict[Any, tuple[float, Any, Any]] = {}
    ends: dict[Any, tuple[float, Any, Any]] = {}
    for event in events:
        phase = event.get("ph") if isinstance(event, dict) else None
        if phase == "X":
            slices.append(event)
        elif phase == "M" and event.get("name") == "process_name":
            processes[event["pid"]] = str(event["args"]["name"])
        elif phase == "M" and event.get("name") == "thread_name":
            threads[event["pid"], event["tid"]] = str(event["args"]["name"])
        elif phase in ("s", "f"):
            (starts if phase == "s" else ends)[event["id"]] = (float(event["ts"]), event["pid"], event["tid"])
    keys = sorted({(e["pid"], e["tid"]) for e in slices}, key=lambda k: (str(k[0]), str(k[1])))
    several = len({pid for pid, _ in keys}) > 1
    tracks = []
    for pid, tid in keys:
        thread = threads.get((pid, tid), f"thread {tid}")
        tracks.append(f"{processes.get(pid, f'process {pid}')}: {thread}" if several else thread)
    index = {key: i for i, key in enumerate(keys)}
    origin = min((float(e["ts"]) for e in slices), default=0.0)
    last = max((float(e["ts"]) + float(e["dur"]) for e in slices), default=origin)
    hooks = []
    nodes: dict[str, None] = {}
    for e in sorted(slices, key=lambda e: float(e["ts"])):
        args = e.get("args")
        lateness = args.get("lateness") if isinstance(args, dict) else None
        hooks.append(
            Hook(
                node=str(e["name"]),
                hook=str(e["cat"]),
                start=(float(e["ts"]) - origin) / 1e6,
                duration=float(e["dur"]) / 1e6,
                track=index[e["pid"], e["tid"]],
                lateness=None if lateness is None else float(lateness),
            )
        )
        nodes.setdefault(str(e["name"]), None)
    flows = [
        ((s[0] - origin) / 1e6, index[s[1], s[2]], (f[0] - origin) / 1e6, index[f[1], f[2]])
        for flow_id, s in starts.items()
        if (f := ends.get(flow_id)) is not None and (s[1], s[2]) in index and (f[1], f[2]) in index
    ]
    return TraceView(name, tracks, hooks, flows, (last - origin) / 1e6, list(nodes))


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


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (the nearest rank), NaN for none."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.3f} ms"


def summary(view: TraceView) -> str:
    """The trace in a few aligned lines: per node its updates and lateness, per track its busy share."""
    width = max([len("node"), *map(len, view.nodes)])
    lines = [
        f"{view.name}: {view.span:.3f} s, {len(view.nodes)} node(s), {len(view.tracks)} thread(s), "
        f"{len(view.hooks)} hook call(s), {len(view.flows)} flow(s)",
        "",
        f"{'node':<{width}}  {'updates':>8}  {'lateness p50':>13}  {'p99':>11}  {'max':>11}",
    ]
    for node in view.nodes:
        late = view.lateness(node)
        lines.append(
            f"{node:<{width}}  {len(view.updates(node)):>8}  {_ms(quantile(late, 0.5)):>13}  "
            f"{_ms(quantile(late, 0.99)):>11}  {_ms(late[-1] if late else math.nan):>11}"
        )
    width = max([len("thread"), *map(len, view.tracks)])
    lines += ["", f"{'thread':<{width}}  {'busy':>7}"]
    lines += [
        f"{track:<{width}}  {share:>7.1%}" for track, share in zip(view.tracks, view.busy(), strict=True)
    ]
    return "\n".join(lines)


# -- the timeline's rectangles, shared with the picture ------------------------------------


def timeline(view: TraceView, columns: int) -> list[tuple[int, str, float, float, int]]:
    """The timeline's rectangles for a width of ``columns`` pixels: (track, node, start,
    end, hook calls), in seconds. A hook call wider than two pixels is a rectangle of its own;
    shorter ones are pooled per pixel, each pixel drawn for the node that spent the most time in
    it, and neighbouring pixels of one node joined: a long run's timeline stays small."""
    scale = columns / view.span if view.span > 0 else 0.0
    rects: list[tuple[int, str, float, float, int]] = []
    pooled: list[dict[int, dict[str, float]]] = [{} for _ in view.tracks]
    for h in view.hooks:
        if h.duration * scale >= 2.0:
            rects.append((h.track, h.node, h.start, h.start + h.duration, 1))
            continue
        column = min(columns - 1, int(h.start * scale))
        spent = pooled[h.track].setdefault(column, {})
        spent[h.node] = spent.get(h.node, 0.0) + h.duration
    pixel = 1.0 / scale if scale > 0 else 0.0
    for track, columns_of in enumerate(pooled):
        run: list[Any] | None = None  # [node, first column, last column, calls]
        for column in sorted(columns_of):
            node = max(columns_of[column].items(), key=lambda item: item[1])[0]
            if run is not None and run[0] == node and run[2] == column - 1:
                run[2] = column
                run[3] += 1
                continue
            if run is not None:
                rects.append((track, run[0], run[1] * pixel, (run[2] + 1) * pixel, run[3]))
            run = [node, column, column, 1]
        if run is not None:
            rects.append((track, run[0], run[1] * pixel, (run[2] + 1) * pixel, run[3]))
    return rects


def chosen_flows(view: TraceView) -> list[tuple[float, int, float, int]]:
    """At most ``MAX_FLOWS`` of the flows, evenly chosen."""
    flows = view.flows
    if len(flows) <= MAX_FLOWS:
        return flows
    step = len(flows) / MAX_FLOWS
    return [flows[int(i * step)] for i in range(MAX_FLOWS)]


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
            f"<td>{len(view.updates(node))}</td><td>{_ms(quantile(late, 0.5))}</td>"
            f"<td>{_ms(quantile(late, 0.99))}</td><td>{_ms(late[-1] if late else math.nan)}</td>"
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
