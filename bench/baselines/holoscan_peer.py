"""NVIDIA Holoscan, Python operators: an operator per node, each update one ``compute`` call.

Each operator has a ``PeriodicCondition`` (10 ms, ``NO_CATCH_UP_MISSED_TICKS``: skipping, as
every system here) and runs on an ``EventBasedScheduler`` with one worker thread (as the
plain pool). The ring's input keeps only the newest message (``QueuePolicy.POP``, no
condition), the operator keeps the latest it received. Holoscan decides the due times
itself; the run's origin is one period before the first ``compute`` (every operator's
first tick is due at the scheduler's start) and each update is given the slot of Mujou's
rule from its start time, the same grid as every other system.
"""

# mypy: disallow-subclassing-any=False

from __future__ import annotations

import datetime
import importlib
import time
from array import array
from typing import Any

import torch

from .._common import (
    DISPATCH_PERIOD,
    ECHO_PERIOD,
    GRACE,
    PERIOD,
    EchoHost,
    Metrics,
    Record,
    Window,
    fleet_metrics,
    idle_metrics,
    next_slot,
    round_trips,
    weights,
    zeros,
)

core: Any = importlib.import_module("holoscan.core")
conditions: Any = importlib.import_module("holoscan.conditions")
schedulers: Any = importlib.import_module("holoscan.schedulers")


def _periodic(fragment: Any, period: float) -> Any:
    return conditions.PeriodicCondition(
        fragment,
        recess_period=datetime.timedelta(seconds=period),
        policy=conditions.PeriodicConditionPolicy.NO_CATCH_UP_MISSED_TICKS,
    )


def _scheduler(app: Any, seconds: float) -> Any:
    return schedulers.EventBasedScheduler(
        app,
        worker_thread_number=1,
        stop_on_deadlock=False,
        max_duration_ms=int(1000 * seconds),
        name="scheduler",
    )


class RingOp(core.Operator):
    def __init__(self, fragment: Any, *args: Any, w: torch.Tensor, starts: array[float], **kwargs: Any):
        self.w = w
        self.starts = starts
        self.zero = zeros()
        self.latest: torch.Tensor | None = None
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: Any) -> None:
        spec.input("x", policy=core.IOSpec.QueuePolicy.POP).condition(core.ConditionType.NONE)
        spec.output("y").condition(core.ConditionType.NONE)

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        self.starts.append(time.perf_counter())
        x = op_input.receive("x")
        if x is not None:
            self.latest = x
        else:
            x = self.latest if self.latest is not None else self.zero
        op_output.emit(torch.tanh(self.w @ x), "y")


def fleet(n: int, seconds: float) -> Metrics:
    starts = [array("d") for _ in range(n)]

    class Fleet(core.Application):
        def compose(self) -> None:
            ops = [
                RingOp(self, _periodic(self, PERIOD), name=f"n{i}", w=w, starts=starts[i])
                for i, w in enumerate(weights(n))
            ]
            for i, op in enumerate(ops):
                self.add_flow(ops[i - 1], op, {("y", "x")})

    app = Fleet()
    app.scheduler(_scheduler(app, seconds + GRACE + PERIOD))
    window = Window()
    future = app.run_async()
    while not any(starts):
        time.sleep(0.0005)
    window.start()
    origin = min(node[0] for node in starts if node) - PERIOD
    time.sleep(max(0.0, origin + seconds + GRACE - time.perf_counter()))
    window.stop()
    future.result()
    record = Record()
    for node in starts:
        slot = 1
        for start in node:
            record.starts.append(start)
            record.dues.append(slot * PERIOD)
            slot = next_slot(slot, PERIOD, start - origin)
    return fleet_metrics(record, origin, n, seconds, cpu_seconds=window.cpu, wall_seconds=window.wall)


class CountOp(core.Operator):
    """An update that does nothing (it records its start time)."""

    def __init__(self, fragment: Any, *args: Any, starts: array[float], **kwargs: Any):
        self.starts = starts
        super().__init__(fragment, *args, **kwargs)

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        self.starts.append(time.perf_counter())


def _count_run(n: int, period: float, seconds: float) -> tuple[Window, int]:
    """Run n counting operators; count the updates and the CPU time after a 0.2 s warm-up."""
    starts = array("d")

    class Counting(core.Application):
        def compose(self) -> None:
            for i in range(n):
                if period > DISPATCH_PERIOD:
                    self.add_operator(CountOp(self, _periodic(self, period), name=f"n{i}", starts=starts))
                else:  # no condition: always ready
                    self.add_operator(CountOp(self, name=f"n{i}", starts=starts))

    app = Counting()
    app.scheduler(_scheduler(app, seconds + 0.4))
    future = app.run_async()
    while not starts:
        time.sleep(0.0005)
    time.sleep(0.2)
    window = Window()
    done = len(starts)
    window.start()
    time.sleep(seconds)
    window.stop()
    done = len(starts) - done
    future.result()
    return window, done


def dispatch(n: int, seconds: float) -> Metrics:
    window, done = _count_run(n, DISPATCH_PERIOD, seconds)
    return {"updates_per_second": done / window.wall, "updates": done, "wall_seconds": window.wall}


def idle(seconds: float) -> Metrics:
    window, done = _count_run(1, PERIOD, seconds)
    return idle_metrics(window.cpu, window.wall, done)


class EchoOp(core.Operator):
    """Sends each new message of the host's box on ``y``."""

    def __init__(self, fragment: Any, *args: Any, host: EchoHost, **kwargs: Any):
        self.host = host
        self.last: torch.Tensor | None = None
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: Any) -> None:
        spec.output("y").condition(core.ConditionType.NONE)

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        message = self.host.box
        if message is not self.last:
            self.last = message
            op_output.emit(message, "y")


class HostSinkOp(core.Operator):
    """Hands what the echo sent back to the host (runs when a message is available)."""

    def __init__(self, fragment: Any, *args: Any, host: EchoHost, **kwargs: Any):
        self.host = host
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: Any) -> None:
        spec.input("x")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        self.host.deliver(op_input.receive("x"))


def echo(seconds: float) -> Metrics:
    host = EchoHost()

    class EchoApp(core.Application):
        def compose(self) -> None:
            echo_op = EchoOp(self, _periodic(self, ECHO_PERIOD), name="echo", host=host)
            sink = HostSinkOp(self, name="host", host=host)
            self.add_flow(echo_op, sink, {("y", "x")})

    app = EchoApp()
    app.scheduler(_scheduler(app, seconds + 3.0))  # stop_execution() does not end run_async here
    future = app.run_async()
    try:
        return host.round_trips(seconds)
    finally:
        app.stop_execution()
        future.result()


class TriggeredEchoOp(core.Operator):
    """Sends the host's box on ``y`` when the host sets its ``AsynchronousCondition`` (no period)."""

    def __init__(self, fragment: Any, *args: Any, host: EchoHost, event: Any, **kwargs: Any):
        self.host = host
        self.event = event
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: Any) -> None:
        spec.output("y").condition(core.ConditionType.NONE)

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        self.event.event_state = conditions.AsynchronousEventState.EVENT_WAITING
        op_output.emit(self.host.box, "y")


def echo_triggered(seconds: float) -> Metrics:
    """The triggered echo: the host wakes the echo operator through an ``AsynchronousCondition``.

    The host puts its message in the box, sets the condition to ``EVENT_DONE`` and notifies
    the scheduler (Holoscan's way for another thread to wake an operator); the sink runs on
    ``MessageAvailableCondition``, as in ``echo``.
    """
    host = EchoHost()
    events: list[Any] = []

    class EchoApp(core.Application):
        def compose(self) -> None:
            event = conditions.AsynchronousCondition(self, name="wake")
            event.event_state = conditions.AsynchronousEventState.EVENT_WAITING
            events.append(event)
            echo_op = TriggeredEchoOp(self, event, name="echo", host=host, event=event)
            sink = HostSinkOp(self, name="host", host=host)
            self.add_flow(echo_op, sink, {("y", "x")})

    app = EchoApp()
    app.scheduler(_scheduler(app, seconds + 3.0))
    future = app.run_async()
    while not events:
        time.sleep(0.001)
    time.sleep(0.2)

    def write(value: float) -> None:
        host.box = torch.full((1,), value)
        events[0].event_state = conditions.AsynchronousEventState.EVENT_DONE
        events[0].notify_scheduler()  # without it the scheduler sees the event later (310 µs p50 here)

    try:
        return round_trips(write, host.wait, seconds)
    finally:
        app.stop_execution()
        future.result()
