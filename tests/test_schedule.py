"""Unit tests of the pure schedule: fixed-rate arithmetic, skipping and the due heap."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from mujou._schedule import DueQueue, due_time, first_slot_at_or_after, next_slot


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


def test_queue_orders_by_due_then_registration() -> None:
    queue = DueQueue()
    for due, index in [(0.02, 3), (0.01, 5), (0.02, 1), (0.01, 2), (0.02, 0)]:
        queue.push(due, index)
    assert len(queue) == 5
    assert queue.next_due() == 0.01
    assert queue.pop_all() == [5, 2]  # the first to run last
    assert queue.next_due() == 0.02
    assert queue.pop_all() == [3, 1, 0]
    assert not queue.dues
    assert queue.next_due() == math.inf
    assert len(queue) == 0


def test_queue_pops_every_node_due_by_a_time_in_due_order() -> None:
    """pop_until(t): the first due time's nodes, and every later one's up to t, earliest due
    first, then registration order (NOTE [ taking what is due ])."""
    queue = DueQueue()
    for due, index in [(0.03, 4), (0.02, 3), (0.01, 5), (0.02, 1), (0.01, 2), (0.04, 0)]:
        queue.push(due, index)
    assert queue.pop_until(0.0) == [5, 2]  # the first due time's, even before it is due
    assert queue.pop_until(0.03) == [4, 3, 1]  # the first to run last
    assert queue.next_due() == 0.04 and len(queue) == 1


def test_queue_counts_the_nodes_due_by_a_time() -> None:
    queue = DueQueue()
    for index in range(6):
        queue.push(0.01, index)
    queue.push(0.011, 6)
    queue.push(0.02, 7)
    assert queue.count_until(0.005, 100) == 0
    assert queue.count_until(0.01, 100) == 6
    assert queue.count_until(0.0105, 4) == 4
    assert queue.count_until(0.015, 100) == 7
    assert queue.count_until(1.0, 100) == 8


def queue_due(indices: list[int], slots: list[int], periods: list[float]) -> float:
    """The due time of the nodes pop_all() returned (before their slots move on)."""
    return due_time(slots[indices[0]], periods[indices[0]])


@pytest.mark.parametrize("seed", range(30))
def test_queue_pops_as_a_heap_of_due_and_index_would(seed: int) -> None:
    """pop_all() takes what popping (due, index) from a heap while the due is the first one's would."""
    rng = random.Random(seed)
    periods = [rng.choice([0.001, 0.002, 0.01, 1 / 30, 0.1]) for _ in range(rng.randrange(1, 40))]
    queue, reference = DueQueue(), list[tuple[float, int]]()
    slots = [1] * len(periods)
    for index, period in enumerate(periods):
        queue.push(due_time(1, period), index)
        heapq.heappush(reference, (due_time(1, period), index))
    for _ in range(500):
        assert queue.next_due() == reference[0][0]
        indices = queue.pop_all()
        expected = []
        while reference and reference[0][0] == queue_due(indices, slots, periods):
            expected.append(heapq.heappop(reference)[1])
        assert indices == expected[::-1]
        for index in indices:
            slots[index] += rng.choice([1, 1, 1, 2])
            due = due_time(slots[index], periods[index])
            queue.push(due, index)
            heapq.heappush(reference, (due, index))
        time = reference[0][0] + rng.choice([0.0, 0.001, 0.01])
        assert queue.count_until(time, 1000) == len([due for due, _ in reference if due <= time])
    queue.clear()
    assert queue.next_due() == math.inf


@pytest.mark.parametrize("seed", range(30))
def test_push_all_leaves_the_queue_as_pushing_each_would(seed: int) -> None:
    """push_all(due, ascending indices), the rest of a batch going back, is one push each."""
    rng = random.Random(seed)
    queue, reference = DueQueue(), DueQueue()
    for _ in range(300):
        due = rng.choice([0.01, 0.02, 0.03, 0.04, math.inf])  # inf: due never, left out
        present = {index for bucket in reference._buckets.values() for index in bucket}
        indices = sorted(set(rng.sample(range(50), rng.randrange(0, 10))) - present)
        queue.push_all(due, indices)
        for index in indices:
            reference.push(due, index)
        if rng.random() < 0.3 and reference.dues:
            assert queue.pop_all() == reference.pop_all()
        assert queue._buckets == reference._buckets
        assert sorted(queue.dues) == sorted(reference.dues)
