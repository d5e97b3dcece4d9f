"""The replay workload (issue 25): a net replayed with its sources replaced by their recording,
under the virtual timer, as fast as the machine goes, against the same net's own rate.

Sources (periodic, 1 kHz, 256 B tensors drawn from their generators) each feed a relay
triggered by every message, which sums what it read. The net runs ``seconds`` of
the virtual timer three times: alone (its own rate), recorded (the file of the replay), and
replayed with every source replaced. The rate is timer seconds per real second; the replay's
is compared with the net's own. A lost message is one the relays did not get in the replay
(each triggered update is one message): their updates are counted in both runs, and their
states are compared bit for bit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import mujou
from mujou import Input, Net, Node, Output

SOURCES = 10
PERIOD = 0.001
FLOATS = 64  # 256 B of float32


class Source(Node):
    frame = Output()

    def __init__(self, seed: int) -> None:
        super().__init__(period=PERIOD, seed=seed)

    def on_update(self, dt: float) -> None:
        self.frame.send(torch.rand(FLOATS, generator=self.generator))


class Relay(Node):
    """Triggered by each frame: keeps a running sum of its head in its state."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.total = torch.zeros(4)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.total = self.total + x[:4]


class Fleet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.sources = mujou.NodeList([Source(seed=i) for i in range(SOURCES)])
        self.relays = mujou.NodeList([Relay() for _ in range(SOURCES)])
        for source, relay in zip(self.sources, self.relays, strict=True):
            self.connect(source.frame, relay.x)


def _timed(net: Fleet, seconds: float, **options: Any) -> tuple[float, dict[str, Any], int]:
    """Real seconds to run ``seconds`` of the virtual timer, the relays' states and updates."""
    with mujou.run(net, timer=mujou.VirtualTimer(), workers=1, **options) as run:
        began = time.perf_counter()
        run.sleep(seconds)
        spent = time.perf_counter() - began
        stats = run.stats().nodes
        updates = sum(stats[f"relays.{i}"].updates for i in range(SOURCES))
        return spent, run.state_dict()["relays"], updates


def replay_virtual(seconds: float) -> dict[str, float]:
    """The net's own virtual-timer rate, and its replay's, with every source replaced."""
    own, expected, relayed = _timed(Fleet(), seconds)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fleet.mcap"
        recorder = mujou.Recorder(path)
        _timed(Fleet(), seconds, record=recorder)
        with mujou.Recording(path) as recording:
            replay = mujou.Replay(recording, nodes=[f"sources.{i}" for i in range(SOURCES)])
            replayed, state, replay_relayed = _timed(Fleet(), seconds, replay=replay)
    identical = all(torch.equal(expected[key]["total"], state[key]["total"]) for key in expected)
    return {
        "own_rate": seconds / own,
        "replay_rate": seconds / replayed,
        "ratio": own / replayed,
        "messages": float(relayed),
        "lost": float(relayed - replay_relayed),
        "recorder_lost": float(recorder.lost),
        "identical": float(identical),
    }


if __name__ == "__main__":
    print(replay_virtual(1.0))
