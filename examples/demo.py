"""Mujou's demo: a small robot net, run for three seconds, then checkpointed and resumed.

A camera on a thread of its own (30 Hz) produces noisy frames, a policy (100 Hz) turns its
latest frame into a command, and a controller (500 Hz) smooths the commands. The host
prints what the net does while it runs, takes the state, and resumes it under the virtual
timer to show that a resumed run continues exactly where the saved one stopped. The first
run records a trace; the demo ends by drawing it, to look at offline: a page for a browser,
and a picture where matplotlib is installed (``pip install mujou[plot]``).

Run it with ``python examples/demo.py [--out DIR]`` (the trace and its pictures go to DIR, by
default the folder ``mujou-demo`` in the system's temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

import mujou
from mujou import Input, Net, Node, Output


class Camera(Node):
    """A 30 Hz camera that blocks while it 'exposes' a frame, so it gets a thread of its own."""

    frame = Output()

    def __init__(self) -> None:
        super().__init__(period=1 / 30, seed=1, dedicated_thread=True)
        self.scene = torch.linspace(-1.0, 1.0, 16)

    def on_update(self, dt: float) -> None:
        noise = 0.1 * torch.randn(16, generator=self.generator)
        self.frame.send(self.scene + noise)


class Policy(Node):
    """A 100 Hz policy: a small linear layer on the latest frame."""

    frame = Input()
    command = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=2)
        self.layer = nn.Linear(16, 2)
        # The default initialisation draws from the global generator: redo it from ours.
        nn.init.normal_(self.layer.weight, std=0.1, generator=self.generator)
        nn.init.zeros_(self.layer.bias)

    def on_update(self, dt: float) -> None:
        frame = self.frame.read()
        if frame is not None:
            with torch.no_grad():
                self.command.send(torch.tanh(self.layer(frame)))


class Controller(Node):
    """A 500 Hz controller that follows the latest command smoothly."""

    command = Input()
    output = Output()

    def __init__(self) -> None:
        super().__init__(period=0.002)
        self.position = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        command = self.command.read()
        if command is not None:
            self.position += (command - self.position) * min(1.0, 20.0 * dt)
            self.output.send(self.position)


class Robot(Net):
    def __init__(self) -> None:
        super().__init__()
        self.camera = Camera()
        self.policy = Policy()
        self.controller = Controller()
        self.connect(self.camera.frame, self.policy.frame)
        self.connect(self.policy.command, self.controller.command)


def show(run: mujou.Run, net: Robot) -> None:
    stats = run.stats()
    position = run.read(net.controller.output)
    counts = ", ".join(f"{name} {node.updates}" for name, node in stats.nodes.items())
    late = max(node.lateness_max for node in stats.nodes.values())
    where = "-" if position is None else ", ".join(f"{value:+.3f}" for value in position.tolist())
    print(f"t={run.time:5.2f} s  position [{where}]  updates: {counts}  worst lateness {late * 1e3:.1f} ms")


def look(trace: Path) -> None:
    """Draw the trace, to look at the run offline: a page, and a picture with matplotlib."""
    page = trace.with_suffix(".html")
    mujou.plot_trace(trace, page)
    print(f"The first run's trace is {trace}; look at it in a browser: {page}")
    try:
        mujou.plot_trace(trace, trace.with_suffix(".png"))
    except ImportError:
        print("(pip install mujou[plot] to draw it as a picture too)")
    else:
        print(f"or as a picture: {trace.with_suffix('.png')}")


def main(out: Path) -> None:
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    net = Robot()
    trace = out / "demo-trace.json"
    print(f"Running {len(list(net.nodes()))} nodes in real time for 3 s...")
    with mujou.run(net, trace=trace) as run:
        print(f"{run.workers} worker thread(s), plus the camera's own thread")
        for _ in range(6):
            run.sleep(0.5)
            show(run, net)
        tree = run.state_dict()

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "robot.pt"
        mujou.save(tree, path)
        print(f"Saved the state at t={tree['@mujou']['time']:.2f} s to {path.name}")

        print("Resuming it twice under the virtual timer, with 1 and with 2 workers, for 1 s:")
        results = []
        for workers in (1, 2):
            resumed = Robot()
            with warnings.catch_warnings():
                # 2 workers and the camera's thread may be more threads than this machine's
                # cores: that slows a virtual-timer run down, it does not change its results.
                warnings.simplefilter("ignore", mujou.OversubscriptionWarning)
                run = mujou.run(resumed, state=mujou.load(path), workers=workers, timer=mujou.VirtualTimer())
            with run:
                run.sleep(1.0)
                show(run, resumed)
                results.append(run.state_dict()["controller"]["position"])
        same = torch.equal(results[0], results[1])
        print(f"Both resumed runs ended in the same state, bit for bit: {same}")
    look(trace)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(tempfile.gettempdir()) / "mujou-demo"
    parser.add_argument("--out", type=Path, default=default, help=f"where the trace goes (default {default})")
    main(parser.parse_args().out)
