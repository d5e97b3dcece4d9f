"""Conformance tests of the orders and hand-offs of a run with processes that only a net made
for them shows: the messages of the last tag before a virtual ``sleep`` returns, the messages
sent in ``on_start``, which of several failures of a tag is the run's error, and the order of
the merged workers. Each runs the same net in one process too, where the spec says the two
give the same, and expects exact values.

The nodes are in ``_order_nodes.py``: the processes are spawned, so their classes must be
importable by name.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from _order_nodes import BusyHost, LongPeriod, StartCrossings, ThreeFailures, raises_earlys_failure
from _support import vt

import mujou


def no_children_left() -> None:
    left = [p.name for p in multiprocessing.active_children() if p.name.startswith("mujou-")]
    assert not left, f"processes of the run still alive: {left}"


@pytest.mark.rule("proc.virtual", "proc.host-api")
@pytest.mark.parametrize("placed", [False, True])
def test_a_sleep_that_ends_between_tags_hands_its_last_tags_messages_over(placed: bool) -> None:
    """> Under the virtual timer ... every process runs its updates of the tag, then the
    > messages of the tag go to their readers in the other processes ...

    The counter (host, period 0.3) sends at t=0.3; the sampler (another process, period 0.5)
    is not woken by it. ``run.sleep(0.3)`` ends after that tag: the message is the sampler's
    input's at once (``run.read``) and at the sampler's update at t=0.5, as in one process.
    Planted: the messages kept back for the reader's next tag not handed over when ``advance``
    stops at ``until`` (``_lockstep.py``: no ``flush`` before ``set_time(until)``); the
    sampler then reads nothing at t=0.5, and this fails."""
    net = LongPeriod()
    with mujou.run(net, timer=vt(), processes={"far": net.sampler} if placed else None) as run:
        run.sleep(0.3)
        at_once = run.read(net.sampler.x)
        run.sleep(0.2)
        seen = run.state_dict()["sampler"]["seen"]
        run.sleep(0.4)  # to t=0.9, the counter's third message: read at t=1.0
        run.sleep(0.1)
        seen_later = run.state_dict()["sampler"]["seen"]
    assert at_once is not None and float(at_once) == 1.0
    assert seen == [1.0], seen
    assert seen_later == [1.0, 3.0], seen_later
    no_children_left()


@pytest.mark.rule("trigger.arrival", "proc.same-rules")
@pytest.mark.parametrize("placed", [False, True])
def test_a_message_sent_in_on_start_wakes_its_triggered_reader_in_another_process(placed: bool) -> None:
    """> Inside each process of the run, every rule of this specification holds ...

    A message sent in ``on_start`` arrives at its triggered reader and wakes it
    (trigger.arrival), whether it crosses from the host to another process or back. Planted:
    the crossings of on_start delivered with ``wake=False`` (``_host.py``, ``Processes.start``);
    neither reader then updates, and this fails."""
    net = StartCrossings()
    processes = {"far": [net.far_reader, net.far_sender]} if placed else None
    with mujou.run(net, timer=vt(), processes=processes) as run:
        run.sleep(0.1)
        tree = run.state_dict()
        updates = {name: stats.updates for name, stats in run.stats().nodes.items()}
    assert tree["far_reader"]["seen"] == [1.5], tree["far_reader"]
    assert tree["host_reader"]["seen"] == [2.5], tree["host_reader"]
    assert updates == {"host_sender": 0, "far_reader": 1, "far_sender": 0, "host_reader": 1}, updates
    no_children_left()


@pytest.mark.rule("sched.virtual-failure", "proc.hook-error", "proc.virtual")
@pytest.mark.parametrize("placed", [False, True])
def test_of_a_tags_failures_the_earliest_registered_nodes_is_the_error(placed: bool) -> None:
    """> ... the host's next call raises the same mujou.HookError as in one process ...

    Three nodes fail at t=0.3: ``early`` (registered first) in group "b", ``middle`` in the
    host, ``late`` in group "a" (the first group of ``processes=``). The error is ``early``'s,
    as in one process, whichever process reported first. Planted: the first failure reported
    (the host's, then the groups' in order) taken (``_lockstep._fail_first`` taking
    ``failures[0]``); the error is then ``middle``'s, and this fails."""
    net = ThreeFailures()
    run = mujou.run(net, timer=vt(), processes={"a": net.late, "b": net.early} if placed else None)
    raises_earlys_failure(run)
    no_children_left()


@pytest.mark.rule("proc.workers", "observe.worker-busy")
def test_the_merged_worker_busy_lists_the_hosts_workers_first() -> None:
    """> run.stats().worker_busy lists them: the host's first, then each group's ...

    With ``workers=1`` each process has one worker. The host's runs a node that sleeps in
    each update; the other process holds only a node on a thread of its own, so its worker
    runs no hook and is busy exactly 0.0 of the time. Planted: the merged stats listing the
    groups' workers first (``_gather.merge_stats``: ``order = [*placement.groups, HOST]``);
    the entries then come the other way round, and this fails."""
    net: Any = BusyHost()
    with mujou.run(net, timer=vt(), workers=1, processes={"g": net.own}) as run:
        run.sleep(0.5)
        stats = run.stats()
    assert stats.workers == 2 and len(stats.worker_busy) == 2, stats
    host, group = stats.worker_busy
    assert host > 0.0, stats.worker_busy
    assert group == 0.0, stats.worker_busy
    no_children_left()
