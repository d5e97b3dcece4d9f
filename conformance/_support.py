"""What several conformance modules share: small nets and nodes built on the public API only."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import mujou
from mujou import Net, Node

HANG_GUARD = 30.0  # seconds; only ever reached when something hangs


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail after HANG_GUARD seconds (a hang, not slowness)."""
    event = threading.Event()
    for _ in range(int(HANG_GUARD / 0.001)):
        if condition():
            return
        event.wait(0.001)
    pytest.fail(f"timed out waiting for {what}")


def vt() -> mujou.VirtualTimer:
    """A fresh virtual timer."""
    return mujou.VirtualTimer()


class Bag(Net):
    """A net holding the nodes and nets given as keywords, in that order."""

    def __init__(self, **members: Node | Net) -> None:
        super().__init__()
        for attr, member in members.items():
            setattr(self, attr, member)


class Plain(Node):
    """A node that overrides no hook."""


class DtRecorder(Node):
    """Records the ``dt`` of each of its updates."""

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)
