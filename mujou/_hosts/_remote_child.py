"""The main function of a remote process: take the host's main script, then be a process of
the run as on one host (``_processes._child.main``), over the TCP connections the agent
handed it (under the virtual timer with the lockstep's own, as on one host)."""

from __future__ import annotations

import dataclasses
import os
import pickle
from multiprocessing.connection import Connection

from .._processes import _codec as codec
from .._processes._child import main as child_main
from .._processes._member import Member, describe
from .._processes._server import Streams
from ._launch import Launch, prepare_here


def main(launch: Launch, control: Connection, events: Connection, tags: Connection | None = None) -> None:
    """Rebuild the group from ``launch`` and obey the host; a setup that cannot be unpickled
    here is the first reply's error, as a node that cannot be rebuilt is (hosts.rebuilt)."""
    try:
        prepare_here(launch.prepare)
        setup = pickle.loads(launch.setup)
    except BaseException as exc:
        error = TypeError(
            f"process {launch.name!r} cannot be set up on this host: {type(exc).__name__}: {exc}; "
            "its nodes' classes must be importable there (the same modules, or the main script "
            "at the same path)"
        )
        error.__cause__ = exc
        control.send_bytes(codec.dumps((0, "error", describe(error), [], 0)))
        return
    offset, plane = launch.offset, launch.plane

    def attach(member: Member) -> None:
        member.clock_offset = offset  # the host's timer time on this host's clock (hosts.clock)
        if plane is not None:
            plane.attach(member, control)

    setup = dataclasses.replace(setup, attach=attach)
    child_main(setup, control, events, {}, [], environ=dict(os.environ), streams=Streams(), tags=tags)
