"""The virtual timer over a run's processes: one tag at a time, in lockstep (proc.virtual).

Each tag, every process runs its updates of the tag and commits them; the messages that
cross go to their readers' processes, which publish them with their arrivals; the next tag
is then the earliest due time of all. This reproduces what one process does at each instant
(``Engine.advance``), one barrier per tag.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._engine._collect import stopping_now
from .._engine._instants import nothing_can_happen
from ._group import rebuild_failure
from ._member import Failure
from ._placement import HOST
from ._wire import Crossing

if TYPE_CHECKING:
    from ._host import Processes


def advance(processes: Processes, until: float | None, done: Callable[[], bool] | None) -> bool:
    """Run the tags up to ``until`` in every process, one at a time (proc.virtual).

    Each tag: every process runs its updates of the tag and commits them; the messages
    that cross are handed to their readers' processes; the next tag is the earliest due
    time of all. ``done`` is asked between whole instants, as ``Engine.advance`` does: not
    while a later tag of the same time (a microstep) is due (trigger.tags).

    The messages for a group that wake none of its nodes leave its next due time as it was:
    they go with the group's next tag command instead of a command of their own (one command
    a tag instead of two), and with one of their own before this returns.
    """
    host, engine = processes.host, processes.host.engine
    policy = engine.policy
    if processes.closed or stopping_now(policy):  # the run has ended, or is ending: no tag runs
        _wait_for_the_end(processes)
        return done() if done is not None else False
    processes.all("begin_advance")
    host.begin_advance()
    dues = processes.all("next_due")
    dues[HOST] = host.next_due()
    deferred: dict[str, list[Crossing]] = {}
    last = -math.inf  # the time of the last tag run here
    while True:
        if stopping_now(policy):  # the last tag's messages are out first, as in one process
            processes.flush(deferred)
            _wait_for_the_end(processes)
            break
        due = min(dues.values())
        if due > last and done is not None and done():  # the instant at ``last`` is whole
            processes.flush(deferred)
            return True
        if until is not None and due > until:
            processes.flush(deferred)
            processes.all("set_time", until)
            host.set_time(until)
            return False
        if due == math.inf:  # nothing deferred: its readers are periodic, so due again
            raise nothing_can_happen()
        _tag(processes, due, dues, deferred)
        last = due
    return done() if done is not None else False


def _wait_for_the_end(processes: Processes) -> None:
    """The run is ending: wait until every node stopped and every process exited (bounded
    once the host's nodes stopped), so that the host's call that returns or raises now finds
    the run ended whole (proc.cleanup)."""
    engine = processes.host.engine
    with engine.lock:
        engine.host_wait(lambda: engine.ended)
    processes.stop()


def _tag(
    processes: Processes, due: float, dues: dict[str, float], deferred: dict[str, list[Crossing]]
) -> None:
    """One tag in every process; ``dues`` becomes each process's next due time, ``deferred``
    the messages for the groups that their next command takes."""
    host = processes.host
    sent = processes.send_each({name: ("instant", due, deferred.pop(name, [])) for name in processes.groups})
    with processes.tag_lock:
        crossed, failure = host.instant(due)  # an interrupt leaves: the replies are dropped
    crossings: dict[str, Sequence[Crossing]] = {HOST: crossed}
    failures: list[tuple[str, Failure]] = [] if failure is None else [(HOST, failure)]
    # Each reply comes after the events its process sent before it (the messages of the
    # ports the host watches): see NOTE [ the control protocol ] in _group.
    for name, (found, failed, next_due) in processes.gather(sent).items():
        crossings[name] = found
        dues[name] = next_due
        if failed is not None:
            failures.append((name, failed))
    dues.update(processes.deliver(crossings, wake=True, defer=deferred))
    dues[HOST] = host.next_due()
    if failures:
        _fail_first(processes, failures)


def _fail_first(processes: Processes, failures: list[tuple[str, Failure]]) -> None:
    """Of the failures of one tag, the earliest registered node's is the run's error
    (sched.virtual-failure), whichever process it was in."""
    order = {node.name: i for i, node in enumerate(processes.nodes)}

    def rank(item: tuple[str, Failure]) -> int:
        failure = item[1]
        return order.get(failure[1], len(order)) if failure[0] == "hook" else -1

    process, failure = min(failures, key=rank)
    error = processes.host.engine.error if process == HOST else rebuild_failure(failure, process)
    assert error is not None
    engine = processes.host.engine
    with engine.lock:
        engine.policy.error = error
        engine.policy.begin_stop()
        engine.deliver()
    # The processes end once the tag's messages are out: advance's loop ends them next.
