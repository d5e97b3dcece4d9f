"""What a node, its ports and the host's calls see of the run that runs the node.

The engine (``mujou._engine``) runs nodes; the nodes and their ports (``_node``, ``_port``,
``_ports``) must not name the engine, which names them: what both need lives here, below
both: the hook threads (a hook runs on one, the host's calls refuse to wait there), and where
a hook's warnings wait for the host (the engine's ``Hooks``). What a port reads of its node's
place in the run is ``_port.RunSlot``.
"""

from __future__ import annotations

import threading
from typing import Protocol


class HookThread(threading.Thread):
    """A thread that runs hooks: a worker, a dedicated node thread or the state thread."""

    def run(self) -> None:
        ident = threading.get_ident()
        hooking.add(ident)
        try:
            super().run()
        finally:
            hooking.discard(ident)


# The idents of the threads that run hooks now: each ``HookThread`` while it runs, and each
# host thread while it runs an update it took as it waits (threads.host-runs-updates; NOTE
# [ the host lends its thread ] in ``_engine._batches``). Each thread adds and discards its
# own (set.add and set.discard are atomic on every build), so ``in_hook_thread`` is one
# look-up instead of ``current_thread()`` and an isinstance check: the host's calls make it
# first thing (NOTE [ the host's round trip ] in ``_run``).
hooking: set[int] = set()
_get_ident = threading.get_ident


def in_hook_thread() -> bool:
    """Whether the calling thread runs hooks: one of Mujou's threads, or a host's thread while
    it runs an update (threads.host-runs-updates)."""
    return _get_ident() in hooking


class WarningQueue(Protocol):
    """Where a hook's warnings wait for the host's next call (rules.warnings-on-host)."""

    def queue_warning(self, category: type[Warning], message: str) -> None: ...
