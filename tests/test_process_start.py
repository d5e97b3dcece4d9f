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
from mujou._processes._member import Member
from mujou._processes._placement import HOST, check_processes


class Quiet(mujou.Node):
    pass


class Two(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.here = Quiet()
        self.there = Quiet()


def test_a_failure_before_the_start_is_kept_for_it() -> None:
    net = Two()
    nodes = list(net.nodes())
    placement = check_processes(nodes, {"g": net.there})
    engine = Engine(placement.host, 1, mujou.VirtualTimer(), None)
    member = Member(engine, placement.host, placement.incoming[HOST], list(placement.outgoing[HOST]))
    processes: Any = Processes(net, nodes, placement, member, None)
    error = RuntimeError("a process failed while the run started")
    processes.fail(error)
    assert engine.policy.error is None and not engine.policy.stopping
    assert processes._early is error
    processes.fail(RuntimeError("a later one"))
    assert processes._early is error  # the first stands
    processes.closed = True  # nothing was spawned: nothing to end
