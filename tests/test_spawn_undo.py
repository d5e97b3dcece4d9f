"""A spawn that fails part way undoes itself (mujou/_processes/_spawn.py): the processes it
started end and every pipe end it made closes, so ``mujou.run`` raises with nothing left
(proc.cleanup, run.start-undone)."""

from __future__ import annotations

import gc
import multiprocessing
import os
from typing import Any

import pytest
from _support import HANG_GUARD, hang_guard

import mujou
from mujou._processes import _server, _spawn


class Idle(mujou.Node):
    """A node that does nothing, placed in a process of its own."""


class Two(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.first = Idle(period=0.1)
        self.second = Idle(period=0.1)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


class _Failing:
    """A start context whose second process fails to start."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.started = 0

    def Pipe(self, duplex: bool = True) -> Any:  # noqa: N802 (multiprocessing's name)
        return self._context.Pipe(duplex=duplex)

    def Process(self, **kwargs: Any) -> Any:  # noqa: N802 (multiprocessing's name)
        self.started += 1
        return _Unstartable() if self.started == 2 else self._context.Process(**kwargs)


class _Unstartable:
    """The second process: its start fails."""

    def start(self) -> None:
        raise OSError("planted: the second process cannot start")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
@pytest.mark.filterwarnings("ignore::mujou.OversubscriptionWarning")
def test_a_spawn_that_fails_part_way_leaves_no_process_and_no_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: no undo (the first process and the pipes left), and this fails."""
    net = Two()
    with hang_guard(HANG_GUARD):  # a warm-up run: the fork server and its pipe are not the run's
        with mujou.run(net, timer=mujou.VirtualTimer(), processes={"a": [net.first]}) as run:
            run.sleep(0.1)
        del run
        gc.collect()
        before = _descriptors()
        failing = _Failing(_server.start_context())
        monkeypatch.setattr(_spawn, "start_context", lambda: failing)
        with pytest.raises(OSError, match="planted"):
            mujou.run(net, timer=mujou.VirtualTimer(), processes={"a": [net.first], "b": [net.second]})
        gc.collect()
    assert failing.started == 2
    assert [p for p in multiprocessing.active_children() if p.name.startswith("mujou-")] == []
    assert _descriptors() == before
