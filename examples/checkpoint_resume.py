"""A checkpoint saved, the process ended, and the run resumed from the file in a new process.

The script starts itself as a child process, which runs a small net for 2 s of the virtual
timer, saves its state to a file and exits. The parent resumes from that file and shows that
the resumed run goes on exactly as a run that was never interrupted.

Run it with ``python examples/checkpoint_resume.py``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import mujou
from mujou import Input, Net, Node, Output


class Walker(Node):
    """A seeded random walk in the plane, 100 steps a second."""

    position = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=7)
        self.here = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        self.here += 0.1 * torch.randn(2, generator=self.generator)
        self.position.send(self.here)


class Tracker(Node):
    """A running mean of the walk, and how many positions it has seen (a plain int, kept too)."""

    position = Input()
    mean = Output()

    def __init__(self) -> None:
        super().__init__(period=0.02, seed=8)
        self.average = torch.zeros(2)
        self.seen = 0

    def on_update(self, dt: float) -> None:
        position = self.position.read()
        if position is not None:
            self.seen += 1
            self.average += (position - self.average) / self.seen
            self.mean.send(self.average)

    # The default state keeps the generator, the tensors and the plain values: also `seen`.


class Walk(Net):
    def __init__(self) -> None:
        super().__init__()
        self.walker = Walker()
        self.tracker = Tracker()
        self.connect(self.walker.position, self.tracker.position)


def child(path: Path) -> None:
    """Run for 2 s, save the state to ``path``, and end the process."""
    with mujou.run(Walk(), timer=mujou.VirtualTimer()) as run:
        run.sleep(2.0)
        mujou.save(run.state_dict(), path)
        print(f"  [child] saved the state at t={run.time:.2f} s to {path.name}; exiting")


def follow(run: mujou.Run, net: Walk) -> list[str]:
    """Run until t=4 s and describe the tracker's mean every half second."""
    lines = []
    while run.time < 4.0:
        run.sleep(0.5)
        mean = run.read(net.tracker.mean)
        assert mean is not None
        lines.append(f"[{mean[0]:+.4f}, {mean[1]:+.4f}]")
    return lines


def same(a: Any, b: Any) -> bool:
    """Whether two state trees are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return bool(a == b)


def main() -> None:
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    if sys.argv[1:2] == ["--child"]:
        child(Path(sys.argv[2]))
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "walk.pt"
        print("Starting a child process that runs the net for 2 s and saves a checkpoint...", flush=True)
        subprocess.run([sys.executable, __file__, "--child", str(path)], check=True)
        tree = mujou.load(path)

    resumed_net = Walk()
    with mujou.run(resumed_net, state=tree, timer=mujou.VirtualTimer()) as run:
        print(f"Resumed from the file at t={run.time:.2f} s, in this process")
        resumed = follow(run, resumed_net)
        resumed_state = run.state_dict()
    print("The same net, run from the start without a break, for comparison:")
    net = Walk()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        run.sleep(2.0)
        uninterrupted = follow(run, net)
        uninterrupted_state = run.state_dict()

    print("  time   mean, uninterrupted   mean, resumed")
    for step, (a, b) in enumerate(zip(uninterrupted, resumed, strict=True)):
        print(f"  {2.5 + 0.5 * step:.2f}   {a}    {b}")
    counted = uninterrupted_state["tracker"]["seen"], resumed_state["tracker"]["seen"]
    print(f"The tracker counted {counted[0]} positions without a break, and {counted[1]} resumed")
    print(f"Both runs ended in the same state tree, bit for bit: {same(uninterrupted_state, resumed_state)}")


if __name__ == "__main__":
    main()
