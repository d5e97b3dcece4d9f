"""Nodes and nets for conformance/test_process_data.py that run in processes of their own.

The processes of a run are spawned: each imports the classes of its nodes by name, so they
live here, at the top level of a module on ``sys.path`` (under pytest the conformance
directory is on it, and multiprocessing passes the host's ``sys.path`` to the children).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

import mujou
from mujou import Input, Net, Node, Output


class Pair(NamedTuple):
    """A message class: a NamedTuple must cross processes as itself (proc.host-api)."""

    value: torch.Tensor
    number: int


class Echo(Node):
    """Triggered by ``x``: sends what it read on ``y`` at once."""

    x = Input(optional=True)
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        assert message is not None
        self.y.send(message)


class Sink(Node):
    """Triggered by ``x``: counts what it read (runs in the host)."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1


class Counter(Node):
    """Periodic: sends 1, 2, 3, ... on ``y``, and the same as a Pair on ``pair``."""

    y = Output()
    pair: Output[Pair] = Output()

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(period=period)
        self.i = 0

    def on_update(self, dt: float) -> None:
        self.i += 1
        self.y.send(torch.tensor([float(self.i)]))
        self.pair.send(Pair(torch.tensor([float(self.i)]), self.i))


class PairReader(Node):
    """Triggered by ``pair``: keeps the class of the last message it read."""

    pair: Input[Pair] = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("pair"))
        self.kind = ""

    def on_update(self, dt: float) -> None:
        self.kind = type(self.pair.read()).__name__

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.kind = state["kind"]


class Big(Node):
    """Periodic: sends a tensor of ``megabytes`` MiB."""

    y = Output()

    def __init__(self, megabytes: int, period: float = 0.005) -> None:
        super().__init__(period=period)
        self.message = torch.zeros(megabytes * 2**18)  # float32: 4 bytes each

    def on_update(self, dt: float) -> None:
        self.y.send(self.message)


class Shaper(Node):
    """Periodic: message ``i`` has ``i % 50 + 1`` elements (a new layout each time)."""

    y = Output()

    def __init__(self, period: float = 0.005) -> None:
        super().__init__(period=period)
        self.i = 0

    def on_update(self, dt: float) -> None:
        self.i += 1
        self.y.send(torch.full((self.i % 50 + 1,), float(self.i)))


class Latest(Node):
    """Triggered by ``x``: keeps the last message it read (its state)."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))
        self.last = torch.zeros(0)

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        assert message is not None
        self.last = message.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last = state["last"]


class Quantized(Node):
    """Its state holds a quantized tensor (its weights, as a quantized model's would)."""

    def __init__(self) -> None:
        super().__init__(period=1.0)
        self.weights = torch.quantize_per_tensor(torch.tensor([1.0, 2.0, 3.0]), 0.5, 3, torch.quint8)

    def on_update(self, dt: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.weights = state["weights"]


class EchoNet(Net):
    """The host writes ``echo.x``; ``echo`` (in a process of its own) answers on ``echo.y``."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo()


class FedNet(Net):
    """``counter`` (in a process) feeds ``sink`` and ``pairs`` (in the host); the host's
    ``ticks`` feeds ``far`` (in the process)."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.sink = Sink()
        self.pairs = PairReader()
        self.ticks = Counter()
        self.far = Latest()
        self.connect(self.counter.y, self.sink.x)
        self.connect(self.counter.pair, self.pairs.pair)
        self.connect(self.ticks.y, self.far.x)


class Burst(Node):
    """Triggered by the host's ``go``: sends ``go`` messages on ``y`` in one update, numbered on."""

    go = Input(optional=True)
    y = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("go"))
        self.sent = 0
        self.ended = 0  # the updates that returned: each of their sends has reached every reader

    def on_update(self, dt: float) -> None:
        count = self.go.read()
        assert count is not None
        for _ in range(int(count.item())):
            self.sent += 1
            self.y.send(torch.tensor([float(self.sent)]))
        self.ended += 1


class BurstNet(Net):
    """``burst`` (in the host) sends to ``latest`` (in a process of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.burst = Burst()
        self.latest = Latest()
        self.connect(self.burst.y, self.latest.x)


class ShapeNet(Net):
    """``shaper`` sends a new layout at each update to ``latest``."""

    def __init__(self) -> None:
        super().__init__()
        self.shaper = Shaper()
        self.latest = Latest()
        self.connect(self.shaper.y, self.latest.x)


class QuantizedNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.quantized = Quantized()
