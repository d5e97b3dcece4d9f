"""Type tests of ports.typed-static: checked by ``mypy --strict`` (CI's typecheck), never run.

Each ``assert_type`` states what a type checker sees; a line marked ``# type: ignore[...]``
must fail to type-check (``warn_unused_ignores``, part of ``--strict``, reports it when it
stops failing).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, assert_type

import torch

import mujou
from mujou import Input, Node, Output


class Pose(NamedTuple):
    position: torch.Tensor
    confidence: float


@dataclasses.dataclass
class Boxes:
    boxes: torch.Tensor
    frame: int


class Typed(Node):
    plain = Output()  # Output[torch.Tensor], by default
    shaped = Output(dtype=torch.float32, shape=(None, 3))
    pose = Output(spec=Pose)  # Output[Pose], from the class
    boxes = Output(spec=Boxes)
    status: Output[dict[str, torch.Tensor]] = Output(spec={"a": torch.Tensor})
    x = Input()
    pose_in = Input(spec=Pose)
    optional = Input(optional=True, spec=Boxes)
    annotated: Input[list[torch.Tensor]] = Input()

    def on_update(self, dt: float) -> None:
        assert_type(self.plain, Output[torch.Tensor])
        assert_type(self.pose, Output[Pose])
        assert_type(self.x.read(), torch.Tensor | None)
        assert_type(self.pose_in.read(), Pose | None)
        assert_type(self.optional.read(), Boxes | None)
        assert_type(self.annotated.read(), list[torch.Tensor] | None)
        assert_type(self.pose_in.stamp, float | None)
        assert_type(self.pose_in.fresh, bool)
        self.plain.send(torch.zeros(1))
        self.shaped.send(torch.zeros(2, 3))
        self.pose.send(Pose(torch.zeros(3), 1.0))
        self.boxes.send(Boxes(torch.zeros(1, 4), 1))
        self.status.send({"a": torch.zeros(1)})
        self.pose.send(torch.zeros(3))  # type: ignore[arg-type]  # a tensor is not a Pose
        self.plain.send(Pose(torch.zeros(3), 1.0))  # type: ignore[arg-type]  # nor a Pose a tensor


class Wiring(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Typed(), Typed()
        self.connect(self.a.pose, self.b.pose_in)
        self.connect(self.a.plain, self.b.x)
        self.connect(self.a.plain, self.b.pose_in)  # type: ignore[misc]  # a tensor is no Pose: no M fits


def host(run: mujou.Run, node: Typed) -> None:
    assert_type(run.read(node.pose), Pose | None)
    assert_type(run.read(node.x), torch.Tensor | None)
    assert_type(run.wait_for(node.pose, lambda pose: pose.confidence > 0.5), Pose)
    with run.subscribe(node.boxes) as boxes:
        assert_type(boxes.drain(), list[Boxes])
        assert_type(boxes.get(), Boxes)
    run.write(node.optional, Boxes(torch.zeros(1, 4), 2))
    run.write(node.optional, torch.zeros(1))  # type: ignore[misc]  # not a Boxes: no M fits both


def owner(node: Typed) -> None:
    """``port.node`` shows a node's public properties, and narrows to the node's class."""
    assert_type(node.pose.node.name, str)
    assert_type(node.x.node.device, torch.device)
    assert_type(node.x.node.period, float | None)
    assert_type(node.x.node.generator, torch.Generator)
    assert_type(node.x.node.trigger, mujou.Trigger | None)
    found = node.pose.node
    if isinstance(found, Typed):
        assert_type(found.pose, Output[Pose])
