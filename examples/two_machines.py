"""A small net on two "machines", bit for bit the run of one process.

A sensor sends noisy readings; a filter on the second machine smooths them, and a controller
back on the first machine turns the estimate into a command. The second machine runs an agent
(``python -m mujou serve``); the run places the filter there with ``mujou.OnHost``. Here both
"machines" are this one: the script starts the agent itself, on loopback, with a fresh secret.
On two real machines, start the agent on the second one (with ``--listen 0.0.0.0:29400`` and
the same ``MUJOU_SECRET``) and give its address to ``mujou.OnHost``.

Under the virtual timer the placement changes no bit of the results: the script runs the net
in one process, then on two machines, and prints ``identical: True`` when the two state trees
are the same.

Run it with ``python examples/two_machines.py``. With ``--ray`` (``pip install mujou[ray]``),
Ray places the filter instead of an agent started by hand: the script starts a Ray cluster on
this machine (``ray.init``) and gives the filter as ``mujou.OnRay``, which asks Ray for one
actor; on a real cluster, ``ray.init()`` joins the cluster of ``RAY_ADDRESS`` and ``num_gpus``
or ``resources`` choose the machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import subprocess
import sys
from typing import Any

import torch

import mujou
import mujou.testing
from mujou import Input, Net, Node, Output


class Sensor(Node):
    reading = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=1)

    def on_update(self, dt: float) -> None:
        self.reading.send(torch.tensor([1.0, -2.0]) + 0.1 * torch.randn(2, generator=self.generator))


class Filter(Node):
    x = Input()
    estimate = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"))
        self.mean = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None  # triggered by it
        self.mean += 0.2 * (x - self.mean)
        self.estimate.send(self.mean)


class Controller(Node):
    estimate = Input()
    command = Output()

    def __init__(self) -> None:
        super().__init__(period=0.05, seed=2)
        self.commands = 0

    def on_update(self, dt: float) -> None:
        estimate = self.estimate.read()
        if estimate is not None:
            self.command.send(-0.5 * estimate + 0.01 * torch.randn(2, generator=self.generator))
            self.commands += 1


class Loop(Net):
    def __init__(self) -> None:
        super().__init__()
        self.sensor = Sensor()
        self.filter = Filter()
        self.controller = Controller()
        self.connect(self.sensor.reading, self.filter.x)
        self.connect(self.filter.estimate, self.controller.estimate)


def state(processes: Any, net: Loop) -> dict[str, Any]:
    with mujou.run(net, timer=mujou.VirtualTimer(), processes=processes) as run:
        run.sleep(2.0)
        return run.state_dict()


def start_agent() -> tuple[subprocess.Popen[str], str]:
    """The second "machine": an agent on loopback, on a free port."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "mujou", "serve", "--listen", "127.0.0.1:0", "--once"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=environ,
        text=True,
    )
    assert agent.stdout is not None
    line = agent.stdout.readline()  # "mujou agent listening on HOST:PORT"
    return agent, line.split()[-1]


def on_agent() -> tuple[dict[str, Any], str]:
    """The run with the filter on an agent started by hand."""
    os.environ["MUJOU_SECRET"] = secrets.token_hex(32)  # the run and its agent share it
    agent, address = start_agent()
    try:
        net = Loop()
        return state({"second": mujou.OnHost(net.filter, address)}, net), address
    finally:
        agent.wait(60)


def on_ray() -> tuple[dict[str, Any], str]:
    """The run with the filter on a Ray actor: Ray places it, Mujou makes its secret."""
    import ray

    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
    )
    try:
        net = Loop()
        return state({"second": mujou.OnRay(net.filter, num_cpus=1)}, net), "a Ray actor"
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ray", action="store_true", help="place the filter with Ray (mujou[ray])")
    arguments = parser.parse_args()
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    alone = state(None, Loop())
    placed, where = on_ray() if arguments.ray else on_agent()
    print(f"the controller sent {placed['controller']['commands']} commands; the filter ran on {where}")
    difference = mujou.testing.state_difference(alone, placed)
    print(f"identical: {difference is None}")
    if difference is not None:
        print(difference)


if __name__ == "__main__":
    main()
