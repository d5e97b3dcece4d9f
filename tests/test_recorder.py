"""The recorder process (mujou/_record/_recorder.py, _sink.py): its failure stops the run."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

import mujou
from mujou import Node, Output
from mujou._record import _feed, _recorder

HANG_GUARD = 30.0  # real seconds the run has to end once the recorder process failed

pytest.importorskip("mcap")


class Source(Node):
    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.zeros(2))


def _ends_with_an_internal_error(run: mujou.Run, match: str) -> None:
    """The run's host calls raise MujouInternalError matching ``match``; the run is over and
    no thread of the recorder is left."""
    began = time.monotonic()
    with pytest.raises(mujou.MujouInternalError) as caught:
        while True:
            assert time.monotonic() - began < HANG_GUARD, "the run went on without its recorder process"
            run.sleep(0.1)  # raises once the failure became the run's error
            time.sleep(0.01)
    assert re.search(match, str(caught.value.__cause__))
    with contextlib.suppress(mujou.MujouInternalError):  # raised again if it became the run's error
        run.stop()
    assert not run.running
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("mujou-record")]


def test_a_failing_recorder_process_stops_the_run_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarded: an exception in the recorder process ends it, and the run with a
    MujouInternalError that says what it was. Planted: the monitor thread's report removed
    (the run goes on: the test fails)."""
    monkeypatch.setattr(_feed, "FIRST_FORM", 8)  # the run's forms: a kind the recorder process refuses
    net = mujou.Net()
    net.source = Source()
    run = mujou.run(net, timer=mujou.VirtualTimer(), record=tmp_path / "x.mcap")
    _ends_with_an_internal_error(run, r"exit code 1: ValueError: a feed record of unknown kind 8")


def test_a_killed_recorder_process_stops_the_run_and_no_tap_waits_for_it(tmp_path: Path) -> None:
    """Guarded: the recorder process killed while a virtual-timer tap waits for room in a
    full feed (4096 bytes, messages of 4 KiB: each waits for the one before): the tap gives up,
    the run ends with MujouInternalError naming the signal. Planted: the tap's wait without
    the check of a dead recorder process (the run hangs: the guard's timeout fails it)."""

    class Big(Node):
        out = Output()

        def __init__(self) -> None:
            super().__init__(period=0.01, seed=0)

        def on_update(self, dt: float) -> None:
            self.out.send(torch.zeros(1000))

    net = mujou.Net()
    net.big = Big()
    recorder = mujou.Recorder(tmp_path / "k.mcap", buffer=4096, compression=None)
    run = mujou.run(net, timer=mujou.VirtualTimer(), record=recorder)
    session = run._recording
    assert isinstance(session, _recorder.Session)
    os.kill(session.process.pid, signal.SIGKILL)
    _ends_with_an_internal_error(run, f"exit code -{int(signal.SIGKILL)}")
