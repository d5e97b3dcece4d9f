"""Unit tests of checking a state tree against the run's nodes before a restore (_tree.check_tree).

The devices: the state of a random generator differs between the CPU and CUDA, so a tree saved
from CPU nodes fits only CPU nodes and one saved from CUDA nodes only CUDA nodes
(cuda.state-restores-on-cuda-only). check_tree reads a node's device from its bookkeeping
alone, so a node here is marked as on CUDA without CUDA, and the conformance test that restores
into a real CUDA node (conformance/test_state.py) runs where CUDA is.
"""

from __future__ import annotations

from typing import Any

import torch

import mujou
from mujou import Net, Node
from mujou._engine._slot import Slot
from mujou._tree import check_tree


class Drawing(Node):
    def __init__(self) -> None:
        super().__init__(period=0.25, seed=3)

    def on_update(self, dt: float) -> None:
        torch.randn(4, generator=self.generator)


class One(Net):
    def __init__(self) -> None:
        super().__init__()
        self.drawer = Drawing()


def saved_tree() -> dict[str, Any]:
    with mujou.run(One(), timer=mujou.VirtualTimer()) as run:
        run.sleep(0.5)
        return run.state_dict()


def slot_on(device: torch.device) -> Slot:
    """The slot of node ``drawer`` of a fresh net, its node marked as on ``device``."""
    node = One().drawer
    node._mujou.device = device
    return Slot(node, node._mujou, 0)


def test_a_tree_from_cpu_nodes_does_not_fit_a_cuda_node() -> None:
    problems, _, _ = check_tree([slot_on(torch.device("cuda", 0))], saved_tree())
    assert problems == [
        "node 'drawer' is on CUDA, but its state was saved from a CPU node; "
        "a tree saved from CPU nodes restores only into CPU nodes."
    ]


def test_a_tree_from_cuda_nodes_does_not_fit_a_cpu_node() -> None:
    tree = saved_tree()
    tree["@mujou"]["nodes"]["drawer"]["device"] = "cuda"
    problems, _, _ = check_tree([slot_on(torch.device("cpu"))], tree)
    assert len(problems) == 1 and problems[0].startswith("node 'drawer' is on the CPU, but"), problems


def test_a_tree_fits_a_node_on_the_device_it_was_saved_from() -> None:
    problems, _, _ = check_tree([slot_on(torch.device("cpu"))], saved_tree())
    assert problems == []
    tree = saved_tree()
    tree["@mujou"]["nodes"]["drawer"]["device"] = "cuda"
    problems, _, _ = check_tree([slot_on(torch.device("cuda", 1))], tree)
    assert problems == []
