"""The workers' batch runner (``_engine._update``), driven on the test's thread with a fake clock.

What ends a batch early (threads.earliest-due-first): with one worker, a node that ran and is
due again goes on waiting while the next node of the batch is due before it; with more
workers, or when it is due first, the batch ends so that the policy (another worker, or this
one) takes it in order.
"""

from __future__ import annotations

import contextvars
import threading
from types import SimpleNamespace
from typing import Any, cast

import torch

from mujou._engine._batches import Batch
from mujou._engine._hooks import Hooks
from mujou._engine._policy import Policy
from mujou._engine._slot import Slot
from mujou._engine._update import batch_runner


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


def run_batch(periods: list[float], workers: int, step: float) -> list[int]:
    """Run one batch of nodes with these periods, each due at its first slot (the first node
    registered first), each update taking ``step`` timer seconds; the nodes that ran."""
    ran: list[int] = []
    slots = [make_slot(index, period, ran) for index, period in enumerate(periods)]
    for slot in slots:
        slot.due = slot.period
    engine = SimpleNamespace(
        lock=threading.Lock(),
        policy=Policy(slots, workers, virtual=False, scale=1.0, gil=False),
        clock=Clock(0.01, step),
        slots=slots,
        hooks=Hooks(slots, None),
        workers=workers,
        deliver=lambda: False,
        report=lambda *args: None,
    )
    batch = Batch()
    batch.due, batch.todo = slots[0].due, list(reversed(range(len(slots))))
    batch_runner(cast(Any, engine), 0)(batch, 0.01)
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
