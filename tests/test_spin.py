"""The virtual timer's reads poll before they block (mujou/_processes/_spin.py)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from mujou._processes._spin import Poller, poller


@pytest.mark.skipif(not Poller.available(), reason="no select.poll here")
def test_a_poller_returns_once_there_is_something_to_read() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        waiting = Poller([reader])
        waiting.wait(0.0)  # nothing yet: the time is up at once
        writer.send_bytes(b"ready")
        # returns at once (the test's hang guard fails it otherwise), with what has data
        assert waiting.wait(3600.0) == [reader.fileno()]
        assert reader.recv_bytes() == b"ready"
        later = threading.Timer(0.05, writer.send_bytes, (b"later",))
        later.start()
        waiting.wait(3600.0)  # returns once the other thread has written
        later.join()
        assert reader.recv_bytes() == b"later"
        writer.close()
        waiting.wait(3600.0)  # the end of the pipe is something to read too
        with pytest.raises(EOFError):
            reader.recv_bytes()
    finally:
        reader.close()


def test_only_the_virtual_timer_polls() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        assert poller([reader], virtual=False) is None
        assert (poller([reader], virtual=True) is not None) == Poller.available()
    finally:
        reader.close()
        writer.close()


@pytest.mark.skipif(not Poller.available(), reason="no select.poll here")
def test_a_poller_stops_at_a_yield_that_found_the_core_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ a busy machine ]: a yield that took longer than BUSY (here each sleeps 1 ms, as
    another thread's time slice would) ends the poll, with nothing found, so that the caller
    blocks. Planted: the BUSY check left out: the wait polled on for the hour and this failed
    on the join's guard."""
    from mujou._processes import _spin

    monkeypatch.setattr(_spin, "_yield_cpu", lambda: time.sleep(0.001))
    reader, writer = multiprocessing.Pipe(duplex=False)
    found: list[list[int]] = []
    try:
        waiting = threading.Thread(target=lambda: found.append(Poller([reader]).wait(3600.0)), daemon=True)
        waiting.start()
        waiting.join(30.0)
        assert not waiting.is_alive(), "the poll went on past a busy yield"
        assert found == [[]]
    finally:
        reader.close()
        writer.close()


@pytest.mark.skipif(not Poller.available(), reason="no select.poll here")
def test_a_poller_blocks_until_there_is_something_to_read_or_the_time_is_up() -> None:
    """``block``: nothing within the time is nothing found; a write or the pipe's end wakes it.
    Planted: ``block`` passing seconds where poll takes milliseconds (5 s became 5 ms): the
    later write was not found, and this failed."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        waiting = Poller([reader])
        assert waiting.block(0.001) == []
        later = threading.Timer(0.05, writer.send_bytes, (b"later",))
        later.start()
        assert waiting.block(5.0) == [reader.fileno()]  # woken by the other thread's write
        later.join()
        assert reader.recv_bytes() == b"later"
        writer.close()
        assert waiting.block(None) == [reader.fileno()]  # the end of the pipe
    finally:
        reader.close()
