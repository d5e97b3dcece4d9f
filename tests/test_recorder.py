"""The recorder's writer thread (mujou/_record/_recorder.py): a failure in it stops the run."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
import torch

import mujou
from mujou import Node, Output
from mujou._record import _encoding

pytest.importorskip("mcap")


class Source(Node):
    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.zeros(2))


def test_a_failing_writer_stops_the_run_with_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarded: the writer's exception ends the run as MujouInternalError, caused by it, and
    the host's calls say so; no thread dies silently. Planted: the writer's except clause
    removed (the run goes on: sleep returns, and this fails)."""

    def broken(tensor: torch.Tensor) -> bytes:
        raise ValueError("planted")

    monkeypatch.setattr(_encoding, "encode_tensor", broken)
    net = mujou.Net()
    net.source = Source()
    run = mujou.run(net, timer=mujou.VirtualTimer(), record=tmp_path / "x.mcap")
    with pytest.raises(mujou.MujouInternalError) as caught:
        run.sleep(1.0)  # raises if the writer failed meanwhile, else the stop does
        run.stop()
    assert isinstance(caught.value.__cause__, ValueError)
    with contextlib.suppress(mujou.MujouInternalError):  # raised again if it became the run's error
        run.stop()
    assert not run.running
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("mujou-record")]
