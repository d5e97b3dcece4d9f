"""An online learner beside an actor that uses its latest weights.

A world streams batches of samples of an unknown function, y = sin(3x). A learner (200 Hz)
takes an optimizer step on each new batch and sends its weights as one flat vector; an actor
(50 Hz) loads the latest weights into its own copy of the model and predicts. The host
follows the actor's error as it goes down, in real time.

Run it with ``python examples/online_learner.py``.
"""

from __future__ import annotations

import torch
from torch import nn

import mujou
from mujou import Input, Net, Node, Output


def make_model(generator: torch.Generator) -> nn.Module:
    """A small MLP, initialised from the node's generator (not torch's global one)."""
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=layer.in_features**-0.5, generator=generator)
            nn.init.zeros_(layer.bias)
    return model


class World(Node):
    """Sends 32 fresh samples (x, y) at 100 Hz, as one [32, 2] tensor."""

    samples = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)

    def on_update(self, dt: float) -> None:
        x = 2 * torch.rand(32, 1, generator=self.generator) - 1
        y = torch.sin(3 * x) + 0.05 * torch.randn(32, 1, generator=self.generator)
        self.samples.send(torch.cat([x, y], 1))


class Learner(Node):
    samples = Input()
    weights = Output()

    def __init__(self) -> None:
        super().__init__(period=0.005, seed=1)
        self.model = make_model(self.generator)

    def on_start(self) -> None:
        # Made in on_start, over the parameters: a restore then fills in its state too.
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def on_update(self, dt: float) -> None:
        samples = self.samples.read()
        if samples is None:
            return
        with torch.enable_grad():  # grad mode is per thread: set it in the hook, in a with
            loss = nn.functional.mse_loss(self.model(samples[:, :1]), samples[:, 1:])
            self.optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
            self.optimizer.step()
        self.weights.send(nn.utils.parameters_to_vector(self.model.parameters()))


class Actor(Node):
    samples = Input()
    weights = Input()
    error = Output()

    def __init__(self) -> None:
        super().__init__(period=0.02, seed=2)
        self.model = make_model(self.generator)

    def on_update(self, dt: float) -> None:
        weights, samples = self.weights.read(), self.samples.read()
        with torch.no_grad():
            if weights is not None:
                # The message is shared and read-only: copy it into our own parameters.
                nn.utils.vector_to_parameters(weights.clone(), self.model.parameters())
            if samples is not None:
                prediction = self.model(samples[:, :1])
                self.error.send(nn.functional.mse_loss(prediction, samples[:, 1:]))


class Learning(Net):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.learner = Learner()
        self.actor = Actor()
        self.connect(self.world.samples, self.learner.samples)
        self.connect(self.world.samples, self.actor.samples)
        self.connect(self.learner.weights, self.actor.weights)


def main() -> None:
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    net = Learning()
    print("The learner fits y = sin(3x) from a stream of samples; the actor uses its latest weights.")
    print(" time   learner steps   actor's mean squared error over the last 0.5 s")
    with mujou.run(net) as run, run.subscribe(net.actor.error) as errors:
        for step in range(1, 7):
            run.sleep(max(0.0, 0.5 * step - run.time))  # until the next half second
            recent = errors.drain()  # every error the actor sent since the last drain
            steps = run.stats().nodes["learner"].updates
            if recent:
                mean = torch.stack(recent).mean().item()
                print(f"{run.time:4.1f} s   {steps:13d}   {mean:.4f}  {'#' * min(60, round(100 * mean))}")
            else:  # the actor sent nothing in this half second (a machine busy elsewhere)
                print(f"{run.time:4.1f} s   {steps:13d}   nan")


if __name__ == "__main__":
    main()
