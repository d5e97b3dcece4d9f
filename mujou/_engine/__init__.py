"""The engine of a run: a pure scheduling policy, the threads that act on it, and the lifecycle.

- ``_policy``: what each thread does next (pure; tested without threads).
- ``_clock``: real and virtual clocks.
- ``_hooks``: the one place hooks are called.
- ``_threads``: the worker, dedicated and state threads, and where they park.
- ``_lifecycle``: ``Engine``: start, the host's waits, the state, the stop.
"""

from ._hooks import HookThread as HookThread
from ._hooks import in_hook_thread as in_hook_thread
from ._lifecycle import Engine as Engine
from ._slot import Slot as Slot
