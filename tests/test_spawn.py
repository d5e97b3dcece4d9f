"""How a run's processes start (mujou/_processes/_server.py): Mujou's fork server, or spawn.

On Linux the processes are forks of Mujou's own server, which imported torch and Mujou once;
they must still start as ``spawn`` starts them: nothing of the host's memory but what the
server imported, the host's environment of the moment, their own multiprocessing defaulting
to spawn. A server that would run another torch or Mujou than the host's is not used, nor is
one off Linux.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import HANG_GUARD, hang_guard

import mujou
from mujou._processes import _server

MARK = "as imported"  # the host changes it; a process imports this module afresh

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux's")


class Reporter(mujou.Node):
    """Records, in its process, what that process was started with."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.parent = 0
        self.environ = ""
        self.mark = ""
        self.method = ""

    def on_start(self) -> None:
        self.parent = os.getppid()
        self.environ = os.environ.get("MUJOU_TEST_SPAWN", "unset")
        self.mark = MARK
        self.method = multiprocessing.get_start_method()


class Alone(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.reporter = Reporter()


@linux_only
@pytest.mark.filterwarnings("ignore::mujou.OversubscriptionWarning")
def test_a_process_is_a_fork_of_the_server_started_as_spawn_starts_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted, one at a time, each fails this: ``_spawn`` with the spawn context (the
    parent is the host), ``_child.main`` not applying ``environ`` ("unset"), the fork context
    (the host's ``MARK``), ``_Process`` without ``_start_method`` ("forkserver")."""
    with hang_guard(HANG_GUARD):
        assert _server.method() == "forkserver"  # the server runs before the changes below
        server = _server.CHOICE.server
        assert server is not None
        monkeypatch.setenv("MUJOU_TEST_SPAWN", "set after the server started")
        monkeypatch.setattr(sys.modules[__name__], "MARK", "changed in the host")
        net = Alone()
        with mujou.run(net, timer=mujou.VirtualTimer(), workers=1, processes={"p": net.reporter}) as run:
            state: dict[str, Any] = run.state_dict()["reporter"]
    assert state["mark"] == "as imported"
    assert state["environ"] == "set after the server started"
    assert state["method"] == "spawn"
    assert state["parent"] == server.pid != os.getpid()


class Talker(mujou.Node):
    """Writes a line to its standard output and one to its standard error in ``on_start``."""

    def on_start(self) -> None:
        print(f"out of {os.getpid()}", flush=True)
        print(f"err of {os.getpid()}", file=sys.stderr, flush=True)


class Talkers(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.talker = Talker()


@contextlib.contextmanager
def redirected(fd: int, path: Path) -> Iterator[None]:
    """Descriptor ``fd`` of this process is the file ``path`` for the block."""
    saved = os.dup(fd)
    with path.open("w") as file:
        os.dup2(file.fileno(), fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@pytest.mark.filterwarnings("ignore::mujou.OversubscriptionWarning")
def test_a_process_writes_where_the_host_writes_when_the_run_starts(tmp_path: Path) -> None:
    """The host's descriptors 1 and 2 point elsewhere than when the server started: a
    process of the run writes to the new ones. Planted: ``Streams.take`` a no-op, and this
    fails (the lines go where the host's streams went when the server started)."""
    with hang_guard(HANG_GUARD):
        _server.method()  # the server runs before the redirection
        net = Talkers()
        processes = {"p": net.talker}
        with (
            redirected(1, tmp_path / "out"),
            redirected(2, tmp_path / "err"),
            mujou.run(net, timer=mujou.VirtualTimer(), workers=1, processes=processes),
        ):
            pass
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert re.fullmatch(r"out of \d+\n", out), out
    assert re.search(r"^err of \d+$", err, re.MULTILINE), err


@linux_only
def test_a_server_that_would_import_another_mujou_is_stopped_for_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's Mujou is not the file the server's process reports: spawn, the server ended.
    Planted: ``_choose`` without the comparison, and this fails."""
    monkeypatch.setattr(_server.CHOICE, "server", None)  # the module's server is put back after
    torch_file, mujou_file = _server.imported_files()
    monkeypatch.setattr(_server, "imported_files", lambda: (torch_file, f"{mujou_file}.elsewhere"))
    with hang_guard(HANG_GUARD):
        context = _server.CHOICE._choose()
    assert context.get_start_method() == "spawn"
    assert _server.CHOICE.server is None


def test_off_linux_the_processes_are_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: ``_choose`` without the platform check, and this fails (a server is started)."""
    monkeypatch.setattr(_server.CHOICE, "server", None)
    monkeypatch.setattr(sys, "platform", "darwin")
    with hang_guard(HANG_GUARD):
        context = _server.CHOICE._choose()
    assert context.get_start_method() == "spawn"
    assert _server.CHOICE.server is None
