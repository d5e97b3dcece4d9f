"""The policy's invariant, for the tests: every node in exactly one place, the counts right."""

from __future__ import annotations

from collections.abc import Iterable

from ._batches import FREE, HOST, QUEUED_JOB
from ._policy import Policy


def check(policy: Policy, current: Iterable[tuple[int, int]] = ()) -> list[str]:
    """The broken invariants, for the tests: each node in exactly one place, the counts right.

    ``current`` lists (holder, index) for the updates threads have popped from a batch and
    are running (they are in neither ``todo`` nor ``ran`` meanwhile).
    """
    places: dict[int, list[str]] = {slot.index: [] for slot in policy.slots}
    problems: list[str] = []
    for bucket_due in list(policy.queue.dues):
        for index in policy.queue._buckets[bucket_due]:
            places[index].append("queue")
            if policy.slots[index].due != bucket_due:
                problems.append(f"node {index} is queued at {bucket_due}, due at {policy.slots[index].due}")
    for slot, _ in policy.jobs:
        places[slot.index].append("job")
    for slot in policy.dedicated:
        for _ in slot.jobs:
            places[slot.index].append("job")
    updates = 0
    for w, batch in enumerate(policy.batch):
        for index in batch.todo:
            places[index].append(f"batch{w}")
        for slot in batch.ran:
            places[slot.index].append(f"ran{w}")
        updates += len(batch.todo) + len(batch.ran) - batch.lodged  # lodged: not in busy
    for holder, index in current:
        places[index].append(f"running{holder}")
        updates += 1
    for holder, (slot, _) in policy.running_job.items():
        places[slot.index].append(f"jobrunning{holder}")
    for slot in policy.slots:
        index, where, held = slot.index, places[slot.index], policy.holder[slot.index]
        if slot.dedicated and held == policy.dedicated_holder(slot) and not where:
            updates += 1  # in an update on its own thread
            continue
        if held == policy.state_holder and not where:
            continue
        if len(where) > 1:
            problems.append(f"node {index} is in {where}")
        elif where == ["queue"] and held != FREE:
            problems.append(f"node {index} is queued but held by {held}")
        elif where == ["job"] and held != QUEUED_JOB:
            problems.append(f"node {index} has a queued job but holder {held}")
        elif where and where[0].startswith(("batch", "ran", "running", "jobrunning")):
            number = int(where[0].lstrip("abcdefghijklmnopqrstuvwxyz"))
            expected = number + 1 if where[0].startswith(("batch", "ran")) else number
            if where[0].startswith(("batch", "ran")) and number == policy.workers:
                expected = HOST  # the host's batch (take_for_host)
            if held != expected:
                problems.append(f"node {index} is in {where[0]} but held by {held}")
        elif not where and held != FREE:
            problems.append(f"node {index} is nowhere but held by {held}")
        if policy.stopping and where == ["queue"]:
            problems.append(f"node {index} is queued while stopping")
    if updates != policy.busy:
        problems.append(f"busy is {policy.busy}, {updates} updates are held")
    if any(batch.held and batch.shared for batch in policy.batch):
        problems.append("a held batch is shared")
    return problems
