"""Conformance tests for typed ports: ``ports.typed``, ``ports.typed-check``,
``ports.typed-errors``, ``ports.typed-static``, ``net.typed-connect`` and
``net.typed-connect-difference`` (spec/en/nodes-and-ports.md).

The static side of ``ports.typed-static`` is checked by mypy in conformance/type_tests/.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Annotated, Any, NamedTuple

import pytest
import torch
from _support import Bag, vt

import mujou
from mujou import Input, Node, Output, TensorSpec

F32 = torch.float32


class Pose(NamedTuple):
    position: Annotated[torch.Tensor, TensorSpec(F32, (3,))]
    confidence: float


@dataclasses.dataclass
class Boxes:
    boxes: Annotated[torch.Tensor, TensorSpec(F32, (None, 4))]
    frame: int
    note: Any = None  # declares nothing


class Sender(Node):
    """Sends each value of ``values`` on the port ``port``, one per update; keeps the errors."""

    def __init__(self, values: list[object]) -> None:
        super().__init__(period=0.25, seed=0)
        self.values = values
        self.errors: list[str] = []

    def port(self) -> Output[Any]:
        raise NotImplementedError

    def on_update(self, dt: float) -> None:
        for value in self.values:
            try:
                self.port().send(value)
            except TypeError as exc:
                self.errors.append(str(exc))
            else:
                self.errors.append("")
        self.values = []


def errors_of(node: Sender) -> list[str]:
    with mujou.run(Bag(node=node), timer=vt()) as run:
        run.sleep(0.25)
    return node.errors


# --------------------------------------------------------------------------------------------
# ports.typed


@pytest.mark.rule("ports.typed")
def test_tensor_spec_arguments_are_checked() -> None:
    """> shape is a sequence of sizes in which None leaves a dimension free (-1 is refused)."""
    spec = TensorSpec(F32, (None, 3))
    assert spec.dtype is F32 and spec.shape == (None, 3)
    assert spec.matches(torch.zeros(5, 3)) and spec.matches(torch.zeros(0, 3))
    assert not spec.matches(torch.zeros(5, 4)) and not spec.matches(torch.zeros(3))
    assert not spec.matches(torch.zeros(5, 3, dtype=torch.float64))
    assert TensorSpec(shape=[2]).matches(torch.zeros(2, dtype=torch.int64))
    assert TensorSpec(F32).matches(torch.zeros(1, 2, 3))
    with pytest.raises(
        ValueError,
        match=r"^shape sizes must be ints >= 0, or None for a free dimension, got -1 in \(-1, 3\) "
        r"\(write None, not -1, for a free dimension\)$",
    ):
        TensorSpec(F32, (-1, 3))
    with pytest.raises(TypeError, match=r"^dtype must be a torch\.dtype or None, got str: 'float32'$"):
        TensorSpec("float32")  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(TypeError, match=r"^shape must be a sequence of sizes"):
        TensorSpec(F32, 3)  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(
        TypeError, match=r"^shape sizes must be ints >= 0, or None for a free dimension, got 2\.0"
    ):
        TensorSpec(F32, (2.0,))  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(TypeError, match=r"^give either spec=, or dtype= and shape=, not both$"):
        Output(spec=Pose, dtype=F32)  # type: ignore[call-overload]  # both, on purpose
    with pytest.raises(
        TypeError, match=r"^spec\['a'\] must be a TensorSpec, torch\.Tensor, bool, int, float, str, None"
    ):
        Output(spec={"a": 3})
    with pytest.raises(TypeError, match=r"^spec has the dict key 1; dict keys are str$"):
        Input(spec={1: torch.Tensor})


class FreeSender(Sender):
    y = Output(dtype=F32, shape=(None, 2))

    def port(self) -> Output[Any]:
        return self.y


@pytest.mark.rule("ports.typed")
def test_free_dimensions_take_any_size() -> None:
    """> Output(dtype=..., shape=...) declares that the port's messages are tensors of that
    > dtype and shape; None leaves a dimension free."""
    node = FreeSender([torch.zeros(0, 2), torch.zeros(7, 2), torch.zeros(7, 3), torch.zeros(2)])
    errors = errors_of(node)
    assert errors[:2] == ["", ""]
    assert errors[2] == (
        "port 'node.y' expects TensorSpec(dtype=torch.float32, shape=(None, 2)), "
        "got a tensor of dtype torch.float32 and shape (7, 3)"
    )
    assert errors[3].endswith("got a tensor of dtype torch.float32 and shape (2,)")


class PoseSender(Sender):
    y = Output(spec=Pose)

    def port(self) -> Output[Any]:
        return self.y


class NestSender(Sender):
    y = Output(spec={"boxes": Boxes, "ok": bool, "pair": (torch.Tensor, None)})

    def port(self) -> Output[Any]:
        return self.y


@pytest.mark.rule("ports.typed", "ports.typed-check")
def test_nests_are_checked_field_by_field() -> None:
    """> spec= declares a nest of the same structure as the messages ... a NamedTuple class or a
    > dataclass for an instance of it, whose fields are declared by their annotations."""
    good = Pose(torch.zeros(3), 0.5)
    pose_errors = errors_of(
        PoseSender([good, Pose(torch.zeros(4), 0.5), Pose(torch.zeros(3), 1), (torch.zeros(3), 0.5)])
    )
    assert pose_errors[0] == ""
    assert pose_errors[1] == (
        "port 'node.y' expects at .position TensorSpec(dtype=torch.float32, shape=(3,)), "
        "got a tensor of dtype torch.float32 and shape (4,)"
    )
    assert pose_errors[2] == "port 'node.y' expects at .confidence float, got int 1"
    assert re.match(
        r"^port 'node\.y' expects Pose\(position=TensorSpec\(dtype=torch\.float32, shape=\(3,\)\), "
        r"confidence=float\), got \(\*, \*\) \(",
        pose_errors[3],
    ), pose_errors[3]
    boxes = Boxes(torch.zeros(5, 4), 3, note={"anything": [1, "x"]})
    nest_errors = errors_of(
        NestSender(
            [
                {"boxes": boxes, "ok": True, "pair": (torch.zeros(1), None)},
                {"boxes": boxes, "ok": 1, "pair": (torch.zeros(1), None)},
                {"boxes": Boxes(torch.zeros(5, 3), 3), "ok": True, "pair": (torch.zeros(1), None)},
                {"boxes": boxes, "ok": True, "pair": (torch.zeros(1), 2)},
                {"boxes": boxes, "ok": True},
            ]
        )
    )
    assert nest_errors[0] == ""
    assert nest_errors[1] == "port 'node.y' expects at ['ok'] bool, got int 1"
    assert nest_errors[2].startswith(
        "port 'node.y' expects at ['boxes'].boxes TensorSpec(dtype=torch.float32, shape=(None, 4)), got"
    )
    assert nest_errors[3] == "port 'node.y' expects at ['pair'][1] None, got int 2"
    assert nest_errors[4].startswith("port 'node.y' expects {'boxes': Boxes(")


# --------------------------------------------------------------------------------------------
# ports.typed-check


SEVEN = torch.full((3,), 7.25)  # a value no error may show


@pytest.mark.rule("ports.typed-errors")
def test_errors_show_no_tensor_value_and_say_where_the_structure_differs() -> None:
    """> An error about a message that does not match a declaration never shows the values of
    > its tensors ... the error says where they first differ (the path, what is expected and
    > what was received, by kind and length); a plain tuple or dict where a NamedTuple or
    > dataclass is declared names the class to make it with."""
    pose = errors_of(PoseSender([(SEVEN, 0.5)]))
    nest = errors_of(
        NestSender(
            [
                {"boxes": (SEVEN, 1), "ok": True, "pair": (SEVEN, None)},
                {"boxes": Boxes(SEVEN, 1), "ok": True, "pair": [SEVEN, None]},
                {"boxes": Boxes(SEVEN, 1), "ok": True, "pair": (SEVEN,)},
                {"boxes": Boxes(SEVEN, 1), "ok": True, "extra": SEVEN},
            ]
        )
    )
    node = HostFed()
    with pytest.raises(TypeError) as info:
        mujou.run(Bag(node=node), timer=vt(), inputs={node.target: (SEVEN, 1)})
    errors = [*pose, *nest, str(info.value)]
    for error in errors:
        assert "7.25" not in error and "tensor(" not in error, error
    assert pose[0].endswith(
        "got (*, *) (at the top: expects a Pose, got a tuple of 2: make it with Pose(...))"
    ), pose[0]
    boxes_hint = "(at ['boxes']: expects a Boxes, got a tuple of 2: make it with Boxes(...))"
    assert nest[0].endswith(boxes_hint), nest[0]
    assert nest[1].endswith("(at ['pair']: expects a tuple of 2, got a list of 2)"), nest[1]
    assert nest[2].endswith("(at ['pair']: expects a tuple of 2, got a tuple of 1)"), nest[2]
    assert nest[3].endswith(
        "(at the top: expects the dict keys [\"'boxes'\", \"'ok'\", \"'pair'\"], "
        "got [\"'boxes'\", \"'extra'\", \"'ok'\"])"
    ), nest[3]
    assert errors[-1].endswith("(at the top: expects a dict, got a tuple of 2)"), errors[-1]


class Untyped(Sender):
    y = Output()

    def port(self) -> Output[Any]:
        return self.y


class TypedReader(Node):
    x = Input(dtype=torch.int64)


@pytest.mark.rule("ports.typed-check")
def test_send_checks_the_declarations_of_the_inputs_it_feeds() -> None:
    """> at send, against the output's declaration and those of the inputs it feeds."""
    sender, reader = Untyped([torch.zeros(2, dtype=torch.int64), torch.zeros(2)]), TypedReader()
    net = Bag(sender=sender, reader=reader)
    net.connect(sender.y, reader.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
    assert sender.errors == [
        "",
        "port 'sender.y' sends to input 'reader.x', which expects TensorSpec(dtype=torch.int64, "
        "shape=None), got a tensor of dtype torch.float32 and shape (2,)",
    ]


class HostFed(Node):
    target: Input[dict[str, Any]] = Input(optional=True, spec={"position": TensorSpec(F32, (3,)), "id": int})


@pytest.mark.rule("ports.typed-check")
def test_write_and_inputs_check_the_input_declaration() -> None:
    """> at run.write and for inputs=, against the input's declaration."""
    node, other = HostFed(), HostFed()
    good = {"position": torch.zeros(3), "id": 1}
    with pytest.raises(
        TypeError,
        match=r"^inputs\['node\.target'\]: input 'node\.target' expects at \['id'\] int, got str '1'$",
    ):
        mujou.run(Bag(node=node), timer=vt(), inputs={node.target: {"position": torch.zeros(3), "id": "1"}})
    node = other
    with mujou.run(Bag(node=node), timer=vt(), inputs={node.target: good}) as run:
        run.write(node.target, good)
        with pytest.raises(
            TypeError,
            match=r"^run\.write\(\): input 'node\.target' expects at \['position'\] "
            r"TensorSpec\(dtype=torch\.float32, shape=\(3,\)\), got a tensor of dtype torch\.float64 "
            r"and shape \(3,\)$",
        ):
            run.write(node.target, {"position": torch.zeros(3, dtype=torch.float64), "id": 1})
        message = run.read(node.target)
        assert message is not None and message["id"] == 1


class StrictSender(Node):
    y = Output(dtype=F32, shape=(2,))

    def on_update(self, dt: float) -> None:
        self.y.send(torch.zeros(2))


class Net1(mujou.Net):
    def __init__(self, sender: Node) -> None:
        super().__init__()
        self.sender = sender


@pytest.mark.rule("ports.typed-check", "state.mismatch")
def test_a_tree_whose_message_does_not_match_is_refused() -> None:
    """> A state tree whose message does not match its port's declaration is refused."""
    with mujou.run(Net1(StrictSender(period=0.25)), timer=vt()) as run:
        run.sleep(0.25)
        tree = run.state_dict()
    tree["@mujou"]["ports"]["sender.y"]["tensor"] = torch.zeros(3)
    with pytest.raises(
        ValueError,
        match=r"^Error\(s\) in loading state for net:\n\tport 'sender\.y' expects "
        r"TensorSpec\(dtype=torch\.float32, shape=\(2,\)\), got a tensor of dtype torch\.float32 and "
        r"shape \(3,\)\.$",
    ):
        mujou.run(Net1(StrictSender(period=0.25)), timer=vt(), state=tree)


# --------------------------------------------------------------------------------------------
# ports.typed-static


@pytest.mark.rule("ports.typed-static")
def test_ports_are_generic_in_their_message_type() -> None:
    """> For type checkers, Input and Output are generic in the type of their messages;
    > Output() and Input() stand for Output[torch.Tensor] and Input[torch.Tensor]."""
    assert typing.get_args(Output[Pose]) == (Pose,)
    assert typing.get_args(Input[dict[str, torch.Tensor]]) == (dict[str, torch.Tensor],)
    params: tuple[Any, ...] = getattr(Output, "__parameters__", ())
    assert len(params) == 1 and params[0].__default__ is torch.Tensor  # PEP 696 default
    port = Output[Pose](spec=Pose)  # a subscripted port is a port
    assert isinstance(port, Output)
    assert isinstance(Input[Pose](spec=Pose, optional=True), Input)


# --------------------------------------------------------------------------------------------
# net.typed-connect


class Floats(Node):
    y = Output(dtype=F32, shape=(None, 3))


class Doubles(Node):
    x = Input(dtype=torch.float64)


class ThreeByAny(Node):
    x = Input(shape=(2, None))


class Wide(Node):
    x = Input(shape=(None, 4))


class PoseIn(Node):
    x = Input(spec=Pose)


class AnyIn(Node):
    x = Input()


@pytest.mark.rule("net.typed-connect")
def test_connect_refuses_declarations_no_message_matches() -> None:
    """> When an output and an input both declare their messages and no message matches both,
    > net.connect raises ValueError naming both ports, both declarations and where they differ."""
    src, doubles, fits, wide, pose, anything = Floats(), Doubles(), ThreeByAny(), Wide(), PoseIn(), AnyIn()
    net = Bag(src=src, doubles=doubles, fits=fits, wide=wide, pose=pose, anything=anything)
    with pytest.raises(
        ValueError,
        match=r"^cannot connect output 'src\.y' to input 'doubles\.x': the output declares "
        r"TensorSpec\(dtype=torch\.float32, shape=\(None, 3\)\) and the input "
        r"TensorSpec\(dtype=torch\.float64, shape=None\), which no message matches "
        r"\(dtype torch\.float32 vs torch\.float64\)$",
    ):
        net.connect(src.y, doubles.x)
    with pytest.raises(
        ValueError, match=r"matches \(shape \(None, 3\) vs \(None, 4\): dimension 1 is 3 vs 4\)$"
    ):
        net.connect(src.y, wide.x)
    with pytest.raises(ValueError, match=r"which no message matches \(a tensor vs a Pose\)$"):
        net.connect(src.y, pose.x)  # type: ignore[misc]  # an Output[Tensor] to an Input[Pose]
    net.connect(src.y, fits.x)  # (None, 3) and (2, None): a (2, 3) tensor matches both
    net.connect(src.y, anything.x)  # an input without a declaration takes anything
    assert fits.x.source is src.y and anything.x.source is src.y
    assert doubles.x.source is None and wide.x.source is None


class PositionOut(Node):
    y = Output(spec={"position": TensorSpec(F32, (3,))})


class PositionIn(Node):
    x = Input(spec={"position": TensorSpec(F32, (4,))})


class DeepIn(Node):
    x = Input(shape=(2, 3, 4))


class PoseOut(Node):
    y = Output(spec=Pose)


class Pose64(NamedTuple):
    position: Annotated[torch.Tensor, TensorSpec(torch.float64, (3,))]
    confidence: float


class Pose64In(Node):
    x = Input(spec=Pose64)


class SamePoseIn(Node):
    x = Input(spec=Pose)


@pytest.mark.rule("net.typed-connect-difference")
def test_connect_names_only_what_differs() -> None:
    """> The error of net.typed-connect shows each declaration once, then names the first place
    > where they differ (its path in the nest, if not the top) and only what differs there."""
    src, wide, deep, pose_in = Floats(), Wide(), DeepIn(), PoseIn()
    camera, planner = PositionOut(), PositionIn()
    net = Bag(src=src, wide=wide, deep=deep, camera=camera, planner=planner, pose_in=pose_in)
    pairs: list[tuple[Output[Any], Input[Any]]] = [
        (src.y, wide.x),
        (src.y, deep.x),
        (camera.y, planner.x),
        (src.y, pose_in.x),
    ]
    errors: list[str] = []
    for output, input in pairs:
        with pytest.raises(ValueError) as info:
            net.connect(output, input)
        errors.append(str(info.value))
    assert errors[0].endswith("(shape (None, 3) vs (None, 4): dimension 1 is 3 vs 4)"), errors[0]
    assert errors[1].endswith("(shape (None, 3) vs (2, 3, 4): 2 vs 3 dimensions)"), errors[1]
    assert errors[2] == (  # the example of the spec
        "cannot connect output 'camera.y' to input 'planner.x': the output declares "
        "{'position': TensorSpec(dtype=torch.float32, shape=(3,))} and the input "
        "{'position': TensorSpec(dtype=torch.float32, shape=(4,))}, which no message matches "
        "(at ['position'] shape (3,) vs (4,): dimension 0 is 3 vs 4)"
    )
    assert errors[3].endswith("which no message matches (a tensor vs a Pose)"), errors[3]
    for error in errors:
        output_text = error.split("the output declares ")[1].split(" and the input ")[0]
        assert error.count(output_text) == 1, error  # each declaration once
    pose, pose64 = PoseOut(), Pose64In()
    with pytest.raises(ValueError, match=r"which no message matches \(Pose vs Pose64\)$"):
        Bag(pose=pose, pose64=pose64).connect(pose.y, pose64.x)  # type: ignore[misc]  # Pose to Pose64
