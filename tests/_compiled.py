"""Whether a module of Mujou is compiled (the opt-in ``MUJOU_COMPILE=1`` build, setup.py).

mypyc binds a compiled module's globals and its classes' methods when it builds them: a test
that plants a fault by patching one (``monkeypatch.setattr(_update, "begin_update", ...)``)
patches nothing there. Such a test runs in the pure-Python build, which CI runs, and skips
in the compiled one; the code that handles the fault (``_threads.guarded``, ``_lend``) is
Python in both.
"""

from __future__ import annotations

from types import ModuleType

import pytest


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a C extension rather than its ``.py`` source."""
    return not str(module.__file__).endswith(".py")


def skip_if_compiled(*modules: ModuleType) -> None:
    """Skip the calling test where any of ``modules`` is compiled: it patches them."""
    names = [module.__name__ for module in modules if compiled(module)]
    if names:
        pytest.skip(f"patches {', '.join(names)}, compiled in this build (MUJOU_COMPILE=1)")
