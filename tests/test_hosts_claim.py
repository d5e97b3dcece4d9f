"""The receiver's claim (``Workers.claim_for_host``, NOTE [ the receiver claims its update ] in
``_engine._batches``) decides as the general way of ``Lender.received`` does: on random
policies, a message from another host is received once each way, from the same state, and the
states after are the same (when the claim declines, it changed nothing)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch

from mujou._engine._arrivals import arrived, wire
from mujou._engine._batches import RUN, Batch
from mujou._engine._invariant import check
from mujou._engine._policy import Policy
from mujou._engine._slot import Slot
from mujou._engine._update import begin_update

from .test_policy import connect, started_policy, triggered_slot

SEEDS = 400


def scene(seed: int) -> tuple[Policy, list[Slot], float, bool]:
    """A real-time policy after a few random steps: node 0 reads node 1's output (the
    stand-in of a sender on another host), other nodes are periodic or triggered; and
    whether the host's thread is in an update still (then the receiving thread takes none)."""
    rng = random.Random(seed)
    reader = triggered_slot(
        0,
        rng.choice([math.inf, math.inf, 0.004]),
        delay=rng.choice([0.0, 0.0, 0.001]),
        min_interval=rng.choice([0.0, 0.0, 0.002]),
    )
    slots = [reader, triggered_slot(1, math.inf)]
    slots += [
        triggered_slot(i, rng.choice([0.001, 0.001, 0.003, math.inf]))
        for i in range(2, 2 + rng.randint(0, 5))
    ]
    connect(slots[1], reader)
    wire(slots)
    workers = rng.randint(1, 3)
    policy = started_policy(slots, workers)
    now = 0.0
    busy = False  # the host's thread is in an update
    for _ in range(rng.randint(0, 12)):
        now += rng.choice([0.0, 0.0005, 0.001, 0.002])
        action = rng.random()
        host: Batch | None = None
        if action < 0.3:  # an earlier message, received the general way
            host = receive(policy, slots, now, claims=False, takes=not busy and rng.random() < 0.5)
        elif action < 0.6:  # a worker asks for work and begins part of it
            kind, batch = policy.next_for_worker(rng.randrange(workers), now, 0.0)
            if kind == RUN:
                for _ in range(rng.randint(1, len(batch.todo))):
                    slot = slots[batch.todo.pop()]
                    begin_update(slot, now, False)
                    batch.ran.append(slot)
        elif action < 0.75 and not busy:  # the host's thread takes an update
            host = policy.take_for_host(now)
        elif action < 0.8:
            policy.pause()
        elif action < 0.85:
            policy.release_pause()
        elif busy and action < 0.95:  # the host's update ends
            policy.host_done()
            busy = False
        if host is not None:  # it runs the update, and ends it now or later
            slot = slots[host.todo.pop()]
            begin_update(slot, now, False)
            host.ran.append(slot)
            busy = rng.random() < 0.3
            if not busy:
                policy.host_done()
        policy.delivered()
    return policy, slots, now, busy


def receive(policy: Policy, slots: list[Slot], now: float, *, claims: bool, takes: bool) -> Batch | None:
    """A message on node 1's output, received at ``now`` as ``Lender.received`` takes it, with
    (``claims``) or without its claim first; the batch the receiving thread takes."""
    port = slots[1].core.ports["y"]
    port._publish(torch.tensor(now), 0, None, now)
    batch = policy.claim_for_host(slots[0], now) if claims and takes else None
    if batch is None:
        policy.host_defers = True
        arrived(policy, port, now)
        policy.host_defers = False
        batch = policy.take_for_host(now) if takes else None
        policy.wake_after_received(now, batch is not None)
    return batch


def state(policy: Policy, slots: list[Slot], batch: Batch | None) -> Any:
    """What the policy decided: holders, queue, due times, notes, wake-ups, the batch taken."""
    return (
        list(policy.holder),
        policy.busy,
        sorted(policy.queue.dues),
        {due: list(bucket) for due, bucket in policy.queue._buckets.items()},
        [(s.due, list(s.arrival_times), list(s.arrival_numbers), s.arrived) for s in slots],
        (policy.wake, policy.wake_workers, policy.wake_worker, policy.wake_host),
        list(policy.until),
        None if batch is None else (batch.due, list(batch.todo), batch.handed),
        [(b.due, list(b.todo), b.held, b.shared) for b in policy.batch],
    )


@pytest.mark.parametrize("first", range(0, SEEDS, 100))
def test_the_claim_decides_as_the_general_way(first: int) -> None:
    claimed = 0
    for seed in range(first, first + 100):
        results = []
        for claims in (False, True):
            policy, slots, now, busy = scene(seed)
            now += random.Random(-seed).choice([0.0, 0.001, 0.003])
            taken = receive(policy, slots, now, claims=claims, takes=not busy)
            results.append(state(policy, slots, taken))
            assert not check(policy)
            if claims and taken is not None and taken.todo == [0]:
                claimed += 1
        assert results[0] == results[1], seed
    assert claimed >= 10  # the random states reach the claim
