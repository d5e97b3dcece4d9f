"""A trace file read for looking at it offline: its hook slices, its flows, and the numbers
both views show (observe.trace-view).

``load`` reads a trace that ``mujou.run(net, trace=...)`` wrote (observe.trace) into a
``TraceView``: the hook slices on their tracks, the flows (observe.trace-flows), and per node and
per track what the views show: the updates on each thread, the distribution of each node's
lateness, and each thread's busy share. ``summary`` is text; ``timeline`` and ``chosen_flows`` are
what the page (``mujou._trace_view``) and the picture (``mujou._plot``) draw.
"""

from __future__ import annotations

import json
import math
import os
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


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (the nearest rank), NaN for none."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def milliseconds(seconds: float) -> str:
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
            f"{node:<{width}}  {len(view.updates(node)):>8}  {milliseconds(quantile(late, 0.5)):>13}  "
            f"{milliseconds(quantile(late, 0.99)):>11}  {milliseconds(late[-1] if late else math.nan):>11}"
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
