"""Two planners that compute in plain Python, in one process and then in two.

A source sends a new goal to each of two planners every millisecond, faster than they can plan;
each planner, triggered by its goal, searches in plain Python for a few milliseconds (every
step holds the GIL) and sends its plan to a sink. In one process the two searches take turns
on the one GIL, however many workers the run has. With ``processes={"right": net.right}``
the right planner runs in a process of its own, with its own interpreter and GIL, and the two
search at the same time; the nodes and their ports do not change. The host prints the plans
made each way and the speed-up (close to 2 on a machine with two free cores), and how many
the sink saw: an input keeps the latest message, so plans that arrive while the sink waits
for its turn coalesce.

Run it with ``python examples/two_processes.py [--seconds S]``. The ``if __name__ ==
"__main__":`` guard matters: the new process imports this script to find the node classes.
"""

from __future__ import annotations

import argparse
import os

import torch

import mujou
from mujou import Input, Net, Node, Output

# At the top level, so that every process of the run makes it (its own interpreter imports
# this script): one torch thread per worker.
torch.set_num_threads(1)

STEPS = 50_000  # steps of a search: a few milliseconds of Python


def search(goal: float, steps: int) -> float:
    """A planner's search in plain Python; the end of the path."""
    position = 0.0
    for _ in range(steps):
        position += 0.0001 * (goal - position)
    return position


class Goals(Node):
    left = Output()
    right = Output()

    def __init__(self) -> None:
        super().__init__(period=0.001, seed=0)

    def on_update(self, dt: float) -> None:
        self.left.send(torch.rand((), generator=self.generator))
        self.right.send(torch.rand((), generator=self.generator))


class Planner(Node):
    goal = Input()
    plan = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("goal"))
        self.pid = 0

    def on_start(self) -> None:
        self.pid = os.getpid()  # on_start runs in the node's own process

    def on_update(self, dt: float) -> None:
        goal = self.goal.read()
        assert goal is not None  # triggered by it
        self.plan.send(torch.tensor(search(float(goal), STEPS)))


class Sink(Node):
    left = Input()
    right = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("left", "right"))
        self.plans = 0

    def on_update(self, dt: float) -> None:
        self.plans += self.left.fresh + self.right.fresh


class Arms(Net):
    def __init__(self) -> None:
        super().__init__()
        self.goals = Goals()
        self.left = Planner()
        self.right = Planner()
        self.sink = Sink()
        self.connect(self.goals.left, self.left.goal)
        self.connect(self.goals.right, self.right.goal)
        self.connect(self.left.plan, self.sink.left)
        self.connect(self.right.plan, self.sink.right)


def plans_made(seconds: float, placed: bool) -> int:
    """The plans both planners made in ``seconds`` after the start, one or two processes."""
    net = Arms()
    processes = {"right": net.right} if placed else None
    # One worker per process: a worker more cannot run Python while another holds the GIL.
    with mujou.run(net, workers=1, processes=processes) as run:  # a process takes a moment to start
        before = run.stats().nodes
        run.sleep(seconds)
        after = run.stats().nodes
        state = run.state_dict()  # the state of every node, wherever it ran
    made = sum(after[name].updates - before[name].updates for name in ("left", "right"))
    where = "the host's process" if state["right"]["pid"] == os.getpid() else "a process of its own"
    print(
        f"{made:5} plans in {seconds:g} s ({made / seconds:4.0f} a second), the right planner in "
        f"{where}; the sink saw {state['sink']['plans']}"
    )
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each run plans (default 3)")
    seconds = parser.parse_args().seconds
    one = plans_made(seconds, placed=False)
    two = plans_made(seconds, placed=True)
    print(f"Speed-up with the right planner in a process of its own: {two / max(one, 1):.2f}x")


if __name__ == "__main__":
    main()
