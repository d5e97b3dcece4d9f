"""Mujou's build: the pure-Python package, or with ``MUJOU_COMPILE=1`` its per-update path
compiled with mypyc.

Everything else about the package is in pyproject.toml. By default (``pip install .``) nothing
is compiled and no compiler is needed. ``MUJOU_COMPILE=1`` compiles ``COMPILED`` into C
extensions beside the same Python sources; it needs mypy (which ships mypyc), Mujou's own
dependencies (mypyc type-checks against torch) and a C compiler in the building environment,
so it is built without pip's isolation: ``MUJOU_COMPILE=1 pip install --no-build-isolation .``
(or ``MUJOU_COMPILE=1 python setup.py build_ext --inplace`` in a checkout). Where something is
missing it stops with an error saying what; it never falls back to pure Python silently.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sysconfig
from typing import Any

from setuptools import setup

#: The modules compiled: the worker's per-update path and what it calls for every update
#: (see the engine's NOTE [ the cost of an update ]), and a send's hand-off to the node it
#: wakes. Not compiled: the engine's modules that the tests patch, ``_hooks`` (its warnings
#: name the host's frame: a compiled frame is not counted), and anything users subclass or
#: declare (Node, Net, the ports: mypyc cannot yet build a class whose ``__init__`` is
#: overloaded, as the ports' is for their typed messages, mypyc issue 961).
COMPILED = [
    "mujou/_schedule.py",
    "mujou/_engine/_arrivals.py",
    "mujou/_engine/_batches.py",
    "mujou/_engine/_clock.py",
    "mujou/_engine/_ending.py",
    "mujou/_engine/_policy.py",
    "mujou/_engine/_slot.py",
    "mujou/_engine/_update.py",
    "mujou/_engine/_lodge.py",  # NOTE [ the send that lodges ]
]


def compiled_modules() -> list[Any]:
    """The C extensions to build: none unless ``MUJOU_COMPILE`` is 1."""
    wanted = os.environ.get("MUJOU_COMPILE", "").strip()
    if wanted in ("", "0"):
        return []
    if wanted != "1":
        raise SystemExit(f"MUJOU_COMPILE={wanted!r}: use 1 to compile, 0 or unset for pure Python")
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            "MUJOU_COMPILE=1 needs mypyc, which ships with mypy: pip install mypy torch optree "
            "typing-extensions, then MUJOU_COMPILE=1 pip install --no-build-isolation . "
            "(or leave MUJOU_COMPILE unset for the pure-Python package)"
        ) from None
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(compiler) is None:
        raise SystemExit(
            f"MUJOU_COMPILE=1 needs a C compiler, and {compiler!r} is not on PATH "
            "(install one, or set CC; or leave MUJOU_COMPILE unset for the pure-Python package)"
        )
    return mypycify(COMPILED, group_name="mujou_compiled")


setup(ext_modules=compiled_modules())
