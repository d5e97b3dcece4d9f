"""A connection's frames on its descriptor (mujou/_processes/_frames.py): the same bytes as
``Connection.send_bytes`` and ``recv_bytes``, either end with either."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from mujou._processes import _frames as frames

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the connection's own methods elsewhere")


def test_frames_read_and_written_on_the_descriptor_are_the_connections() -> None:
    """Planted: the length packed little endian: this fails."""
    a, b = multiprocessing.Pipe()
    try:
        write, read = frames.writer(a), frames.reader(b)
        for data in (b"", b"x", bytes(range(256)) * 300):  # the last more than a pipe holds
            sender = threading.Thread(target=write, args=(data,))
            sender.start()
            assert b.recv_bytes() == data
            sender.join(10)
            sender = threading.Thread(target=a.send_bytes, args=(data,))
            sender.start()
            assert read() == data
            sender.join(10)
    finally:
        a.close()
        b.close()


def test_a_frame_cut_by_the_end_is_eof_and_a_closed_connection_is_not_read() -> None:
    a, b = multiprocessing.Pipe()
    read = frames.reader(b)
    os.write(a.fileno(), b"\0\0\0\x05abc")  # 3 of 5 bytes, then the end
    a.close()
    with pytest.raises(EOFError):
        read()
    b.close()
    with pytest.raises(OSError, match="closed"):
        read()
