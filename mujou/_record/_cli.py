"""``python -m mujou record info FILE``: a recording's summary as a table.

See :ref:`record.read-info`. The table is made from the file's summary (:class:`Recording`),
so it is quick on a large file.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from .._errors import MujouWarning
from .._version import __version__
from ._reader import Recording

SHOWN_KEYFRAMES = 8  # the keyframe times listed at most; the count is always given


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``record`` (with its subcommand ``info``) to the command line."""
    record = commands.add_parser("record", help="look at a recording (an MCAP file a run wrote)")
    actions = record.add_subparsers(dest="record_command", metavar="ACTION", required=True)
    info = actions.add_parser(
        "info",
        help="print a recording's summary",
        description=(
            "Print a recording's summary: who wrote it, its timer, time range, message count and "
            "lost messages, keyframes, whether it was cut, and a table of its ports (kind, dtype, "
            "shape, period, messages, rate)."
        ),
    )
    info.add_argument("file", metavar="FILE", help="the recording (.mcap)")


def run(args: argparse.Namespace) -> int:
    """Print the summary of ``args.file``; 1 with the reason on stderr when it cannot be read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MujouWarning)  # the table says both
            with Recording(args.file) as recording:
                text = render(recording)
    except (OSError, ValueError, ImportError) as exc:
        print(f"python -m mujou record info: error: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


def render(recording: Recording) -> str:
    """The summary of ``recording`` as the lines a person reads."""
    meta = recording.metadata
    size = recording.path.stat().st_size
    version = meta.get("version", "?")
    other = "" if version == __version__ else f" (this is Mujou {__version__})"
    span = recording.end - recording.start
    keyframes = recording.keyframes
    times = ", ".join(f"{time:g}" for time in keyframes[:SHOWN_KEYFRAMES])
    if len(keyframes) > SHOWN_KEYFRAMES:
        times += ", ..."
    lost = recording.lost
    facts = [
        ("recording", f"{recording.path.name}: {_size(size)}, written by Mujou {version}{other}"),
        ("written with", f"torch {meta.get('torch', '?')}, Python {meta.get('python', '?')}"),
        (
            "timer",
            f"{meta.get('timer', '?')}, seed {meta.get('seed', '?')}, workers {meta.get('workers', '?')}",
        ),
        ("time", f"{recording.start:g} s to {recording.end:g} s ({span:g} s)"),
        ("messages", f"{recording.message_count}, lost {'unknown (cut)' if lost is None else lost}"),
        ("keyframes", f"{len(keyframes)}" + (f": {times}" if keyframes else "")),
        ("cut", "no" if recording.cut is None else f"yes: {recording.cut}"),
    ]
    width = max(len(name) for name, _ in facts)
    lines = [f"{name:<{width}}  {value}" for name, value in facts]
    rows = [("port", "kind", "dtype", "shape", "period", "messages", "rate (1/s)")]
    for port in recording.ports.values():
        rate = f"{port.messages / span:.4g}" if span > 0 else "-"
        tensor = port.kind == "tensor"  # a nest's leaves have dtypes and shapes of their own
        rows.append(
            (
                port.name,
                port.kind,
                (port.dtype or "varies") if tensor else "-",
                ("varies" if port.shape is None else str(list(port.shape))) if tensor else "-",
                "triggered" if port.period is None else f"{port.period:g}",
                str(port.messages),
                rate,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    numeric = {5, 6}  # right-aligned columns
    lines.append("")
    for row in rows:
        cells = [
            cell.rjust(width) if column in numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    if len(rows) == 1:
        lines.append("(no ports recorded)")
    return "\n".join(lines)


def _size(size: int) -> str:
    if size < 1000:
        return f"{size} bytes"
    value = size / 1000
    for unit in ("kB", "MB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
