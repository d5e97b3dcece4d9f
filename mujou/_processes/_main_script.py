"""The main script as a run's processes see it (proc.main-guard, proc.main-file).

Each process of a run imports the host's main script anew, as ``__mp_main__``, to find the
classes defined there (proc.start-method). A script that starts a run at its top level, outside
``if __name__ == "__main__":``, would start that run again in the process, which would start
processes of its own: the process refuses at once (``refuse_in_import``, called first by
``mujou.run``) by ending with ``GUARD_EXIT``, and its host names the missing guard
(``guard_reason``). A main program with no file (standard input, ``python -c``, an interactive
session) cannot be imported at all: a node class defined there is refused before any process
starts (``check_classes``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence

from .._node import Node

PROCESS_PREFIX = "mujou-"
"""The start of the name of every process Mujou starts (a group's, the fork server's probe)."""

GUARD_EXIT = 78
"""The exit code of a process whose import of the main script started a run."""

GUARD = 'if __name__ == "__main__":'


def refuse_in_import() -> None:
    """End this process with ``GUARD_EXIT`` if it is a process of a run importing the main
    script (``multiprocessing`` marks a process that has not finished starting): the script
    started a run as it was imported. Nothing is printed; the host says why."""
    process = multiprocessing.current_process()
    if getattr(process, "_inheriting", False) and process.name.startswith(PROCESS_PREFIX):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(GUARD_EXIT)


def guard_reason() -> str:
    """Why a process ended with ``GUARD_EXIT``, and the fix (the reason of its ProcessError)."""
    script = main_file()
    where = "the main script" if script is None else f"the main script {script}"
    return (
        f"could not start: it imports {where} to find the node classes, and the script started a "
        f"run again when imported: it has no `{GUARD}` guard. Put the code that starts the run "
        f"under `{GUARD}` and keep the node classes at the top level, above it"
    )


def main_file() -> str | None:
    """The main script's file; None where the main program has none that a process can import."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path if isinstance(path, str) and os.path.isfile(path) else None


def check_classes(groups: Mapping[str, Sequence[Node]]) -> None:
    """TypeError naming the first node whose class is defined in a main program with no file:
    its process could not import the class (proc.main-file)."""
    if main_file() is not None:
        return
    for process, nodes in groups.items():
        for node in nodes:
            cls = type(node)
            if cls.__module__ == "__main__":
                raise TypeError(
                    f"node {node.name!r} cannot be copied into process {process!r}: its class "
                    f"{cls.__qualname__} is defined in a main program that has no file "
                    f"({_no_file()}), which the new process cannot import; define the class in a "
                    "module file and import it from there, or run the program from a file "
                    "(python script.py)"
                )


def _no_file() -> str:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path == "<stdin>":
        return "read from standard input"
    if path is None and sys.argv[:1] == ["-c"]:
        return "python -c"
    if path is None:
        return "an interactive session or a notebook"
    return f"{path!r} is not a file"
