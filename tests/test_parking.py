"""Unit tests of the workers' parking: wait, notify (the last parked first), time-outs."""

from __future__ import annotations

import threading
import time

from mujou._engine._threads import Parking

GUARD = 30.0  # seconds: only a hang reaches this


def _park(
    parking: Parking, lock: threading.Lock, number: int, woke: list[int], ready: threading.Event
) -> None:
    with lock:
        ready.set()
        if parking.wait(number, None, True):
            woke.append(number)


def test_a_wait_that_times_out_leaves_nobody_parked() -> None:
    lock = threading.Lock()
    parking = Parking(lock, 1)
    with lock:
        assert parking.wait(0, 0.0, True) is False
        parking.notify_worker()  # nobody parked: does not open a gate for later
        assert parking.wait(0, 0.0, True) is False


def test_notify_wakes_the_worker_that_parked_last() -> None:
    lock = threading.Lock()
    parking = Parking(lock, 3)
    woke: list[int] = []
    threads = []
    for number in range(3):  # park 0, then 1, then 2, each once the previous is parked
        ready = threading.Event()
        thread = threading.Thread(target=_park, args=(parking, lock, number, woke, ready))
        thread.start()
        assert ready.wait(GUARD)
        with lock:  # the thread released the lock in wait(): it is parked
            pass
        threads.append(thread)
    with lock:
        parking.notify_worker()
    threads[2].join(GUARD)
    assert woke == [2]
    with lock:
        parking.notify_workers()
    for thread in threads:
        thread.join(GUARD)
    assert sorted(woke) == [0, 1, 2]


def test_a_notify_after_the_time_ran_out_counts_once() -> None:
    lock = threading.Lock()
    parking = Parking(lock, 1)
    result: list[bool] = []
    parked = threading.Event()

    def worker() -> None:
        with lock:
            parked.set()
            result.append(parking.wait(0, 0.01, True))

    thread = threading.Thread(target=worker)
    with lock:
        thread.start()
        lock.release()  # let it park
        assert parked.wait(GUARD)
        lock.acquire()  # it is parked (or has timed out and waits for the lock)
        time.sleep(0.05)  # most likely past its time-out; either way the result is the same
        parking.notify_worker()
    thread.join(GUARD)
    assert result == [True]
    with lock:  # the notify was consumed: the gate is closed again
        assert parking.wait(0, 0.0, True) is False
