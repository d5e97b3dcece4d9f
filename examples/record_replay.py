"""A run recorded to MCAP under the virtual timer, then replayed with its camera replaced.

A camera (seeded noise) feeds a detector that wakes on each frame, and a tracker smooths
what the detector finds. The run is recorded to the file given as the first argument (every
output, and a keyframe of the state each half second). The replay builds the same net again,
replaces the camera by its recording (its hooks do not run: its frames come from the file, at
the tags they were sent at) and checks that the detector and the tracker end exactly as they
did, bit for bit. Then it replays again from the keyframe at 1.0 s.

Run it with ``python examples/record_replay.py run.mcap`` (needs ``pip install mujou[record]``);
open ``run.mcap`` in Foxglove to plot the messages against time.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

import mujou
from mujou import Input, Net, Node, Output, TensorSpec

SECONDS = 2.0


class Camera(Node):
    """30 frames a second of 4x4 seeded noise."""

    frame = Output(spec=TensorSpec(torch.float32, (4, 4)))

    def __init__(self) -> None:
        super().__init__(period=1 / 30, seed=1)

    def on_update(self, dt: float) -> None:
        self.frame.send(torch.rand(4, 4, generator=self.generator))


class Detector(Node):
    """On each frame: the brightest pixel's position, jittered by a draw of its own."""

    frame = Input()
    spot = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("frame"), seed=2)
        self.frames = 0

    def on_update(self, dt: float) -> None:
        frame = self.frame.read()
        assert frame is not None  # it woke on a frame
        index = int(frame.argmax())
        jitter = 0.1 * torch.randn(2, generator=self.generator)
        self.frames += 1
        self.spot.send(torch.tensor([index // 4, index % 4], dtype=torch.float32) + jitter)


class Tracker(Node):
    """Twenty times a second: an exponential average of the latest spot."""

    spot = Input()
    estimate = Output()

    def __init__(self) -> None:
        super().__init__(period=0.05, seed=3)
        self.mean = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        spot = self.spot.read()
        if spot is not None:
            self.mean = self.mean + 0.2 * (spot - self.mean)
            self.estimate.send(self.mean)


class Robot(Net):
    def __init__(self) -> None:
        super().__init__()
        self.camera = Camera()
        self.detector = Detector()
        self.tracker = Tracker()
        self.connect(self.camera.frame, self.detector.frame)
        self.connect(self.detector.spot, self.tracker.spot)


def same(a: Any, b: Any) -> bool:
    """Whether two state trees are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return bool(a == b)


def but_camera(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The state tree of the nodes that were not replaced."""
    return {name: tree[name] for name in ("detector", "tracker")}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/record_replay.py RECORDING.mcap")
    path = sys.argv[1]
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run

    net = Robot()
    recorder = mujou.Recorder(path, state_every=0.5)
    with mujou.run(net, timer=mujou.VirtualTimer(), record=recorder) as run:
        run.sleep(SECONDS)
        recorded = run.state_dict()
    print(f"Recorded {SECONDS} s to {path}: {net.detector.frames} frames detected")

    with mujou.Recording(path) as recording:
        ports = ", ".join(sorted(recording.ports))
        print(f"The recording holds {ports}; keyframes at {list(recording.keyframes)}")

        net = Robot()
        replay = mujou.Replay(recording, nodes=["camera"])
        with mujou.run(net, timer=mujou.VirtualTimer(), workers=2, replay=replay) as run:
            run.sleep(SECONDS)
            replayed = run.state_dict()
        print(f"Replayed with the camera replaced: {net.detector.frames} frames detected")
        print(f"identical: {same(but_camera(recorded), but_camera(replayed))}")

        net = Robot()
        replay = mujou.Replay(recording, nodes=["camera"], start=1.0)
        with mujou.run(net, timer=mujou.VirtualTimer(), replay=replay) as run:
            start = run.time
            run.sleep(SECONDS - start)
            resumed = run.state_dict()
        identical = same(but_camera(recorded), but_camera(resumed))
        print(f"Replayed from the keyframe at {start} s: identical: {identical}")


if __name__ == "__main__":
    main()
