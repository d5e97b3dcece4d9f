"""What several conformance modules share: small nets and nodes built on the public API only."""

from __future__ import annotations

import mujou
from mujou import Net, Node

HANG_GUARD = 30.0  # seconds; only ever reached when something hangs


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
