"""The host threads that run an update now, lent to the run while they wait.

NOTE [ the host lends its thread ] (in ``_batches``) says why; ``_lend`` takes and runs the
updates. Apart, with no imports, so that whoever asks whether a thread runs hooks
(``_hooks.in_hook_thread``) can read it without importing the engine.
"""

from __future__ import annotations

# The idents of the host threads running an update they took; changed by that thread only
# (set.add and set.discard are atomic on every build).
running: set[int] = set()
