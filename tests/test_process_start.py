"""A process's failure before the timers start is left to the start (mujou/_processes/_host.py).

The start waits for each process's reply and undoes what started when one reports a failure;
stopping the host's engine from the event thread meanwhile could come before the host queued
its own on_start jobs, which then never ran and ``mujou.run`` hung (seen once in CI). Planted:
``fail`` without the ``_running`` check, and this fails.
"""

from __future__ import annotations

from typing import Any

import mujou
from mujou._engine import Engine
from mujou._processes._host import Processes
from mujou._processes._lockstep import Lockstep
from mujou._processes._member import Member
from mujou._processes._placement import HOST, check_processes


class Quiet(mujou.Node):
    pass


class Two(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.here = Quiet()
        self.there = Quiet()


def unspawned() -> tuple[Any, Engine]:
    """The host's side of a run of ``Two`` with node ``there`` in a process, not spawned."""
    net = Two()
    nodes = list(net.nodes())
    placement = check_processes(nodes, {"g": net.there})
    engine = Engine(placement.host, 1, mujou.VirtualTimer(), None)
    member = Member(engine, placement.host, placement.incoming[HOST], list(placement.outgoing[HOST]))
    return Processes(net, nodes, placement, member, None, lockstep=Lockstep), engine


def test_a_failure_before_the_start_is_kept_for_it() -> None:
    processes, engine = unspawned()
    error = RuntimeError("a process failed while the run started")
    processes.fail(error)
    assert engine.policy.error is None and not engine.policy.stopping
    assert processes._early is error
    processes.fail(RuntimeError("a later one"))
    assert processes._early is error  # the first stands
    processes.closed = True  # nothing was spawned: nothing to end


def test_under_the_virtual_timer_a_process_end_does_not_stop_the_host_at_once() -> None:
    """A process that failed in a tag says so in its reply, and the tag's end stops the run;
    its "ended" event, which can come while the host still runs the tag, leaves the host's
    engine alone (seen in CI: the host's node missed its update of the failing tag).
    Planted: the event handled as under the real-time timer, and this fails."""
    processes, engine = unspawned()
    processes._running = True
    failure = ("other", "ValueError", "boom", None, "")
    processes._on_event(None, ("ended", failure))
    assert engine.policy.error is None and not engine.policy.stopping
    processes.closed = True
