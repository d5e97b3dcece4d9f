"""Nodes made without a seed, for conformance/test_seeds.py: at the top level of a module, so
that a process of their own can import them (see _process_nodes.py)."""

from __future__ import annotations

import torch

from mujou import Input, Net, Node, Output


class Noise(Node):
    """No seed: draws its first value in on_start, then one at each update, and sends it."""

    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1)

    def on_start(self) -> None:
        self.value = torch.rand(4, generator=self.generator)

    def on_update(self, dt: float) -> None:
        self.value = torch.rand(4, generator=self.generator)
        self.out.send(self.value)


class Quiet(Node):
    """No seed, never draws: only its generator's state is in its state."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.1)


class Seeded(Noise):
    """Like Noise, with a seed of its own."""

    def __init__(self) -> None:
        Node.__init__(self, period=0.1, seed=7)


class Pair(Net):
    """Two unseeded nodes and a seeded one: ``noise`` feeds ``quiet``."""

    def __init__(self) -> None:
        super().__init__()
        self.noise = Noise()
        self.quiet = Quiet()
        self.seeded = Seeded()
        self.connect(self.noise.out, self.quiet.x)
