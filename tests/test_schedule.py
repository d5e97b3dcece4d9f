"""Unit tests of the pure schedule: fixed-rate arithmetic, skipping and the due heap."""

from __future__ import annotations

import math
import random

import pytest

from mujou._schedule import DueHeap, due_time, first_slot_at_or_after, next_slot


def test_next_slot_on_time_runs_the_following_slot() -> None:
    assert next_slot(1, 0.01, 0.01) == (2, 0)
    assert next_slot(3, 0.01, 0.0305) == (4, 0)


def test_next_slot_exactly_one_period_late_skips_nothing() -> None:
    # Slot 2 is due at 0.02 = the start: not passed, so it runs next (late), no burst of more.
    assert next_slot(1, 0.01, due_time(2, 0.01)) == (2, 0)


@pytest.mark.parametrize("seed", range(50))
def test_next_slot_skips_exactly_the_passed_slots(seed: int) -> None:
    rng = random.Random(seed)
    period = rng.choice([0.001, 0.01, 1 / 30, 0.1, 0.7])
    slot = rng.randrange(1, 10_000)
    start = due_time(slot, period) + rng.uniform(0, 20 * period)
    following, skipped = next_slot(slot, period, start)
    assert due_time(following, period) >= start, (slot, period, start, following)
    assert following == slot + 1 or due_time(following - 1, period) < start
    assert skipped == following - slot - 1
    assert skipped >= 0


def test_first_slot_at_or_after() -> None:
    assert first_slot_at_or_after(0.0, 0.01) == 1
    assert first_slot_at_or_after(0.05, 0.01) == 5
    assert first_slot_at_or_after(0.051, 0.01) == 6
    for time in (0.3, 1.7, 12.345):
        slot = first_slot_at_or_after(time, 0.03)
        assert due_time(slot, 0.03) >= time > due_time(slot - 1, 0.03)


def test_heap_orders_by_due_then_registration() -> None:
    heap = DueHeap()
    for due, index in [(0.02, 3), (0.01, 5), (0.02, 1), (0.01, 2)]:
        heap.push(due, index)
    assert heap.next_due() == 0.01
    assert [heap.pop_due(1.0) for _ in range(4)] == [2, 5, 1, 3]
    assert heap.pop_due(1.0) == -1
    assert heap.next_due() == math.inf


def test_heap_pops_only_what_is_due() -> None:
    heap = DueHeap()
    heap.push(0.5, 0)
    assert heap.pop_due(0.4) == -1
    assert len(heap) == 1
    assert heap.pop_due(0.5) == 0
