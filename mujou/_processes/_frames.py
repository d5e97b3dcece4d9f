"""A ``multiprocessing.Connection``'s frames, read and written on its descriptor itself.

The virtual timer's tags go one small frame each way a tag (proc.exchange), and
``Connection.send_bytes`` and ``recv_bytes`` wrap each in several Python frames (the checks,
a ``BytesIO``, a read loop): about 2 us of a tag's send and receive of 6 (NOTE [ the
exchange ] in ``_lockstep``). These read and write the same bytes (the length, 4 bytes big
endian, or -1 and 8 bytes for a frame of 2 GiB or more, then the frame), so either end may
use either; where the descriptor is not a POSIX one (Windows' pipe handles), they are the
connection's own methods.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection

_SIZE = struct.Struct("!i")
_LONG_SIZE = struct.Struct("!Q")
_read, _write = os.read, os.write


def reader(connection: Connection) -> Callable[[], bytes]:
    """The function that reads ``connection``'s next frame (EOFError at its end)."""
    if os.name != "posix":
        return connection.recv_bytes
    fd = connection.fileno()

    def read() -> bytes:
        if connection.closed:  # its descriptor may be another's now
            raise OSError("handle is closed")
        head = _read(fd, 4)
        if len(head) < 4:
            head += _exactly(fd, 4 - len(head))
        (size,) = _SIZE.unpack(head)
        if size == -1:
            (size,) = _LONG_SIZE.unpack(_exactly(fd, 8))
        data = _read(fd, size) if size else b""
        if len(data) < size:
            data += _exactly(fd, size - len(data))
        return data

    return read


def writer(connection: Connection) -> Callable[[bytes], None]:
    """The function that writes a frame on ``connection`` whole (blocking)."""
    if os.name != "posix":
        return connection.send_bytes
    fd = connection.fileno()

    def write(data: bytes) -> None:
        if connection.closed:  # its descriptor may be another's now
            raise OSError("handle is closed")
        size = len(data)
        frame = (
            _SIZE.pack(size) + data if size <= 0x7FFFFFFF else _SIZE.pack(-1) + _LONG_SIZE.pack(size) + data
        )
        done = _write(fd, frame)
        while done < len(frame):
            done += _write(fd, memoryview(frame)[done:])

    return write


def _exactly(fd: int, size: int) -> bytes:
    """``size`` bytes read from ``fd``; EOFError where it ends first."""
    parts = []
    while size > 0:
        chunk = _read(fd, size)
        if not chunk:
            raise EOFError
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)
