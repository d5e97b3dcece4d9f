"""Nodes and nets for conformance/test_process_lockstep.py, importable by name (the
processes of a run are spawned: each imports its nodes' classes by name)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from mujou import Input, Net, Node, Output


class Noter(Node):
    """Periodic (10 ms): notes the name of the thread of each update and whether grad mode was
    on there, runs ``action`` if set, leaves grad mode off (a setting left behind), and sends
    how many updates it ran plus what it read."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.count = 0
        self.threads: list[str] = []
        self.grad: list[bool] = []
        self.action: Callable[[], None] | None = None

    def on_update(self, dt: float) -> None:
        self.threads.append(threading.current_thread().name)
        self.grad.append(torch.is_grad_enabled())
        if self.action is not None:
            self.action()
        torch.set_grad_enabled(False)
        x = self.x.read()
        self.count += 1
        self.y.send(torch.tensor(float(self.count) + (0.0 if x is None else float(x))))


class Volley(Net):
    """``near`` and ``far``, each reading the other's count."""

    def __init__(self) -> None:
        super().__init__()
        self.near = Noter()
        self.far = Noter()
        self.connect(self.near.y, self.far.x)
        self.connect(self.far.y, self.near.x)
