"""The policy's side of threads ending: a thread that exits, and one that hit an internal error.

Part of ``Policy`` (its base): a crash frees what the thread held and stops the run, so that
``stop()`` and the host's waits return (run.internal-error).
"""

from __future__ import annotations

from ._batches import FREE, QUEUED_JOB, Workers
from ._slot import STATE, STOP, Job, Slot


class Ending(Workers):
    """Threads exiting and crashing; the fields and the stop protocol are Policy's."""

    # Set by Policy, read here.
    alive: int
    workers_alive: int
    error: BaseException | None
    state_holder: int
    pending: int
    state_jobs: int

    def _update_paused(self) -> None:
        raise NotImplementedError

    def begin_stop(self) -> None:
        raise NotImplementedError

    def _wake_everyone(self) -> None:
        raise NotImplementedError

    def thread_exited(self) -> bool:
        """A thread exited; whether it was the last (the run has ended)."""
        self.alive -= 1
        return self.alive == 0

    def thread_crashed(self, holder: int, error: BaseException, *, exits: bool) -> bool:
        """Thread ``holder`` hit ``error`` (an internal error): forget what it held, and stop.

        The nodes it held get no more hooks, on_stop included: their state is unknown; nor does
        the node of a dedicated thread that exits (its queued jobs are forgotten). When it
        ``exits`` (else it goes on, to run the other nodes' stop jobs), returns whether it was
        the last thread.
        """
        if self.error is None:
            self.error = error
        running = self.running_job.pop(holder, None)
        waiting: set[int] = set()  # held in its batch, not in a hook: these get their on_stop
        if 0 < holder <= self.workers:
            batch = self.batch[holder - 1]
            waiting = set(batch.todo) | {slot.index for slot in batch.ran}
            if batch.shared:
                self.shared.remove(batch)
                batch.shared = False
            batch.todo, batch.ran, batch.held, batch.handed = [], [], False, 0
            self.busy += batch.lodged  # not counted: each node it held takes one off below
            batch.lodged = 0
            if exits:
                self.workers_alive -= 1
        freed: list[Slot] = []
        for slot in self.slots:
            if self.holder[slot.index] != holder:
                continue
            self.holder[slot.index] = FREE
            if slot.index in waiting:
                self.busy -= 1
                freed.append(slot)
                continue
            slot.stopped = True
            if running is not None and slot is running[0]:
                self._forget_job(slot, running[1])
            elif holder == self.state_holder:  # a state job it had not begun
                self._forget_job(slot, Job(STATE))
            else:
                self.busy -= 1
        if exits and self.workers < holder < self.state_holder:  # a dedicated node's own thread
            slot = self.slots[holder - self.workers - 1]  # Policy.dedicated_holder
            for job in slot.jobs:  # its jobs would never run: nobody waits for them
                self._forget_job(slot, job)
            slot.jobs.clear()
            if self.holder[slot.index] == QUEUED_JOB:
                self.holder[slot.index] = FREE
            slot.stopped = True
        if self.workers_alive == 0:  # worker jobs would never run
            for slot, job in self.jobs:
                self.holder[slot.index] = FREE
                slot.stopped = True
                self._forget_job(slot, job)
            self.jobs.clear()
        self._update_paused()
        self.begin_stop()
        for slot in freed:
            self._queue_stop(slot)
        for slot in self.slots:  # a stop that waited for a sender this thread held
            if slot.lodger >= 0:
                self._queue_stop(slot)
        self._wake_everyone()
        return self.thread_exited() if exits else False

    def _forget_job(self, slot: Slot, job: Job) -> None:
        """A job that will never run: nobody waits for it."""
        if job.kind == STOP:
            if not slot.dedicated:
                self.worker_stops -= 1
            return
        if job.kind == STATE:
            self.state_jobs -= 1
        self.pending -= 1
