"""A multi-rate robot loop: a 30 Hz camera, a policy woken by each frame, a 500 Hz controller.

The camera (on a thread of its own, as it blocks while it exposes a frame) films a target
that moves on a circle. The policy, triggered by each new frame (no period: it runs when a
frame arrives, not on a clock), finds the target in it and commands the arm's velocity
towards it; the controller moves the arm at 500 Hz and reports its position
back to the policy. The host follows the commands while the loop runs in real time.

Run it with ``python examples/robot_loop.py``; add ``--trace robot.json`` to write a trace
of every hook, to open in https://ui.perfetto.dev.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import mujou
from mujou import Input, Net, Node, Output

SIZE = 16  # the camera's frames are SIZE x SIZE pixels, over [-1, 1] x [-1, 1]
GRID = torch.stack(torch.meshgrid(*[torch.linspace(-1, 1, SIZE)] * 2, indexing="xy"), -1).reshape(-1, 2)


class Camera(Node):
    frame = Output()
    target = Output()  # the true position, for the host to compare with

    def __init__(self) -> None:
        super().__init__(period=1 / 30, seed=0, dedicated_thread=True)
        self.angle = torch.zeros(())

    def on_update(self, dt: float) -> None:
        time.sleep(0.003)  # waits for the exposure: this would hold a shared worker
        self.angle += 0.8 * dt
        target = 0.6 * torch.stack([self.angle.cos(), self.angle.sin()])
        light = torch.exp(-(GRID - target).square().sum(1) / 0.02).reshape(SIZE, SIZE)
        self.frame.send(light + 0.05 * torch.randn(SIZE, SIZE, generator=self.generator))
        self.target.send(target)


class Locate(nn.Module):
    """Where a frame is brightest (a soft argmax), through a slightly miscalibrated lens."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.lens = nn.Linear(2, 2)
        with torch.no_grad():  # initialised from the node's generator, not torch's global one
            self.lens.weight.copy_(torch.eye(2) + 0.05 * torch.randn(2, 2, generator=generator))
            self.lens.bias.copy_(0.02 * torch.randn(2, generator=generator))

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(frame.flatten() / 0.05, 0)
        position: torch.Tensor = self.lens(weights @ GRID)
        return position


class Policy(Node):
    frame = Input()
    arm = Input()
    command = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("frame"), seed=1)  # each frame, at once
        self.locate = Locate(self.generator)

    def on_update(self, dt: float) -> None:
        frame, arm = self.frame.read(), self.arm.read()
        if frame is not None and arm is not None:
            with torch.no_grad():
                self.command.send((4.0 * (self.locate(frame) - arm)).clamp(-2.0, 2.0))


class Controller(Node):
    command = Input()
    arm = Output()

    def __init__(self) -> None:
        super().__init__(period=0.002, seed=2)
        self.position = torch.zeros(2)
        self.velocity = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        command = self.command.read()
        if command is not None:  # follow the commanded velocity, with limited acceleration
            self.velocity += (command - self.velocity).clamp(-20 * dt, 20 * dt)
        self.position += self.velocity * dt
        self.arm.send(self.position)


class Robot(Net):
    def __init__(self) -> None:
        super().__init__()
        self.camera = Camera()
        self.policy = Policy()
        self.controller = Controller()
        self.connect(self.camera.frame, self.policy.frame)
        self.connect(self.policy.command, self.controller.command)
        self.connect(self.controller.arm, self.policy.arm)


def show(vector: torch.Tensor | None) -> str:
    return "-" if vector is None else "[" + ", ".join(f"{value:+.2f}" for value in vector.tolist()) + "]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", help="write a Chrome/Perfetto trace of the run to this file")
    trace = parser.parse_args().trace
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    net = Robot()
    with mujou.run(net, trace=trace) as run:
        print(f"Running in real time on {run.workers} worker(s), plus the camera's own thread")
        first = run.wait_for(net.policy.command, timeout=5.0)
        print(f"First command at t={run.time * 1e3:.0f} ms: {show(first)}")
        print("time     commands  latest command    arm position      target            distance")
        with run.subscribe(net.policy.command) as commands:
            for step in range(1, 7):
                run.sleep(max(0.0, 0.5 * step - run.time))
                received = commands.drain()  # every command since the last drain, in order
                arm, target = run.read(net.controller.arm), run.read(net.camera.target)
                distance = "-" if arm is None or target is None else f"{(arm - target).norm():.3f}"
                latest = received[-1] if received else None
                print(
                    f"{run.time:4.2f} s {len(received):9d}  {show(latest):16}  {show(arm):16}"
                    f"  {show(target):16}  {distance}"
                )
    stats = run.stats()  # still there after the run ended
    print("node         updates  skipped  lateness p99    max   busy")
    for name, node in stats.nodes.items():
        print(
            f"{name:12} {node.updates:7d}  {node.skipped:7d}  {node.lateness_p99 * 1e3:9.2f} ms"
            f" {node.lateness_max * 1e3:6.2f}   {node.busy:.2f} s"
        )
    print("worker busy: " + ", ".join(f"{busy:.0%}" for busy in stats.worker_busy))
    if trace is not None:
        print(f"Wrote the trace to {trace}")


if __name__ == "__main__":
    main()
