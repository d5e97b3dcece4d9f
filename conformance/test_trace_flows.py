"""The trace's flows: an arrow from the update that sent a message to the update it woke.

Each test runs a chain ``source`` (periodic) -> ``middle`` (triggered) -> ``sink`` (triggered)
with ``trace=``, loads the JSON and binds every flow event to the slice around it, as Perfetto
does: the start (``"ph": "s"``) to the slice of its track that encloses it, the end
(``"ph": "f"``, ``"bp": "e"``) likewise.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import HANG_GUARD, hang_guard

import mujou
from mujou import Input, Net, Node, Output


class Source(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.ones(1))


class Relay(Node):
    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.y.send(x + 1)


class Chain(Net):
    def __init__(self) -> None:
        super().__init__()
        self.source = Source()
        self.middle = Relay()
        self.sink = Relay()
        self.connect(self.source.y, self.middle.x)
        self.connect(self.middle.y, self.sink.x)


Event = dict[str, Any]


def enclosing(slices: list[Event], event: Event) -> Event:
    """The one complete event on ``event``'s track whose span holds its ``ts``."""
    around = [
        s
        for s in slices
        if (s["pid"], s["tid"]) == (event["pid"], event["tid"])
        and s["ts"] <= event["ts"] <= s["ts"] + s["dur"]
    ]
    assert len(around) == 1, f"{event} lies in {len(around)} slices: {around}"
    return around[0]


def flows(path: Path) -> tuple[list[Event], list[tuple[Event, Event]]]:
    """The trace's complete events, and each flow as (the slice it starts in, the slice it
    ends in). Every start has one end and every end one start, with the same name and cat."""
    events: list[Event] = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == sum(e["ph"] == "s" for e in events), "two flow starts share an id"
    assert len(ends) == sum(e["ph"] == "f" for e in events), "two flow ends share an id"
    assert starts.keys() == ends.keys(), (starts.keys() ^ ends.keys(), "a flow without its other end")
    pairs = []
    for flow_id, start in starts.items():
        end = ends[flow_id]
        assert end.get("bp") == "e", end  # bound to the enclosing slice, not the next one
        assert (start["name"], start["cat"]) == (end["name"], end["cat"]), (start, end)
        pairs.append((enclosing(slices, start), enclosing(slices, end)))
    return slices, pairs


@pytest.mark.rule("observe.trace-flows")
def test_every_woken_update_has_one_flow_from_the_update_that_sent_under_the_virtual_timer(
    tmp_path: Path,
) -> None:
    """> Each message a node's hook sends that wakes a triggered node [...] is a flow in the
    trace: a flow start ("ph": "s") inside the slice of the hook that sent it, on its track, and
    a flow end ("ph": "f", "bp": "e") inside the slice of the woken node's next update [...]."""
    path = tmp_path / "t.json"
    net = Chain()
    with hang_guard(HANG_GUARD), mujou.run(net, timer=mujou.VirtualTimer(), trace=path) as run:
        run.sleep(0.1)
    slices, pairs = flows(path)
    links = Counter((a["name"], b["name"]) for a, b in pairs)
    assert set(links) == {("source", "middle"), ("middle", "sink")}, links
    for sender, woken in pairs:
        assert (sender["cat"], woken["cat"]) == ("on_update", "on_update"), (sender, woken)
        # No delay: the woken update runs at the sender's time, after it.
        assert woken["args"]["t"] == sender["args"]["t"], (sender, woken)
        assert woken["ts"] >= sender["ts"] + sender["dur"], (sender, woken)
    for name in ("middle", "sink"):
        updates = [s for s in slices if s["name"] == name and s["cat"] == "on_update"]
        into = Counter(id(woken) for _, woken in pairs if woken["name"] == name)
        assert len(updates) == 10, (name, len(updates))
        assert [into[id(u)] for u in updates] == [1] * 10, f"{name}: flows into each update {into}"


@pytest.mark.rule("observe.trace-flows")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_flow_starts_at_the_send_inside_the_sending_update_under_the_real_time_timer(
    tmp_path: Path, workers: int
) -> None:
    """> [...] under the real-time timer at the moment of the send [...]; the woken update
    starts after it. (One worker or more: each update a send woke has its flow.)"""
    path = tmp_path / "t.json"
    net = Chain()
    with hang_guard(HANG_GUARD), mujou.run(net, workers=workers, trace=path) as run:
        run.wait_for(net.sink.y, timeout=HANG_GUARD)  # the chain's first message through
        run.sleep(0.05)
    _, pairs = flows(path)
    assert {(a["name"], b["name"]) for a, b in pairs} == {("source", "middle"), ("middle", "sink")}, pairs
    for sender, woken in pairs:
        assert (sender["cat"], woken["cat"]) == ("on_update", "on_update"), (sender, woken)
        assert woken["ts"] >= sender["ts"], (sender, woken)
        assert woken["args"]["t"] >= sender["args"]["t"], (sender, woken)


@pytest.mark.rule("observe.trace-flows")
def test_no_flow_without_a_send_that_woke_a_node(tmp_path: Path) -> None:
    """> A message that wakes no triggered node (its readers update on their period) [...]
    starts no flow."""

    class Reader(Node):
        x = Input()

        def __init__(self) -> None:
            super().__init__(period=0.01)

        def on_update(self, dt: float) -> None:
            self.x.read()

    class Periodic(Net):
        def __init__(self) -> None:
            super().__init__()
            self.source = Source()
            self.reader = Reader()
            self.connect(self.source.y, self.reader.x)

    path = tmp_path / "t.json"
    with hang_guard(HANG_GUARD), mujou.run(Periodic(), timer=mujou.VirtualTimer(), trace=path) as run:
        run.sleep(0.05)
    slices, pairs = flows(path)
    assert pairs == [] and len(slices) > 10, (len(slices), pairs)


@pytest.mark.rule("observe.trace-flows", "proc.trace")
def test_flows_inside_a_process_of_the_run_and_none_across_processes(tmp_path: Path) -> None:
    """> [...] a message from another process of the run ([](#proc.trace)) starts no flow.

    ``middle`` and ``sink`` run in a process of their own: the source's messages cross into it
    and start no flow; the middle's wake the sink inside that process, whose track the flows
    are on."""
    path = tmp_path / "t.json"
    net = Chain()
    far = {"far": [net.middle, net.sink]}
    with hang_guard(HANG_GUARD), mujou.run(net, timer=mujou.VirtualTimer(), trace=path, processes=far) as run:
        run.sleep(0.1)
    slices, pairs = flows(path)
    assert Counter((a["name"], b["name"]) for a, b in pairs) == {("middle", "sink"): 10}, pairs
    assert all(a["pid"] == b["pid"] != 1 for a, b in pairs), pairs  # in the process's tracks
    for sender, woken in pairs:
        assert woken["args"]["t"] == sender["args"]["t"], (sender, woken)
    assert sum(s["name"] == "middle" and s["cat"] == "on_update" for s in slices) == 10


class Fast(Node):
    y = Output()

    def __init__(self, period: float) -> None:
        super().__init__(period=period)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.ones(1))


class Both(Node):
    a = Input()
    b = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on_all("a", "b"))

    def on_update(self, dt: float) -> None:
        self.a.read()


class Pair(Net):
    def __init__(self) -> None:
        super().__init__()
        self.fast = Fast(0.001)
        self.slow = Fast(0.4)
        self.both = Both()
        self.connect(self.fast.y, self.both.a)
        self.connect(self.slow.y, self.both.b)


@pytest.mark.rule("observe.trace-flows")
def test_an_update_woken_by_many_sends_has_the_first_256_flows(tmp_path: Path) -> None:
    """> Several messages that wake one update are as many flows into it, up to 256 (the first
    ones)."""
    path = tmp_path / "t.json"
    with hang_guard(HANG_GUARD), mujou.run(Pair(), timer=mujou.VirtualTimer(), trace=path) as run:
        run.sleep(0.45)  # 450 sends on a; b at 0.4 s: one update of both, woken by them all
    slices, pairs = flows(path)
    [update] = [s for s in slices if s["name"] == "both" and s["cat"] == "on_update"]
    assert update["args"]["t"] == pytest.approx(0.4)
    senders = [a for a, b in pairs if b is update]
    assert len(senders) == len(pairs) == 256, len(pairs)
    assert {a["name"] for a in senders} == {"fast"}  # the first 256 of fast's 400
    times = sorted(a["args"]["t"] for a in senders)
    assert times == pytest.approx([0.001 * (i + 1) for i in range(256)]), times[:5]
