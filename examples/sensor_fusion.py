"""Sensor fusion: a Kalman filter fuses a noisy 5 Hz GPS with a 100 Hz accelerometer.

A vehicle drives on a circle; two seeded noisy sensors measure it, a filter fuses them, and
the host compares both with the truth, 10 ms at a time. Under the virtual timer the run is a function of the
net and its seeds: run with 1 and with 2 workers, it ends in the same state, bit for bit.
``test_sensor_fusion.py`` tests its nodes one at a time with ``mujou.testing.Harness``.

Run it with ``python examples/sensor_fusion.py``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import mujou
import mujou.testing
from mujou import Input, Net, Node, Output


class Vehicle(Node):
    """Drives on a circle of 5 m at 2.5 m/s; sends the true position and acceleration."""

    truth = Output()

    def __init__(self) -> None:
        # No seed: the run seeds its generator from the run's seed and its name "vehicle".
        super().__init__(period=0.01)
        self.angle = torch.zeros(())

    def on_update(self, dt: float) -> None:
        self.angle += 0.5 * dt
        around = torch.stack([self.angle.cos(), self.angle.sin()])
        self.truth.send(torch.cat([5.0 * around, -1.25 * around]))  # [x, y, ax, ay]


class Accelerometer(Node):
    truth = Input()
    acceleration = Output()

    def on_update(self, dt: float) -> None:
        truth = self.truth.read()
        if truth is not None:
            self.acceleration.send(truth[2:] + 0.1 * torch.randn(2, generator=self.generator))


class Gps(Node):
    """A fix every 0.2 s, 1 m of noise; the fix carries its number, so readers see new ones."""

    truth = Input()
    fix = Output()

    def __init__(self) -> None:
        super().__init__(period=0.2, seed=2)
        self.fixes = torch.zeros(1)

    def on_update(self, dt: float) -> None:
        truth = self.truth.read()
        if truth is not None:
            self.fixes += 1
            self.fix.send(torch.cat([truth[:2] + torch.randn(2, generator=self.generator), self.fixes]))


class Fusion(Node):
    """A Kalman filter on [x, y, vx, vy]: predicts with the acceleration, corrects with fixes."""

    acceleration = Input()
    fix = Input()
    estimate = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=3)
        self.x = torch.zeros(4)
        self.p = 100.0 * torch.eye(4)
        self.last_fix = torch.zeros(())

    def on_update(self, dt: float) -> None:
        acceleration, fix = self.acceleration.read(), self.fix.read()
        if acceleration is None:
            return
        eye, zero = torch.eye(2), torch.zeros(2, 2)
        f = torch.cat([torch.cat([eye, dt * eye], 1), torch.cat([zero, eye], 1)])
        b = torch.cat([0.5 * dt * dt * eye, dt * eye])
        self.x = f @ self.x + b @ acceleration
        self.p = f @ self.p @ f.T + 0.01 * b @ b.T  # the accelerometer's noise
        if fix is not None and fix[2] != self.last_fix:  # a new fix: correct with it
            self.last_fix = fix[2].clone()
            h = torch.cat([eye, zero], 1)
            gain = self.p @ h.T @ torch.linalg.inv(h @ self.p @ h.T + eye)
            self.x = self.x + gain @ (fix[:2] - h @ self.x)
            self.p = (torch.eye(4) - gain @ h) @ self.p
        self.estimate.send(self.x[:2])


class Tracking(Net):
    def __init__(self) -> None:
        super().__init__()
        self.vehicle = Vehicle()
        self.accelerometer = Accelerometer(period=0.01, seed=1)
        self.gps = Gps()
        self.fusion = Fusion()
        self.connect(self.vehicle.truth, self.accelerometer.truth)
        self.connect(self.vehicle.truth, self.gps.truth)
        self.connect(self.accelerometer.acceleration, self.fusion.acceleration)
        self.connect(self.gps.fix, self.fusion.fix)


def simulate(workers: int, verbose: bool) -> dict[str, Any]:
    """Run the net for 30 s of virtual time, 10 ms at a time, and return its final state tree."""
    net = Tracking()
    squares = torch.zeros(2)  # the squared errors of the latest fix and of the estimate, summed
    started = time.perf_counter()
    with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
        for step in range(1, 3001):
            run.sleep(0.01)
            truth, fix = run.read(net.vehicle.truth), run.read(net.gps.fix)
            estimate = run.read(net.fusion.estimate)
            if truth is not None and fix is not None and estimate is not None:
                squares += (torch.stack([fix[:2], estimate]) - truth[:2]).square().sum(1)
            if verbose and step % 500 == 0:
                rms = (squares / step).sqrt()
                print(f"{run.time:4.0f} s   {rms[0]:10.2f} m   {rms[1]:10.2f} m")
        tree = run.state_dict()
    if verbose:
        print(f"(30 s of the net computed in {time.perf_counter() - started:.1f} s of real time)")
    return tree


def main() -> None:
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    print("A vehicle on a circle, tracked for 30 s under the virtual timer (RMS errors so far):")
    print("time   GPS fix alone   fused with the accelerometer")
    one = simulate(workers=1, verbose=True)
    two = simulate(workers=2, verbose=False)
    difference = mujou.testing.state_difference(one, two)  # None, or where they first differ
    print(f"Run again with 2 workers: the same state tree, bit for bit: {difference is None}")


if __name__ == "__main__":
    main()
