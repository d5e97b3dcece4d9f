"""Ask a node and wait for its answer: event-driven round trips through triggered nodes.

A host sends a question to a small model with ``run.write``; the model is triggered by its
input (``trigger=mujou.on("question")``), so it runs as soon as the question arrives, and a
second triggered node checks its answer. The host waits for the checked answer with
``run.wait_for``. Nothing polls: no node has a period.

Under the virtual timer each round trip takes no timer time at all: the model runs one
microstep after the write, the checker one after the model (superdense time, see the
Triggers page), and the results are bit for bit the same on 1 and 2 workers. Under the
real-time timer the same net answers in microseconds, not in a polling period.

Run it with ``python examples/ask_and_answer.py``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

import mujou
from mujou import Input, Net, Node, Output


class Model(Node):
    """Answers each question: a fixed random linear map of it."""

    question = Input(optional=True)  # the host writes it
    answer = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("question"), seed=0)
        self.layer = nn.Linear(4, 4)
        with torch.no_grad():  # from the node's generator: the same weights in every run
            self.layer.weight.copy_(torch.randn(4, 4, generator=self.generator))
            self.layer.bias.zero_()

    def on_update(self, dt: float) -> None:
        with torch.no_grad():
            self.answer.send(self.layer(self.question.read()))


class Checker(Node):
    """Woken by each answer: sends it with its norm and the number of answers so far."""

    answer = Input()
    checked: Output[dict[str, Any]] = Output()  # a nest: the answer, its norm, the count

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("answer"))
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        answer = self.answer.read()
        assert answer is not None  # it woke for one
        self.checked.send({"answer": answer, "norm": answer.norm(), "count": self.count})


class Service(Net):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.checker = Checker()
        self.connect(self.model.answer, self.checker.answer)


def is_reply(number: int) -> Any:
    """The predicate of ``run.wait_for`` that waits for the reply to question ``number``."""
    return lambda message: message["count"] == number


def ask_all(run: mujou.Run, net: Service, questions: torch.Tensor) -> list[float]:
    """Ask each question in turn, wait for its checked answer; return the answers' norms."""
    norms = []
    for number, question in enumerate(questions, 1):
        run.write(net.model.question, question)
        reply = run.wait_for(net.checker.checked, is_reply(number), timeout=5.0)
        norms.append(float(reply["norm"]))
    return norms


def main() -> None:
    torch.set_num_threads(1)
    questions = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    results = []
    for workers in (1, 2):
        net = Service()
        with mujou.run(net, workers=workers, timer=mujou.VirtualTimer()) as run:
            norms = ask_all(run, net, questions)
            print(f"Virtual timer, {workers} worker(s): {len(norms)} round trips at t={run.time:.3f} s")
            results.append((norms, run.state_dict()))
    (first, tree1), (second, tree2) = results
    same = first == second and torch.equal(
        tree1["model"]["layer"]["weight"], tree2["model"]["layer"]["weight"]
    )
    print(f"The answers on 1 and 2 workers are the same, bit for bit: {same}")
    print(f"First answers' norms: {', '.join(f'{n:.3f}' for n in first[:3])}")

    net = Service()
    with mujou.run(net, workers=2) as run:
        ask_all(run, net, questions[:5])  # warm up
        trips = []
        for number, question in enumerate(questions, 6):
            began = time.perf_counter()
            run.write(net.model.question, question)
            run.wait_for(net.checker.checked, is_reply(number), timeout=5.0)
            trips.append(time.perf_counter() - began)
        updates = run.stats().nodes["model"].updates
    print(
        f"Real-time timer: {len(trips)} round trips through 2 triggered nodes, "
        f"median {statistics.median(trips) * 1e6:.0f} us; the model ran {updates} times"
    )


if __name__ == "__main__":
    main()
