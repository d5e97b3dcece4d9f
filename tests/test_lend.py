"""The host's thread running a due update (``_engine._lend``): Mujou's own failures there."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from _support import HANG_GUARD, Bag, Blocker

import mujou
from mujou import Input, Node, Output
from mujou._engine import _update

from ._compiled import skip_if_compiled


class Echo(Node):
    x = Input(optional=True)
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.stopped = False

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.y.send(x + 1)

    def on_stop(self) -> None:
        self.stopped = True


def test_an_error_of_mujou_on_the_lent_host_thread_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.internal-error: an exception in Mujou's code while the host runs an update stops
    the run with MujouInternalError, raised by the host's call; the node it held gets no more
    hooks (as a worker's, its state is unknown), and the stop does not wait for it."""
    skip_if_compiled(_update)
    host = threading.get_ident()
    begin = _update.begin_update

    def failing(*args: Any) -> float:
        if threading.get_ident() == host:
            raise RuntimeError("planted")
        return begin(*args)

    monkeypatch.setattr(_update, "begin_update", failing)
    blocker, echo = Blocker(), Echo()
    run = mujou.run(Bag(blocker=blocker, echo=echo), workers=1)
    try:
        run.write(blocker.go, torch.zeros(1))
        assert blocker.inside.wait(HANG_GUARD)
        run.write(echo.x, torch.ones(1))
        with pytest.raises(mujou.MujouInternalError) as caught:
            run.wait_for(echo.y, timeout=HANG_GUARD)
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert threading.current_thread().name in str(caught.value)
    finally:
        blocker.release.set()
    with pytest.raises(mujou.MujouInternalError):
        run.stop()
    assert not run.running
    assert not echo.stopped  # held in its update when Mujou failed: no more hooks, as on a worker
