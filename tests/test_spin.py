"""The virtual timer's reads poll before they block (mujou/_processes/_spin.py)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from mujou._processes._spin import Poller, poller


@pytest.mark.skipif(not Poller.available(), reason="no select.poll here")
def test_a_poller_returns_once_there_is_something_to_read() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        waiting = Poller([reader])
        waiting.wait(0.0)  # nothing yet: the time is up at once
        writer.send_bytes(b"ready")
        waiting.wait(3600.0)  # returns at once (the test's hang guard fails it otherwise)
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
