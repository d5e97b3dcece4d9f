"""A remote process ends with its agent (hosts.cleanup).

The agent hands each process it starts the read end of a pipe whose write end only the agent
holds, and never writes to. The process watches it on a thread of its own: the read returns
(end of file) once the agent's end closes, which the kernel does when the agent dies, however
it dies (SIGKILL, its Ray actor killed). The process then kills itself with SIGKILL, as its
agent would have: nobody is left to report its end to the run's host, which finds the agent's
life line closed and stops the run (hosts.lost).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from multiprocessing.connection import Connection, wait

from ._launch import Launch


def main(
    agent: Connection, launch: Launch, control: Connection, events: Connection, tags: Connection | None = None
) -> None:
    """The remote process: watch ``agent``, then be the group's process (``_remote_child``)."""
    from ._remote_child import main as remote_main

    threading.Thread(target=_watch, args=(agent,), name="mujou-agent-watch", daemon=True).start()
    remote_main(launch, control, events, tags)


def _watch(agent: Connection) -> None:
    """Wait for the agent's end of the pipe to close; then end this process."""
    try:
        wait([agent])
    except BaseException as exc:  # a bug here: end as if the agent were gone, never silently
        print(f"mujou: internal error watching the agent: {type(exc).__name__}: {exc}", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGKILL)
