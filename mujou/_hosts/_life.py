"""The life line between the host and an agent for one remote process (hosts.lost).

Each remote process has a connection of its own between the host and the agent that started
it, besides its control and events connections. On it, both ends send a heartbeat every
``interval(timeout)`` seconds; the agent also says the process's id once it started and its
exit code once it ended, and the host may ask it to kill the process. The frames are a byte
and a signed 64-bit integer, never a pickle.
"""

from __future__ import annotations

import struct

ALIVE = b"A"  # a heartbeat
PID = b"P"  # the agent started the process: its id
EXIT = b"E"  # the process ended: its exit code (negative: the signal)
KILL = b"K"  # the host asks the agent to SIGKILL the process
FRAME = struct.Struct("!cq")


def frame(kind: bytes, value: int = 0) -> bytes:
    return FRAME.pack(kind, value)


def parse(data: bytes) -> tuple[bytes, int]:
    """The kind and value of a frame; ValueError for anything else."""
    if len(data) != FRAME.size:
        raise ValueError(f"a life frame has {FRAME.size} bytes, got {len(data)}")
    kind, value = FRAME.unpack(data)
    return kind, value


def interval(timeout: float) -> float:
    """Real seconds between heartbeats for a host lost after ``timeout`` seconds of silence."""
    return min(1.0, timeout / 10)
