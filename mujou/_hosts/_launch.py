"""What the host sends an agent to start one remote process of a run, and its checks.

The agent unpickles a ``Launch`` only from a connection that proved it knows the run's secret
(``_link``). It checks the versions before anything else (hosts.refused); the group's
``Setup``, pickled by the host, is unpickled by the new process only, where the nodes'
modules are imported (so the agent itself never imports a user's module).
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from .._version import __version__


@dataclass(frozen=True)
class Launch:
    """One remote process: its group's name, its setup, and the host's environment."""

    name: str
    setup: bytes  # the process layer's Setup, pickled on the host
    versions: tuple[str, str, str]  # Mujou, torch and Python (major.minor) on the host
    prepare: dict[str, Any]  # the host's main script and sys.path, as spawn prepares a process
    timeout: float  # real seconds of silence after which either end takes the other as lost
    offset: float  # this host's monotonic clock minus the host's, measured at the launch
    plane: Any = field(default=None)  # the data plane's part of this process (real-time timer)
    tags: bool = False  # a fourth connection comes: the lockstep's (virtual timer; _processes._group)


def versions() -> tuple[str, str, str]:
    """Mujou's, torch's and Python's (major.minor) versions here."""
    return __version__, torch.__version__, f"{sys.version_info[0]}.{sys.version_info[1]}"


def refusal(theirs: tuple[str, str, str]) -> str | None:
    """Why a run from a host with the versions ``theirs`` cannot run here, or None."""
    ours = versions()
    if theirs == ours:
        return None
    names = ("Mujou", "torch", "Python")
    differ = [
        f"{name} {there} on the run's host, {here} here"
        for name, there, here in zip(names, theirs, ours, strict=True)
        if there != here
    ]
    return "; ".join(differ) + ": install the same versions of Mujou, torch and Python on every host"


def host_preparation() -> dict[str, Any]:
    """The host's main script and ``sys.path`` for a remote process (as ``spawn`` prepares
    one, less the host's ``multiprocessing`` authkey, which is not the remote's to know)."""
    data = multiprocessing.spawn.get_preparation_data("mujou-remote")
    return {
        key: data[key]
        for key in ("sys_path", "dir", "init_main_from_path", "init_main_from_name")
        if key in data
    }


def prepare_here(data: dict[str, Any]) -> None:
    """Take the host's main script and ``sys.path`` where they exist on this host: the
    entries of ``sys.path`` this host lacks, and the main script when its file is here."""
    found = dict(data)
    found["sys_path"] = [path for path in data.get("sys_path", []) if os.path.isdir(path)] + [
        path for path in sys.path if path not in data.get("sys_path", [])
    ]
    if not os.path.isdir(found.get("dir", "")):
        found.pop("dir", None)
    main = found.get("init_main_from_path")
    if main is not None and not os.path.isfile(main):
        found.pop("init_main_from_path")
    multiprocessing.spawn.prepare(found)
