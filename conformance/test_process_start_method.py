"""Conformance tests for rule ``proc.start-method`` (spec/en/processes.md, "How the processes start").

A process of a run starts as ``spawn`` starts one, whether it is a fork of Mujou's server (on
Linux) or spawned: the host's environment of the moment, nothing of the host's memory, the
main script imported anew in each process, its own multiprocessing on ``spawn``. The node
class of these tests is at the top level of this module, which the processes import by name.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _support import HANG_GUARD

import mujou

MARK = "as imported"  # the host changes it; a process imports this module afresh


class Reporter(mujou.Node):
    """Records, in its process, what that process was started with."""

    def __init__(self) -> None:
        super().__init__(period=0.01)
        self.pid = 0
        self.parent = 0
        self.environ = ""
        self.mark = ""
        self.method = ""

    def on_start(self) -> None:
        self.pid = os.getpid()
        self.parent = os.getppid()
        self.environ = os.environ.get("MUJOU_TEST_START_METHOD", "unset")
        self.mark = MARK
        self.method = multiprocessing.get_start_method()


class Pair(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.first = Reporter()
        self.second = Reporter()


def run_pair() -> dict[str, Any]:
    """A virtual-timer run of a pair, each node in a process of its own: their reports."""
    net = Pair()
    processes = {"one": net.first, "two": net.second}
    with mujou.run(net, timer=mujou.VirtualTimer(), workers=1, processes=processes) as run:
        tree: dict[str, Any] = run.state_dict()
    return tree


@pytest.mark.rule("proc.start-method")
def test_a_process_starts_as_spawn_starts_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs, the second after the host changed its environment and a module global."""
    first = run_pair()
    monkeypatch.setenv("MUJOU_TEST_START_METHOD", "set between the runs")
    monkeypatch.setattr(sys.modules[__name__], "MARK", "changed in the host")
    second = run_pair()
    reports = [tree[name] for tree in (first, second) for name in ("first", "second")]
    assert [report["environ"] for report in reports] == ["unset"] * 2 + ["set between the runs"] * 2
    assert all(report["mark"] == "as imported" for report in reports)  # nothing of the host's memory
    assert all(report["method"] == "spawn" for report in reports)
    assert len({report["pid"] for report in reports}) == 4
    parents = {report["parent"] for report in reports}
    if sys.platform == "linux":  # every process a fork of one server, not a child of the host
        assert len(parents) == 1 and os.getpid() not in parents
    else:
        assert parents == {os.getpid()}


MAIN_SCRIPT = """
import os
import pathlib
import sys

import mujou

DIRECTORY = pathlib.Path({directory!r})
if __name__ == "__mp_main__":  # imported anew by a process of the run: its own mark
    (DIRECTORY / f"imported-by-{{os.getpid()}}").touch()


class Local(mujou.Node):
    def __init__(self):
        super().__init__(period=0.01)
        self.module = ""
        self.imported_here = False

    def on_start(self):
        self.module = type(self).__module__
        self.imported_here = (DIRECTORY / f"imported-by-{{os.getpid()}}").exists()


class Both(mujou.Net):
    def __init__(self):
        super().__init__()
        self.a = Local()
        self.b = Local()


if __name__ == "__main__":
    net = Both()
    processes = {{"a": net.a, "b": net.b}}
    for _ in range(2):
        with mujou.run(net, timer=mujou.VirtualTimer(), workers=1, processes=processes) as run:
            tree = run.state_dict()
        print(tree["a"]["module"], tree["a"]["imported_here"], tree["b"]["imported_here"])
"""


@pytest.mark.rule("proc.start-method", "proc.copied")
def test_a_class_of_the_main_script_is_imported_anew_in_each_process(tmp_path: Path) -> None:
    """The main script's classes are found by name; the script is imported anew by every
    process of every run (Mujou's server does not import it once for all)."""
    script = tmp_path / "main_script.py"
    script.write_text(MAIN_SCRIPT.format(directory=str(tmp_path)))
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["__mp_main__ True True"] * 2, result.stderr
