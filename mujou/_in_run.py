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


# The idents of the host threads running an update they took while they wait
# (threads.host-runs-updates; NOTE [ the host lends its thread ] in ``_engine._batches``);
# changed by that thread only (set.add and set.discard are atomic on every build).
host_running: set[int] = set()


def in_hook_thread() -> bool:
    """Whether the calling thread runs hooks: one of Mujou's threads, or a host's thread while
    it runs an update (threads.host-runs-updates)."""
    return isinstance(threading.current_thread(), HookThread) or threading.get_ident() in host_running


class WarningQueue(Protocol):
    """Where a hook's warnings wait for the host's next call (rules.warnings-on-host)."""

    def queue_warning(self, category: type[Warning], message: str) -> None: ...
