"""The engine of a run: a pure scheduling policy, the threads that act on it, and the lifecycle.

- ``_slot``: one node's schedule and counters.
- ``_clock``: real and virtual clocks.
- ``_hooks``: where hooks are called; ``_update``: a worker's updates, top to bottom.
- ``_threads``: the worker, dedicated and state threads, and where they park.
- ``_batches`` and ``_policy``: the policy, the workers' side and the rest; ``_invariant``: its check.
- ``_lifecycle``: ``Engine``: start, the host's waits, the stop; ``_collect``: taking the state.
- ``_restore``, ``_snapshot``, ``_exit``: resuming a tree, the host's counters, runs left at exit.
"""

from .._in_run import HookThread as HookThread
from .._in_run import in_hook_thread as in_hook_thread
from ._lifecycle import Engine as Engine
from ._slot import Slot as Slot
