"""Where a virtual tag's time goes, each side: the mean wall time a tag of each step of the
exchange (proc.exchange), in the host's lockstep thread and in the other process.

::

    python -m bench.tag_steps [SECONDS [SLEEP]]

runs tags-virtual-2p's net (``Rally``, ``pong`` in a process of its own, one worker) for
SECONDS (2 by default) after a warm-up, in ``run.sleep(SLEEP)`` calls (0.01 by default, the
bench's: 10 tags a call), with each step wrapped in a timer put in at import
(this module is the node classes' module, which the process imports too): the tag's instant
(``Member.instant``: the updates due, their commit, the next due time) and the node's own hook
within it, the pickling of the message and the unpickling of the other's (``_codec``), the
frame's write and read (``_frames``), the wait for the other's frame (``Poller.wait``, polling;
``Poller.block`` once a poll ran out), and the publish of what the other sent
(``Member.apply``). A step's mean is per call; the table also gives the calls per tag, so that
a step's share of a tag is its mean times its calls; the steps count from the start, the
warm-up's 20 tags and its one sleep among them (``rally_tags``). Each ``run.sleep`` is timed too: the
host's call (``Lockstep.advance``, on the host's thread: it hands the tags to
``mujou-lockstep`` and waits) and the span of tags it asked for (``_lockstep._span``, on
that thread: the span's command, its tags, its end); the difference is the hand-off between
the two threads. Each wrapper is a Python call of its own
(about 0.2-0.5 µs): the steps' sum is a little more than the bench's tag.

The process writes its totals as its node stops (``on_stop``), to ``STEPS``; the host's are
its lockstep thread's (the host's process runs no other tag step).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import mujou
from bench.mujou_processes import Rally, Volley, rally_tags
from mujou._processes import _codec, _frames, _lockstep, _member, _spin

STEPS = "/tmp/mujou-tag-steps-{}.txt"  # the process's totals, by the host's pid
_now = time.perf_counter
_totals: dict[str, list[float]] = {}  # step: [calls, seconds], this process's


def _add(step: str, began: float) -> None:
    total = _totals.setdefault(step, [0, 0.0])
    total[0] += 1
    total[1] += _now() - began


def _timed(function: Callable[..., Any], step: str) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = _now()
        try:
            return function(*args, **kwargs)
        finally:
            _add(step, began)

    return timed


def _timed_factory(factory: Callable[..., Any], step: str) -> Callable[..., Any]:
    """``factory`` (``_frames.reader`` or ``writer``), its functions timed as ``step``."""

    def make(*args: Any) -> Any:
        return _timed(factory(*args), step)

    return make


def _install() -> None:
    for owner, name, step in (
        (_member.Member, "instant", "instant"),
        (_member.Member, "apply", "publish the other's"),
        (_codec, "dumps", "pickle"),
        (_codec, "loads", "unpickle"),
        (_spin.Poller, "wait", "wait (polling)"),
        (_spin.Poller, "block", "wait (blocked)"),
        (_lockstep.Lockstep, "advance", "the host's run.sleep"),
        (_lockstep, "_span", "its span (mujou-lockstep)"),
    ):
        setattr(owner, name, _timed(getattr(owner, name), step))
    _frames.reader = _timed_factory(_frames.reader, "read a frame")
    _frames.writer = _timed_factory(_frames.writer, "write a frame")


_install()


class StepsVolley(Volley):
    """The bench's node, its hook timed; the process's writes its totals as it stops."""

    def __init__(self, host: int) -> None:
        super().__init__()
        self.host = host

    def on_update(self, dt: float) -> None:
        began = _now()
        super().on_update(dt)
        _add("  the node's hook", began)

    def on_stop(self) -> None:
        if os.getpid() != self.host:
            with open(STEPS.format(self.host), "w") as file:
                rows = _totals.items()
                file.writelines(f"{step}\t{calls}\t{seconds!r}\n" for step, (calls, seconds) in rows)


class StepsRally(Rally):
    def __init__(self) -> None:  # Rally's net of StepsVolley nodes
        mujou.Net.__init__(self)
        self.ping = StepsVolley(os.getpid())
        self.pong = StepsVolley(os.getpid())
        self.connect(self.ping.y, self.pong.x)
        self.connect(self.pong.y, self.ping.x)


def _table(side: str, totals: dict[str, list[float]], tags: int) -> None:
    print(f"{side}: µs a call, calls a tag, µs a tag")
    for step, (calls, seconds) in totals.items():
        print(f"  {step:26s} {seconds / calls * 1e6:7.2f} {calls / tags:6.2f} {seconds / tags * 1e6:7.2f}")


def main(seconds: float, sleep: float) -> None:
    net = StepsRally()
    path = STEPS.format(os.getpid())
    if os.path.exists(path):
        os.remove(path)
    rate, _ = rally_tags(seconds, net, {"pong": net.pong}, sleep)
    tags = int(_totals["instant"][0])  # the host's process runs each tag's instant once
    sleeps = int(_totals["the host's run.sleep"][0])
    print(f"{rate:,.0f} tags a second, {tags} tags in {sleeps} run.sleep({sleep}) calls")
    _table("host (mujou-lockstep; run.sleep on the host's thread)", _totals, tags)
    with open(path) as file:
        rows = [line.rstrip("\n").split("\t") for line in file]
    theirs = {step: [int(calls), float(seconds)] for step, calls, seconds in rows}
    _table("process", theirs, int(theirs["instant"][0]))
    call, span = (
        _totals[step][1] / sleeps * 1e6 for step in ("the host's run.sleep", "its span (mujou-lockstep)")
    )
    print(
        f"a run.sleep: {call:.1f} µs, its span {span:.1f}, the hand-off between the threads {call - span:.1f}"
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0, float(sys.argv[2]) if len(sys.argv) > 2 else 0.01)
