"""The workers' batch runner (``_engine._update``), driven on the test's thread with a fake clock.

What ends a batch early (threads.earliest-due-first): with one worker, a node that ran and is
due again goes on waiting while the next node of the batch is due before it; with more
workers, or when it is due first, the batch ends so that the policy (another worker, or this
one) takes it in order.
"""

from __future__ import annotations

import contextvars
import math
import random
import threading
from array import array
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from mujou._engine import _update
from mujou._engine._batches import Batch
from mujou._engine._clock import RealClock
from mujou._engine._hooks import Hooks
from mujou._engine._policy import Policy
from mujou._engine._slot import Slot
from mujou._engine._update import batch_runner, begin_update
from mujou._stats import LATENESS_WINDOW


class Clock:
    """Timer time that moves by ``step`` at each read: each update takes that long."""

    virtual = False
    scale = 1.0

    def __init__(self, start: float, step: float) -> None:
        self.time, self.step = start, step

    def now(self) -> float:
        self.time += self.step
        return self.time


def make_slot(index: int, period: float, ran: list[int]) -> Slot:
    core = SimpleNamespace(
        period=period,
        dedicated=False,
        device=torch.device("cpu"),
        ports={},
        trigger=None,
        min_interval=0.0,
        delay=0.0,
        context=contextvars.Context(),
        reads=[],
        hook_thread=0,
        streams=None,
    )
    node = SimpleNamespace(name=f"n{index}", on_update=lambda dt: ran.append(index))
    return Slot(cast(Any, node), cast(Any, core), index)


def runner_for(slots: list[Slot], workers: int, clock: Any) -> Any:
    """``batch_runner`` of worker 0 of a run of ``slots`` on ``clock``, without threads."""
    engine = SimpleNamespace(
        lock=threading.Lock(),
        policy=Policy(slots, workers, virtual=False, scale=1.0, gil=False),
        clock=clock,
        slots=slots,
        hooks=Hooks(slots, None),
        workers=workers,
        deliver=lambda: False,
        report=lambda *args: None,
    )
    return batch_runner(cast(Any, engine), 0)


def run_batch(periods: list[float], workers: int, step: float) -> list[int]:
    """Run one batch of nodes with these periods, each due at its first slot (the first node
    registered first), each update taking ``step`` timer seconds; the nodes that ran."""
    ran: list[int] = []
    slots = [make_slot(index, period, ran) for index, period in enumerate(periods)]
    for slot in slots:
        slot.due = slot.period
    batch = Batch()
    batch.due, batch.todo = slots[0].due, list(reversed(range(len(slots))))
    runner_for(slots, workers, Clock(0.01, step))(batch, 0.01)
    assert [slot.index for slot in batch.ran] == ran
    return ran


def test_one_worker_runs_the_batch_on_while_what_ran_is_due_after_the_rest() -> None:
    """Node 0 (period 0.003) is due again at 0.012 after its update at 0.01; nodes 1 and 2 of
    the batch are due at 0.01: with one worker the batch goes on, the earliest due first."""
    assert run_batch([0.003, 0.01, 0.01], workers=1, step=0.002) == [0, 1, 2]


def test_a_batch_ends_when_what_ran_is_due_first_or_another_worker_may_take_it() -> None:
    """With two workers the batch ends once node 0 is due again (another worker may take it);
    with one, when node 0 is due again before the next node of the batch (due at 0.05), or
    at the same time, as it was registered first (period 0.001: due again at 0.01)."""
    assert run_batch([0.003, 0.01, 0.01], workers=2, step=0.002) == [0]
    assert run_batch([0.003, 0.05], workers=1, step=0.002) == [0]
    assert run_batch([0.001, 0.01], workers=1, step=0.002) == [0]


def began(slot: Slot) -> Any:
    """What the start of an update decides: the schedule and the statistics."""
    return (
        slot.slot,
        slot.due,
        slot.skipped,
        slot.last,
        slot.updates,
        slot.last - slot.dt_from,
        slot.dt_min,
        slot.dt_max,
        slot.lateness_max,
        list(slot.lateness),
    )


@pytest.mark.parametrize("seed", range(60))
def test_the_runner_begins_an_update_as_begin_update(seed: int) -> None:
    """The runner does ``begin_update``'s steps in place (NOTE [ the cost of an update ]): from
    the same random state (a periodic update on time, late by less than a period or by many
    (sched.skip), a triggered one ahead of the periodic one, the lateness ring full or not),
    both leave the same schedule and statistics (sched.fixed-rate, observe.stats-values)."""
    rng = random.Random(seed)
    period = rng.choice([0.001, 0.003, 0.01, 0.1, math.inf])
    pair = [make_slot(0, period, []) for _ in range(2)]
    number = rng.randint(1, 40)
    due = number * period if rng.random() < 0.6 else rng.uniform(0.0, 4.0)
    last = rng.uniform(-1.0, 0.5)
    done = rng.choice([0, 1, 7, LATENESS_WINDOW - 1, LATENESS_WINDOW, LATENESS_WINDOW + 5])
    ring = [rng.random() for _ in range(min(done, LATENESS_WINDOW))]
    start = due + rng.choice([0.0, 0.0004, 0.0021, 0.013, 1.37]) if due < math.inf else rng.uniform(0.0, 4.0)
    for slot in pair:
        slot.slot, slot.due, slot.last, slot.updates = number, due, last, done
        slot.lateness_ring[: len(ring)] = array("d", ring)
    dt = begin_update(pair[0], start, False)
    batch = Batch()
    batch.due, batch.todo = due, [0]
    runner_for([pair[1]], 1, Clock(start, 0.001))(batch, start)
    assert began(pair[1]) == began(pair[0]), (seed, period, number, due, start)
    assert dt == start - last


@pytest.mark.parametrize("one_clock", [True, False])
def test_each_update_of_a_batch_starts_when_the_hook_before_it_returned(
    monkeypatch: pytest.MonkeyPatch, one_clock: bool
) -> None:
    """Under the real-time timer the runner reads the clock again for each update of a batch
    (NOTE [ the clock between two updates ]): with hooks that take 2 ms each, the second and
    third nodes of a batch due at 0.01 start at 0.012 and 0.014 (their dt and lateness follow
    from it: sched.fixed-rate, observe.stats-values), whether the read that ends a hook's busy
    time serves as the next start (``perf_counter`` is the clock's source) or the clock is
    read apart (``now()``: here a source 1,000 s ahead of ``perf_counter``, which the next
    start must not be taken from; planted: the read in place whatever the source, the second
    and third starts about 1,000 s early)."""
    now = [100.0]  # the perf_counter time, moved by the hooks alone

    def perf_counter() -> float:
        return now[0]

    monkeypatch.setattr(_update, "_perf_counter", perf_counter)

    def hook(dt: float) -> None:
        now[0] += 0.002

    slots = [make_slot(index, 0.01, []) for index in range(3)]
    for slot in slots:
        slot.due = 0.01
        slot.actor = cast(Any, SimpleNamespace(on_update=hook))
    if one_clock:
        clock = RealClock(1.0, source=perf_counter)
        clock.start(100.0 - 0.01)  # timer time 0.01 now
    else:
        clock = RealClock(1.0, source=lambda: now[0] + 1000.0)
        clock.start(1100.0 - 0.01)
    batch = Batch()
    batch.due, batch.todo = 0.01, [2, 1, 0]
    runner_for(slots, 1, clock)(batch, 0.01)
    starts = [slot.last for slot in slots]
    assert starts == pytest.approx([0.01, 0.012, 0.014]), starts
    assert [slot.busy_seconds for slot in slots] == pytest.approx([0.002] * 3)
