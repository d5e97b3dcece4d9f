"""One node's place in a run: its schedule, its statistics, and the jobs it is given.

A ``Slot`` is written by the thread that holds its node (see ``Policy.holder``), and by the
policy under the engine's lock while nobody holds it: the hand-off through the lock makes each
hook see what the previous one wrote (threads.hooks-exclusive).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import MujouInternalError
from .._ports import Input
from .._stats import LATENESS_WINDOW

if TYPE_CHECKING:
    from .._node import Node, NodeCore
    from .._port import _Port
    from .._trace import Update


class Actor(Protocol):
    """The hooks the engine calls for a slot: a node's, or a replay's stand-in for one."""

    def on_start(self) -> None: ...
    def on_update(self, dt: float) -> None: ...
    def on_stop(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


START, RESTORE, STATE, STOP = "start", "restore", "state", "stop"
HOOK_OF_JOB = {START: "on_start", RESTORE: "load_state_dict", STATE: "state_dict", STOP: "on_stop"}


class Job:
    """A one-off hook call on a node: start, restore, state or stop."""

    __slots__ = ("arg", "error", "kind", "result")

    def __init__(self, kind: str, arg: Any = None) -> None:
        self.kind = kind
        self.arg = arg
        self.result: Any = None
        self.error: BaseException | None = None


class Slot:
    """One node's schedule, flags and statistics."""

    __slots__ = (
        "_actor",
        "arrival_numbers",
        "arrival_times",
        "arrived",
        "busy_seconds",
        "core",
        "cuda",
        "dedicated",
        "delay",
        "dt_from",
        "dt_max",
        "dt_min",
        "due",
        "flows_in",
        "hook",
        "index",
        "inputs",
        "jobs",
        "last",
        "lateness",
        "lateness_max",
        "lateness_ring",
        "lodger",
        "lodges",
        "min_interval",
        "name",
        "node",
        "now",
        "one_input",
        "pending",
        "period",
        "sent",
        "skipped",
        "slot",
        "started",
        "stop_queued",
        "stopped",
        "timeout",
        "traced_at",
        "trigger_all",
        "trigger_inputs",
        "update_hook",
        "updates",
        "warned",
    )

    def __init__(self, node: Node, core: NodeCore, index: int) -> None:
        self.node = node
        self.actor = node
        self.core = core
        self.index = index
        self.name = node.name
        self.period = core.period
        self.dedicated = core.dedicated
        self.cuda = core.device.type == "cuda"
        self.slot = 1  # the number of the next update; it is due at slot * period
        self.due = 0.0  # due_time(slot, period), set when the timer starts and at each update
        # A restored pending trigger's due time (inf: none), which takes effect when the timer
        # starts (come_back; trigger.state).
        self.pending = math.inf
        # An arrival came while the node was held or before the timer started: when the node
        # comes back, the policy decides from what its update meanwhile read (come_back).
        self.arrived = False
        self.last = 0.0  # the start time of the previous update (or of the run)
        self.started = False  # its on_start returned
        self.stop_queued = False
        self.stopped = False
        self.jobs: deque[Job] = deque()  # dedicated nodes only; worker jobs share one queue
        self.updates = 0
        self.skipped = 0
        self.busy_seconds = 0.0
        self.dt_min = math.inf
        self.dt_max = 0.0
        # The ``last`` before the node's first update: the sum of its dts is ``last - dt_from``
        # (each update adds its start minus the one before: one subtraction for the run).
        self.dt_from = 0.0
        # The latenesses of the last LATENESS_WINDOW updates: update k writes item k % the window
        # through ``lateness_ring``, a memoryview (an array's own setitem parses its argument
        # with PyArg_Parse: twice the instructions); the first ``updates`` hold a lateness.
        self.lateness = array("d", [0.0]) * LATENESS_WINDOW
        self.lateness_ring: memoryview[float] = memoryview(self.lateness)
        self.lateness_max = 0.0
        self.hook = ""  # the hook running now, while core.hook_thread is set
        # Tracing: the running update's t, dt, lateness and the flows into it (observe.trace).
        self.now: Update | None = None
        # Tracing (observe.trace-flows): where the sends that woke the node were made (a
        # thread's name and a time in the sender's slice), for its next update; where its
        # last update ran, for a flow from it to start.
        self.flows_in: list[tuple[str, float]] = []
        self.traced_at: tuple[str, float] | None = None
        self.warned: set[str] = set()
        # The node's inputs: each update marks which message was latest at its start (ports.fresh).
        self.inputs = tuple(port for port in core.ports.values() if isinstance(port, Input))
        trigger = core.trigger  # what wakes it on its inputs (_arrivals)
        self.trigger_inputs: tuple[Input[Any], ...] = ()
        self.trigger_all = False
        self.timeout = math.inf
        if trigger is not None:
            self.trigger_inputs = tuple(
                port for name in trigger.inputs if isinstance(port := core.ports[name], Input)
            )  # every name is an input: Node checked it
            self.trigger_all = trigger.all
            self.timeout = math.inf if trigger.timeout is None else trigger.timeout
        # Per trigger input, the time and message number of its first arrival that the node's
        # updates have not read (_arrivals.arrive; stale once the number is seen).
        self.arrival_times = [0.0] * len(self.trigger_inputs)
        self.arrival_numbers = [0] * len(self.trigger_inputs)
        # A send may lodge the node without the lock (NOTE [ the send that lodges ] in
        # _lodge): its sender's index (-1: none), whose release queues its stop job; and the
        # nodes this node's sends may lodge. Set for each run (``_lodge.plan``).
        self.lodger = -1
        self.lodges: tuple[int, ...] = ()
        self.min_interval = core.min_interval
        self.delay = core.delay
        # Woken through one input by ``on`` on a worker: a send to it takes the short path
        # (``Policy.sent_to_free``).
        self.one_input = len(self.trigger_inputs) == 1 and not self.trigger_all and not self.dedicated
        # What a send of the node's update that wakes triggered nodes calls (``RunSlot.sent``):
        # the engine's ``arrived``, by this slot, set by the engine.
        self.sent: Callable[[_Port], None] = partial(_no_run, by=self)

    @property
    def actor(self) -> Actor:
        """Whose hooks run: the node, or what stands in for it in a replay (replay.hooks-replaced)."""
        return self._actor

    @actor.setter
    def actor(self, actor: Actor) -> None:
        self._actor = actor
        self.update_hook = actor.on_update  # bound once: a worker calls it for every update


def _no_run(port: _Port, by: Slot) -> None:
    raise MujouInternalError(f"internal error in Mujou: {by.name!r} sent on {port.name!r} in no run")
